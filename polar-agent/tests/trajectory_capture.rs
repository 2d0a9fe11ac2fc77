//! Trajectories from real captures: a two-turn tool-use exchange goes
//! through the capture stage to the mock backend with each of its template
//! behaviours (prefix-preserving, stripping earlier reasoning, glue only in
//! the generation prompt), and `prefix_merging` rebuilds one trace from the
//! capture log in every case: a plain extension, or a detected and spliced
//! template mismatch. The invariant checker passes on each.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed step fails the test"
)]

mod common;

use common::*;
use polar_mock::script::{Script, ScriptedCall, SessionScript, Turn};
use polar_mock::{self as mock, MockConfig, tokenizer};
use polar_trajectory::{
    self, Builder, PrefixMergingOptions, SessionMeta, SessionOutcome, TemplateInfo,
};
use serde_json::{Value, json};

/// A tool call, then an answer; with reasoning before each when `think`
/// (a template that adds glue only to the generation prompt is the one used
/// when the model does not think, as Qwen3 with `enable_thinking: false`).
fn script(think: bool) -> Script {
    let reasoning = |t: &str| think.then(|| t.to_owned());
    let call: ScriptedCall = serde_json::from_value(json!({"shell": "echo hi > out.txt"})).unwrap();
    Script {
        final_text: None,
        sessions: vec![SessionScript {
            id: "*".into(),
            turns: vec![
                Turn {
                    think: reasoning("I should run the command"),
                    tool_calls: vec![call],
                    ..Turn::default()
                },
                Turn {
                    think: reasoning("it worked"),
                    text: Some("done".into()),
                    ..Turn::default()
                },
            ],
            ..SessionScript::default()
        }],
    }
}

/// Runs the exchange in `session` with the mock's template switches in
/// `polar_mock` (kept in the request and passed to the backend).
async fn exchange(agent: &TestAgent, session: &str, polar_mock: Option<Value>) {
    agent.session(session, "t");
    let h = Harness::Qwen;
    let mut first = h.first_turn();
    if let Some(m) = &polar_mock {
        first["polar_mock"] = m.clone();
    }
    let r1 = send(h.request(agent.addr, session, first.clone(), false)).await;
    assert_eq!(h.check_reply(&r1, false).len(), 1, "{}", r1.text());
    let second = second_turn(h, first, &r1.json());
    let r2 = send(h.request(agent.addr, session, second, false)).await;
    assert!(h.check_reply(&r2, false).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_merging_of_captured_sessions_under_each_template() {
    let cases = [
        ("plain", None, false, true),
        ("strip", Some(json!({"strip_reasoning": "all"})), true, true),
        (
            "glue",
            Some(json!({"generation_glue": "<think>\n\n</think>\n\n"})),
            true,
            false,
        ),
    ];
    for (session, switches, mismatch, think) in cases {
        run_case(session, switches, mismatch, think).await;
    }
}

async fn run_case(session: &str, switches: Option<Value>, mismatch: bool, think: bool) {
    let mock = mock::start(MockConfig {
        script: Some(script(think)),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let agent = TestAgent::start(&backend_toml("mock", &mock.url(), 5000)).await;
    let template = TemplateInfo {
        end_of_turn: vec![tokenizer::IM_END, tokenizer::ENDOFTEXT],
        think: vec![tokenizer::THINK, tokenizer::THINK_END],
        whitespace: Vec::new(),
    };
    let builder = Builder::PrefixMerging(PrefixMergingOptions {
        template: Some(template),
        ..PrefixMergingOptions::default()
    });
    {
        exchange(&agent, session, switches).await;
        let (records, problems) = agent.calls(session);
        assert!(
            problems.is_empty() && records.len() == 2,
            "{session}: {problems:?}"
        );
        let meta = SessionMeta {
            session_id: session.into(),
            task_id: Some("t".into()),
            group_id: None,
            attempt: None,
            superseded_attempts: 0,
            outcome: SessionOutcome::Completed,
            ended_by: None,
            evaluation: None,
            policy_version: None,
            instruction: None,
        };
        let traj = polar_trajectory::build(&builder, &records, &meta);
        polar_trajectory::check(&traj, &records).unwrap();
        let s = &traj.stats;
        assert_eq!(traj.traces.len(), 1, "{session}: {s:?}");
        assert_eq!(s.calls_merged, 1, "{session}: {s:?}");
        assert!(s.calls_dropped.is_empty(), "{session}: {s:?}");
        if mismatch {
            assert_eq!(s.template_mismatches_detected, 1, "{session}: {s:?}");
            assert_eq!(s.template_mismatches_spliced, 1, "{session}: {s:?}");
        } else {
            assert_eq!(s.template_mismatches_detected, 0, "{session}: {s:?}");
        }
        // Every generated token keeps loss 1 and the backend's logprob.
        let trace = &traj.traces[0];
        let generated: usize = records
            .iter()
            .map(|r| r.response_token_ids.as_ref().unwrap().len())
            .sum();
        let loss: usize = trace.loss_mask.iter().map(|&m| usize::from(m)).sum();
        assert_eq!(loss, generated, "{session}");
    }
    agent.stop().await;
    mock.stop().await;
}
