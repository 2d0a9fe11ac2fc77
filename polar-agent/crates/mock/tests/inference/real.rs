//! The client against replicas serving Qwen3's real files (`--model-dir`,
//! installed by `cargo xtask chat-models`): a reply Polar's Qwen3 output
//! parser reads as the server's parsers do, and a reply cut mid-way
//! resumed token-in into the unfaulted reply.

use std::sync::Arc;

use polar_chat::output::OutputFormat;
use polar_inference::*;
use polar_mock::real::RealModel;
use polar_mock::script::{ScriptedCall, Turn};
use polar_mock::{MockConfig, MockHandle};

use super::failover::scripted;
use super::{backend, qwen3_dir, request};

fn qwen3() -> Arc<RealModel> {
    Arc::new(RealModel::load(&qwen3_dir()).unwrap())
}

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
    let model = qwen3();
    let chat = |urls: Vec<String>| {
        let mut cfg = backend(Dialect::Vllm, urls);
        cfg.output_parser = Some(OutputFormat::Qwen3);
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
    assert_eq!(
        plain.message.reasoning.as_ref().map(|r| r.text.trim()),
        Some("I need the demo file, so bash it is.")
    );
    assert_eq!(plain.message.tool_calls.len(), 1);
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
            .unwrap_or_else(|e| panic!("cut at {at}: {e}"));
        assert_eq!(done.response.tokens, plain.tokens, "cut at {at}");
        assert_eq!(done.response.message.tool_calls.len(), 1, "cut at {at}");
        for m in m {
            m.stop().await;
        }
    }
}
