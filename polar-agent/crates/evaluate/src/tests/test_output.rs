//! `test_output` end to end on the host: a real `git apply` / `patch -p1`
//! of a test patch, a real `python3 -m unittest -v` run, conflicts,
//! timeouts, missing tests, and a patch file escaping the workspace.

use std::path::Path;
use std::process::Command;

use serde_json::json;

use super::super::Evaluation;
use super::{HostRunner, evaluator, facts, run};

const CALC_FIXED: &str = "\
def add(a, b):
    return a + b


def div(a, b):
    if b == 0:
        raise ValueError(\"division by zero\")
    return a / b
";

const CALC_BUGGY: &str = "\
def add(a, b):
    return a + b


def div(a, b):
    return a / b
";

const TEST_CALC: &str = "\
import unittest
import calc


class TestCalc(unittest.TestCase):
    def test_add(self):
        self.assertEqual(calc.add(2, 3), 5)

if __name__ == \"__main__\":
    unittest.main()
";

/// Adds `test_div_zero` and a test with a unicode name.
const TEST_PATCH: &str = "\
diff --git a/test_calc.py b/test_calc.py
--- a/test_calc.py
+++ b/test_calc.py
@@ -6,5 +6,12 @@ class TestCalc(unittest.TestCase):
     def test_add(self):
         self.assertEqual(calc.add(2, 3), 5)
 
+    def test_div_zero(self):
+        with self.assertRaises(ValueError):
+            calc.div(1, 0)
+
+    def test_ünï(self):
+        self.assertEqual(calc.div(6, 3), 2)
+
 if __name__ == \"__main__\":
     unittest.main()
";

/// A workspace with `calc.py` as the model left it; a git repo if `git`.
fn workspace(calc: &str, git: bool) -> tempfile::TempDir {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("calc.py"), calc).unwrap();
    std::fs::write(ws.path().join("test_calc.py"), TEST_CALC).unwrap();
    if git {
        let status = Command::new("git")
            .args(["init", "-q"])
            .current_dir(ws.path())
            .status()
            .unwrap();
        assert!(status.success());
    }
    ws
}

fn unittest_options() -> serde_json::Value {
    json!({
        "test_patch": TEST_PATCH,
        "command": "python3 -m unittest -v test_calc",
        "parser": "unittest",
        "env": {"PYTHONDONTWRITEBYTECODE": "1"},
        "timeout_secs": 60,
        "fail_to_pass": ["test_div_zero (test_calc.TestCalc)", "test_calc.TestCalc.test_ünï"],
        "pass_to_pass": ["test_add (test_calc.TestCalc.test_add)"],
    })
}

fn leftover_patches(ws: &Path) -> Vec<String> {
    std::fs::read_dir(ws)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".polar-test-patch"))
        .collect()
}

#[tokio::test]
async fn git_apply_then_unittest_resolved() {
    let ws = workspace(CALC_FIXED, true);
    let out = run(&evaluator("test_output", unittest_options()), ws.path()).await;
    assert_eq!(
        (out.reward, out.usable, out.error.as_deref()),
        (Some(1.0), true, None),
        "{out:#?}"
    );
    let d = &out.detail;
    assert_eq!(d["patch"], json!({"tool": "git apply", "applied": true}));
    assert_eq!(d["resolved"], json!(true));
    assert_eq!(
        d["fail_to_pass"],
        json!({"test_div_zero (test_calc.TestCalc)": "passed", "test_calc.TestCalc.test_ünï": "passed"})
    );
    assert_eq!(
        d["pass_to_pass"],
        json!({"test_add (test_calc.TestCalc.test_add)": "passed"})
    );
    assert_eq!(d["missing"], json!([]));
    assert_eq!(d["counts"]["passed"], json!(3));
    assert_eq!(
        d["counts"]["fail_to_pass"],
        json!({"passed": 2, "total": 2})
    );
    assert_eq!(d["tests"]["test_calc.TestCalc.test_ünï"], json!("passed"));
    let patched = std::fs::read_to_string(ws.path().join("test_calc.py")).unwrap();
    assert!(patched.contains("def test_div_zero"));
    assert!(leftover_patches(ws.path()).is_empty());
}

#[tokio::test]
async fn patch_p1_then_unittest_unresolved() {
    let ws = workspace(CALC_BUGGY, false);
    let out = run(&evaluator("test_output", unittest_options()), ws.path()).await;
    assert_eq!(
        (out.reward, out.usable, out.error.as_deref()),
        (Some(0.0), true, None),
        "{out:#?}"
    );
    let d = &out.detail;
    assert_eq!(d["patch"], json!({"tool": "patch", "applied": true}));
    assert_eq!(d["resolved"], json!(false));
    // ZeroDivisionError is not the ValueError asserted: an error.
    assert_eq!(
        d["fail_to_pass"]["test_div_zero (test_calc.TestCalc)"],
        json!("error")
    );
    assert_eq!(
        d["fail_to_pass"]["test_calc.TestCalc.test_ünï"],
        json!("passed")
    );
    assert_eq!(
        d["counts"]["fail_to_pass"],
        json!({"passed": 1, "total": 2})
    );
    assert_eq!(d["command"]["exit"], json!(1));
    assert!(leftover_patches(ws.path()).is_empty());
}

#[tokio::test]
async fn a_conflicting_patch_scores_zero_and_says_so() {
    for git in [true, false] {
        let ws = workspace(CALC_FIXED, git);
        // The model rewrote the test file: the patch's context is gone.
        std::fs::write(ws.path().join("test_calc.py"), "import unittest\n").unwrap();
        let out = run(&evaluator("test_output", unittest_options()), ws.path()).await;
        assert_eq!((out.reward, out.usable), (Some(0.0), true), "{out:#?}");
        let error = out.error.unwrap();
        let tool = if git { "git apply" } else { "patch" };
        assert!(
            error.starts_with(&format!("the test patch does not apply ({tool}): ")),
            "{error}"
        );
        assert_eq!(out.detail["patch"]["applied"], json!(false));
        assert!(
            out.detail.get("command").is_none(),
            "the tests must not run"
        );
        assert!(leftover_patches(ws.path()).is_empty());
    }
}

#[tokio::test]
async fn missing_tests_count_as_failed() {
    let ws = workspace(CALC_FIXED, true);
    let mut options = unittest_options();
    options["pass_to_pass"] = json!([
        "test_calc.TestCalc.test_add",
        "test_calc.TestCalc.test_gone"
    ]);
    let out = run(&evaluator("test_output", options), ws.path()).await;
    assert_eq!(out.reward, Some(0.0), "{out:#?}");
    assert_eq!(
        out.detail["missing"],
        json!(["test_calc.TestCalc.test_gone"])
    );
    assert_eq!(
        out.detail["pass_to_pass"]["test_calc.TestCalc.test_gone"],
        json!("missing")
    );
}

#[tokio::test]
async fn without_lists_every_test_must_pass() {
    let ws = workspace(CALC_FIXED, false);
    let mut options = unittest_options();
    options.as_object_mut().unwrap().remove("fail_to_pass");
    options.as_object_mut().unwrap().remove("pass_to_pass");
    assert_eq!(
        run(&evaluator("test_output", options.clone()), ws.path())
            .await
            .reward,
        Some(1.0)
    );
    let ws = workspace(CALC_BUGGY, false);
    assert_eq!(
        run(&evaluator("test_output", options), ws.path())
            .await
            .reward,
        Some(0.0)
    );
}

#[tokio::test]
async fn the_patch_can_come_from_a_workspace_file_but_not_from_outside() {
    let ws = workspace(CALC_FIXED, true);
    std::fs::create_dir(ws.path().join("eval")).unwrap();
    std::fs::write(ws.path().join("eval/test.patch"), TEST_PATCH).unwrap();
    let mut options = unittest_options();
    options.as_object_mut().unwrap().remove("test_patch");
    options["test_patch_file"] = json!("eval/test.patch");
    let out = run(&evaluator("test_output", options.clone()), ws.path()).await;
    assert_eq!(out.reward, Some(1.0), "{out:#?}");

    let ws = workspace(CALC_FIXED, true);
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("test.patch"), TEST_PATCH).unwrap();
    std::os::unix::fs::symlink(outside.path(), ws.path().join("eval")).unwrap();
    // The workspace is the policy's: a test patch file it replaced by a
    // way out, or removed, scores 0.0, labelled.
    let out = run(&evaluator("test_output", options.clone()), ws.path()).await;
    assert_eq!((out.reward, out.usable), (Some(0.0), true), "{out:#?}");
    assert_eq!(out.detail["broken"]["cause"], "escapes");
    assert!(
        out.error
            .unwrap()
            .contains("eval/test.patch: resolves outside the workspace")
    );

    let ws = workspace(CALC_FIXED, true);
    let out = run(&evaluator("test_output", options), ws.path()).await;
    assert_eq!((out.reward, out.usable), (Some(0.0), true), "{out:#?}");
    assert_eq!(
        (
            &out.detail["broken"]["cause"],
            &out.detail["broken"]["side"]
        ),
        (&json!("unreadable"), &json!("policy"))
    );
    assert!(out.error.unwrap().contains("eval/test.patch: not found"));
}

#[tokio::test]
async fn a_missing_patch_tool_is_not_the_models_fault() {
    let ws = workspace(CALC_FIXED, true);
    // A PATH with only `sh`: neither git nor patch can be found.
    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/bin/sh", bin.path().join("sh")).unwrap();
    let mut options = unittest_options();
    options["env"] = json!({"PATH": bin.path()});
    let out = run(&evaluator("test_output", options), ws.path()).await;
    assert_eq!((out.reward, out.usable), (None, false), "{out:#?}");
    let error = out.error.unwrap();
    assert!(
        error.starts_with("applying the test patch: git apply could not be run (exit 127)"),
        "{error}"
    );
    assert!(error.contains("git: not found in the sandbox"), "{error}");
}

fn scripted(script: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut options = json!({"command": script, "parser": "pytest", "timeout_secs": 1});
    for (k, v) in extra.as_object().unwrap() {
        options[k] = v.clone();
    }
    options
}

#[tokio::test]
async fn a_test_command_timing_out_scores_zero() {
    let ws = tempfile::tempdir().unwrap();
    let options = scripted(
        "echo 'PASSED t.py::test_a'; sleep 30",
        json!({"fail_to_pass": ["t.py::test_a"]}),
    );
    let out: Evaluation = run(&evaluator("test_output", options), ws.path()).await;
    assert_eq!((out.reward, out.usable), (Some(0.0), true));
    assert!(
        out.error
            .unwrap()
            .contains("the test command timed out after 1 s")
    );
}

#[tokio::test]
async fn output_without_tests_scores_zero_with_a_reason() {
    let ws = tempfile::tempdir().unwrap();
    let options = scripted(
        "echo 'SyntaxError: invalid syntax' >&2; exit 2",
        json!({"fail_to_pass": ["t.py::test_a"]}),
    );
    let out = run(&evaluator("test_output", options), ws.path()).await;
    assert_eq!((out.reward, out.usable), (Some(0.0), true));
    let error = out.error.unwrap();
    assert!(
        error.contains("no test results found") && error.contains("exit 2"),
        "{error}"
    );
}

#[tokio::test]
async fn output_over_what_is_read_is_the_policys_failure_whatever_it_says() {
    let ws = tempfile::tempdir().unwrap();
    // Passing lines flood stdout past what is read, the real failure is
    // last; and then on stderr, the summary under more passing lines.
    for script in [
        "yes 'PASSED t.py::test_a' | head -n 300000; echo 'FAILED t.py::test_a - assert 0'",
        "{ echo 'FAILED t.py::test_a - assert 0'; yes 'PASSED t.py::test_a' | head -n 300000; } >&2",
    ] {
        let options =
            json!({"command": script, "parser": "pytest", "fail_to_pass": ["t.py::test_a"]});
        let out = run(&evaluator("test_output", options), ws.path()).await;
        assert_eq!(
            (out.reward, out.usable),
            (Some(0.0), true),
            "{script}: {out:#?}"
        );
        assert_eq!(out.detail["broken"]["cause"], "too_much_output", "{script}");
        assert_eq!(out.detail["broken"]["side"], "policy");
        let bytes = &out.detail["command"];
        assert!(
            bytes["stdout_bytes"].as_u64().unwrap() + bytes["stderr_bytes"].as_u64().unwrap()
                > crate::output::MAX_STREAM_BYTES,
            "{bytes}"
        );
    }
    // Just under the limit, the same lines are parsed: the failure counts.
    let script =
        "yes 'PASSED t.py::test_a' | head -n 100000; echo 'FAILED t.py::test_a - assert 0'";
    let options = json!({"command": script, "parser": "pytest", "fail_to_pass": ["t.py::test_a"]});
    let out = run(&evaluator("test_output", options), ws.path()).await;
    assert_eq!(out.reward, Some(0.0));
    assert!(out.detail.get("broken").is_none(), "{out:#?}");
    assert_eq!(
        out.detail["fail_to_pass"],
        json!({"t.py::test_a": "failed"})
    );
}

#[tokio::test]
async fn pytest_and_regex_parsers_read_real_command_output() {
    let ws = tempfile::tempdir().unwrap();
    let script = "printf '%s\\n' 'PASSED t.py::test_a[x-1]' 'FAILED t.py::test_b - assert 0' 'XFAIL t.py::test_c'";
    let options = scripted(
        script,
        json!({"fail_to_pass": ["t.py::test_a[x-1]", "t.py::test_c"], "pass_to_pass": []}),
    );
    let out = run(&evaluator("test_output", options), ws.path()).await;
    assert_eq!(out.reward, Some(1.0), "{out:#?}");
    assert_eq!(out.detail["counts"]["failed"], json!(1));
    assert_eq!(out.detail["counts"]["total"], json!(3));

    let options = json!({
        "command": "echo 'ok 1 - adds'; echo 'not ok 2 - divides' >&2",
        "parser": "regex",
        "pass_regex": "^ok \\d+ - (?P<name>.+)$",
        "fail_regex": "^not ok \\d+ - (?P<name>.+)$",
        "fail_to_pass": ["adds", "divides"],
    });
    let out = run(&evaluator("test_output", options), ws.path()).await;
    assert_eq!(out.reward, Some(0.0));
    assert_eq!(
        out.detail["fail_to_pass"],
        json!({"adds": "passed", "divides": "failed"})
    );
}

#[tokio::test]
async fn steps_run_through_the_runner_in_order() {
    let ws = workspace(CALC_FIXED, true);
    let runner = HostRunner::new(ws.path());
    let out = evaluator("test_output", unittest_options())
        .evaluate(&facts(ws.path()), &runner)
        .await;
    assert_eq!(out.reward, Some(1.0));
    let seen = runner.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0][..2], ["sh", "-c"]);
    assert!(
        seen[0][2].starts_with("polar_git_setup() {")
            && seen[0][2].contains("--no-pager apply -v \"$1\""),
        "{:?}",
        seen[0]
    );
    assert!(seen[0][4].starts_with(".polar-test-patch-"));
    assert_eq!(seen[0][5], "git");
    assert_eq!(seen[1], ["sh", "-c", "python3 -m unittest -v test_calc"]);
}
