//! Every bad option is refused by `from_spec` with a message naming it.

use serde_json::json;

use super::super::{EvalError, Evaluator};
use super::spec;
use polar_spec::EvaluatorSpec;

fn error(kind: &str, options: serde_json::Value) -> String {
    Evaluator::from_spec(&spec(kind, options))
        .unwrap_err()
        .to_string()
}

#[track_caller]
fn refused(kind: &str, options: serde_json::Value, prefix: &str, contains: &str) {
    let e = error(kind, options.clone());
    assert!(
        e.starts_with(prefix),
        "{kind} {options}: {e:?} should start with {prefix:?}"
    );
    assert!(
        e.contains(contains),
        "{kind} {options}: {e:?} should contain {contains:?}"
    );
}

#[test]
fn the_default_spec_is_session_completed() {
    let e = Evaluator::from_spec(&EvaluatorSpec::default()).unwrap();
    assert_eq!(e.kind(), "session_completed");
    assert!(!e.needs_fresh_sandbox());
    assert!(!e.runs_commands());
}

#[test]
fn unknown_kinds_name_the_kind_field() {
    let err = Evaluator::from_spec(&spec("pytest", json!({}))).unwrap_err();
    assert_eq!(err.field(), "evaluator.kind");
    assert!(
        err.to_string()
            .starts_with("evaluator.kind: unknown evaluator \"pytest\""),
        "{err}"
    );
}

#[test]
fn session_completed_options() {
    let p = "evaluator.options.";
    refused(
        "session_completed",
        json!({"min_call": 2}),
        &format!("{p}min_call: unknown option"),
        "min_calls",
    );
    refused(
        "session_completed",
        json!({"min_calls": "two"}),
        &format!("{p}min_calls: "),
        "invalid type",
    );
    refused(
        "session_completed",
        json!({"min_calls": -1}),
        &format!("{p}min_calls: "),
        "invalid value",
    );
    refused(
        "session_completed",
        json!({"reward_success": "1"}),
        &format!("{p}reward_success: "),
        "invalid type",
    );
    refused(
        "session_completed",
        json!({"max_failed_calls": 1.5}),
        &format!("{p}max_failed_calls: "),
        "invalid type",
    );
}

#[test]
fn command_options() {
    let p = "evaluator.options.";
    let c = "command";
    refused(c, json!({}), &format!("{p}command: required"), "");
    refused(
        c,
        json!({"command": 5}),
        &format!("{p}command: "),
        "must be a string",
    );
    refused(
        c,
        json!({"command": "  "}),
        &format!("{p}command: "),
        "must not be empty",
    );
    refused(
        c,
        json!({"command": []}),
        &format!("{p}command: "),
        "must not be empty",
    );
    refused(
        c,
        json!({"command": [""]}),
        &format!("{p}command: "),
        "program",
    );
    refused(
        c,
        json!({"command": ["ls", 1]}),
        &format!("{p}command: "),
        "only strings",
    );
    refused(
        c,
        json!({"command": "x\u{0}y"}),
        &format!("{p}command: "),
        "NUL",
    );
    refused(
        c,
        json!({"command": "x", "comand": "y"}),
        &format!("{p}comand: unknown option"),
        "reward_file",
    );
    refused(
        c,
        json!({"command": "x", "timeout_secs": 0}),
        &format!("{p}timeout_secs: "),
        "between 1 and 86400",
    );
    refused(
        c,
        json!({"command": "x", "timeout_secs": 86401}),
        &format!("{p}timeout_secs: "),
        "not 86401",
    );
    refused(
        c,
        json!({"command": "x", "fresh": "yes"}),
        &format!("{p}fresh: "),
        "invalid type",
    );
    refused(
        c,
        json!({"command": "x", "reward": "score"}),
        &format!("{p}reward: "),
        "exit_status, file",
    );
    refused(
        c,
        json!({"command": "x", "reward_file": "r"}),
        &format!("{p}reward_file: "),
        "only used with reward = \"file\"",
    );
    refused(
        c,
        json!({"command": "x", "reward": "file", "reward_file": "../r"}),
        &format!("{p}reward_file: "),
        "`..`",
    );
    refused(
        c,
        json!({"command": "x", "reward": "file", "reward_file": "a/../../r"}),
        &format!("{p}reward_file: "),
        "`..`",
    );
    refused(
        c,
        json!({"command": "x", "reward": "file", "reward_file": "/etc/r"}),
        &format!("{p}reward_file: "),
        "not absolute",
    );
    refused(
        c,
        json!({"command": "x", "reward": "file", "reward_file": ""}),
        &format!("{p}reward_file: "),
        "must not be empty",
    );
    refused(
        c,
        json!({"command": "x", "reward": "file", "reward_file": "./."}),
        &format!("{p}reward_file: "),
        "must name a file",
    );
    refused(
        c,
        json!({"command": "x", "env": {"A=B": "1"}}),
        &format!("{p}env.A=B: "),
        "without `=`",
    );
    refused(
        c,
        json!({"command": "x", "env": {"A": 1}}),
        &format!("{p}env.A: "),
        "invalid type",
    );
    refused(
        c,
        json!({"command": "x", "env": ["A"]}),
        &format!("{p}env: "),
        "invalid type",
    );
    refused(
        c,
        json!({"command": "x", "env": {"POLAR_REWARD_FILE": "x"}}),
        &format!("{p}env.POLAR_REWARD_FILE: "),
        "set by the evaluator",
    );
}

#[test]
fn test_output_options() {
    let p = "evaluator.options.";
    let t = "test_output";
    let diff = "--- a/t.py\n+++ b/t.py\n@@ -1 +1 @@\n-a\n+b\n";
    refused(
        t,
        json!({"parser": "pytest"}),
        &format!("{p}command: required"),
        "",
    );
    refused(
        t,
        json!({"command": "pytest"}),
        &format!("{p}parser: required"),
        "pytest, unittest or regex",
    );
    refused(
        t,
        json!({"command": "x", "parser": "jest"}),
        &format!("{p}parser: "),
        "unknown parser \"jest\"",
    );
    refused(
        t,
        json!({"command": "x", "parser": "pytest", "pass_regex": "(?P<name>.)"}),
        &format!("{p}pass_regex: "),
        "only used with parser = \"regex\"",
    );
    refused(
        t,
        json!({"command": "x", "parser": "unittest", "fail_regex": "(?P<name>.)"}),
        &format!("{p}fail_regex: "),
        "only used with",
    );
    refused(
        t,
        json!({"command": "x", "parser": "regex"}),
        &format!("{p}pass_regex: "),
        "required with parser",
    );
    refused(
        t,
        json!({"command": "x", "parser": "regex", "pass_regex": "(ok"}),
        &format!("{p}pass_regex: "),
        "invalid regex",
    );
    refused(
        t,
        json!({"command": "x", "parser": "regex", "pass_regex": "ok (\\S+)"}),
        &format!("{p}pass_regex: "),
        "named group `name`",
    );
    refused(
        t,
        json!({"command": "x", "parser": "regex", "pass_regex": "(?P<name>ok)", "fail_regex": "bad"}),
        &format!("{p}fail_regex: "),
        "named group",
    );
    refused(
        t,
        json!({"command": "x", "parser": "pytest", "test_patch": " \n"}),
        &format!("{p}test_patch: "),
        "must not be empty",
    );
    refused(
        t,
        json!({"command": "x", "parser": "pytest", "test_patch": "fix the tests"}),
        &format!("{p}test_patch: "),
        "not a unified diff",
    );
    refused(
        t,
        json!({"command": "x", "parser": "pytest", "test_patch": diff, "test_patch_file": "p.diff"}),
        &format!("{p}test_patch_file: "),
        "not both",
    );
    refused(
        t,
        json!({"command": "x", "parser": "pytest", "test_patch_file": "../p.diff"}),
        &format!("{p}test_patch_file: "),
        "`..`",
    );
    refused(
        t,
        json!({"command": "x", "parser": "pytest", "fail_to_pass": ["a", " "]}),
        &format!("{p}fail_to_pass[1]: "),
        "empty test name",
    );
    refused(
        t,
        json!({"command": "x", "parser": "pytest", "pass_to_pass": "a"}),
        &format!("{p}pass_to_pass: "),
        "invalid type",
    );
    refused(
        t,
        json!({"command": "x", "parser": "pytest", "pass_to_pass": [1]}),
        &format!("{p}pass_to_pass[0]: "),
        "invalid type",
    );
    refused(
        t,
        json!({"command": "x", "parser": "pytest", "timeout_secs": 0}),
        &format!("{p}timeout_secs: "),
        "between",
    );
    refused(
        t,
        json!({"command": "x", "parser": "pytest", "reward": "file"}),
        &format!("{p}reward: unknown option"),
        "test_patch",
    );
}

#[test]
fn errors_carry_their_field() {
    let err = Evaluator::from_spec(&spec("command", json!({"command": "x", "env": {"": "1"}})))
        .unwrap_err();
    assert_eq!(err.field(), "evaluator.options.env.");
    assert!(matches!(err, EvalError::Option { .. }));
}

#[test]
fn valid_specs_keep_what_they_say() {
    let e = Evaluator::from_spec(&spec(
        "command",
        json!({"command": ["pytest", "-q"], "fresh": true}),
    ))
    .unwrap();
    let Evaluator::Command(c) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(c.run.argv, ["pytest", "-q"]);
    assert_eq!(c.run.timeout.as_secs(), 300);
    assert!(e.needs_fresh_sandbox() && e.runs_commands());
    let e = Evaluator::from_spec(&spec(
        "command",
        json!({"command": "make test", "reward": "file"}),
    ))
    .unwrap();
    let Evaluator::Command(c) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(c.run.argv, ["sh", "-c", "make test"]);
    assert_eq!(
        c.reward,
        super::super::RewardSource::File(".polar/reward".into())
    );
    assert!(!e.needs_fresh_sandbox());
    let e = Evaluator::from_spec(&spec(
        "test_output",
        json!({"command": "x", "parser": "unittest", "fresh": true, "fail_to_pass": ["test_a (m.C)"]}),
    ))
    .unwrap();
    let Evaluator::TestOutput(t) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(t.fail_to_pass[0].canonical, "m.C.test_a");
    assert_eq!(t.fail_to_pass[0].given, "test_a (m.C)");
    assert!(e.needs_fresh_sandbox());
}

#[test]
fn restore_lists_paths_of_the_workspace_none_inside_another() {
    let p = "evaluator.options.";
    let with = |restore: serde_json::Value| json!({"command": "x", "restore": restore});
    refused(
        "command",
        with(json!(["../etc"])),
        &format!("{p}restore[0]: "),
        "`..`",
    );
    refused(
        "command",
        with(json!(["ok", "/abs"])),
        &format!("{p}restore[1]: "),
        "not absolute",
    );
    refused(
        "command",
        with(json!([""])),
        &format!("{p}restore[0]: "),
        "empty",
    );
    refused(
        "command",
        with(json!(["node_modules", "./node_modules/jest"])),
        &format!("{p}restore: "),
        "one holds the other",
    );
    refused(
        "command",
        with(json!(["a", "a"])),
        &format!("{p}restore: "),
        "one holds the other",
    );
    refused(
        "test_output",
        json!({"command": "x", "parser": "pytest", "tests": "tests", "restore": ["tests/conftest.py"]}),
        &format!("{p}restore[0]: "),
        "overlaps `tests`",
    );
    refused(
        "command",
        json!({"command": "x", "tests": "t/hidden", "restore": ["t"]}),
        &format!("{p}restore[0]: "),
        "overlaps `tests`",
    );
    let many: Vec<String> = (0..65).map(|i| format!("p{i}")).collect();
    refused(
        "command",
        with(json!(many)),
        &format!("{p}restore: "),
        "at most 64",
    );
    refused(
        "command",
        with(json!("node_modules")),
        &format!("{p}restore: "),
        "invalid type",
    );

    // Siblings that share a prefix are not inside each other.
    let e = Evaluator::from_spec(&spec(
        "command",
        with(json!([
            "node_modules.bak",
            "./node_modules",
            "jest.config.js"
        ])),
    ))
    .unwrap();
    assert_eq!(
        e.restore_paths(),
        ["jest.config.js", "node_modules", "node_modules.bak"].map(std::path::PathBuf::from)
    );
    // A composite's parts' paths together, a path inside another's once.
    let e = Evaluator::from_spec(&spec(
        "composite",
        json!({"evaluators": [
            {"kind": "command", "options": with(json!(["vendor/lib", "package.json"]))},
            {"kind": "test_output", "options": {"command": "x", "parser": "pytest", "restore": ["vendor", "package.json"]}},
            {"kind": "session_completed"},
        ]}),
    ))
    .unwrap();
    assert_eq!(
        e.restore_paths(),
        ["package.json", "vendor"].map(std::path::PathBuf::from)
    );
    assert!(
        Evaluator::from_spec(&spec("command", json!({"command": "x"})))
            .unwrap()
            .restore_paths()
            .is_empty()
    );
}
