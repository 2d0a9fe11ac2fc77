//! The client against the mock backend on loopback, both dialects: events
//! in order, tool calls, token data equal to the mock's own tokenization,
//! error classification.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers: a failed step fails the test"
)]

use std::time::{Duration, Instant};

use serde_json::json;

use polar_chat::{
    ChatRequest, FinishReason, Message, Reasoning, Role, Sampling, StreamEvent, Tool, ToolCall,
};
use polar_inference::*;
use polar_mock::script::{Script, SessionScript, Turn};
use polar_mock::template::{TemplateOptions, render_prompt};
use polar_mock::{self as mock, MockConfig, MockHandle, tokenizer};

mod failover;
mod faithful;
mod guided;
mod pool;
mod real;
mod tokenize;

/// Qwen3's real files, as `cargo xtask chat-models` installs them
/// (`POLAR_CHAT_MODELS_DIR`).
pub(crate) fn qwen3_dir() -> std::path::PathBuf {
    model_dir("qwen3")
}

/// A model's real files (`qwen3`, `deepseek_v3_1`, `gptoss`, ...), as
/// `cargo xtask chat-models` installs them (`POLAR_CHAT_MODELS_DIR`).
pub(crate) fn model_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::var_os("POLAR_CHAT_MODELS_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../../.polar-cache/chat-models")
        })
        .join(name);
    assert!(
        dir.join("tokenizer.json").is_file(),
        "{name}'s model files are missing from {}: install them with `cargo xtask chat-models`",
        dir.display()
    );
    dir
}

pub(crate) fn backend(dialect: Dialect, urls: Vec<String>) -> BackendConfig {
    let mut cfg = BackendConfig::new("test", dialect, urls, "polar-mock");
    cfg.request_timeout_ms = 5_000;
    cfg.connect_timeout_ms = 500;
    cfg
}

pub(crate) fn bash() -> Tool {
    Tool {
        name: "bash".into(),
        description: Some("Run a shell command".into()),
        parameters: polar_json::RawJson::from_value(
            &json!({"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}),
        ),
    }
}

pub(crate) fn request(stream: bool) -> ChatRequest {
    ChatRequest {
        model: "claude-sonnet-4-5".into(),
        messages: vec![
            Message::text(Role::System, "You are a coder."),
            Message::text(Role::User, "make the demo file"),
        ],
        tools: vec![bash()],
        tool_choice: None,
        response_format: None,
        sampling: Sampling::default(),
        stream,
        extra: serde_json::Map::new(),
    }
}

pub(crate) async fn mock_with(dialect: Dialect, turns: Vec<Turn>) -> MockHandle {
    let script = Script {
        final_text: None,
        sessions: vec![SessionScript {
            id: "*".into(),
            turns,
            ..SessionScript::default()
        }],
    };
    mock::start(MockConfig {
        dialect,
        script: Some(script),
        ..MockConfig::default()
    })
    .await
    .unwrap()
}

fn thinking_tool_turn() -> Turn {
    Turn {
        think: Some("I need a file — let me use bash.".into()),
        text: Some("Créating it.".into()),
        tool_calls: vec![polar_mock::script::ScriptedCall {
            shell: Some("echo polar > polar-demo.txt".into()),
            ..Default::default()
        }],
        ..Turn::default()
    }
}

/// Every event until the end; the error that ended it, if any.
pub(crate) async fn drain(stream: &mut ChatStream) -> (Vec<StreamEvent>, Option<InferenceError>) {
    let mut events = Vec::new();
    while let Some(e) = stream.next().await {
        match e {
            Ok(ev) => events.push(ev),
            Err(err) => return (events, Some(err)),
        }
    }
    (events, None)
}

fn kinds(events: &[StreamEvent]) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for e in events {
        let k = match e {
            StreamEvent::Start { .. } => "start",
            StreamEvent::ReasoningDelta { .. } => "reasoning",
            StreamEvent::ReasoningDone { .. } => "reasoning_done",
            StreamEvent::TextDelta { .. } => "text",
            StreamEvent::ToolCallStart { .. } => "tool_start",
            StreamEvent::ToolCallDelta { .. } => "tool_args",
            StreamEvent::Finish { .. } => "finish",
        };
        if out.last() != Some(&k) {
            out.push(k);
        }
    }
    out
}

async fn check_full_turn(dialect: Dialect, stream: bool) {
    let mock = mock_with(dialect, vec![thinking_tool_turn()]).await;
    let client = Client::new(backend(dialect, vec![mock.url()])).unwrap();
    let req = request(stream);
    let mut s = client.chat("s-1", &req).await.unwrap();
    let (events, err) = drain(&mut s).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(
        kinds(&events),
        [
            "start",
            "reasoning",
            "reasoning_done",
            "text",
            "tool_start",
            "tool_args",
            "finish"
        ]
    );
    let tokens = s.tokens();
    let info = s.backend().clone();
    let timings = s.timings().clone();
    let done = polar_inference::stream::assemble(&events, tokens.clone()).unwrap();
    assert_eq!(done.model, "claude-sonnet-4-5");
    assert_eq!(
        done.message.reasoning.as_ref().map(|r| r.text.as_str()),
        Some("I need a file — let me use bash.")
    );
    assert_eq!(done.message.joined_text(), "Créating it.");
    assert_eq!(done.message.tool_calls.len(), 1);
    assert_eq!(done.message.tool_calls[0].name, "bash");
    assert_eq!(
        done.message.tool_calls[0].arguments,
        r#"{"command":"echo polar > polar-demo.txt"}"#
    );
    assert!(done.message.tool_calls[0].id.starts_with("call_"));
    assert_eq!(done.finish_reason, FinishReason::ToolCalls);

    let expected_prompt = tokenizer::encode(&render_prompt(
        &req.messages,
        &req.tools,
        &TemplateOptions::default(),
        true,
    ));
    assert_eq!(tokens.prompt_token_ids.as_ref(), Some(&expected_prompt));
    let response = tokens.response_token_ids.unwrap();
    assert_eq!(response.len(), tokens.response_logprobs.unwrap().len());
    assert_eq!(response.last(), Some(&tokenizer::IM_END));
    assert_eq!(done.usage.prompt_tokens as usize, expected_prompt.len());
    assert_eq!(done.usage.completion_tokens as usize, response.len());
    let text = tokenizer::decode(&response).unwrap();
    assert!(text.starts_with("<think>\nI need a file"), "{text}");
    assert_eq!(info.replica, mock.url());
    assert_eq!(info.served_model, "polar-mock");
    assert_eq!(info.weight_version.as_deref(), Some("0"));
    assert_eq!(info.attempts, 1);
    assert!(timings.head.is_some() && timings.first_token.is_some() && timings.finished.is_some());
    mock.stop().await;
}

#[tokio::test]
async fn vllm_streamed_turn() {
    check_full_turn(Dialect::Vllm, true).await;
}

#[tokio::test]
async fn vllm_turn_for_a_non_streaming_harness_call() {
    check_full_turn(Dialect::Vllm, false).await;
}

#[tokio::test]
async fn sglang_streamed_turn() {
    check_full_turn(Dialect::Sglang, true).await;
}

#[tokio::test]
async fn sglang_turn_for_a_non_streaming_harness_call() {
    check_full_turn(Dialect::Sglang, false).await;
}

#[tokio::test]
async fn vllm_events_arrive_as_generated() {
    let cfg = MockConfig {
        token_latency: Duration::from_millis(30),
        ..MockConfig::default()
    };
    let mock = mock::start(cfg).await.unwrap();
    let client = Client::new(backend(Dialect::Vllm, vec![mock.url()])).unwrap();
    let started = Instant::now();
    let mut s = client.chat("s-2", &request(true)).await.unwrap();
    let mut first_tool = None;
    let mut finish = None;
    while let Some(e) = s.next().await {
        match e.unwrap() {
            StreamEvent::ToolCallStart { .. } => first_tool = Some(started.elapsed()),
            StreamEvent::Finish { .. } => finish = Some(started.elapsed()),
            _ => {}
        }
    }
    let (first_tool, finish) = (first_tool.unwrap(), finish.unwrap());
    let n = s.tokens().response_token_ids.unwrap().len() as u32;
    assert!(finish >= Duration::from_millis(30) * (n - 1));
    assert!(
        finish - first_tool >= Duration::from_millis(30) * 5,
        "streamed, not buffered: {first_tool:?} vs {finish:?}"
    );
    mock.stop().await;
}

#[tokio::test]
async fn multi_turn_prompts_extend_through_the_client() {
    let dialect = Dialect::Vllm;
    let turns = vec![
        thinking_tool_turn(),
        Turn {
            think: Some("ok".into()),
            text: Some("done".into()),
            ..Turn::default()
        },
    ];
    let mock = mock_with(dialect, turns).await;
    let client = Client::new(backend(dialect, vec![mock.url()])).unwrap();
    let mut req = request(true);
    let first = client
        .chat("s-3", &req)
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let t1 = first.response.tokens.clone();
    let mut reply = first.response.message.clone();
    reply.reasoning = reply.reasoning.map(|r| Reasoning {
        text: r.text,
        ..Reasoning::default()
    });
    let call: ToolCall = reply.tool_calls[0].clone();
    req.messages.push(reply);
    let mut result = Message::text(Role::Tool, "");
    result.tool_call_id = Some(call.id);
    req.messages.push(result);
    let second = client
        .chat("s-3", &req)
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let earlier: Vec<u32> = t1
        .prompt_token_ids
        .unwrap()
        .into_iter()
        .chain(t1.response_token_ids.unwrap())
        .collect();
    let prompt2 = second.response.tokens.prompt_token_ids.unwrap();
    assert_eq!(&prompt2[..earlier.len()], earlier.as_slice());
    assert_eq!(second.response.message.joined_text(), "done");
    assert_eq!(
        second.response.usage.cached_tokens,
        Some(earlier.len() as u32)
    );
    mock.stop().await;
}

/// One thinking tool turn, then its reply sent back with its reasoning and
/// a tool result: whether the second prompt extends the first prompt +
/// response, i.e. whether the server's template got the reasoning back.
async fn reasoning_kept(
    dialect: Dialect,
    server_reads: Option<mock::HistoryReasoning>,
    field: Option<ReasoningField>,
) -> bool {
    let script = Script {
        final_text: None,
        sessions: vec![SessionScript {
            id: "*".into(),
            turns: vec![
                thinking_tool_turn(),
                Turn {
                    text: Some("done".into()),
                    ..Turn::default()
                },
            ],
            ..SessionScript::default()
        }],
    };
    let mock = mock::start(MockConfig {
        dialect,
        script: Some(script),
        history_reasoning: server_reads,
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let mut cfg = backend(dialect, vec![mock.url()]);
    cfg.reasoning_field = field;
    let client = Client::new(cfg).unwrap();
    let mut req = request(false);
    let first = client
        .chat("s-r", &req)
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let reply = first.response.message.clone();
    assert!(reply.reasoning.as_ref().is_some_and(|r| !r.text.is_empty()));
    let call = reply.tool_calls[0].clone();
    req.messages.push(reply);
    let mut result = Message::text(Role::Tool, "done");
    result.tool_call_id = Some(call.id);
    req.messages.push(result);
    let second = client
        .chat("s-r", &req)
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    mock.stop().await;
    let t1 = first.response.tokens;
    let earlier: Vec<u32> = t1
        .prompt_token_ids
        .unwrap()
        .into_iter()
        .chain(t1.response_token_ids.unwrap())
        .collect();
    second
        .response
        .tokens
        .prompt_token_ids
        .unwrap()
        .starts_with(&earlier)
}

/// Earlier reasoning reaches the server's template only in the field the
/// server reads: with the default setting (per dialect) and with a setting
/// naming that field the next prompt extends the last one; a setting naming
/// the other field, or none, loses the reasoning (the mock reads requests
/// as the real server does, so a wrong setting shows).
#[tokio::test]
async fn earlier_reasoning_is_kept_only_in_the_field_the_server_reads() {
    use mock::HistoryReasoning as Reads;
    for (dialect, reads, field, kept) in [
        (Dialect::Vllm, None, None, true),
        (Dialect::Sglang, None, None, true),
        (Dialect::Vllm, None, Some(ReasoningField::Reasoning), true),
        (
            Dialect::Vllm,
            None,
            Some(ReasoningField::ReasoningContent),
            false,
        ),
        (Dialect::Vllm, None, Some(ReasoningField::Both), true),
        (Dialect::Vllm, None, Some(ReasoningField::None), false),
        (
            Dialect::Sglang,
            None,
            Some(ReasoningField::ReasoningContent),
            true,
        ),
        (
            Dialect::Sglang,
            None,
            Some(ReasoningField::Reasoning),
            false,
        ),
        (Dialect::Sglang, None, Some(ReasoningField::Both), true),
        (Dialect::Sglang, None, Some(ReasoningField::None), false),
        // vLLM renaming the deprecated field takes either.
        (
            Dialect::Vllm,
            Some(Reads::Either),
            Some(ReasoningField::ReasoningContent),
            true,
        ),
        (
            Dialect::Vllm,
            Some(Reads::Either),
            Some(ReasoningField::None),
            false,
        ),
    ] {
        assert_eq!(
            reasoning_kept(dialect, reads, field).await,
            kept,
            "{dialect:?}, server reads {reads:?}, sent as {field:?}"
        );
    }
}

#[tokio::test]
async fn mid_stream_disconnect_is_a_distinct_error_after_the_events() {
    for dialect in [Dialect::Vllm, Dialect::Sglang] {
        let turn = Turn {
            text: Some("one two three four five six".into()),
            disconnect_after: Some(6),
            ..Turn::default()
        };
        let mock = mock_with(dialect, vec![turn]).await;
        let client = Client::new(backend(dialect, vec![mock.url()])).unwrap();
        let mut s = client.chat("s-4", &request(true)).await.unwrap();
        let (events, err) = drain(&mut s).await;
        if dialect == Dialect::Sglang {
            // A whole reply cut: nothing of it was yielded, so it is sent
            // again (to the only replica) and served.
            assert!(err.is_none(), "{err:?}");
            assert!(matches!(events.last(), Some(StreamEvent::Finish { .. })));
            assert_eq!(s.resumed().map(|r| r.part_tokens[0]), Some(0));
            mock.stop().await;
            continue;
        }
        match err {
            Some(InferenceError::StreamCut { events: n, .. }) => {
                assert_eq!(n, events.len());
                if dialect == Dialect::Vllm {
                    assert_eq!(kinds(&events), ["start", "text"]);
                    let text: String = events
                        .iter()
                        .filter_map(|e| match e {
                            StreamEvent::TextDelta { text } => Some(text.as_str()),
                            _ => None,
                        })
                        .collect();
                    // Six tokens: "one", " ", "two", " ", "thr", "ee".
                    assert_eq!(text, "one two three");
                    assert_eq!(events.len(), 1 + 6);
                } else {
                    assert!(events.is_empty(), "a whole reply cut: nothing to replay");
                }
            }
            other => panic!("{dialect:?}: expected StreamCut, got {other:?}"),
        }
        assert!(s.next().await.is_none());
        mock.stop().await;
    }
}

#[tokio::test]
async fn an_abort_finish_is_an_error_with_the_tokens_before_it() {
    // (No token before the abort, or a whole SGLang reply that ends with
    // one: none of its output is yielded, and the request is sent again,
    // see `failover::an_abort_before_any_output_is_sent_again`.)
    {
        let dialect = Dialect::Vllm;
        for (after, streamed) in [(3, true), (3, false)] {
            let turn = Turn {
                text: Some("one two three four five six".into()),
                abort_after: Some(after),
                ..Turn::default()
            };
            let mock = mock_with(dialect, vec![turn]).await;
            let client = Client::new(backend(dialect, vec![mock.url()])).unwrap();
            let mut s = client.chat("s-a", &request(streamed)).await.unwrap();
            let (events, err) = drain(&mut s).await;
            let what = format!("{dialect:?} after {after} streamed {streamed}");
            match err {
                Some(InferenceError::Aborted { events: n, .. }) => assert_eq!(n, events.len()),
                other => panic!("{what}: expected Aborted, got {other:?}"),
            }
            // Never relayed as a finish: the turn did not end.
            assert!(
                !events
                    .iter()
                    .any(|e| matches!(e, StreamEvent::Finish { .. })),
                "{what}"
            );
            let (ids, _) = s.response_tokens();
            assert_eq!(ids.len(), after as usize, "{what}");
            assert!(s.next().await.is_none());
            let failures = client.pool().stats().replicas[0].failures;
            assert_eq!(failures, 0, "{what}: an abort is no failure of the replica");
            mock.stop().await;
        }
    }
}

#[tokio::test]
async fn backend_http_error_is_classified() {
    for dialect in [Dialect::Vllm, Dialect::Sglang] {
        let mock = mock::start(MockConfig {
            dialect,
            fail_rate: 1.0,
            ..MockConfig::default()
        })
        .await
        .unwrap();
        let client = Client::new(backend(dialect, vec![mock.url()])).unwrap();
        match client.chat("s-5", &request(true)).await {
            Err(InferenceError::Status {
                status: 500, body, ..
            }) => assert!(body.contains("injected failure")),
            other => panic!("expected HTTP 500, got {other:?}"),
        }
        assert_eq!(client.pool().stats().replicas[0].failures, 1);
        mock.stop().await;
    }
}

#[tokio::test]
async fn slow_backend_times_out() {
    let mock = mock::start(MockConfig {
        ttft: Duration::from_secs(1),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let mut cfg = backend(Dialect::Vllm, vec![mock.url()]);
    cfg.request_timeout_ms = 300;
    cfg.connect_timeout_ms = 200;
    let client = Client::new(cfg).unwrap();
    let started = Instant::now();
    let result = match client.chat("s-6", &request(true)).await {
        Ok(mut s) => drain(&mut s).await.1,
        Err(e) => Some(e),
    };
    assert!(
        matches!(result, Some(InferenceError::Timeout { .. })),
        "{result:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));

    let sg = mock::start(MockConfig {
        dialect: Dialect::Sglang,
        ttft: Duration::from_secs(1),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let mut cfg = backend(Dialect::Sglang, vec![sg.url()]);
    cfg.request_timeout_ms = 300;
    cfg.connect_timeout_ms = 200;
    let client = Client::new(cfg).unwrap();
    let err = client.chat("s-6", &request(false)).await.unwrap_err();
    assert!(err.is_timeout() && err.reached_backend(), "{err:?}");
    mock.stop().await;
    sg.stop().await;
}

#[tokio::test]
async fn length_finish_and_clamped_max_tokens() {
    let mock = mock_with(
        Dialect::Vllm,
        vec![Turn {
            text: Some("a fairly long answer here".into()),
            ..Turn::default()
        }],
    )
    .await;
    let mut cfg = backend(Dialect::Vllm, vec![mock.url()]);
    cfg.max_tokens_clamp = Some(4);
    let client = Client::new(cfg).unwrap();
    let mut req = request(true);
    req.sampling.max_tokens = Some(100);
    let done = client
        .chat("s-7", &req)
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(done.response.finish_reason, FinishReason::Length);
    assert_eq!(done.response.tokens.response_token_ids.unwrap().len(), 4);
    assert_eq!(done.response.message.joined_text(), "a fairly");
    mock.stop().await;
}

#[tokio::test]
async fn legacy_reasoning_field_and_multi_token_chunks() {
    let cfg = MockConfig {
        reasoning_field: polar_mock::ReasoningField::ReasoningContent,
        tokens_per_chunk: 4,
        script: Some(Script {
            final_text: None,
            sessions: vec![SessionScript {
                id: "*".into(),
                turns: vec![thinking_tool_turn()],
                ..SessionScript::default()
            }],
        }),
        ..MockConfig::default()
    };
    let mock = mock::start(cfg).await.unwrap();
    let client = Client::new(backend(Dialect::Vllm, vec![mock.url()])).unwrap();
    let done = client
        .chat("s-8", &request(true))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(
        kinds(&done.events),
        [
            "start",
            "reasoning",
            "reasoning_done",
            "text",
            "tool_start",
            "tool_args",
            "finish"
        ]
    );
    assert_eq!(
        done.response.message.reasoning.as_ref().unwrap().text,
        "I need a file — let me use bash."
    );
    assert_eq!(done.response.message.joined_text(), "Créating it.");
    let t = done.response.tokens;
    assert_eq!(
        t.response_token_ids.unwrap().len(),
        t.response_logprobs.unwrap().len()
    );
    mock.stop().await;
}
