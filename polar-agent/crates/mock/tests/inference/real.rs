//! The client against replicas serving real model files (`--model-dir`,
//! installed by `cargo xtask chat-models`) of Qwen3, DeepSeek-V3.1 (with
//! the model card's tool section) and gpt-oss: a reply Polar's output
//! parser of the family reads as the server's parsers do, and a reply cut
//! mid-way resumed token-in into the unfaulted reply.

use std::sync::Arc;

use polar_chat::output::OutputFormat;
use polar_inference::*;
use polar_mock::real::RealModel;
use polar_mock::script::{ScriptedCall, Turn};
use polar_mock::{MockConfig, MockHandle};

use super::failover::scripted;
use super::{backend, model_dir, request};

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

async fn replicas(model: &Arc<RealModel>, turn: &Turn, n: usize) -> Vec<MockHandle> {
    let base = MockConfig {
        model: Some(Arc::clone(model)),
        ..MockConfig::default()
    };
    scripted(&base, turn, n).await
}

#[tokio::test]
async fn a_real_models_reply_cut_mid_way_is_resumed_into_the_unfaulted_reply() {
    let tmp = tempfile::tempdir().unwrap();
    let deepseek = tmp.path().join("deepseek_v3_1");
    polar_mock::real::deepseek::tool_model_dir(&model_dir("deepseek_v3_1"), &deepseek).unwrap();
    for (dir, format) in [
        (model_dir("qwen3"), OutputFormat::Qwen3),
        (deepseek, OutputFormat::DeepseekV3),
        (model_dir("gptoss"), OutputFormat::GptOss),
    ] {
        resumed_as_unfaulted(Arc::new(RealModel::load(&dir).unwrap()), format).await;
    }
}

async fn resumed_as_unfaulted(model: Arc<RealModel>, format: OutputFormat) {
    let chat = |urls: Vec<String>| {
        let mut cfg = backend(Dialect::Vllm, urls);
        cfg.output_parser = Some(format);
        Client::new(cfg).unwrap()
    };
    let m = replicas(&model, &turn(), 1).await;
    let plain = chat(vec![m[0].url()])
        .chat("s", &request(true))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap()
        .response;
    for m in m {
        m.stop().await;
    }
    // DeepSeek-V3.1 out of thinking mode writes no reasoning.
    let reasoning =
        (format != OutputFormat::DeepseekV3).then_some("I need the demo file, so bash it is.");
    assert_eq!(
        plain.message.reasoning.as_ref().map(|r| r.text.trim()),
        reasoning,
        "{format:?}"
    );
    assert_eq!(plain.message.tool_calls.len(), 1, "{format:?}");
    let total = plain.tokens.response_token_ids.as_ref().unwrap().len() as u32;
    for at in [3, total / 2, total - 2] {
        let fault = Turn {
            disconnect_after: Some(at),
            ..turn()
        };
        let m = replicas(&model, &fault, 2).await;
        let done = chat(m.iter().map(MockHandle::url).collect())
            .chat("s", &request(true))
            .await
            .unwrap()
            .collect()
            .await
            .unwrap_or_else(|e| panic!("{format:?} cut at {at}: {e}"));
        assert_eq!(done.response.tokens, plain.tokens, "{format:?} cut at {at}");
        assert_eq!(
            done.response.message.tool_calls.len(),
            1,
            "{format:?} cut at {at}"
        );
        for m in m {
            m.stop().await;
        }
    }
}
