//! The evaluators' `git` against a hostile repository: a workspace whose
//! `.git/config` (and a file it includes, and the attributes) names a
//! program for every way git runs one (pager, fsmonitor, hooks, external
//! diff, textconv, clean/smudge/process filters, ssh, editor, askpass,
//! gpg). Plain `git` in that workspace runs some of them (the control: the
//! hostile configuration works); the judge's diff script and the
//! `test_output` patch step run none, and still see and apply the change.
//! Also: what the sandbox left in the way of the reward file, scored as
//! the policy's failure, and a runner's error keeping its side.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

use super::super::isolation;
use super::super::judge::DEFAULT_DIFF_SCRIPT;
use super::super::{Broken, CommandRunner, Evaluator, RunError, RunFuture};
use super::{HostRunner, evaluator, facts, run};

/// Every way the configuration tries to run a program, each its own.
const WAYS: [&str; 14] = [
    "pager",
    "fsmonitor",
    "fsmonitor_included",
    "hook",
    "external",
    "textconv",
    "textconv_included",
    "clean",
    "smudge",
    "process",
    "ssh",
    "editor",
    "askpass",
    "gpg",
];

struct Hostile {
    ws: tempfile::TempDir,
    /// Outside the workspace: the programs and the markers they leave.
    aside: tempfile::TempDir,
}

impl Hostile {
    fn marks(&self) -> PathBuf {
        self.aside.path().join("marks")
    }

    /// The ways that ran since the marks were last cleared.
    fn ran(&self) -> Vec<String> {
        let mut ran: Vec<String> = std::fs::read_dir(self.marks())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        ran.sort();
        ran
    }

    fn clear(&self) {
        std::fs::remove_dir_all(self.marks()).unwrap();
        std::fs::create_dir(self.marks()).unwrap();
    }
}

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
}

/// A repository with `calc.py` committed, then changed, an untracked
/// `notes.txt`, and the hostile configuration written last.
fn hostile() -> Hostile {
    let ws = tempfile::tempdir().unwrap();
    let aside = tempfile::tempdir().unwrap();
    std::fs::create_dir(aside.path().join("marks")).unwrap();
    let tool = |way: &str| {
        let path = aside.path().join(format!("tool-{way}"));
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\ntouch '{}/{way}'\ncat \"$@\" 2>/dev/null\nexit 0\n",
                aside.path().join("marks").display()
            ),
        )
        .unwrap();
        Command::new("chmod")
            .arg("755")
            .arg(&path)
            .status()
            .unwrap();
        path.display().to_string()
    };
    std::fs::write(
        ws.path().join("calc.py"),
        "def add(a, b):\n    return a - b\n",
    )
    .unwrap();
    git(ws.path(), &["init", "-q"]);
    git(ws.path(), &["add", "calc.py"]);
    git(
        ws.path(),
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-qm",
            "start",
        ],
    );
    std::fs::write(
        ws.path().join("calc.py"),
        "def add(a, b):\n    return a + b\n",
    )
    .unwrap();
    std::fs::write(ws.path().join("notes.txt"), "a note\n").unwrap();
    std::fs::write(
        ws.path().join(".gitattributes"),
        "*.py filter=x diff=x\n*.txt filter=y diff=x\n",
    )
    .unwrap();
    let hooks = aside.path().join("hooks");
    std::fs::create_dir(&hooks).unwrap();
    for hook in ["pre-applypatch", "post-applypatch", "post-index-change"] {
        std::os::unix::fs::symlink(tool("hook"), hooks.join(hook)).unwrap();
    }
    let included = aside.path().join("included.cfg");
    std::fs::write(
        &included,
        format!(
            "[core]\n\tfsmonitor = {}\n[diff \"x\"]\n\ttextconv = {}\n",
            tool("fsmonitor_included"),
            tool("textconv_included"),
        ),
    )
    .unwrap();
    let config = format!(
        "[core]\n\trepositoryformatversion = 0\n\tbare = false\n\
         \tpager = {pager}\n\tfsmonitor = {fsmonitor}\n\thooksPath = {hooks}\n\
         \tsshCommand = {ssh}\n\teditor = {editor}\n\taskPass = {askpass}\n\
         [diff]\n\texternal = {external}\n\
         [diff \"x\"]\n\ttextconv = {textconv}\n\
         [filter \"x\"]\n\tclean = {clean}\n\tsmudge = {smudge}\n\trequired = true\n\
         [filter \"y\"]\n\tprocess = {process}\n\
         [gpg]\n\tprogram = {gpg}\n\
         [include]\n\tpath = {included}\n",
        pager = tool("pager"),
        fsmonitor = tool("fsmonitor"),
        hooks = hooks.display(),
        ssh = tool("ssh"),
        editor = tool("editor"),
        askpass = tool("askpass"),
        external = tool("external"),
        textconv = tool("textconv"),
        clean = tool("clean"),
        smudge = tool("smudge"),
        process = tool("process"),
        gpg = tool("gpg"),
        included = included.display(),
    );
    std::fs::write(ws.path().join(".git/config"), config).unwrap();
    Hostile { ws, aside }
}

/// A host runner that adds the evaluator's variables, HOME and tmp, as
/// the gateway's runner does.
struct IsolatedRunner {
    host: HostRunner,
    home: tempfile::TempDir,
    tmp: tempfile::TempDir,
    python: tempfile::TempDir,
}

impl IsolatedRunner {
    fn new(cwd: &Path) -> Self {
        let python = tempfile::tempdir().unwrap();
        std::fs::write(
            python.path().join(isolation::SITECUSTOMIZE_NAME),
            isolation::SITECUSTOMIZE,
        )
        .unwrap();
        Self {
            host: HostRunner::new(cwd),
            home: tempfile::tempdir().unwrap(),
            tmp: tempfile::tempdir().unwrap(),
            python,
        }
    }
}

impl CommandRunner for IsolatedRunner {
    fn run<'a>(
        &'a self,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        timeout: std::time::Duration,
    ) -> RunFuture<'a> {
        let tmp = self.tmp.path().display().to_string();
        let mut all = isolation::env(&tmp, &self.python.path().display().to_string());
        all.push(("HOME".into(), self.home.path().display().to_string()));
        all.push(("TMPDIR".into(), tmp));
        all.extend(env);
        self.host.run(argv, all, timeout)
    }
}

#[test]
fn plain_git_runs_what_the_hostile_configuration_names() {
    // The control: without the evaluators' isolation the configuration
    // does run programs, so the tests below can fail.
    let h = hostile();
    let out = Command::new("git")
        .args(["diff", "HEAD"])
        .current_dir(h.ws.path())
        .output()
        .unwrap();
    let ran = h.ran();
    for way in ["clean", "external", "fsmonitor_included", "smudge"] {
        assert!(
            ran.contains(&way.to_owned()),
            "{way} did not run: {ran:?} {out:?}"
        );
    }
}

#[tokio::test]
async fn the_judges_diff_runs_nothing_the_workspace_configured() {
    let h = hostile();
    let runner = IsolatedRunner::new(h.ws.path());
    let out = runner
        .run(
            vec!["sh".into(), "-c".into(), DEFAULT_DIFF_SCRIPT.into()],
            Vec::new(),
            std::time::Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert_eq!(h.ran(), Vec::<String>::new(), "{out:?}");
    assert_eq!(out.exit, Some(0), "{out:?}");
    assert!(
        out.stdout.contains("-    return a - b") && out.stdout.contains("+    return a + b"),
        "{out:?}"
    );
    assert!(out.stdout.contains("+a note"), "{out:?}");
    // Every way is named once in the configuration the test wrote.
    let config = std::fs::read_to_string(h.ws.path().join(".git/config")).unwrap();
    for way in WAYS {
        assert!(
            config.contains(&format!("tool-{way}"))
                || std::fs::read_to_string(h.aside.path().join("included.cfg"))
                    .unwrap()
                    .contains(&format!("tool-{way}"))
                || way == "hook",
            "{way}"
        );
    }
}

#[tokio::test]
async fn the_test_patch_is_applied_without_running_what_the_workspace_configured() {
    let h = hostile();
    let patch = "\
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
    let e = evaluator(
        "test_output",
        json!({
            "test_patch": patch,
            "command": "python3 -m unittest -v test_calc",
            "parser": "unittest",
            "fail_to_pass": ["test_calc.TestCalc.test_add"],
        }),
    );
    let runner = IsolatedRunner::new(h.ws.path());
    let out = e.evaluate(&facts(h.ws.path()), &runner).await;
    assert_eq!(h.ran(), Vec::<String>::new(), "{out:#?}");
    assert_eq!(out.reward, Some(1.0), "{out:#?}");
    assert_eq!(out.detail["patch"]["tool"], "git apply");
    // The same patch with plain `git apply` runs the workspace's filters.
    h.clear();
    std::fs::remove_file(h.ws.path().join("test_calc.py")).unwrap();
    std::fs::write(h.aside.path().join("p.diff"), patch).unwrap();
    let _ = Command::new("git")
        .arg("apply")
        .arg(h.aside.path().join("p.diff"))
        .current_dir(h.ws.path())
        .output()
        .unwrap();
    let _ = Command::new("git")
        .args(["status", "--short"])
        .current_dir(h.ws.path())
        .output()
        .unwrap();
    assert!(!h.ran().is_empty(), "the control ran nothing");
}

#[test]
fn the_evaluators_variables_isolate_python_and_git() {
    let env = isolation::env("/tmp/e/", "/polar/py");
    let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    assert_eq!(get("PYTHONNOUSERSITE"), Some("1"));
    assert_eq!(get("PYTHONSAFEPATH"), Some("1"));
    assert_eq!(get("PYTHONPATH"), Some("/polar/py"));
    assert_eq!(get("PYTHONPYCACHEPREFIX"), Some("/tmp/e/.pycache"));
    assert_eq!(get("GIT_CONFIG_NOSYSTEM"), Some("1"));
    assert_eq!(get("GIT_CONFIG_GLOBAL"), Some("/dev/null"));
    assert_eq!(get("GIT_CONFIG_COUNT"), Some("4"));
    assert_eq!(get("GIT_CONFIG_VALUE_0"), Some("/dev/null"));
    assert_eq!(get("GIT_CONFIG_KEY_3"), Some("safe.bareRepository"));
    assert_eq!(get("GIT_CONFIG_VALUE_3"), Some("explicit"));
    for name in ["PYTHONSTARTUP", "NODE_OPTIONS", "LD_PRELOAD", "BASH_ENV"] {
        assert_eq!(get(name), None, "{name}");
    }
}

#[tokio::test]
async fn python_in_an_evaluation_ignores_a_planted_pycache_and_user_site() {
    // Bytecode the policy planted for a module of the workspace, claiming
    // the source's size and mtime: plain Python runs it (the control), the
    // evaluation's Python reads the source; and no user site.
    let ws = tempfile::tempdir().unwrap();
    let plant = "import os, py_compile\n\
                 open('m.py', 'w').write(\"VALUE = 'planted'\\n\")\n\
                 st = os.stat('m.py')\n\
                 py_compile.compile('m.py')\n\
                 open('m.py', 'w').write(\"VALUE = 'sourced'\\n\")\n\
                 os.utime('m.py', ns=(st.st_atime_ns, st.st_mtime_ns))\n";
    let status = Command::new("python3")
        .args(["-c", plant])
        .current_dir(ws.path())
        .status()
        .unwrap();
    assert!(status.success());
    let show = "import site, m; print(m.VALUE, site.ENABLE_USER_SITE)";
    let plain = Command::new("python3")
        .args(["-c", show])
        .current_dir(ws.path())
        .env_remove("PYTHONPYCACHEPREFIX")
        .env_remove("PYTHONNOUSERSITE")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout).trim(),
        "planted True",
        "{plain:?}"
    );
    let runner = IsolatedRunner::new(ws.path());
    let out = runner
        .run(
            vec!["python3".into(), "-c".into(), show.into()],
            Vec::new(),
            std::time::Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert_eq!(out.stdout.trim(), "sourced False", "{out:?}");
}

#[tokio::test]
async fn leftovers_in_the_way_of_the_reward_file_are_the_policys_failure() {
    // A file where the reward file's directory goes, a directory where
    // the reward file goes: scored 0.0, labelled, usable.
    for (plant, cause) in [
        ("printf x > .polar", "not_a_directory"),
        ("mkdir -p .polar/reward/x", "not_a_directory"),
    ] {
        let ws = tempfile::tempdir().unwrap();
        let status = Command::new("sh")
            .args(["-c", plant])
            .current_dir(ws.path())
            .status()
            .unwrap();
        assert!(status.success());
        let e = evaluator(
            "command",
            json!({"command": "echo 1 > \"$POLAR_REWARD_FILE\"", "reward": "file"}),
        );
        let out = run(&e, ws.path()).await;
        assert_eq!(
            (out.reward, out.usable),
            (Some(0.0), true),
            "{plant}: {out:#?}"
        );
        assert_eq!(
            (
                &out.detail["broken"]["cause"],
                &out.detail["broken"]["side"]
            ),
            (&json!(cause), &json!("policy")),
            "{plant}"
        );
        assert!(
            out.error
                .as_deref()
                .unwrap_or_default()
                .contains("scored 0.0"),
            "{out:#?}"
        );
    }
}

/// A runner whose every command fails with `cause`.
struct FailingRunner(Broken);

impl CommandRunner for FailingRunner {
    fn run<'a>(
        &'a self,
        _: Vec<String>,
        _: Vec<(String, String)>,
        _: std::time::Duration,
    ) -> RunFuture<'a> {
        let cause = self.0;
        Box::pin(async move {
            Err(RunError {
                message: format!("create logs/eval-0.out: ({})", cause.as_str()),
                cause,
            })
        })
    }
}

#[tokio::test]
async fn a_runners_error_keeps_its_side_in_every_evaluator() {
    let ws = tempfile::tempdir().unwrap();
    assert_ne!(
        nix::sys::statfs::statfs(ws.path())
            .unwrap()
            .filesystem_type(),
        nix::sys::statfs::TMPFS_MAGIC,
        "the test's temporary directory must not be a tmpfs (TMPDIR)"
    );
    for (kind, options) in [
        ("command", json!({"command": "true"})),
        ("command", json!({"command": "true", "reward": "file"})),
        (
            "test_output",
            json!({"command": "true", "parser": "pytest"}),
        ),
    ] {
        let e = evaluator(kind, options.clone());
        let left = e
            .evaluate(&facts(ws.path()), &FailingRunner(Broken::Unwritable))
            .await;
        assert_eq!(
            (left.reward, left.usable),
            (Some(0.0), true),
            "{options}: {left:#?}"
        );
        assert_eq!(left.detail["broken"]["side"], "policy", "{options}");
        // No space where the workspace has no quota of its own (a tmpfs):
        // the node's disk is full, not the session's.
        let disk = e
            .evaluate(&facts(ws.path()), &FailingRunner(Broken::NoSpace))
            .await;
        assert_eq!((disk.reward, disk.usable), (None, false), "{options}");
        assert_eq!(disk.detail["broken"]["cause"], "node_io", "{options}");
        let node = e
            .evaluate(&facts(ws.path()), &FailingRunner(Broken::Runner))
            .await;
        assert_eq!(
            (node.reward, node.usable),
            (None, false),
            "{options}: {node:#?}"
        );
        assert_eq!(node.detail["broken"]["side"], "node", "{options}");
    }
}

#[tokio::test]
async fn start_up_hooks_beside_the_tests_do_not_run() {
    // `sitecustomize.py` and `usercustomize.py` in the workspace (the
    // working directory of every evaluator command) are not on Python's
    // path when `site` imports them, for `-c`, `-m` and a script alike.
    let ws = tempfile::tempdir().unwrap();
    for hook in ["sitecustomize.py", "usercustomize.py"] {
        std::fs::write(ws.path().join(hook), "print('HOOKED')\n").unwrap();
    }
    std::fs::write(
        ws.path().join("test_t.py"),
        "import unittest\n\nclass T(unittest.TestCase):\n    def test_x(self):\n        pass\n",
    )
    .unwrap();
    let runner = IsolatedRunner::new(ws.path());
    for argv in [
        vec!["python3", "-c", "print('ran')"],
        vec!["python3", "-m", "unittest", "-v", "test_t"],
        vec!["python3", "test_t.py"],
    ] {
        let out = runner
            .run(
                argv.iter().map(|s| (*s).to_owned()).collect(),
                Vec::new(),
                std::time::Duration::from_secs(60),
            )
            .await
            .unwrap();
        assert_eq!(out.exit, Some(0), "{argv:?}: {out:?}");
        assert!(
            !out.stdout.contains("HOOKED") && !out.stderr.contains("HOOKED"),
            "{argv:?}: {out:?}"
        );
    }
}

/// Debian's interpreter, which has pytest (`python3-pytest`, installed by
/// `cargo xtask setup`) and is the one sandboxes see.
const SYSTEM_PYTHON: &str = "/usr/bin/python3";

/// A workspace holding the wrong `calc.py` and the task's tests in
/// `tests/` (a conftest of the task's whose fixture the test uses), and
/// beside them everything a policy may leave to make the tests pass: a
/// `conftest.py` that reports every test passed, `pytest.ini`, `tox.ini`,
/// `setup.cfg` and `pyproject.toml` whose `addopts` deselect the test, a
/// `pytest.py` and a `unittest.py` that print success and exit 0, a
/// `*.dist-info` declaring a pytest plugin that passes every test, a
/// `sitecustomize.py` and a `.pth`.
fn shadowed_workspace(right: bool) -> tempfile::TempDir {
    let ws = tempfile::tempdir().unwrap();
    let p = ws.path();
    let op = if right { "+" } else { "-" };
    let w = |rel: &str, text: &str| {
        let path = p.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    w("calc.py", &format!("def add(a, b):\n    return a {op} b\n"));
    w(
        "tests/conftest.py",
        "import pytest\n\n@pytest.fixture\ndef five():\n    return 5\n",
    );
    w(
        "tests/test_calc.py",
        "import calc\n\ndef test_add(five):\n    assert calc.add(2, 3) == five\n",
    );
    w(
        "tests/test_unit.py",
        "import unittest\nimport calc\n\nclass T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(calc.add(2, 3), 5)\n",
    );
    let pass_all = "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\n\
                    def pytest_runtest_makereport(item, call):\n    \
                    outcome = yield\n    outcome.get_result().outcome = 'passed'\n";
    w("conftest.py", pass_all);
    w("polar_evil.py", pass_all);
    w(
        "polar_evil-1.0.dist-info/METADATA",
        "Metadata-Version: 2.1\nName: polar-evil\nVersion: 1.0\n",
    );
    w(
        "polar_evil-1.0.dist-info/entry_points.txt",
        "[pytest11]\nevil = polar_evil\n",
    );
    let deselect = "addopts = --deselect tests/test_calc.py::test_add -p polar_evil\n";
    w("pytest.ini", &format!("[pytest]\n{deselect}"));
    w("tox.ini", &format!("[pytest]\n{deselect}"));
    w("setup.cfg", &format!("[tool:pytest]\n{deselect}"));
    w(
        "pyproject.toml",
        "[tool.pytest.ini_options]\naddopts = \"-p polar_evil\"\n",
    );
    let fake = "import sys\nprint('PASSED tests/test_calc.py::test_add')\nsys.exit(0)\n";
    w("pytest.py", fake);
    w("unittest.py", fake);
    w("sitecustomize.py", "import os\nos._exit(0)\n");
    w("zz.pth", "import os; os._exit(0)\n");
    ws
}

#[tokio::test]
async fn modules_configurations_and_conftests_planted_around_the_tests_change_nothing() {
    let pytest = evaluator(
        "test_output",
        json!({
            "command": [SYSTEM_PYTHON, "-m", "pytest", "-rA", "tests"],
            "parser": "pytest",
            "tests": "tests",
            "fail_to_pass": ["tests/test_calc.py::test_add"],
        }),
    );
    let unit = evaluator(
        "command",
        json!({"command": [SYSTEM_PYTHON, "-m", "unittest", "-v", "tests.test_unit"]}),
    );
    let script = evaluator(
        "command",
        json!({"command": [SYSTEM_PYTHON, "-c", "import calc, sys; sys.exit(0 if calc.add(2, 3) == 5 else 1)"]}),
    );
    // The control: run plainly, the leftovers make a wrong solution pass.
    let wrong = shadowed_workspace(false);
    for e in [&pytest, &unit] {
        let got = run(e, wrong.path()).await;
        assert_eq!(got.reward, Some(1.0), "{got:?}");
    }
    for (name, e) in [
        ("pytest", &pytest),
        ("unittest", &unit),
        ("script", &script),
    ] {
        // In an evaluation, the wrong solution fails and the right one
        // passes, the task's own conftest and the workspace's module used.
        let runner = IsolatedRunner::new(wrong.path());
        let got = e.evaluate(&facts(wrong.path()), &runner).await;
        assert_eq!(got.reward, Some(0.0), "{name}: {got:?}");
        let right = shadowed_workspace(true);
        let runner = IsolatedRunner::new(right.path());
        let got = e.evaluate(&facts(right.path()), &runner).await;
        assert_eq!(got.reward, Some(1.0), "{name}: {got:?}");
    }
}

#[tokio::test]
async fn a_tests_package_keeps_the_workspace_behind_what_it_imports() {
    // The tests directory is a package with a helper module; its test
    // imports `fractions`, which the workspace shadows with a `Fraction`
    // equal to anything.
    let package = |right: bool| {
        let ws = shadowed_workspace(right);
        let w = |rel: &str, text: &str| std::fs::write(ws.path().join(rel), text).unwrap();
        w("tests/__init__.py", "");
        w("tests/helpers.py", "TWO = 2\n");
        w(
            "tests/test_calc.py",
            "from fractions import Fraction\nimport calc\nfrom . import helpers\n\n\
             def test_add(five):\n    \
             assert calc.add(Fraction(helpers.TWO), Fraction(3)) == five\n",
        );
        w(
            "fractions.py",
            "class Fraction:\n    def __init__(self, *a):\n        pass\n\n    \
             def __eq__(self, other):\n        return True\n\n    \
             def __add__(self, other):\n        return self\n\n    \
             __sub__ = __radd__ = __rsub__ = __add__\n",
        );
        ws
    };
    let pytest = |task_opts: Option<&str>| {
        let mut options = json!({
            "command": [SYSTEM_PYTHON, "-m", "pytest", "-rA", "tests"],
            "parser": "pytest",
            "tests": "tests",
            "fail_to_pass": ["tests/test_calc.py::test_add"],
        });
        if let Some(opts) = task_opts {
            options["env"] = json!({"PYTEST_ADDOPTS": opts});
        }
        evaluator("test_output", options)
    };
    // The control: pytest's default import mode (the task's own options
    // come last and may choose it) puts the workspace first, and the
    // wrong solution passes.
    let wrong = package(false);
    let runner = IsolatedRunner::new(wrong.path());
    let got = pytest(Some("--import-mode=prepend"))
        .evaluate(&facts(wrong.path()), &runner)
        .await;
    assert_eq!(got.reward, Some(1.0), "{got:?}");
    // Pinned, the wrong solution fails and the right one passes, the
    // package's conftest and helper used.
    let got = pytest(None).evaluate(&facts(wrong.path()), &runner).await;
    assert_eq!(got.reward, Some(0.0), "{got:?}");
    let right = package(true);
    let runner = IsolatedRunner::new(right.path());
    let got = pytest(None).evaluate(&facts(right.path()), &runner).await;
    assert_eq!(got.reward, Some(1.0), "{got:?}");
}

#[tokio::test]
async fn pytest_is_pinned_to_the_tests_own_configuration() {
    // A tests directory with a configuration of its own: it is the one
    // read (its marker registered, `--strict-markers` from its addopts),
    // whatever the workspace's says.
    let ws = shadowed_workspace(true);
    std::fs::write(
        ws.path().join("tests/pytest.ini"),
        "[pytest]\naddopts = --strict-markers\nmarkers =\n    task: the task's marker\n",
    )
    .unwrap();
    std::fs::write(
        ws.path().join("tests/test_marked.py"),
        "import pytest\n\n@pytest.mark.task\ndef test_marked():\n    pass\n",
    )
    .unwrap();
    let e = evaluator(
        "test_output",
        json!({
            "command": [SYSTEM_PYTHON, "-m", "pytest", "-rA", "tests"],
            "parser": "pytest",
            "tests": "tests",
            "fail_to_pass": ["tests/test_calc.py::test_add", "tests/test_marked.py::test_marked"],
        }),
    );
    let runner = IsolatedRunner::new(ws.path());
    let got = e.evaluate(&facts(ws.path()), &runner).await;
    assert_eq!(got.reward, Some(1.0), "{got:?}");
    // An unregistered marker fails under the tests' own --strict-markers.
    std::fs::write(
        ws.path().join("tests/test_marked.py"),
        "import pytest\n\n@pytest.mark.other\ndef test_marked():\n    pass\n",
    )
    .unwrap();
    let got = e.evaluate(&facts(ws.path()), &runner).await;
    assert_eq!(got.reward, Some(0.0), "{got:?}");
}

#[test]
fn pytest_options_name_the_tests_directory_and_keep_the_tasks() {
    let opts = isolation::pytest_addopts(Path::new("t/hidden"), Some("tox.ini"), false, Some("-x"));
    assert_eq!(
        opts,
        "-p no:cacheprovider --rootdir=. --confcutdir=t/hidden \
         -c t/hidden/tox.ini -x"
    );
    let opts = isolation::pytest_addopts(Path::new("t"), None, false, None);
    assert!(opts.ends_with("--confcutdir=t -c /dev/null"), "{opts}");
    let opts = isolation::pytest_addopts(Path::new("t"), None, true, Some("-x"));
    assert!(
        opts.ends_with("-c /dev/null --import-mode=importlib -x"),
        "{opts}"
    );
    for bad in ["a b", "a'b", "a\"b", "../t", "/abs", "a\\b"] {
        let e = Evaluator::from_spec(&super::spec(
            "test_output",
            json!({"command": "true", "parser": "pytest", "tests": bad}),
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("tests"), "{bad}: {e}");
    }
}

#[tokio::test]
async fn the_judges_diff_sees_a_change_whose_size_and_times_match_the_index() {
    // The policy rewrites a committed file with the same size and puts its
    // times back: by the workspace's index it is unchanged, and plain
    // `git diff` shows nothing (the control); the judge's diff shows it.
    let ws = tempfile::tempdir().unwrap();
    let p = ws.path();
    std::fs::write(p.join("calc.py"), "def add(a, b):\n    return a + b\n").unwrap();
    git(p, &["init", "-q"]);
    git(p, &["add", "calc.py"]);
    git(
        p,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-qm",
            "start",
        ],
    );
    let status = Command::new("sh")
        .arg("-c")
        .arg(
            // git compares change times in whole seconds: tried again
            // should the rewrite cross one.
            "for i in 1 2 3; do git checkout -q calc.py; \
             touch -d '2020-01-01 00:00:00' calc.py && git update-index --refresh -q; \
             printf 'def add(a, b):\\n    return a - b\\n' > calc.py && \
             touch -d '2020-01-01 00:00:00' calc.py && \
             test -z \"$(git diff HEAD)\" && exit 0; done; exit 1",
        )
        .current_dir(p)
        .status()
        .unwrap();
    assert!(status.success(), "the control: plain git saw the change");
    let runner = IsolatedRunner::new(p);
    let out = runner
        .run(
            vec!["sh".into(), "-c".into(), DEFAULT_DIFF_SCRIPT.into()],
            Vec::new(),
            std::time::Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert!(
        out.stdout.contains("-    return a + b") && out.stdout.contains("+    return a - b"),
        "{out:?}"
    );
}

/// Runs `argv` with the evaluation's variables in `dir`.
async fn isolated(dir: &Path, argv: Vec<String>) -> super::super::CommandOutput {
    IsolatedRunner::new(dir)
        .run(argv, Vec::new(), std::time::Duration::from_secs(60))
        .await
        .unwrap()
}

/// Runs `script` as the task's own command would.
async fn task_command(dir: &Path, script: &str) -> super::super::CommandOutput {
    isolated(dir, vec!["sh".into(), "-c".into(), script.into()]).await
}

#[tokio::test]
async fn after_the_clean_up_the_tasks_own_git_runs_nothing_the_workspace_configured() {
    let h = hostile();
    let ws = h.ws.path();
    // A nested repository and a worktree-style `.git` file, each with a
    // configuration of their own naming a program.
    let tool = h.aside.path().join("tool-external").display().to_string();
    git(ws, &["init", "-q", "nested"]);
    std::fs::write(
        ws.join("nested/.git/config"),
        format!("[core]\n\trepositoryformatversion = 0\n[diff]\n\texternal = {tool}\n"),
    )
    .unwrap();
    std::fs::create_dir(ws.join("linked")).unwrap();
    git(
        ws,
        &["init", "-q", "--separate-git-dir", ".linked-git", "linked"],
    );
    std::fs::write(
        ws.join(".linked-git/config"),
        format!("[core]\n\trepositoryformatversion = 0\n[diff]\n\texternal = {tool}\n"),
    )
    .unwrap();
    std::fs::write(
        ws.join(".git/config"),
        std::fs::read_to_string(ws.join(".git/config")).unwrap()
            + "[user]\n\tname = Pol\n[remote \"origin\"]\n\turl = /nowhere\n",
    )
    .unwrap();
    // The control: the task's plain `git diff` runs what the workspace
    // configured, even with the evaluators' variables.
    let out = task_command(ws, "git diff HEAD").await;
    assert!(!h.ran().is_empty(), "{out:?}");
    h.clear();

    let out = isolated(ws, isolation::clean_git_argv()).await;
    assert_eq!(out.exit, Some(0), "{out:?}");
    let out = task_command(
        ws,
        "git diff HEAD && git status --short && git log --oneline \
         && (cd nested && git diff) && (cd linked && git diff) \
         && git -c user.email=t@t commit -qam fix && git show --stat HEAD",
    )
    .await;
    assert_eq!(out.exit, Some(0), "{out:?}");
    assert_eq!(h.ran(), Vec::<String>::new(), "{out:?}");
    assert!(out.stdout.contains("+    return a + b"), "{out:?}");
    // Data stays: the format, the user, the remote; the policy's file is
    // kept beside.
    let config = std::fs::read_to_string(ws.join(".git/config")).unwrap();
    for kept in [
        "repositoryformatversion = 0",
        "name = Pol",
        "url = /nowhere",
    ] {
        assert!(config.contains(kept), "{kept}: {config}");
    }
    assert!(!config.contains("tool-"), "{config}");
    for policy in [".git", "nested/.git", ".linked-git"] {
        let kept = ws.join(policy).join("config.polar-policy");
        assert!(kept.is_file(), "{}", kept.display());
    }
    // Cleaning again changes nothing.
    let again = isolated(ws, isolation::clean_git_argv()).await;
    assert_eq!(again.exit, Some(0), "{again:?}");
    assert_eq!(
        std::fs::read_to_string(ws.join(".git/config")).unwrap(),
        config
    );
}

#[tokio::test]
async fn a_workspace_made_a_bare_repository_is_never_used_implicitly() {
    let h = hostile();
    let ws = h.ws.path();
    // The policy turns the workspace itself into a repository directory
    // (`HEAD`, `objects/`, `refs/` at its top, `.git` removed) whose
    // configuration makes the workspace its work tree and names an
    // external diff.
    let tool = h.aside.path().join("tool-external").display().to_string();
    let make_bare = format!(
        "mv .git/objects .git/refs .git/HEAD .git/index . && rm -rf .git \
         && printf '[core]\\n\\trepositoryformatversion = 0\\n\\tbare = false\\n\\tworktree = {}\\n[diff]\\n\\texternal = {tool}\\n' > config",
        ws.display()
    );
    let out = task_command(ws, &make_bare).await;
    assert_eq!(out.exit, Some(0), "{out:?}");
    // The control: plain git takes the workspace as the repository.
    let plain = Command::new("git")
        .args(["diff"])
        .current_dir(ws)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .unwrap();
    assert!(h.ran().contains(&"external".to_owned()), "{plain:?}");
    h.clear();
    // The cleaning finds no `.git`; the task's git refuses the directory.
    let out = isolated(ws, isolation::clean_git_argv()).await;
    assert_eq!(out.exit, Some(0), "{out:?}");
    let out = task_command(ws, "git diff").await;
    assert!(out.stderr.contains("Not a git repository"), "{out:?}");
    assert_eq!(h.ran(), Vec::<String>::new(), "{out:?}");
}

#[tokio::test]
async fn a_workspace_of_too_many_repositories_is_refused_before_any_is_cleaned() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    for i in 0..isolation::MAX_REPOSITORIES {
        std::fs::create_dir_all(ws.join(format!("r{i}/.git"))).unwrap();
    }
    std::fs::write(ws.join("r0/.git/config"), "[core]\n\tfsmonitor = /x\n").unwrap();
    // As many as may be: cleaned.
    let out = isolated(ws, isolation::clean_git_argv()).await;
    assert_eq!(out.exit, Some(0), "{out:?}");
    assert!(ws.join("r0/.git/config.polar-policy").exists());
    std::fs::remove_file(ws.join("r0/.git/config.polar-policy")).unwrap();
    std::fs::write(ws.join("r0/.git/config"), "[core]\n\tfsmonitor = /x\n").unwrap();
    // One more: refused at once, the policy's, nothing cleaned.
    std::fs::create_dir_all(ws.join("one-more/.git")).unwrap();
    let out = isolated(ws, isolation::clean_git_argv()).await;
    assert_eq!(out.exit, Some(4), "{out:?}");
    assert_eq!(
        Broken::of_message(&out.stderr),
        Some(Broken::TooManyRepositories),
        "{out:?}"
    );
    assert_eq!(
        Broken::TooManyRepositories.side(),
        super::super::Side::Policy
    );
    assert!(!ws.join("r0/.git/config.polar-policy").exists());
}
