//! Token-faithful serving (`model_dir`) against replicas serving Qwen3's
//! real files as vLLM serves them (`--model-dir`, installed by `cargo
//! xtask chat-models`): a session of tool calls whose replies are echoed
//! back as a harness echoes them (the text the reply had, or "\n\n", no
//! reasoning) is one chain, each prompt the last one's ids and generated
//! ids plus the new messages' ids; the same session through the chat
//! endpoint (the server renders the template) is not, as the real world
//! shows. DeepSeek-V3.1's and gpt-oss's real files are served the same
//! way (the mock writes their output formats): token-faithfully one chain;
//! through the chat endpoint gpt-oss drifts, DeepSeek-V3.1 out of thinking
//! mode does not.

use std::sync::Arc;

use polar_chat::output::OutputFormat;
use polar_chat::{ChatRequest, Message, Role, ToolCall};
use polar_faithful::{Fresh, Origin, Serving};
use polar_inference::*;
use polar_mock::real::RealModel;
use polar_mock::script::{Script, ScriptedCall, SessionScript, StepBy, Turn};
use polar_mock::{self as mock, MockConfig, MockHandle};

use super::{backend, model_dir, qwen3_dir, request};

/// Three tool calls with reasoning, then an answer.
fn script() -> Script {
    let call = |k: usize| Turn {
        think: Some(format!("Step {k}: the listing tells me what to do next.")),
        tool_calls: vec![ScriptedCall {
            shell: Some(format!("ls -la src/{k}")),
            ..ScriptedCall::default()
        }],
        ..Turn::default()
    };
    Script {
        final_text: Some("All done: the test passes.".into()),
        sessions: vec![SessionScript {
            id: "*".into(),
            step_by: StepBy::ToolResults,
            turns: (0..3).map(call).collect(),
            ..SessionScript::default()
        }],
    }
}

async fn replica(dialect: Dialect) -> MockHandle {
    replica_of(dialect, &qwen3_dir()).await
}

async fn replica_of(dialect: Dialect, dir: &std::path::Path) -> MockHandle {
    mock::start(MockConfig {
        dialect,
        model: Some(Arc::new(RealModel::load(dir).unwrap())),
        script: Some(script()),
        ..MockConfig::default()
    })
    .await
    .unwrap()
}

/// What the harness sends back for a reply: its text (or "\n\n" when it
/// had none, as vLLM's hermes parser returns it for Qwen3), its calls, no
/// reasoning.
fn echo(reply: &Message, format: OutputFormat) -> Message {
    let mut m = Message::new(Role::Assistant);
    let text = reply.joined_text();
    m.content = vec![polar_chat::Part::Text {
        text: if text.is_empty() && format == OutputFormat::Qwen3 {
            "\n\n".into()
        } else {
            text.into()
        },
    }];
    m.tool_calls = reply.tool_calls.clone();
    m
}

fn result(call: &ToolCall, k: usize) -> Message {
    let mut m = Message::text(Role::Tool, format!("total {k}\nfile_{k}.rs"));
    m.tool_call_id = Some(call.id.clone());
    m
}

/// Runs the session; returns each call's prompt ids, response ids and how
/// its prompt was served.
async fn session(client: &Client) -> Vec<(Vec<u32>, Vec<u32>, Option<Serving>)> {
    session_in(client, OutputFormat::Qwen3).await
}

/// [`session`] of a model writing `format`.
async fn session_in(
    client: &Client,
    format: OutputFormat,
) -> Vec<(Vec<u32>, Vec<u32>, Option<Serving>)> {
    let mut req: ChatRequest = request(true);
    let mut out = Vec::new();
    for k in 0..4 {
        let done = client
            .chat("s", &req)
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let tokens = done.response.tokens.clone();
        out.push((
            tokens.prompt_token_ids.unwrap(),
            tokens.response_token_ids.unwrap(),
            done.backend.serving.clone(),
        ));
        let reply = done.response.message;
        if reply.tool_calls.is_empty() {
            break;
        }
        req.messages.push(echo(&reply, format));
        let call = reply.tool_calls[0].clone();
        req.messages.push(result(&call, k));
    }
    out
}

fn faithful(url: String, dialect: Dialect) -> Client {
    let mut cfg = backend(dialect, vec![url]);
    cfg.output_parser = Some(OutputFormat::Qwen3);
    cfg.model_dir = Some(qwen3_dir());
    Client::new(cfg).unwrap()
}

#[tokio::test]
async fn a_session_served_token_faithfully_is_one_chain() {
    for dialect in [Dialect::Vllm, Dialect::Sglang] {
        let m = replica(dialect).await;
        let calls = session(&faithful(m.url(), dialect)).await;
        assert_eq!(calls.len(), 4, "{dialect:?}: three calls then the answer");
        assert_eq!(
            calls[0].2,
            Some(Serving::TokenIn {
                prompt: Origin::Fresh {
                    reason: Fresh::FirstCall
                }
            })
        );
        assert_one_chain(&calls, &format!("{dialect:?}"));
        m.stop().await;
    }
}

/// Each call after the first extends the last one's prompt and generated
/// ids.
fn assert_one_chain(calls: &[(Vec<u32>, Vec<u32>, Option<Serving>)], what: &str) {
    for k in 1..calls.len() {
        let (before, generated) = (&calls[k - 1].0, &calls[k - 1].1);
        let prompt = &calls[k].0;
        let kept = before.len() + generated.len();
        assert!(
            prompt.len() > kept && prompt[..before.len()] == before[..],
            "{what} call {k}: extends the last prompt"
        );
        assert_eq!(
            &prompt[before.len()..kept],
            generated.as_slice(),
            "{what} call {k}: the model's own ids, reasoning included"
        );
        assert!(
            matches!(calls[k].2, Some(Serving::TokenIn { prompt: Origin::Extends { call, kept: n, .. } }) if call == k as u64 - 1 && n == kept),
            "{what} call {k}: {:?}",
            calls[k].2
        );
    }
}

#[tokio::test]
async fn deepseek_v3_1_and_gpt_oss_sessions_are_one_chain_token_faithfully() {
    let tmp = tempfile::tempdir().unwrap();
    // DeepSeek's template lists no tools: the model card's tool section.
    let deepseek = tmp.path().join("deepseek_v3_1");
    polar_mock::real::deepseek::tool_model_dir(&model_dir("deepseek_v3_1"), &deepseek).unwrap();
    for (name, dir, format) in [
        ("deepseek_v3_1", deepseek, OutputFormat::DeepseekV3),
        ("gptoss", model_dir("gptoss"), OutputFormat::GptOss),
    ] {
        let m = replica_of(Dialect::Vllm, &dir).await;
        let mut cfg = backend(Dialect::Vllm, vec![m.url()]);
        cfg.output_parser = Some(format);
        // Server-rendered: the reply is read as vLLM's parsers read it.
        let served = session_in(&Client::new(cfg.clone()).unwrap(), format).await;
        assert_eq!(served.len(), 4, "{name}: three calls then the answer");
        let drifted = served.windows(2).any(|pair| {
            let seen: Vec<u32> = pair[0].0.iter().chain(&pair[0].1).copied().collect();
            !pair[1].0.starts_with(&seen)
        });
        // gpt-oss's template writes a call's recipient before its channel
        // (the model after it) and the text before a call as reasoning;
        // DeepSeek-V3.1's, out of thinking mode, renders a turn of text
        // and calls as the model wrote it (the arguments as `tojson`
        // writes them), so its history does not drift here.
        assert_eq!(
            drifted,
            format == OutputFormat::GptOss,
            "{name}: whether the server's rendering re-renders the history"
        );
        // Token-faithful: one chain.
        cfg.model_dir = Some(dir.clone());
        let calls = session_in(&Client::new(cfg).unwrap(), format).await;
        assert_eq!(calls.len(), 4, "{name}: three calls then the answer");
        assert_one_chain(&calls, name);
        m.stop().await;
    }
}

#[tokio::test]
async fn the_same_session_through_the_chat_endpoint_drifts() {
    let m = replica(Dialect::Vllm).await;
    let mut cfg = backend(Dialect::Vllm, vec![m.url()]);
    cfg.output_parser = Some(OutputFormat::Qwen3);
    let calls = session(&Client::new(cfg).unwrap()).await;
    assert_eq!(calls.len(), 4);
    for (k, pair) in calls.windows(2).enumerate() {
        let (before, generated) = (&pair[0].0, &pair[0].1);
        let seen: Vec<u32> = before.iter().chain(generated).copied().collect();
        assert!(
            !pair[1].0.starts_with(&seen),
            "call {}: the server's rendering re-renders the history",
            k + 1
        );
        assert_eq!(pair[1].2, Some(Serving::ChatEndpoint { reason: None }));
    }
    m.stop().await;
}

#[tokio::test]
async fn what_the_template_or_the_context_cannot_take_is_refused_before_anything_is_sent() {
    let m = replica(Dialect::Vllm).await;
    let client = faithful(m.url(), Dialect::Vllm);
    let mut req = request(false);
    let mut img = Message::new(Role::User);
    img.content = vec![polar_chat::Part::Image {
        media_type: Some("image/png".into()),
        data: Some("iVBORw0KGgo=".into()),
        url: None,
    }];
    req.messages = vec![img];
    let err = client.chat("s", &req).await.unwrap_err();
    assert!(matches!(err, InferenceError::Unrenderable { .. }), "{err}");
    assert!(err.to_string().contains("image"), "{err}");
    // The backend serves on.
    let done = client
        .chat("s2", &request(true))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert!(!done.response.message.tool_calls.is_empty());
    m.stop().await;

    // A replica whose context the prompt does not fit (its max_model_len,
    // GET /v1/models): refused with the figures, nothing generated.
    let small = mock::start(MockConfig {
        model: Some(Arc::new(RealModel::load(&qwen3_dir()).unwrap())),
        script: Some(script()),
        max_model_len: 64,
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let err = faithful(small.url(), Dialect::Vllm)
        .chat("s", &request(true))
        .await
        .unwrap_err();
    let overflow = err.context_overflow().expect("a context overflow");
    assert_eq!(overflow.max, 64, "{err}");
    assert!(overflow.prompt_too_long(), "{err}");
    small.stop().await;
}
