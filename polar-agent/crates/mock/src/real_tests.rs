//! The mock serving Qwen3's real files (`--model-dir`), over HTTP: chat
//! prompt ids against `transformers.apply_chat_template` (the reference
//! script and Python environment of `polar-template`'s differential test),
//! the drift a harness's echo of a reply makes, token-in calls that
//! continue exactly what the chat path generates, vLLM's parse of the turn,
//! streamed and whole.
//!
//! The model files and the reference environment are installed by
//! `cargo xtask chat-models` (`POLAR_CHAT_MODELS_DIR`,
//! `POLAR_TEMPLATE_PYTHON` name other places); a test without them fails
//! saying so.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use http::{Method, StatusCode};
use serde_json::{Value, json};

use super::real::RealModel;
use super::script::{Script, SessionScript, StepBy, Turn};
use super::tests::request;
use super::*;

const INSTALL: &str = "install them with `cargo xtask chat-models` (or run `cargo xtask test`)";
const THINK: &str = "The listing shows what is there.";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..")
}

fn qwen3_dir() -> PathBuf {
    let root = std::env::var_os("POLAR_CHAT_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".polar-cache/chat-models"));
    let dir = root.join("qwen3");
    assert!(
        dir.join("tokenizer.json").is_file() && dir.join("tokenizer_config.json").is_file(),
        "Qwen3's model files are missing from {}: {INSTALL}",
        dir.display()
    );
    dir
}

fn python() -> PathBuf {
    let python = std::env::var_os("POLAR_TEMPLATE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".polar-cache/venvs/chat-template/bin/python"));
    assert!(
        python.is_file(),
        "the reference Python environment ({}) is missing: {INSTALL}",
        python.display()
    );
    python
}

/// transformers' `{"text", "ids"}` for each case (`{"messages", "tools",
/// "add_generation_prompt", "kwargs"}`), by `polar-template`'s reference
/// script.
fn reference(cases: &[Value]) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("cases.json");
    let output = dir.path().join("out.json");
    std::fs::write(&input, serde_json::to_vec(cases).unwrap()).unwrap();
    let script = workspace_root().join("polar-agent/crates/template/tests/reference.py");
    let run = Command::new(python())
        .arg(&script)
        .arg(qwen3_dir())
        .arg(&input)
        .arg(&output)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "the reference renderer failed ({}): {}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    serde_json::from_slice(&std::fs::read(&output).unwrap()).unwrap()
}

/// Qwen3's files, loaded once per test process.
fn model() -> Arc<RealModel> {
    static MODEL: std::sync::OnceLock<Arc<RealModel>> = std::sync::OnceLock::new();
    Arc::clone(MODEL.get_or_init(|| Arc::new(RealModel::load(&qwen3_dir()).unwrap())))
}

/// A `tool_results` script: a shell call with reasoning, then an answer.
fn script() -> Script {
    Script {
        final_text: Some("All done.".into()),
        sessions: vec![SessionScript {
            id: "*".into(),
            step_by: StepBy::ToolResults,
            turns: vec![Turn {
                think: Some(THINK.into()),
                tool_calls: vec![script::ScriptedCall {
                    name: Some("bash".into()),
                    arguments: Some(json!({"command": "ls -la", "timeout": 30})),
                    shell: None,
                }],
                ..Turn::default()
            }],
            ..SessionScript::default()
        }],
    }
}

async fn mock(dialect: Dialect) -> MockHandle {
    start(MockConfig {
        dialect,
        model: Some(model()),
        script: Some(script()),
        ..MockConfig::default()
    })
    .await
    .unwrap()
}

async fn post(url: &str, body: &Value) -> Value {
    let (status, _, bytes) =
        request(Method::POST, url, Some(body), &[("x-polar-session", "s1")]).await;
    let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    assert_eq!(status, StatusCode::OK, "{v}");
    v
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not ids: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "bash", "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
                       "required": ["command"]}}}])
}

fn first_turn() -> Vec<Value> {
    vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": [{"type": "text", "text": "List the files."}, {"type": "text", "text": "Be brief."}]}),
    ]
}

/// The messages as transformers gets them from vLLM: text parts joined,
/// call arguments as objects, `reasoning` as `reasoning_content`.
fn hf(messages: &[Value]) -> Vec<Value> {
    messages
        .iter()
        .map(|m| {
            let mut m = m.clone();
            if let Some(parts) = m["content"].as_array() {
                let texts: Vec<&str> = parts.iter().filter_map(|p| p["text"].as_str()).collect();
                m["content"] = json!(texts.join("\n"));
            }
            if let Some(r) = m.as_object_mut().and_then(|o| o.remove("reasoning")) {
                m["reasoning_content"] = r;
            }
            if let Some(calls) = m["tool_calls"].as_array_mut() {
                for c in calls {
                    let args = c["function"]["arguments"].as_str().unwrap().to_owned();
                    c["function"]["arguments"] = serde_json::from_str(&args).unwrap();
                }
            }
            m
        })
        .collect()
}

#[tokio::test]
async fn chat_prompt_ids_are_transformers_ids_for_the_same_conversation() {
    let mock = mock(Dialect::Vllm).await;
    let url = format!("{}/v1/chat/completions", mock.url());
    let call = json!({"id": "call_1", "type": "function",
        "function": {"name": "bash", "arguments": "{\"command\": \"ls -la\", \"timeout\": 30}"}});
    let mut history = first_turn();
    history.push(json!({"role": "assistant", "content": "\n\n", "reasoning": "\nLooking.\n", "tool_calls": [call]}));
    history.push(json!({"role": "tool", "tool_call_id": "call_1", "content": "a.txt\nb.txt"}));
    let mut later = history.clone();
    later.push(json!({"role": "assistant", "content": "Two files.", "reasoning": "Counted."}));
    later.push(json!({"role": "user", "content": "Now read a.txt."}));
    // Two calls with text before them, their results as text parts, no
    // system message.
    let calls = json!([
        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{\"command\":\"ls\"}"}},
        {"id": "c2", "type": "function", "function": {"name": "bash", "arguments": "{\"command\": \"cat a.txt\", \"timeout\": 5}"}}
    ]);
    let parallel = vec![
        json!({"role": "user", "content": "Show me a.txt and the listing."}),
        json!({"role": "assistant", "content": [{"type": "text", "text": "Both at once."}], "tool_calls": calls}),
        json!({"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "a.txt"}]}),
        json!({"role": "tool", "tool_call_id": "c2", "content": "hello ü 🦀"}),
        json!({"role": "assistant", "content": "It says hello.", "reasoning": ""}),
        json!({"role": "user", "content": "<tool_response>\nnot a result\n</tool_response>"}),
    ];
    let conversations = [
        (parallel.clone(), true, json!({})),
        (parallel, false, json!({"enable_thinking": false})),
        (first_turn(), true, json!({})),
        (first_turn(), false, json!({})),
        (first_turn(), true, json!({"enable_thinking": false})),
        (history.clone(), true, json!({})),
        (history, true, json!({"enable_thinking": false})),
        (later.clone(), true, json!({})),
        (later, false, json!({"enable_thinking": true})),
    ];
    let mut cases = Vec::new();
    let mut ours = Vec::new();
    for (messages, with_tools, kwargs) in &conversations {
        let mut body = json!({"model": "m", "messages": messages, "chat_template_kwargs": kwargs,
            "return_token_ids": true, "max_tokens": 1});
        if *with_tools {
            body["tools"] = tools();
        }
        let reply = post(&url, &body).await;
        let prompt = ids(&reply["prompt_token_ids"]);
        let counted = post(&format!("{}/tokenize", mock.url()), &body).await;
        assert_eq!(ids(&counted["tokens"]), prompt, "/tokenize counts the same");
        ours.push(prompt);
        cases.push(json!({"messages": hf(messages), "tools": if *with_tools { tools() } else { Value::Null },
            "add_generation_prompt": true, "kwargs": kwargs}));
    }
    let theirs = reference(&cases);
    let model = model();
    for (i, (ours, theirs)) in ours.iter().zip(&theirs).enumerate() {
        assert!(theirs.get("error").is_none(), "case {i}: {theirs}");
        let expected = ids(&theirs["ids"]);
        assert_eq!(
            ours,
            &expected,
            "case {i}: ours {:?}\ntransformers {:?}",
            model.decode(ours, false),
            theirs["text"]
        );
    }
    mock.stop().await;
}

/// The reply's prompt ids, response ids and message.
async fn chat(url: &str, messages: &[Value], kwargs: Value) -> (Vec<u32>, Vec<u32>, Value) {
    let body = json!({"model": "m", "messages": messages, "tools": tools(),
        "chat_template_kwargs": kwargs, "return_token_ids": true});
    let reply = post(url, &body).await;
    (
        ids(&reply["prompt_token_ids"]),
        ids(&reply["choices"][0]["token_ids"]),
        reply["choices"][0]["message"].clone(),
    )
}

#[tokio::test]
async fn a_turn_is_written_and_parsed_as_qwen3_and_vllm_do() {
    let mock = mock(Dialect::Vllm).await;
    let url = format!("{}/v1/chat/completions", mock.url());
    let model = model();
    let (_, response, message) = chat(&url, &first_turn(), json!({})).await;
    assert_eq!(
        model.decode(&response, false).unwrap(),
        format!(
            "<think>\n{THINK}\n</think>\n\n<tool_call>\n{{\"name\": \"bash\", \"arguments\": {{\"command\": \"ls -la\", \"timeout\": 30}}}}\n</tool_call><|im_end|>"
        )
    );
    assert_eq!(message["content"], "\n\n");
    assert_eq!(message["reasoning"], format!("\n{THINK}\n"));
    assert_eq!(message["reasoning_content"], message["reasoning"]);
    let call = &message["tool_calls"][0]["function"];
    assert_eq!(call["name"], "bash");
    assert_eq!(call["arguments"], r#"{"command": "ls -la", "timeout": 30}"#);
    // Thinking off: the generation prompt holds the empty reasoning block,
    // the turn starts with the call.
    let (prompt, response, message) =
        chat(&url, &first_turn(), json!({"enable_thinking": false})).await;
    assert!(
        model
            .decode(&prompt, false)
            .unwrap()
            .ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    );
    assert!(
        model
            .decode(&response, false)
            .unwrap()
            .starts_with("<tool_call>\n{\"name\": \"bash\"")
    );
    assert_eq!(message["content"], Value::Null);
    assert_eq!(message["reasoning"], Value::Null);
    // Streamed: the same ids, reasoning, content and arguments.
    let body = json!({"model": "m", "messages": first_turn(), "tools": tools(),
        "return_token_ids": true, "stream": true});
    let (status, _, bytes) = request(
        Method::POST,
        &url,
        Some(&body),
        &[("x-polar-session", "s1")],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let text = std::str::from_utf8(&bytes).unwrap();
    let (mut reasoning, mut content, mut args, mut streamed) =
        (String::new(), String::new(), String::new(), Vec::new());
    for data in text.split("\n\n").filter_map(|e| e.strip_prefix("data: ")) {
        let Ok(chunk) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        let choice = &chunk["choices"][0];
        let delta = &choice["delta"];
        reasoning += delta["reasoning"].as_str().unwrap_or_default();
        content += delta["content"].as_str().unwrap_or_default();
        if let Some(calls) = delta["tool_calls"].as_array() {
            args += calls[0]["function"]["arguments"]
                .as_str()
                .unwrap_or_default();
        }
        if let Some(t) = choice["token_ids"].as_array() {
            streamed.extend(t.iter().map(|x| x.as_u64().unwrap() as u32));
        }
    }
    let (_, whole, _) = chat(&url, &first_turn(), json!({})).await;
    assert_eq!(streamed, whole);
    assert_eq!(reasoning, format!("\n{THINK}\n"));
    assert_eq!(content, "\n\n");
    assert_eq!(args, r#"{"command": "ls -la", "timeout": 30}"#);
    mock.stop().await;
}

#[tokio::test]
async fn an_echoed_reply_does_not_extend_the_call_it_echoes() {
    let mock = mock(Dialect::Vllm).await;
    let url = format!("{}/v1/chat/completions", mock.url());
    let model = model();
    let (prompt, response, message) = chat(&url, &first_turn(), json!({})).await;
    // The harness sends the reply back as it got it, reasoning dropped.
    let mut messages = first_turn();
    messages.push(json!({"role": "assistant", "content": message["content"], "tool_calls": message["tool_calls"]}));
    let call_id = message["tool_calls"][0]["id"].clone();
    messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": "a.txt"}));
    let (next, _, _) = chat(&url, &messages, json!({})).await;
    let mut seen = prompt.clone();
    seen.extend(&response);
    assert!(!next.starts_with(&seen));
    let diverges = next.iter().zip(&seen).take_while(|(a, b)| a == b).count();
    // One token before the response: `assistant\n` + the echoed "\n\n" +
    // the template's "\n" merge into one newline token.
    assert_eq!(diverges, prompt.len() - 1);
    let merged = model.decode(&next[diverges..=diverges], false).unwrap();
    assert!(
        merged.len() >= 3 && merged.bytes().all(|b| b == b'\n'),
        "{merged:?}"
    );
    let text = model.decode(&next, false).unwrap();
    assert!(!text.contains(THINK), "no reasoning came back");
    // Echoed with its reasoning, the turn keeps it while no user query
    // follows; a new user message drops it by position.
    let with_reasoning = json!({"role": "assistant", "content": message["content"],
        "reasoning": message["reasoning"], "tool_calls": message["tool_calls"]});
    messages[2] = with_reasoning;
    let (kept, _, _) = chat(&url, &messages, json!({})).await;
    assert!(model.decode(&kept, false).unwrap().contains(THINK));
    messages.push(json!({"role": "assistant", "content": "Done."}));
    messages.push(json!({"role": "user", "content": "Thanks, now count them."}));
    let (dropped, _, _) = chat(&url, &messages, json!({})).await;
    assert!(!model.decode(&dropped, false).unwrap().contains(THINK));
    mock.stop().await;
}

#[tokio::test]
async fn token_in_calls_continue_what_the_chat_path_generates() {
    for kwargs in [json!({}), json!({"enable_thinking": false})] {
        let mock = mock(Dialect::Vllm).await;
        let base = mock.url();
        let (prompt, response, _) = chat(
            &format!("{base}/v1/chat/completions"),
            &first_turn(),
            kwargs.clone(),
        )
        .await;
        let model = model();
        let completions = format!("{base}/v1/completions");
        let whole = post(
            &completions,
            &json!({"prompt": prompt, "max_tokens": 1000, "return_token_ids": true, "skip_special_tokens": false}),
        )
        .await;
        assert_eq!(ids(&whole["choices"][0]["token_ids"]), response, "{kwargs}");
        // The raw text, without the end-of-turn token vLLM stops at.
        let raw = model
            .decode(&response[..response.len() - 1], false)
            .unwrap();
        assert_eq!(whole["choices"][0]["text"], raw);
        for cut in [1, 3, response.len() / 2, response.len() - 1] {
            let mut input = prompt.clone();
            input.extend(&response[..cut]);
            let rest = post(
                &completions,
                &json!({"prompt": input, "max_tokens": 1000, "return_token_ids": true}),
            )
            .await;
            assert_eq!(
                ids(&rest["choices"][0]["token_ids"]),
                response[cut..],
                "cut at {cut}, {kwargs}"
            );
        }
        // vLLM's default token limit.
        let short = post(&completions, &json!({"prompt": prompt})).await;
        assert_eq!(short["choices"][0]["finish_reason"], "length");
        assert_eq!(short["usage"]["completion_tokens"], 16);
        mock.stop().await;
    }
    // SGLang's `/generate` with `input_ids`: the turn the chat path writes.
    let mock = mock(Dialect::Sglang).await;
    let body = json!({"model": "m", "messages": first_turn(), "tools": tools(),
        "return_prompt_token_ids": true});
    let reply = post(&format!("{}/v1/chat/completions", mock.url()), &body).await;
    let prompt = ids(&reply["choices"][0]["prompt_token_ids"]);
    let out = post(
        &format!("{}/generate", mock.url()),
        &json!({"input_ids": prompt, "sampling_params": {"max_new_tokens": 1000}}),
    )
    .await;
    let text = out["text"].as_str().unwrap();
    assert_eq!(
        text,
        format!(
            "<think>\n{THINK}\n</think>\n\n<tool_call>\n{{\"name\": \"bash\", \"arguments\": {{\"command\": \"ls -la\", \"timeout\": 30}}}}\n</tool_call>"
        )
    );
    // SGLang's tool detector strips the text before the call.
    assert_eq!(reply["choices"][0]["message"]["content"], "");
    assert_eq!(
        reply["choices"][0]["message"]["reasoning_content"],
        format!("\n{THINK}\n")
    );
    mock.stop().await;
}

#[tokio::test]
async fn tokenizer_endpoints_and_models_use_the_real_files() {
    let mock = mock(Dialect::Vllm).await;
    let model = model();
    let ids_of = model.encode("<|im_start|>user\nhé<|im_end|>").unwrap();
    let out = post(
        &format!("{}/tokenize", mock.url()),
        &json!({"prompt": "<|im_start|>user\nhé<|im_end|>"}),
    )
    .await;
    assert_eq!(ids(&out["tokens"]), ids_of);
    let out = post(
        &format!("{}/detokenize", mock.url()),
        &json!({"tokens": ids_of}),
    )
    .await;
    assert_eq!(out["prompt"], "<|im_start|>user\nhé<|im_end|>");
    let (status, _, bytes) =
        request(Method::GET, &format!("{}/v1/models", mock.url()), None, &[]).await;
    assert_eq!(status, StatusCode::OK);
    let models: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        models["data"][0]["max_model_len"],
        model.context_len().unwrap_or(32_768)
    );
    // An image is refused as vLLM refuses it for a text model.
    let (status, _, bytes) = request(
        Method::POST,
        &format!("{}/v1/chat/completions", mock.url()),
        Some(&json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}]})),
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&bytes).contains("multimodal"));
    mock.stop().await;
}

#[test]
fn spans_cover_the_text_and_a_split_character_is_one_tokens() {
    let model = model();
    for text in [
        "plain ascii text",
        "naïve café 🦀 crab",
        "\n\n\n<think>\nx</think>",
    ] {
        let spans = model.encode_with_spans(text);
        let mut at = 0;
        for (_, span) in &spans {
            assert_eq!(span.start, at);
            assert!(text.is_char_boundary(span.end));
            at = span.end;
        }
        assert_eq!(at, text.len());
        let ids: Vec<u32> = spans.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, model.encode(text).unwrap());
    }
}

#[test]
fn a_directory_without_a_known_family_is_refused_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let err = RealModel::load(dir.path()).unwrap_err();
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
    let qwen = qwen3_dir();
    std::fs::copy(
        qwen.join("tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}"#,
    )
    .unwrap();
    let err = RealModel::load(dir.path()).unwrap_err();
    assert!(err.to_string().contains("no output format"), "{err}");
}

#[test]
fn the_cli_loads_the_directory_and_derives_the_context_length() {
    use clap::Parser;
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        mock: MockArgs,
    }
    let dir = qwen3_dir();
    let parse = |extra: &[&str]| {
        let mut argv = vec!["polar", "--model-dir", dir.to_str().unwrap()];
        argv.extend(extra);
        Cli::try_parse_from(argv).map(|c| c.mock)
    };
    let cfg = parse(&[]).unwrap().to_config().unwrap();
    let model = cfg.model.as_ref().expect("the model is loaded");
    assert_eq!(
        cfg.max_model_len,
        model.context_len().unwrap_or(32_768),
        "the model's context length, else the mock's default"
    );
    assert_eq!(
        parse(&["--max-model-len", "4096"])
            .unwrap()
            .to_config()
            .unwrap()
            .max_model_len,
        4096
    );
    // The mock's own template switches make no sense with a real template.
    assert!(parse(&["--no-think-glue"]).is_err());
    assert!(parse(&["--strip-reasoning", "all"]).is_err());
    // A directory that is not a model's is refused, naming the file.
    let empty = tempfile::tempdir().unwrap();
    let args = Cli::try_parse_from(["polar", "--model-dir", empty.path().to_str().unwrap()])
        .unwrap()
        .mock;
    let err = args.to_config().unwrap_err().to_string();
    assert!(err.contains("tokenizer.json"), "{err}");
}

#[tokio::test]
async fn a_prompt_over_the_context_is_refused_and_the_server_serves_on() {
    let mock = start(MockConfig {
        model: Some(model()),
        script: Some(script()),
        max_model_len: 40,
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let url = format!("{}/v1/chat/completions", mock.url());
    let long = json!({"messages": [{"role": "user", "content": "word ".repeat(100)}]});
    let (status, _, bytes) = request(Method::POST, &url, Some(&long), &[]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&bytes).contains("maximum context length is 40"));
    let short = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5});
    let reply = post(&url, &short).await;
    assert_eq!(reply["choices"][0]["finish_reason"], "length");
    mock.stop().await;
}

#[tokio::test]
async fn chat_and_token_in_calls_of_one_conversation_are_one_session() {
    // A `requests` script: each call of a session takes the next turn, so
    // the second call gets the second turn only if both calls read the
    // same first user message (the session key) from the prompt.
    let turn = |text: &str| Turn {
        text: Some(text.into()),
        ..Turn::default()
    };
    let mock = start(MockConfig {
        model: Some(model()),
        script: Some(Script {
            final_text: None,
            sessions: vec![SessionScript {
                id: "*".into(),
                turns: vec![turn("first"), turn("second")],
                ..SessionScript::default()
            }],
        }),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let body = json!({"messages": first_turn(), "return_token_ids": true});
    let (status, _, bytes) = request(
        Method::POST,
        &format!("{}/v1/chat/completions", mock.url()),
        Some(&body),
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let reply: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(reply["choices"][0]["message"]["content"], "\n\nfirst");
    let prompt = ids(&reply["prompt_token_ids"]);
    let (status, _, bytes) = request(
        Method::POST,
        &format!("{}/v1/completions", mock.url()),
        Some(&json!({"prompt": prompt, "max_tokens": 100})),
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let out: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        out["choices"][0]["text"], "<think>\n\n</think>\n\nsecond",
        "the same session's next turn"
    );
    mock.stop().await;
}

#[test]
fn streamed_deltas_add_up_to_the_whole_parse() {
    use super::codec::Codec;
    use super::generate::{DeltaSplitter, generate_with};
    use super::script::Plan;
    let codec = Codec::Real(model());
    let model = model();
    let prompt = model
        .encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
        .unwrap();
    let plan = Plan {
        think: Some("Two things: ü and 🦀.".into()),
        text: "Running both.".into(),
        tool_calls: vec![
            ("bash".into(), r#"{"command":"echo 🦀"}"#.into()),
            ("read".into(), r#"{"path":"a.txt"}"#.into()),
        ],
        ..Plan::default()
    };
    let g = generate_with(&codec, prompt.clone(), &plan, 10_000);
    assert_eq!(g.parsed.content, "\n\nRunning both.\n");
    assert_eq!(
        g.parsed.reasoning.as_deref(),
        Some("\nTwo things: ü and 🦀.\n")
    );
    assert_eq!(
        g.parsed.tool_calls[0].arguments,
        r#"{"command": "echo 🦀"}"#
    );
    assert_eq!(g.ids, model.encode(&g.text).unwrap());
    for per_chunk in [1, 3] {
        let mut splitter = DeltaSplitter::new(&g);
        let (mut reasoning, mut content) = (String::new(), String::new());
        let mut args = vec![String::new(); 2];
        let mut i = 0;
        while i < g.ids.len() {
            let j = (i + per_chunk).min(g.ids.len());
            let d = splitter.chunk(i..j);
            reasoning += &d.reasoning;
            content += &d.content;
            for (n, a) in d.tool_args {
                args[n] += &a;
            }
            i = j;
        }
        assert_eq!(Some(reasoning), g.parsed.reasoning);
        assert_eq!(content, g.parsed.content);
        let whole: Vec<&str> = g
            .parsed
            .tool_calls
            .iter()
            .map(|c| c.arguments.as_str())
            .collect();
        assert_eq!(args, whole);
    }
    // Thinking off (the prompt ends with the empty reasoning block): no
    // reasoning is written.
    let mut off = prompt;
    off.extend(model.encode("<think>\n\n</think>\n\n").unwrap());
    let g = generate_with(&codec, off, &plan, 10_000);
    assert!(
        g.text.starts_with("Running both.\n<tool_call>"),
        "{}",
        g.text
    );
    assert_eq!(g.parsed.reasoning, None);
    // A cut inside a character drops the whole character.
    let g = generate_with(&codec, Vec::new(), &plan, 10_000);
    for limit in 1..g.ids.len() {
        let cut = generate_with(&codec, Vec::new(), &plan, limit);
        assert!(g.text.starts_with(&cut.text));
        assert_eq!(cut.ids, g.ids[..cut.ids.len()]);
        assert_eq!(
            model.decode(&cut.ids, false).unwrap(),
            cut.text,
            "limit {limit}"
        );
    }
}
