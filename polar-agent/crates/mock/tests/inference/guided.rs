//! Constrained output served token-faithfully (`model_dir`, Qwen3's real
//! files): structured output and forced tool choices go to the token-in
//! endpoint with the dialect's constraint fields, their output is read as
//! the chat endpoint reads it (the JSON as text; a forced choice's JSON as
//! tool calls with fresh ids), and the chain goes on through them: every
//! call extends the one before with the ids the model generated.

use polar_chat::output::OutputFormat;
use polar_chat::{ChatRequest, FinishReason, Message, ResponseFormat, Role, ToolChoice};
use polar_faithful::{Origin, Serving};
use polar_inference::*;
use serde_json::{Value, json};

use super::{backend, qwen3_dir, request};

async fn replica(dialect: Dialect) -> polar_mock::MockHandle {
    polar_mock::start(polar_mock::MockConfig {
        dialect,
        model: Some(std::sync::Arc::new(
            polar_mock::real::RealModel::load(&qwen3_dir()).unwrap(),
        )),
        ..polar_mock::MockConfig::default()
    })
    .await
    .unwrap()
}

fn faithful(url: String, dialect: Dialect) -> Client {
    let mut cfg = backend(dialect, vec![url]);
    cfg.output_parser = Some(OutputFormat::Qwen3);
    cfg.model_dir = Some(qwen3_dir());
    Client::new(cfg).unwrap()
}

/// One call: its prompt ids, response ids, serving and reply.
async fn call(
    client: &Client,
    session: &str,
    req: &ChatRequest,
) -> (Vec<u32>, Vec<u32>, Option<Serving>, Message, FinishReason) {
    let done = client
        .chat(session, req)
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let t = done.response.tokens.clone();
    (
        t.prompt_token_ids.unwrap(),
        t.response_token_ids.unwrap(),
        done.backend.serving.clone(),
        done.response.message,
        done.response.finish_reason,
    )
}

/// The reply as a harness sends it back ("\n\n" for no text, as vLLM's
/// hermes parser gives it for Qwen3), no reasoning.
fn echo(reply: &Message) -> Message {
    let mut m = Message::new(Role::Assistant);
    let text = reply.joined_text();
    m.content = vec![polar_chat::Part::Text {
        text: if text.is_empty() {
            "\n\n".into()
        } else {
            text.into()
        },
    }];
    m.tool_calls = reply.tool_calls.clone();
    m
}

fn result(id: &str, text: &str) -> Message {
    let mut m = Message::text(Role::Tool, text);
    m.tool_call_id = Some(id.to_owned());
    m
}

fn report_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "status": {"type": "string", "enum": ["passed", "failed"]},
            "tests": {"type": "integer", "minimum": 3},
        },
        "required": ["status", "tests"],
        "additionalProperties": false,
    })
}

#[tokio::test]
async fn structured_output_and_a_forced_call_are_served_token_in_in_one_chain() {
    for dialect in [Dialect::Vllm, Dialect::Sglang] {
        let m = replica(dialect).await;
        let client = faithful(m.url(), dialect);
        let mut req = request(false);
        let mut calls = Vec::new();
        // A normal call: the mock's policy calls a tool.
        let first = call(&client, "s", &req).await;
        let tool = first.3.tool_calls[0].clone();
        req.messages.push(echo(&first.3));
        req.messages.push(result(&tool.id, "total 0"));
        calls.push(first);
        // Structured output: the reply's text is JSON the schema allows.
        req.response_format = Some(ResponseFormat::JsonSchema {
            name: "report".into(),
            schema: report_schema(),
            strict: Some(true),
        });
        let structured = call(&client, "s", &req).await;
        let text = structured.3.joined_text();
        let v: Value =
            serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!(structured.3.tool_calls.is_empty(), "{dialect:?}");
        assert_eq!(v["status"], "passed", "{dialect:?}: {v}");
        assert!(
            v["tests"].as_u64().is_some_and(|n| n >= 3),
            "{dialect:?}: {v}"
        );
        assert_eq!(v.as_object().unwrap().len(), 2, "{dialect:?}: {v}");
        req.response_format = None;
        req.messages.push(echo(&structured.3));
        req.messages
            .push(Message::text(Role::User, "Now run the tests."));
        calls.push(structured);
        // A named tool choice: the reply is a call of that tool.
        req.tool_choice = Some(ToolChoice::Tool {
            name: "bash".into(),
        });
        let forced = call(&client, "s", &req).await;
        let c = &forced.3.tool_calls;
        assert_eq!(c.len(), 1, "{dialect:?}: {:?}", forced.3);
        assert_eq!(c[0].name, "bash");
        let args: Value = serde_json::from_str(&c[0].arguments).unwrap();
        assert!(args["command"].is_string(), "{dialect:?}: {args}");
        assert!(forced.3.joined_text().is_empty(), "{dialect:?}: no text");
        assert_ne!(c[0].id, tool.id, "{dialect:?}: a fresh call id");
        assert_eq!(forced.4, FinishReason::ToolCalls);
        req.tool_choice = None;
        req.messages.push(echo(&forced.3));
        req.messages.push(result(&c[0].id, "3 passed"));
        calls.push(forced);
        // And the next call goes on from the forced call's own ids.
        let next = call(&client, "s", &req).await;
        calls.push(next);
        for (k, pair) in calls.windows(2).enumerate() {
            let (before, generated) = (&pair[0].0, &pair[0].1);
            let kept = before.len() + generated.len();
            let prompt = &pair[1].0;
            assert!(prompt.len() > kept, "{dialect:?} call {}", k + 1);
            assert_eq!(
                &prompt[..before.len()],
                before.as_slice(),
                "{dialect:?} call {}",
                k + 1
            );
            assert_eq!(
                &prompt[before.len()..kept],
                generated.as_slice(),
                "{dialect:?} call {}: the generated ids",
                k + 1
            );
            assert!(
                matches!(pair[1].2, Some(Serving::TokenIn { prompt: Origin::Extends { call, kept: n, .. } }) if call == k as u64 && n == kept),
                "{dialect:?} call {}: {:?}",
                k + 1,
                pair[1].2
            );
        }
        m.stop().await;
    }
}

#[tokio::test]
async fn a_required_choice_gives_calls_and_json_mode_an_object() {
    for dialect in [Dialect::Vllm, Dialect::Sglang] {
        let m = replica(dialect).await;
        let client = faithful(m.url(), dialect);
        let mut req = request(false);
        req.tool_choice = Some(ToolChoice::Required);
        let (_, _, serving, reply, finish) = call(&client, "r", &req).await;
        assert!(
            matches!(serving, Some(Serving::TokenIn { .. })),
            "{serving:?}"
        );
        assert_eq!(reply.tool_calls.len(), 1, "{dialect:?}: {reply:?}");
        assert_eq!(reply.tool_calls[0].name, "bash");
        // vLLM and SGLang write the arguments with json.dumps.
        assert!(
            reply.tool_calls[0].arguments.contains("\": "),
            "{:?}",
            reply.tool_calls[0]
        );
        assert_eq!(finish, FinishReason::ToolCalls);
        let mut req = request(true);
        req.response_format = Some(ResponseFormat::JsonObject);
        let (_, _, serving, reply, _) = call(&client, "j", &req).await;
        assert!(
            matches!(serving, Some(Serving::TokenIn { .. })),
            "{serving:?}"
        );
        let v: Value = serde_json::from_str(reply.joined_text().trim()).unwrap();
        assert!(v.is_object(), "{dialect:?}: {v}");
        m.stop().await;
    }
}

#[tokio::test]
async fn what_the_chat_endpoint_keeps_is_labelled_and_no_grammar_is_refused() {
    let m = replica(Dialect::Vllm).await;
    let client = faithful(m.url(), Dialect::Vllm);
    let mut req = request(false);
    req.tool_choice = Some(ToolChoice::Required);
    req.response_format = Some(ResponseFormat::JsonObject);
    let (_, _, serving, _, _) = call(&client, "both", &req).await;
    match serving {
        Some(Serving::ChatEndpoint { reason: Some(why) }) => {
            assert!(why.starts_with("constrained output"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    // A backend without constrained decoding still refuses, token-faithful
    // or not.
    let mut cfg = backend(Dialect::Vllm, vec![m.url()]);
    cfg.output_parser = Some(OutputFormat::Qwen3);
    cfg.model_dir = Some(qwen3_dir());
    cfg.constrained_decoding = false;
    let mut req = request(false);
    req.tool_choice = Some(ToolChoice::Tool {
        name: "bash".into(),
    });
    let err = Client::new(cfg).unwrap().chat("n", &req).await.unwrap_err();
    assert!(matches!(err, InferenceError::Unsupported { .. }), "{err}");
    m.stop().await;
}

/// A harness's structured-output check asked with the main conversation
/// and a question after it (Gemini CLI's next-speaker check) branches off:
/// the main chain's next call still extends the main call.
#[tokio::test]
async fn a_structured_side_check_does_not_break_the_main_chain() {
    let m = replica(Dialect::Vllm).await;
    let client = faithful(m.url(), Dialect::Vllm);
    let mut req = request(false);
    let main = call(&client, "g", &req).await;
    let tool = main.3.tool_calls[0].clone();
    req.messages.push(echo(&main.3));
    let mut check = req.clone();
    check.messages.push(Message::text(
        Role::User,
        "Who speaks next? Answer in JSON.",
    ));
    check.response_format = Some(ResponseFormat::JsonObject);
    let side = call(&client, "g", &check).await;
    assert!(
        matches!(
            side.2,
            Some(Serving::TokenIn {
                prompt: Origin::Extends { call: 0, .. }
            })
        ),
        "{:?}",
        side.2
    );
    req.messages.push(result(&tool.id, "total 0"));
    let next = call(&client, "g", &req).await;
    let kept = main.0.len() + main.1.len();
    assert!(
        matches!(next.2, Some(Serving::TokenIn { prompt: Origin::Extends { call: 0, kept: n, .. } }) if n == kept),
        "{:?}",
        next.2
    );
    m.stop().await;
}
