//! Token counts from the backend ([`Client::count_tokens`]) against the
//! mock on loopback: equal to the prompt length of a real call with the
//! same request on both dialects (SGLang's tool-choice rendering
//! included), an error when the backend has no tokenize endpoint (the
//! agent then answers its labelled estimate), and requests that need
//! constrained decoding refused by a backend configured without it.

use polar_chat::{ResponseFormat, ToolChoice};
use polar_inference::*;
use polar_mock::{self as mock, MockConfig};

use super::{backend, drain, request};

#[tokio::test]
async fn counts_equal_the_prompt_of_a_real_call() {
    for dialect in [Dialect::Vllm, Dialect::Sglang] {
        let mock = mock::start(MockConfig {
            dialect,
            ..MockConfig::default()
        })
        .await
        .unwrap();
        let client = Client::new(backend(dialect, vec![mock.url()])).unwrap();
        for choice in [None, Some(ToolChoice::None)] {
            let mut req = request(false);
            req.tool_choice = choice.clone();
            let counted = client.count_tokens("s-count", &req).await.unwrap();
            let mut s = client.chat("s-count", &req).await.unwrap();
            let (_, err) = drain(&mut s).await;
            assert!(err.is_none(), "{err:?}");
            let prompt = s.tokens().prompt_token_ids.unwrap();
            assert_eq!(counted, prompt.len() as u64, "{dialect:?} {choice:?}");
        }
        mock.stop().await;
    }
}

#[tokio::test]
async fn a_backend_without_the_endpoint_is_an_error() {
    // A vLLM server has `/tokenize`, not SGLang's `/v1/tokenize`.
    let mock = mock::start(MockConfig::default()).await.unwrap();
    let client = Client::new(backend(Dialect::Sglang, vec![mock.url()])).unwrap();
    match client.count_tokens("s", &request(false)).await {
        Err(InferenceError::Status { status: 404, .. }) => {}
        other => panic!("{other:?}"),
    }
    let dead = Client::new(backend(Dialect::Vllm, vec!["http://127.0.0.1:1".into()])).unwrap();
    assert!(matches!(
        dead.count_tokens("s", &request(false)).await,
        Err(InferenceError::Unreachable { .. })
    ));
    mock.stop().await;
}

#[tokio::test]
async fn constrained_decoding_can_be_switched_off() {
    let mock = mock::start(MockConfig::default()).await.unwrap();
    let mut cfg = backend(Dialect::Vllm, vec![mock.url()]);
    cfg.constrained_decoding = false;
    let client = Client::new(cfg).unwrap();
    let mut structured = request(false);
    structured.response_format = Some(ResponseFormat::JsonObject);
    let mut required = request(false);
    required.tool_choice = Some(ToolChoice::Required);
    for req in [structured, required] {
        match client.chat("s", &req).await {
            Err(e @ InferenceError::Unsupported { .. }) => assert!(!e.reached_backend()),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("refused before anything is sent"),
        }
    }
    let mut plain = client.chat("s", &request(false)).await.unwrap();
    assert!(drain(&mut plain).await.1.is_none());
    mock.stop().await;
}

#[tokio::test]
async fn structured_output_reaches_the_mock_through_both_dialects() {
    for dialect in [Dialect::Vllm, Dialect::Sglang] {
        let mock = mock::start(MockConfig {
            dialect,
            ..MockConfig::default()
        })
        .await
        .unwrap();
        let client = Client::new(backend(dialect, vec![mock.url()])).unwrap();
        let mut req = request(false);
        req.response_format = Some(ResponseFormat::JsonSchema {
            name: "title".into(),
            schema: serde_json::json!({"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}),
            strict: Some(true),
        });
        let mut s = client.chat("s-json", &req).await.unwrap();
        let (events, err) = drain(&mut s).await;
        assert!(err.is_none(), "{err:?}");
        let done = polar_inference::stream::assemble(&events, s.tokens()).unwrap();
        assert_eq!(
            done.message.joined_text(),
            "{\"title\":\"polar title\"}",
            "{dialect:?}"
        );
        assert!(done.message.tool_calls.is_empty());
        mock.stop().await;
    }
}
