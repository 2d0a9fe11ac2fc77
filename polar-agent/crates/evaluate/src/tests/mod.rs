//! Tests of the evaluators: option checks, and each evaluator against real
//! commands, run by [`host::HostRunner`] as host processes in a temporary
//! workspace.

mod command;
mod host;
mod isolation;
mod judge;
mod session;
mod test_output;
mod validation;

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use super::{CommandRunner, Evaluation, Evaluator, RunFuture, SessionFacts};
use polar_spec::EvaluatorSpec;

pub use host::HostRunner;

/// A spec of `kind` with `options` (a JSON object).
fn spec(kind: &str, options: Value) -> EvaluatorSpec {
    let Value::Object(options) = options else {
        panic!("options must be an object")
    };
    EvaluatorSpec {
        kind: kind.to_owned(),
        options,
    }
}

fn evaluator(kind: &str, options: Value) -> Evaluator {
    Evaluator::from_spec(&spec(kind, options)).unwrap()
}

/// A session that ran to its end with three model calls.
fn facts(workspace: &Path) -> SessionFacts {
    SessionFacts {
        harness_exit: Some(0),
        timed_out: false,
        calls: 3,
        failed_calls: 0,
        workspace: workspace.to_owned(),
        base: crate::DiffBase::Head,
    }
}

/// Evaluates in `workspace` with a host runner.
async fn run(e: &Evaluator, workspace: &Path) -> Evaluation {
    e.evaluate(&facts(workspace), &HostRunner::new(workspace))
        .await
}

/// A runner that cannot run anything.
struct BrokenRunner;

impl CommandRunner for BrokenRunner {
    fn run<'a>(&'a self, _: Vec<String>, _: Vec<(String, String)>, _: Duration) -> RunFuture<'a> {
        Box::pin(async { Err(crate::RunError::runner("the sandbox is gone")) })
    }
}

/// A runner that hits a bug.
struct PanickingRunner;

impl CommandRunner for PanickingRunner {
    fn run<'a>(&'a self, _: Vec<String>, _: Vec<(String, String)>, _: Duration) -> RunFuture<'a> {
        Box::pin(async { panic!("a bug in the runner") })
    }
}

#[tokio::test]
async fn an_evaluator_that_panics_fails_its_evaluation_and_nothing_else() {
    let ws = tempfile::tempdir().unwrap();
    let e = evaluator("command", serde_json::json!({"command": ["true"]}));
    let got = e.evaluate(&facts(ws.path()), &PanickingRunner).await;
    assert_eq!(got.reward, None, "{got:?}");
    assert!(!got.usable, "{got:?}");
    let error = got.error.unwrap_or_default();
    assert!(
        error.starts_with("command: the evaluator panicked (a bug): a bug in the runner"),
        "{error}"
    );
    // Within a composite the panic fails the part; the composite goes on
    // to report.
    let c = evaluator(
        "composite",
        serde_json::json!({"evaluators": [
            {"kind": "session_completed", "options": {}},
            {"kind": "command", "options": {"command": ["true"]}},
        ]}),
    );
    let got = c.evaluate(&facts(ws.path()), &PanickingRunner).await;
    assert_eq!(got.reward, None, "{got:?}");
    assert!(!got.usable, "{got:?}");
    assert_eq!(got.detail["parts"][0]["reward"], 1.0, "{got:?}");
    let error = got.error.unwrap_or_default();
    assert!(
        error.contains("evaluators[1] (command): command: the evaluator panicked"),
        "{error}"
    );
}

#[test]
fn evaluate_futures_are_send() {
    fn send<T: Send>(_: &T) {}
    let e = Evaluator::from_spec(&EvaluatorSpec::default()).unwrap();
    let f = facts(Path::new("/nonexistent"));
    send(&e.evaluate(&f, &BrokenRunner));
}
