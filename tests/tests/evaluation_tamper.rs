//! Evaluation the policy cannot tamper with, end to end (root only): a
//! rollout server, one gateway (`polar agent`, native runtime) and real
//! rollout sessions of the `shell` harness, whose command plays a hostile
//! policy. Each task has two samples: sample 0 leaves a wrong `calc.py`
//! and plants a tamper, sample 1 (its sibling, in the same task, on the
//! same node) leaves the right one. Each tamper is first shown to work in
//! the session itself (the harness's last command succeeds only if it
//! fired), then the evaluation must give sample 0 its honest reward, 0.0,
//! labelled where the tamper broke the evaluation, and sample 1 its normal
//! 1.0:
//!
//! - a start-up hook in HOME (a `usercustomize.py` and a `.pth` in the user
//!   site that make every Python exit 0), for a `command` evaluator in the
//!   session's sandbox and with `fresh = true`;
//! - a hostile `.git/config` (fsmonitor, clean/smudge filters, textconv,
//!   an included file, a hooks path) whose program rewrites `calc.py` to
//!   pass, for `test_output`'s `git apply` of the test patch;
//! - the same configuration for the task's own command, which runs plain
//!   `git diff HEAD` before its check (the workspace's configurations are
//!   replaced by their data keys before any evaluator command);
//! - the workspace made a repository directory itself (no `.git`, a
//!   configuration at its top naming it the work tree and an external
//!   diff), for a command that runs `git diff`;
//! - a textconv driver in `.git/config`, chosen by `.gitattributes`, that
//!   makes `git diff` show the right line, for `llm_judge`'s default diff
//!   (the mock judges from the diff it is shown);
//! - the base's blob of a test rewritten in the workspace's object store
//!   so that `git diff` hides the test's removed assertion, for
//!   `llm_judge` with a criterion that the test is kept (the diff reads
//!   the base from the pack the node kept before the harness ran);
//! - the task's test dependency rewritten in the workspace's
//!   `node_modules` (the check Node's `require` finds there always
//!   passes), for a `command` evaluator that lists `node_modules` in
//!   `restore` (put back as the prepare step left it), in the session's
//!   sandbox and with `fresh = true`;
//! - (the task's own error, not a tamper) `restore` paths that do not fit
//!   in the session's disk quota beside the workspace: both samples fail
//!   before the harness runs, with an error naming the option;
//! - more git repositories in the workspace than the clean-up of their
//!   configurations takes (1,001 `.git` directories, which would run it
//!   past its time): scored 0.0, `broken.cause = "too_many_repositories"`;
//! - a results directory the evaluator cannot write (`.polar` made
//!   read-only), for a `command` evaluator with a reward file: scored 0.0,
//!   `broken.cause = "unwritable"`, not an unscored error;
//! - a workspace the evaluator cannot enter (`chmod 000` on its root):
//!   scored 0.0, `broken.cause = "unwritable"`;
//! - the session's disk quota filled: scored 0.0, `broken.cause =
//!   "no_space"`;
//!
//! and around hidden tests that a `[[post]]` step uploads (`replace =
//! true`) into `tests/` and a `test_output` evaluator runs with pytest
//! (`tests = "tests"`), each first shown to make the wrong solution pass
//! a plain pytest run in the session:
//!
//! - a `conftest.py` at the workspace's top that reports every test
//!   passed;
//! - a `pytest.ini`, `tox.ini`, `setup.cfg` and `pyproject.toml` whose
//!   `addopts` load such a plugin from the workspace;
//! - a `tests/pytest.ini` doing the same, where the tests will be
//!   uploaded (the upload replaces the directory);
//! - a `pytest.py` that prints a passing report (`python -m pytest` puts
//!   the working directory first on Python's path);
//! - a `*.dist-info` declaring the plugin as a pytest entry point;
//! - a `fractions.py` shadowing the standard module the tests compare
//!   with;
//! - a process left running after the harness (`setsid`, double fork)
//!   that rewrites the tests once they are uploaded;
//! - the tests' captured output flooded with passing lines, more than the
//!   4 MiB of a stream the evaluator reads: scored 0.0, `broken.cause =
//!   "too_much_output"`.
//!
//! Every task runs in the native runtime and, in its own test, in docker
//! (the engine and image of `cargo xtask test`).
#![cfg_attr(not(feature = "privileged"), allow(dead_code, unused_imports))]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use polar_mock::{self as mock, MockConfig};
use polar_rollout::{RolloutConfig, RolloutServer};
use polar_rollout_api::{RolloutClient, SampleResult, SampleStatus, SessionState};
use polar_tests::{docker, polar_bin, sandbox_tempdir};
use serde_json::{Value, json};

const TOKEN: &str = "tamper-e2e-token";
const GATEWAY_TOKEN: &str = "tamper-e2e-server-token";
const NODE: &str = "gw-tamper";
const NODE_TOKEN: &str = "tamper-e2e-node-token";

/// `polar agent`, killed on drop.
struct Agent {
    child: Child,
    log: PathBuf,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the gateway of node `NODE` on `dir`, with `sandbox` more keys
/// of its `[sandbox]` table; task uploads may come from `dir/tasks`.
fn start_agent(
    dir: &Path,
    server: &str,
    mock: std::net::SocketAddr,
    sandbox: &str,
) -> Result<Agent> {
    let port = std::net::TcpListener::bind("127.0.0.43:0")?
        .local_addr()?
        .port();
    let config = dir.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            r#"[agent]
state_dir = "{state}"

[[backend]]
name = "local"
dialect = "vllm"
replicas = ["http://{mock}"]
served_model = "default"

[sandbox]
disk_bytes = 1073741824
{sandbox}

[gateway]
server = "http://{server}"
node_id = "{NODE}"
listen = "127.0.0.43:{port}"
token = "{NODE_TOKEN}"
accept_tokens = ["{GATEWAY_TOKEN}"]
max_sessions = 2
heartbeat_interval_ms = 300
export = "{export}"
formats = ["jsonl"]

[gateway.policy]
upload_roots = ["{tasks}"]
"#,
            state = dir.join("state").display(),
            export = dir.join("trajectories").display(),
            tasks = dir.join("tasks").display(),
        ),
    )?;
    let log = dir.join("agent.log");
    let child = Command::new(polar_bin()?)
        .args(["--log-format", "json", "agent", "--config"])
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()?;
    Ok(Agent { child, log })
}

const WRONG: &str = r"printf 'def add(a, b):\n    return a - b\n' > calc.py";
const RIGHT: &str = r"printf 'def add(a, b):\n    return a + b\n' > calc.py";

/// The harness's command: sample 0 runs `tamper` after leaving the wrong
/// solution, and must end with a command that succeeds only when the
/// tamper fired; sample 1 leaves the right solution.
fn policy(tamper: &str) -> String {
    format!(
        "set -e\ncase \"$POLAR_SESSION\" in\n*-s0)\n{WRONG}\n{tamper}\n;;\n*)\n{RIGHT}\n;;\nesac\n"
    )
}

/// A task of two samples with the harness command `command`, the runtime
/// spec `runtime` and the evaluator `evaluator`.
fn task(id: &str, command: String, runtime: Value, evaluator: Value) -> Value {
    json!({
        "task_id": id,
        "instruction": "Write calc.py whose add(a, b) returns a + b.",
        "num_samples": 2,
        "timeout_secs": 120,
        "agent": {"harness": "shell", "options": {"command": command}},
        "runtime": runtime,
        "evaluator": evaluator,
        "builder": {"kind": "per_request"},
    })
}

/// Checks `calc.add(2, 3) == 5` by its exit status.
fn exit_status_check(fresh: bool) -> Value {
    json!({"kind": "command", "options": {
        "command": "python3 -c 'import calc, sys; sys.exit(0 if calc.add(2, 3) == 5 else 1)'",
        "fresh": fresh,
    }})
}

/// The task's own command runs `git` (`git_command`, its failure
/// ignored), then checks `calc.add(2, 3) == 5` by its exit status.
fn git_then_check(git_command: &str) -> Value {
    json!({"kind": "command", "options": {
        "command": format!("{git_command} > /dev/null 2>&1; python3 -c 'import calc, sys; sys.exit(0 if calc.add(2, 3) == 5 else 1)'"),
    }})
}

/// Writes `1` or `0` to the reward file from Python.
fn reward_file_check() -> Value {
    json!({"kind": "command", "options": {
        "command": "python3 -c 'import calc, os; open(os.environ[\"POLAR_REWARD_FILE\"], \"w\").write(\"1\" if calc.add(2, 3) == 5 else \"0\")'",
        "reward": "file",
    }})
}

/// A start-up hook in HOME: every Python of the session exits 0 at once.
const HOME_HOOK: &str = r#"site=$(python3 -c 'import site; print(site.getusersitepackages())')
mkdir -p "$site"
printf 'import os\nos._exit(0)\n' > "$site/usercustomize.py"
printf 'import os; os._exit(0)\n' > "$site/zz-polar-tamper.pth"
python3 -c 'import sys; sys.exit(3)'"#;

/// A repository whose configuration runs `.cheat.sh` (which makes
/// `calc.py` right) in every way git runs a program; `git diff` in the
/// session shows it fires, then the wrong solution is put back.
const GIT_TAMPER: &str = r#"git init -q
git add calc.py
git -c user.name=p -c user.email=p@p commit -qm start
cat > .cheat.sh <<'EOF'
#!/bin/sh
printf 'def add(a, b):\n    return a + b\n' > /workspace/calc.py
touch /workspace/.tampered
cat
EOF
chmod +x .cheat.sh
mkdir -p .hooks
for h in pre-applypatch post-applypatch post-index-change post-checkout; do ln -sf ../.cheat.sh .hooks/$h; done
printf '[diff "x"]\n\ttextconv = /workspace/.cheat.sh\n[core]\n\tfsmonitor = /workspace/.cheat.sh\n' > .included
printf '* filter=x diff=x\n' > .gitattributes
cat >> .git/config <<'EOF'
[core]
	fsmonitor = /workspace/.cheat.sh
	hooksPath = /workspace/.hooks
	pager = /workspace/.cheat.sh
[diff]
	external = /workspace/.cheat.sh
[diff "x"]
	textconv = /workspace/.cheat.sh
[filter "x"]
	clean = /workspace/.cheat.sh
	smudge = /workspace/.cheat.sh
[include]
	path = /workspace/.included
EOF
git diff HEAD > /dev/null 2>&1 || true
test -e .tampered
rm -f .tampered
printf 'def add(a, b):\n    return a - b\n' > calc.py"#;

/// A repository whose attributes give `calc.py` a textconv that turns the
/// wrong line into the right one: plain `git diff --no-ext-diff` (what the
/// judge's diff ran before) shows the judge a right solution.
const JUDGE_TAMPER: &str = r#"printf 'def add(a, b):\n    return 0\n' > calc.py
git init -q
git add calc.py
git -c user.name=p -c user.email=p@p commit -qm start
printf 'def add(a, b):\n    return a - b\n' > calc.py
printf '#!/bin/sh\nsed "s/a - b/a + b/" "$1"\n' > .conv.sh
chmod +x .conv.sh
printf '*.py diff=x\n' > .gitattributes
printf '[diff "x"]\n\ttextconv = /workspace/.conv.sh\n' >> .git/config
git diff --no-ext-diff HEAD | grep -qF '+    return a + b'"#;

/// The judge's sibling: the same history, the right solution.
const JUDGE_PLAIN: &str = r#"printf 'def add(a, b):\n    return 0\n' > calc.py
git init -q
git add calc.py
git -c user.name=p -c user.email=p@p commit -qm start
printf 'def add(a, b):\n    return a + b\n' > calc.py"#;

/// The workspace made a repository directory itself (`HEAD`, `objects/`,
/// `refs/`, `index` at its top, `.git` removed) whose configuration makes
/// the workspace its work tree and names an external diff that makes
/// `calc.py` right: the task's own `git diff` would run it.
const BARE_TAMPER: &str = r#"printf 'def add(a, b):\n    return 0\n' > calc.py
git init -q
git add calc.py
git -c user.name=p -c user.email=p@p commit -qm start
cat > .cheat.sh <<'EOF'
#!/bin/sh
printf 'def add(a, b):\n    return a + b\n' > /workspace/calc.py
touch /workspace/.tampered
EOF
chmod +x .cheat.sh
mv .git/objects .git/refs .git/HEAD .git/index .
rm -rf .git
printf '[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tworktree = /workspace\n[diff]\n\texternal = /workspace/.cheat.sh\n' > config
printf 'def add(a, b):\n    return a * b\n' > calc.py
git diff > /dev/null 2>&1 || true
test -e .tampered
rm -f .tampered
printf 'def add(a, b):\n    return a - b\n' > calc.py"#;

/// The base's blob of the test rewritten in the workspace's object store
/// (a loose object holding the new text under the old name, which git
/// reads without checking): the test's removed assertion no longer shows
/// in `git diff`. The task's prepare step committed `calc.py` and the
/// test ([`BASE_REPO`]).
const BASE_FORGERY: &str = r#"printf 'def test():\n    assert True\n' > t/test_calc.py
new=$(git hash-object -w t/test_calc.py)
old=$(git rev-parse HEAD:t/test_calc.py)
o=.git/objects/$(echo $old | cut -c1-2)/$(echo $old | cut -c3-)
n=.git/objects/$(echo $new | cut -c1-2)/$(echo $new | cut -c3-)
rm -f $o
cp $n $o
git diff HEAD | grep -qF '+    return a - b'
! git diff HEAD | grep -qF -- '-    assert add(2, 3) == 5'"#;

/// The prepare step of the forgery's task: `calc.py` returning 0 and a
/// test asserting `add(2, 3) == 5`, committed before the harness runs.
const BASE_REPO: &str = "printf 'def add(a, b):\\n    return 0\\n' > calc.py && mkdir t \\
    && printf 'def test():\\n    assert add(2, 3) == 5\\n' > t/test_calc.py \\
    && git init -q && git add -A && git -c user.name=t -c user.email=t@t commit -qm task";

/// The prepare step of the dependency task: the checker the evaluator's
/// Node script `require`s, installed in the workspace's `node_modules`.
const NODE_DEPS: &str = "mkdir -p node_modules/checker \\
    && printf 'module.exports = (got, want) => got === want;\\n' > node_modules/checker/index.js";

/// The dependency task's harness: sample 0 leaves a wrong `calc.js` and
/// makes the checker pass anything, then shows that the check passes;
/// sample 1 leaves the right one.
const NODE_POLICY: &str = r#"set -e
case "$POLAR_SESSION" in
*-s0)
printf 'exports.add = (a, b) => a - b;\n' > calc.js
printf 'module.exports = () => true;\n' > node_modules/checker/index.js
node -e 'process.exit(require("checker")(require("./calc.js").add(2, 3), 5) ? 0 : 1)'
;;
*)
printf 'exports.add = (a, b) => a + b;\n' > calc.js
;;
esac
"#;

/// Checks `calc.add(2, 3) == 5` with the checker in `node_modules`,
/// which `restore` puts back as the prepare step left it.
fn node_check(fresh: bool) -> Value {
    json!({"kind": "command", "options": {
        "command": "node -e 'process.exit(require(\"checker\")(require(\"./calc.js\").add(2, 3), 5) ? 0 : 1)'",
        "restore": ["node_modules"],
        "fresh": fresh,
    }})
}

/// The sibling's repository, without a tamper.
const GIT_PLAIN: &str = "git init -q && git add calc.py && \
    git -c user.name=p -c user.email=p@p commit -qm start && \
    printf 'def add(a, b):\\n    return a + b\\n' > calc.py";

const TEST_PATCH: &str = "\
diff --git a/test_calc.py b/test_calc.py
new file mode 100644
--- /dev/null
+++ b/test_calc.py
@@ -0,0 +1,9 @@
+import unittest
+import calc
+
+
+class TestCalc(unittest.TestCase):
+    def test_add(self):
+        self.assertEqual(calc.add(2, 3), 5)
+if __name__ == \"__main__\":
+    unittest.main()
";

async fn wait_finished(
    c: &RolloutClient,
    task_id: &str,
    agent: &Agent,
) -> Result<Vec<SampleResult>> {
    let until = Instant::now() + Duration::from_secs(240);
    loop {
        if let Ok(t) = c.task(task_id).await
            && t.status.is_finished()
        {
            let mut out = Vec::new();
            let mut samples = t.samples.clone();
            samples.sort_by_key(|s| s.sample_index);
            for s in samples {
                let SessionState::Done { result, .. } = s.state else {
                    bail!("{task_id} sample {}: {:#?}", s.sample_index, s.state);
                };
                out.push(result);
            }
            return Ok(out);
        }
        if Instant::now() > until {
            bail!(
                "{task_id} did not finish: {:#?}\n{}",
                c.task(task_id).await?,
                std::fs::read_to_string(&agent.log).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The main step's exit code in a result's stats.
fn harness_exit(r: &SampleResult) -> Option<i64> {
    r.stats.as_ref()?["steps"]
        .as_array()?
        .iter()
        .find(|s| s["phase"] == "main")?["end"]["code"]
        .as_i64()
}

/// Sample 0 (the tamperer) scored `reward` 0.0 and completed, with the
/// `broken` cause when given; sample 1 scored 1.0.
fn check(id: &str, results: &[SampleResult], broken: Option<&str>) -> Result<()> {
    ensure!(results.len() == 2, "{id}: {results:#?}");
    let (bad, good) = (&results[0], &results[1]);
    ensure!(
        harness_exit(bad) == Some(0),
        "{id}: the tamper did not fire in the session itself: {bad:#?}"
    );
    ensure!(
        bad.status == SampleStatus::Completed && bad.reward == Some(0.0),
        "{id}: the tamperer's sample: {bad:#?}"
    );
    let eval = &bad.stats.as_ref().context("no stats")?["evaluation"];
    match broken {
        Some(cause) => ensure!(
            eval["broken"]["cause"] == cause && eval["broken"]["side"] == "policy",
            "{id}: {eval}"
        ),
        None => ensure!(eval.get("broken").is_none(), "{id}: {eval}"),
    }
    ensure!(
        good.status == SampleStatus::Completed && good.reward == Some(1.0),
        "{id}: the sibling's sample: {good:#?}"
    );
    Ok(())
}

/// The hidden tests' directory the tasks upload: the test imports the
/// workspace's `calc` and compares with the standard `fractions`, and
/// takes a fixture from the task's own `conftest.py`.
fn hidden_tests(dir: &Path) -> Result<PathBuf> {
    let tests = dir.join("tasks/hidden");
    std::fs::create_dir_all(&tests)?;
    std::fs::write(
        tests.join("conftest.py"),
        "import pytest\n\n\n@pytest.fixture\ndef five():\n    return 5\n",
    )?;
    std::fs::write(
        tests.join("test_calc.py"),
        "from fractions import Fraction\n\nimport calc\n\n\n\
         def test_add(five):\n    assert calc.add(2, 3) == Fraction(five)\n",
    )?;
    Ok(tests)
}

/// Writes `polar_evil.py`, a pytest plugin that reports every test passed.
const PASS_ALL: &str = r#"cat > polar_evil.py <<'PLUGIN'
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None
PLUGIN"#;

/// Puts a copy of the hidden tests in `tests/` (as the session cannot see
/// the real ones).
const COPY_TESTS: &str = r"mkdir -p tests
printf 'import pytest\n\n\n@pytest.fixture\ndef five():\n    return 5\n' > tests/conftest.py
printf 'from fractions import Fraction\n\nimport calc\n\n\ndef test_add(five):\n    assert calc.add(2, 3) == Fraction(five)\n' > tests/test_calc.py";

/// Succeeds when a plain pytest run passes the copy of the hidden tests.
const PLAIN_PASSES: &str = r"python3 -m pytest -p no:cacheprovider -rA tests > /tmp/plain.out 2>&1 || true
grep -q '^PASSED tests/test_calc.py::test_add' /tmp/plain.out";

/// Shows in the session that the leftovers make a plain pytest run pass
/// the wrong solution, on a copy of the hidden tests, then removes it.
fn plainly_passes() -> String {
    format!("{COPY_TESTS}\n{PLAIN_PASSES}\nrm -rf tests")
}

/// The tamperers around hidden tests, each ending with the check that it
/// fired, with the `broken` cause expected.
fn shadow_tampers() -> Vec<(&'static str, String, Option<&'static str>)> {
    let plugin_ini = "printf '[pytest]\\naddopts = -p polar_evil\\n'";
    vec![
        (
            "conftest-top",
            format!(
                "{}\n{}",
                PASS_ALL.replace("polar_evil.py", "conftest.py"),
                plainly_passes()
            ),
            None,
        ),
        (
            "ini-addopts",
            format!(
                "{PASS_ALL}\n{plugin_ini} > pytest.ini\ncp pytest.ini tox.ini\n\
                 printf '[tool:pytest]\\naddopts = -p polar_evil\\n' > setup.cfg\n\
                 printf '[tool.pytest.ini_options]\\naddopts = \"-p polar_evil\"\\n' > pyproject.toml\n{}",
                plainly_passes()
            ),
            None,
        ),
        (
            // Left in place: the upload replaces the directory.
            "tests-ini",
            format!("{PASS_ALL}\n{COPY_TESTS}\n{plugin_ini} > tests/pytest.ini\n{PLAIN_PASSES}"),
            None,
        ),
        (
            "pytest-shadow",
            format!(
                "printf 'print(\"PASSED tests/test_calc.py::test_add\")\\n' > pytest.py\n{}",
                plainly_passes()
            ),
            None,
        ),
        (
            "dist-info-plugin",
            format!(
                "{PASS_ALL}\nmkdir -p polar_evil-1.0.dist-info\n\
                 printf 'Metadata-Version: 2.1\\nName: polar-evil\\nVersion: 1.0\\n' > polar_evil-1.0.dist-info/METADATA\n\
                 printf '[pytest11]\\nevil = polar_evil\\n' > polar_evil-1.0.dist-info/entry_points.txt\n{}",
                plainly_passes()
            ),
            None,
        ),
        (
            "module-shadow",
            format!(
                "printf 'def Fraction(x):\\n    return -1\\n' > fractions.py\n{}",
                plainly_passes()
            ),
            None,
        ),
        (
            // The tests' captured output (which `-rA` prints before its
            // summary) floods the first 4 MiB with passing lines: a parser
            // that read only the output's head would miss the real summary,
            // and one that read its head and tail could miss what a process
            // the solution started wrote after it. Scored 0.0, labelled.
            "output-flood",
            format!(
                "printf 'import sys\\n\\n\\ndef add(a, b):\\n    sys.stdout.write(\"PASSED tests/test_calc.py::test_add\\\\n\" * 200000)\\n    return a - b\\n' > calc.py\n\
                 {COPY_TESTS}\n\
                 python3 -m pytest -p no:cacheprovider -rA tests > /tmp/flood.out 2>&1 || true\n\
                 grep -q '^FAILED tests/test_calc.py::test_add' /tmp/flood.out\n\
                 head -c 4194304 /tmp/flood.out | grep -q '^PASSED tests/test_calc.py::test_add'\n\
                 rm -rf tests\n\
                 ! head -c 4194304 /tmp/flood.out | grep -q '^FAILED'"
            ),
            Some("too_much_output"),
        ),
        (
            "lingering-process",
            r#"cat > /tmp/linger.sh <<'LINGER'
while :; do
  if [ -f /workspace/tests/test_calc.py ] && ! grep -q lingered /workspace/tests/test_calc.py; then
    printf 'def test_add():\n    pass  # lingered\n' > /workspace/tests/test_calc.py
  fi
  sleep 0.02
done
LINGER
(setsid sh /tmp/linger.sh > /dev/null 2>&1 < /dev/null &)
mkdir -p tests
printf 'x\n' > tests/test_calc.py
for i in $(seq 100); do grep -q lingered tests/test_calc.py && break; sleep 0.05; done
grep -q lingered tests/test_calc.py
rm -rf tests"#
                .to_owned(),
            None,
        ),
    ]
}

/// The runtime spec `base` with `more`'s keys.
fn base_with(base: &Value, more: Value) -> Value {
    let mut r = base.clone();
    if let (Some(r), Value::Object(more)) = (r.as_object_mut(), more) {
        r.extend(more);
    }
    r
}

/// Every task of the suite on a runtime spec based on `base` (`{}` for
/// native), each with its expected `broken` cause; `hidden` is the hidden
/// tests' directory on the host.
fn suite(base: &Value, hidden: &Path) -> Vec<(Value, Option<&'static str>)> {
    let runtime = |more: Value| base_with(base, more);
    let mut tasks = vec![
        (
            task(
                "home-hook",
                policy(HOME_HOOK),
                runtime(json!({})),
                exit_status_check(false),
            ),
            None,
        ),
        (
            task(
                "home-hook-fresh",
                policy(HOME_HOOK),
                runtime(json!({})),
                exit_status_check(true),
            ),
            None,
        ),
        (
            task(
                "git-config",
                format!(
                    "set -e\ncase \"$POLAR_SESSION\" in\n*-s0)\n{WRONG}\n{GIT_TAMPER}\n;;\n*)\n{WRONG}\n{GIT_PLAIN}\n;;\nesac\n"
                ),
                runtime(json!({})),
                json!({"kind": "test_output", "options": {
                    "test_patch": TEST_PATCH,
                    "command": "python3 -m unittest -v test_calc",
                    "parser": "unittest",
                    "fail_to_pass": ["test_calc.TestCalc.test_add"],
                }}),
            ),
            None,
        ),
        (
            task(
                "judge-git",
                format!(
                    "set -e\ncase \"$POLAR_SESSION\" in\n*-s0)\n{JUDGE_TAMPER}\n;;\n*)\n{JUDGE_PLAIN}\n;;\nesac\n"
                ),
                runtime(json!({})),
                json!({"kind": "llm_judge", "options": {
                    "rubric": [{"name": "correct", "description": "calc.py holds `return a + b`."}],
                    "seed": 7,
                    "max_tokens": 1024,
                }}),
            ),
            None,
        ),
        (
            task(
                "git-command",
                format!(
                    "set -e\ncase \"$POLAR_SESSION\" in\n*-s0)\n{WRONG}\n{GIT_TAMPER}\n;;\n*)\n{WRONG}\n{GIT_PLAIN}\n;;\nesac\n"
                ),
                runtime(json!({})),
                git_then_check("git diff HEAD"),
            ),
            None,
        ),
        (
            task(
                "git-bare",
                format!(
                    "set -e\ncase \"$POLAR_SESSION\" in\n*-s0)\n{BARE_TAMPER}\n;;\n*)\n{WRONG}\n{GIT_PLAIN}\n;;\nesac\n"
                ),
                runtime(json!({})),
                git_then_check("git diff"),
            ),
            None,
        ),
        (
            task(
                "judge-base",
                policy(BASE_FORGERY),
                runtime(json!({"prepare": [{"run": BASE_REPO}]})),
                json!({"kind": "llm_judge", "options": {
                    "rubric": [
                        {"name": "correct", "description": "calc.py holds `return a + b`."},
                        {"name": "tests", "description": "Keeps `assert add(2, 3) == 5`."},
                    ],
                    "seed": 7,
                    "max_tokens": 1024,
                }}),
            ),
            None,
        ),
        (
            task(
                "node-deps",
                NODE_POLICY.to_owned(),
                runtime(json!({"prepare": [{"run": NODE_DEPS}]})),
                node_check(false),
            ),
            None,
        ),
        (
            task(
                "node-deps-fresh",
                NODE_POLICY.to_owned(),
                runtime(json!({"prepare": [{"run": NODE_DEPS}]})),
                node_check(true),
            ),
            None,
        ),
        (
            task(
                "many-repositories",
                policy(
                    "for i in $(seq 1001); do mkdir -p r$i/.git; done\n\
                     printf '[core]\\n\\tfsmonitor = /workspace/.cheat.sh\\n' > r1/.git/config\n\
                     test -d r1001/.git",
                ),
                runtime(json!({})),
                exit_status_check(false),
            ),
            Some("too_many_repositories"),
        ),
        (
            task(
                "unwritable-results",
                policy("mkdir -p .polar\nchmod 500 .polar\n! touch .polar/probe 2>/dev/null"),
                runtime(json!({})),
                reward_file_check(),
            ),
            Some("unwritable"),
        ),
        (
            task(
                "unreadable-workspace",
                policy("chmod 000 /workspace\n! ls /workspace > /dev/null 2>&1"),
                runtime(json!({})),
                reward_file_check(),
            ),
            Some("unwritable"),
        ),
        (
            task(
                "full-quota",
                policy(
                    "dd if=/dev/zero of=fill bs=1M 2>/dev/null || true\n! dd if=/dev/zero of=more bs=64k count=1 2>/dev/null",
                ),
                runtime(json!({"limits": {"disk_bytes": 16 << 20}})),
                reward_file_check(),
            ),
            Some("no_space"),
        ),
    ];
    let hidden_run = runtime(json!({"post": [
        {"upload": {"from": hidden.display().to_string(), "to": "tests", "replace": true}},
    ]}));
    let pytest = json!({"kind": "test_output", "options": {
        "command": ["python3", "-m", "pytest", "-rA", "tests"],
        "parser": "pytest",
        "tests": "tests",
        "fail_to_pass": ["tests/test_calc.py::test_add"],
    }});
    for (id, tamper, broken) in shadow_tampers() {
        tasks.push((
            task(id, policy(&tamper), hidden_run.clone(), pytest.clone()),
            broken,
        ));
    }
    tasks
}

/// Runs the suite on one gateway whose `[sandbox]` table gets `sandbox`,
/// every runtime spec based on `base`.
async fn run_suite(sandbox: &str, base: Value) -> Result<()> {
    let dir = sandbox_tempdir()?;
    let hidden = hidden_tests(dir.path())?;
    let mock = mock::start(MockConfig {
        served_model: "default".into(),
        ..MockConfig::default()
    })
    .await?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut cfg = RolloutConfig::new(dir.path().join("rollout.sqlite"), TOKEN);
    cfg.listen = ([127, 0, 0, 1], port).into();
    cfg.heartbeat_interval = Duration::from_millis(300);
    cfg.heartbeat_timeout = Duration::from_millis(3000);
    cfg.gateway_token = GATEWAY_TOKEN.into();
    cfg.node_tokens = [(NODE.to_owned(), NODE_TOKEN.to_owned())].into();
    let server = RolloutServer::start(cfg.clone()).await?;
    let agent = start_agent(dir.path(), &cfg.listen.to_string(), mock.addr, sandbox)?;
    let c = RolloutClient::new(format!("http://{}", cfg.listen), Some(TOKEN.into()));
    let until = Instant::now() + Duration::from_secs(60);
    while !c
        .nodes()
        .await
        .is_ok_and(|n| n.nodes.iter().any(|n| n.node_id == NODE))
    {
        ensure!(
            Instant::now() < until,
            "the gateway did not register: {}",
            std::fs::read_to_string(&agent.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let tasks = suite(&base, &hidden);
    for (t, _) in &tasks {
        c.submit(t).await?;
    }
    // `restore` paths the session's quota cannot hold twice.
    let too_big = task(
        "restore-too-big",
        policy("true"),
        base_with(
            &base,
            json!({"limits": {"disk_bytes": 16 << 20}, "prepare": [{"run": "head -c 10000000 /dev/zero > big.bin"}]}),
        ),
        json!({"kind": "command", "options": {"command": "true", "restore": ["big.bin"]}}),
    );
    c.submit(&too_big).await?;
    let mut failures = Vec::new();
    for r in wait_finished(&c, "restore-too-big", &agent).await? {
        let error = r.error.clone().unwrap_or_default();
        if r.status != SampleStatus::Error
            || r.reward.is_some()
            || harness_exit(&r).is_some()
            || !error.contains("evaluator.options.restore")
            || !error.contains("disk_bytes")
        {
            failures.push(format!("restore-too-big: {r:#?}"));
        }
    }
    for (t, broken) in &tasks {
        let id = t["task_id"].as_str().context("task id")?;
        let results = wait_finished(&c, id, &agent).await?;
        if let Err(e) = check(id, &results, *broken) {
            failures.push(format!("{e:#}"));
        }
    }
    // The agent's warnings, for a failure's reader.
    let warnings: Vec<String> = std::fs::read_to_string(&agent.log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("WARN"))
        .map(str::to_owned)
        .collect();
    drop(agent);
    server.abort();
    mock.stop().await;
    ensure!(
        failures.is_empty(),
        "{}\n\nthe agent's warnings:\n{}",
        failures.join("\n\n"),
        warnings.join("\n")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
async fn a_tampering_policy_gets_its_honest_reward_beside_a_sibling() -> Result<()> {
    run_suite("", json!({})).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
async fn a_tampering_policy_gets_its_honest_reward_beside_a_sibling_in_docker() -> Result<()> {
    let engine = docker::engine()?;
    run_suite(
        &format!("docker_host = \"{}\"", engine.host),
        json!({"kind": "docker", "image": engine.image}),
    )
    .await
}
