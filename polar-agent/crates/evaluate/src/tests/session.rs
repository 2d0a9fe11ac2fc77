//! `session_completed` from the session's facts.

use std::path::Path;

use serde_json::json;

use super::super::SessionFacts;
use super::{BrokenRunner, evaluator, facts};

async fn score(options: serde_json::Value, f: SessionFacts) -> super::super::Evaluation {
    evaluator("session_completed", options)
        .evaluate(&f, &BrokenRunner)
        .await
}

#[tokio::test]
async fn a_clean_exit_with_calls_is_a_success() {
    let e = score(json!({}), facts(Path::new("/w"))).await;
    assert_eq!(e.reward, Some(1.0));
    assert!(e.usable);
    assert_eq!(e.error, None);
    assert_eq!(e.detail["success"], json!(true));
    assert_eq!(e.detail["calls"], json!(3));
}

#[tokio::test]
async fn failures_score_reward_failure_and_say_why() {
    let base = facts(Path::new("/w"));
    let cases = [
        (
            SessionFacts {
                harness_exit: Some(2),
                ..base.clone()
            },
            "exited with 2",
            true,
        ),
        (
            SessionFacts {
                calls: 0,
                ..base.clone()
            },
            "0 model calls, fewer than min_calls = 1",
            true,
        ),
        (
            SessionFacts {
                timed_out: true,
                ..base.clone()
            },
            "timed out",
            false,
        ),
        (
            SessionFacts {
                harness_exit: None,
                ..base.clone()
            },
            "did not exit",
            false,
        ),
        (
            SessionFacts {
                harness_exit: Some(0),
                timed_out: true,
                ..base.clone()
            },
            "timed out",
            false,
        ),
    ];
    for (f, reason, usable) in cases {
        let e = score(json!({"reward_failure": -1.0}), f.clone()).await;
        assert_eq!(e.reward, Some(-1.0), "{f:?}");
        assert_eq!(e.usable, usable, "{f:?}");
        let got = e.detail["reason"].as_str().unwrap();
        assert!(got.contains(reason), "{got}");
    }
}

#[tokio::test]
async fn min_calls_max_failed_calls_and_rewards_are_options() {
    let base = facts(Path::new("/w"));
    let e = score(
        json!({"min_calls": 0, "reward_success": 0.5}),
        SessionFacts {
            calls: 0,
            ..base.clone()
        },
    )
    .await;
    assert_eq!(e.reward, Some(0.5));
    let e = score(json!({"min_calls": 4}), base.clone()).await;
    assert_eq!(e.reward, Some(0.0));
    let flaky = SessionFacts {
        failed_calls: 2,
        ..base.clone()
    };
    assert_eq!(score(json!({}), flaky.clone()).await.reward, Some(1.0));
    assert_eq!(
        score(json!({"max_failed_calls": 2}), flaky.clone())
            .await
            .reward,
        Some(1.0)
    );
    let e = score(json!({"max_failed_calls": 1}), flaky).await;
    assert_eq!(e.reward, Some(0.0));
    assert!(
        e.detail["reason"]
            .as_str()
            .unwrap()
            .contains("max_failed_calls = 1")
    );
}
