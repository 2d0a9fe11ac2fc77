//! Failover inside a call, client against mock replicas: a fault before
//! any output (an error status before the reply too) sends the request
//! again, and the call tells the replica that failed; a cut or an abort after output
//! resumes the generation token-in on the other replica, and what the
//! stream yields, with its token data, is what an unfaulted call yields.

use polar_chat::output::OutputFormat;
use polar_chat::{ChatResponse, StreamEvent};
use polar_inference::*;
use polar_mock::script::{Script, ScriptedCall, ScriptedError, SessionScript, Turn};
use polar_mock::{self as mock, MockConfig, MockHandle, tokenizer};

use super::{backend, drain, mock_with, request};

fn turn() -> Turn {
    Turn {
        think: Some("I need the demo file, so bash it is.".into()),
        text: Some("Creating it now.".into()),
        tool_calls: vec![ScriptedCall {
            shell: Some("echo polar > polar-demo.txt".into()),
            ..ScriptedCall::default()
        }],
        ..Turn::default()
    }
}

async fn replicas(dialect: Dialect, turn: &Turn, n: usize) -> Vec<MockHandle> {
    scripted(
        &MockConfig {
            dialect,
            ..MockConfig::default()
        },
        turn,
        n,
    )
    .await
}

/// `n` replicas configured as `base`, each scripted to answer every
/// session with `turn`.
pub(super) async fn scripted(base: &MockConfig, turn: &Turn, n: usize) -> Vec<MockHandle> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(
            mock::start(MockConfig {
                script: Some(Script {
                    final_text: None,
                    sessions: vec![SessionScript {
                        id: "*".into(),
                        turns: vec![turn.clone()],
                        ..SessionScript::default()
                    }],
                }),
                ..base.clone()
            })
            .await
            .unwrap(),
        );
    }
    out
}

fn with_parser(mut cfg: BackendConfig) -> BackendConfig {
    cfg.output_parser = Some(OutputFormat::Qwen3);
    cfg
}

/// The reply of an unfaulted call, its events and token data.
async fn unfaulted(dialect: Dialect) -> (ChatResponse, Vec<StreamEvent>) {
    let m = replicas(dialect, &turn(), 1).await;
    let client = Client::new(with_parser(backend(dialect, vec![m[0].url()]))).unwrap();
    let done = client
        .chat("s", &request(true))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    for m in m {
        m.stop().await;
    }
    (done.response, done.events)
}

fn parts(r: &ChatResponse) -> (String, Option<String>, Vec<(String, String)>) {
    (
        r.message.joined_text(),
        r.message.reasoning.as_ref().map(|x| x.text.clone()),
        r.message
            .tool_calls
            .iter()
            .map(|c| (c.name.clone(), c.arguments.clone()))
            .collect(),
    )
}

#[tokio::test]
async fn a_fault_mid_reply_is_resumed_into_the_unfaulted_reply() {
    for dialect in [Dialect::Vllm, Dialect::Sglang] {
        let (plain, plain_events) = unfaulted(dialect).await;
        let ids = plain.tokens.response_token_ids.clone().unwrap();
        let total = ids.len() as u32;
        // The mock streams an aborted generation as its own whole parse of
        // the cut text (an unfinished tool call as answer text), which a
        // streaming server does not: vLLM aborts are checked before the
        // call (cuts everywhere).
        let call_at = ids
            .iter()
            .position(|&id| id == tokenizer::TOOL_CALL)
            .unwrap() as u32;
        for at in (1..total).step_by(7) {
            let mut faults = vec![Turn {
                disconnect_after: Some(at),
                ..turn()
            }];
            if dialect == Dialect::Sglang || at < call_at {
                faults.push(Turn {
                    abort_after: Some(at),
                    ..turn()
                });
            }
            for (k, fault) in faults.into_iter().enumerate() {
                // SGLang replies come whole: a cut loses all of it (the
                // request is sent again, not resumed).
                let what = format!("{dialect:?} fault {k} at {at}");
                let m = replicas(dialect, &fault, 2).await;
                let urls: Vec<String> = m.iter().map(MockHandle::url).collect();
                let client = Client::new(with_parser(backend(dialect, urls.clone()))).unwrap();
                let done = client
                    .chat("s", &request(true))
                    .await
                    .unwrap()
                    .collect()
                    .await
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(parts(&done.response), parts(&plain), "{what}");
                assert_eq!(done.response.finish_reason, plain.finish_reason, "{what}");
                assert_eq!(done.response.tokens, plain.tokens, "{what}");
                assert_eq!(
                    done.events
                        .iter()
                        .filter(|e| matches!(e, StreamEvent::Start { .. }))
                        .count(),
                    1,
                    "{what}"
                );
                assert_eq!(
                    done.events.last().map(std::mem::discriminant),
                    plain_events.last().map(std::mem::discriminant),
                    "{what}"
                );
                assert_eq!(done.response.usage.completion_tokens, total, "{what}");
                for m in m {
                    m.stop().await;
                }
            }
        }
    }
}

#[tokio::test]
async fn a_resumption_without_the_harness_max_tokens_generates_the_whole_rest() {
    // The token-in endpoints stop at their own defaults (vLLM's
    // /v1/completions 16 tokens, SGLang's /generate 128) when a request
    // sets no length: the resumption must set what is left of the context.
    let long = Turn {
        text: Some("word ".repeat(300)),
        ..Turn::default()
    };
    for dialect in [Dialect::Vllm, Dialect::Sglang] {
        let m = replicas(dialect, &long, 1).await;
        let client = Client::new(with_parser(backend(dialect, vec![m[0].url()]))).unwrap();
        let plain = client
            .chat("s", &request(true))
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let total = plain.response.usage.completion_tokens;
        assert!(
            total > 200,
            "{dialect:?}: a reply longer than both defaults ({total})"
        );
        for m in m {
            m.stop().await;
        }
        // SGLang replies come whole: a cut loses them, an abort keeps its
        // ids, which are resumed from.
        let fault = match dialect {
            Dialect::Vllm => Turn {
                disconnect_after: Some(5),
                ..long.clone()
            },
            Dialect::Sglang => Turn {
                abort_after: Some(5),
                ..long.clone()
            },
        };
        let m = replicas(dialect, &fault, 2).await;
        let urls: Vec<String> = m.iter().map(MockHandle::url).collect();
        let client = Client::new(with_parser(backend(dialect, urls))).unwrap();
        let mut req = request(true);
        req.sampling.max_tokens = None;
        let done = client
            .chat("s", &req)
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        assert_eq!(done.response.usage.completion_tokens, total, "{dialect:?}");
        assert_eq!(
            done.response.finish_reason, plain.response.finish_reason,
            "{dialect:?}"
        );
        assert_eq!(parts(&done.response), parts(&plain.response), "{dialect:?}");
        for m in m {
            m.stop().await;
        }
    }
}

#[tokio::test]
async fn the_parts_are_told() {
    let m = replicas(
        Dialect::Vllm,
        &Turn {
            abort_after: Some(9),
            ..turn()
        },
        2,
    )
    .await;
    let urls: Vec<String> = m.iter().map(MockHandle::url).collect();
    let client = Client::new(with_parser(backend(Dialect::Vllm, urls.clone()))).unwrap();
    let mut s = client.chat("s", &request(true)).await.unwrap();
    let (events, err) = drain(&mut s).await;
    assert!(err.is_none(), "{err:?}");
    assert!(matches!(events.last(), Some(StreamEvent::Finish { .. })));
    let resumed = s.resumed().unwrap();
    assert_eq!(resumed.replicas.len(), 2);
    assert_ne!(resumed.replicas[0], resumed.replicas[1]);
    assert_eq!(resumed.part_tokens[0], 9);
    assert_eq!(
        resumed.part_tokens.iter().sum::<u32>() as usize,
        s.response_tokens().0.len()
    );
    assert_eq!(resumed.weight_versions, vec!["0", "0"]);
    assert!(resumed.faults[0].contains("aborted"));
    assert_eq!(s.backend().replica, resumed.replicas[1]);
    for m in m {
        m.stop().await;
    }
}

#[tokio::test]
async fn an_error_status_before_the_reply_is_sent_again_and_told() {
    for (dialect, status) in [(Dialect::Vllm, 503), (Dialect::Sglang, 500)] {
        let fault = Turn {
            error: Some(ScriptedError {
                status,
                message: None,
            }),
            ..turn()
        };
        let m = replicas(dialect, &fault, 2).await;
        let urls: Vec<String> = m.iter().map(MockHandle::url).collect();
        let client = Client::new(with_parser(backend(dialect, urls.clone()))).unwrap();
        let mut s = client.chat("s", &request(true)).await.unwrap();
        let (events, err) = drain(&mut s).await;
        assert!(err.is_none(), "{dialect:?}: {err:?}");
        assert!(matches!(events.last(), Some(StreamEvent::Finish { .. })));
        // The record tells the replica that failed: a part with no ids.
        let resumed = s.resumed().unwrap();
        assert_eq!(resumed.replicas.len(), 2, "{resumed:?}");
        assert_ne!(resumed.replicas[0], resumed.replicas[1]);
        assert_eq!(s.backend().replica, resumed.replicas[1]);
        assert_eq!(resumed.part_tokens[0], 0);
        assert_eq!(resumed.part_tokens[1] as usize, s.response_tokens().0.len());
        assert!(
            resumed.faults[0].contains(&status.to_string()),
            "{resumed:?}"
        );
        for m in m {
            m.stop().await;
        }
    }
}

#[tokio::test]
async fn an_abort_before_any_output_is_sent_again() {
    // vLLM: no token before the abort; SGLang: a whole reply aborted after
    // 3 tokens yields none of its output.
    for (dialect, after) in [
        (Dialect::Vllm, 0),
        (Dialect::Sglang, 0),
        (Dialect::Sglang, 3),
    ] {
        let mock = mock_with(
            dialect,
            vec![Turn {
                text: Some("one two three".into()),
                abort_after: Some(after),
                ..Turn::default()
            }],
        )
        .await;
        // One replica, no output parser: it is sent again to the same one.
        let client = Client::new(backend(dialect, vec![mock.url()])).unwrap();
        let mut s = client.chat("s-a", &request(true)).await.unwrap();
        let (events, err) = drain(&mut s).await;
        assert!(err.is_none(), "{dialect:?}: {err:?}");
        let starts = events
            .iter()
            .filter(|e| matches!(e, StreamEvent::Start { .. }))
            .count();
        assert_eq!(starts, 1, "{dialect:?}: one start");
        assert!(matches!(events.last(), Some(StreamEvent::Finish { .. })));
        let resumed = s.resumed().unwrap();
        assert_eq!(resumed.replicas, vec![mock.url(), mock.url()]);
        assert_eq!(resumed.part_tokens[0], 0);
        mock.stop().await;
    }
}

#[tokio::test]
async fn without_an_output_parser_a_fault_after_output_stays_an_error() {
    let m = replicas(
        Dialect::Vllm,
        &Turn {
            disconnect_after: Some(9),
            ..turn()
        },
        2,
    )
    .await;
    let client = Client::new(backend(
        Dialect::Vllm,
        m.iter().map(MockHandle::url).collect(),
    ))
    .unwrap();
    let mut s = client.chat("s", &request(true)).await.unwrap();
    let (_, err) = drain(&mut s).await;
    assert!(
        matches!(err, Some(InferenceError::StreamCut { .. })),
        "{err:?}"
    );
    assert!(s.resumed().is_none());
    for m in m {
        m.stop().await;
    }
}
