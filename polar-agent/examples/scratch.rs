#![allow(clippy::all, missing_docs, unused)]
use std::hint::black_box;
use std::time::{Duration, Instant};
use serde_json::{Value, json};
use polar_agent::inference::wire::chat_body_bytes;
use polar_agent::inference::{BackendConfig, Dialect, SamplingMode};
use polar_agent::provider::{self, Detected};
use polar_agent::json_doc::Doc;
fn filler(seed: usize, len: usize) -> String {
    const WORDS: [&str; 12] = [
        "the", "file", "function", "returns", "error", "value", "test", "module", "struct",
        "config", "parse", "request",
    ];
    let mut out = String::with_capacity(len + 16);
    let mut i = seed;
    while out.len() < len {
        out.push_str(WORDS[i % WORDS.len()]);
        out.push(if i.is_multiple_of(17) { '\n' } else { ' ' });
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    out
}

/// A Claude Code turn: system blocks, 50 messages (text, tool uses, tool
/// results), 8 tools; about 100 KB.
fn big_request() -> Value {
    let schema = json!({"type": "object", "properties": {"command": {"type": "string", "description": filler(1, 300)}, "timeout": {"type": "number"}}, "required": ["command"]});
    let tools: Vec<Value> = (0..8)
        .map(|i| json!({"name": format!("Tool{i}"), "description": filler(i, 800), "input_schema": schema}))
        .collect();
    let mut messages =
        vec![json!({"role": "user", "content": [{"type": "text", "text": filler(3, 1500)}]})];
    for i in 0..49usize {
        let id = format!("toolu_{i:04}");
        if i.is_multiple_of(2) {
            messages.push(json!({"role": "assistant", "content": [
                {"type": "text", "text": filler(i, 400)},
                {"type": "tool_use", "id": id, "name": "Tool0", "input": {"command": filler(i + 1, 200)}}
            ]}));
        } else {
            messages.push(json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": format!("toolu_{:04}", i - 1), "content": [{"type": "text", "text": filler(i, 2600)}]}
            ]}));
        }
    }
    json!({
        "model": "claude-opus-4-8",
        "max_tokens": 32000,
        "stream": true,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.a1b;"},
            {"type": "text", "text": filler(9, 6000), "cache_control": {"type": "ephemeral"}}
        ],
        "messages": messages,
        "tools": tools,
        "metadata": {"user_id": "bench"},
    })
}


fn main() {
    if std::env::var("TUNE").is_ok() { polar_agent::export::memory::retain_freed_memory(); }
    if std::env::var("ONLY").is_ok() {
        let body = big_request().to_string().into_bytes();
        let backend = BackendConfig::new("bench", Dialect::Vllm, vec!["http://127.0.0.1:1".into()], "m");
        let headers = [("anthropic-version", "2023-06-01")];
        for _ in 0..20000 {
            let doc = Doc::parse(&body).unwrap();
            let Detected::Model(call) = provider::detect("POST", "/v1/messages", &headers, &doc.root()) else { panic!() };
            let parsed = provider::parse_request(&call, doc.root()).unwrap();
            black_box(chat_body_bytes(&backend, &parsed.request, SamplingMode::Train));
        }
        return;
    }
    let body = big_request().to_string().into_bytes();
    let backend = BackendConfig::new("bench", Dialect::Vllm, vec!["http://127.0.0.1:1".into()], "m");
    let headers = [("anthropic-version", "2023-06-01")];
    let path = "/v1/messages?beta=true";
    let n = 400;
    let mut t: Vec<Vec<Duration>> = vec![Vec::new(); 10];
    for _ in 0..n {
        let a = Instant::now();
        let doc = Doc::parse(&body).unwrap();
        let b = Instant::now();
        let Detected::Model(call) = provider::detect("POST", path, &headers, &doc.root()) else { panic!() };
        let c = Instant::now();
        let parsed = provider::parse_request(&call, doc.root()).unwrap();
        let d = Instant::now();
        let up = chat_body_bytes(&backend, &parsed.request, SamplingMode::Train);
        let e = Instant::now();
        drop(parsed);
        let f = Instant::now();
        black_box(up);
        for (k, x) in [b-a, c-b, d-c, e-d, f-e].into_iter().enumerate() { t[k].push(x) }
    }
    // pieces
    let doc = Doc::parse(&body).unwrap();
    let r = doc.root();
    let mut ts = vec![Vec::new(); 4];
    for _ in 0..n {
        let a = Instant::now();
        let v: Vec<Value> = r.get("tools").unwrap().as_array().unwrap().map(|t| t.get("input_schema").unwrap().to_value()).collect();
        let b = Instant::now();
        let mut k = 0; for m in r.get("messages").unwrap().as_array().unwrap() { for bl in m.get("content").unwrap().as_array().unwrap() { if let Some(t) = bl.get("text") { k += t.as_str().unwrap().len(); } if let Some(c) = bl.get("content") { for x in c.as_array().unwrap() { k += x.get("text").unwrap().as_str().unwrap().len(); } } } }
        let c = Instant::now();
        let mut s2 = 0; for m in r.get("messages").unwrap().as_array().unwrap() { for bl in m.get("content").unwrap().as_array().unwrap() { if let Some(i) = bl.get("input") { s2 += i.to_compact_string().len(); } } }
        let d = Instant::now();
        let sys = r.get("system").unwrap().to_value();
        let e = Instant::now();
        black_box((v, k, s2, sys));
        for (j, x) in [b-a, c-b, d-c, e-d].into_iter().enumerate() { ts[j].push(x) }
    }
    for (name, mut v) in ["schemas to_value", "texts unescaped", "inputs compact", "system to_value"].into_iter().zip(ts) { v.sort(); println!("{name}: {:.1} us", v[v.len()/2].as_secs_f64()*1e6); }
    for (name, mut v) in ["doc parse", "detect", "parse_request", "chat_body_bytes", "drop request"].into_iter().zip(t) {
        v.sort(); println!("{name}: {:.1} us", v[v.len()/2].as_secs_f64()*1e6);
    }
}
