//! Chains over the real chat templates and tokenizers of the model families
//! people train (Qwen3, DeepSeek-V3, gpt-oss, Llama 3.1), as `cargo xtask
//! test` installs them (`cargo xtask chat-models`; `POLAR_CHAT_MODELS_DIR`).
//!
//! Agentic sessions shaped like the harnesses' (a system prompt and tools,
//! a task, then turns of reasoning and tool calls whose replies the harness
//! echoes without their reasoning and with whitespace-only text, tool
//! results, now and then a user message) must make one chain: every call
//! after the first extends the one before, its prompt starts with every id
//! the model saw and generated, and what it adds is what the whole
//! conversation's rendering writes after the reply's end-of-turn token
//! (found here with a marker in the reply's text, not as the bridge finds
//! it).
//!
//! Every prompt is also the prompt of a chain that renders the whole
//! conversation for every call, and by the end of each session the chain
//! trusts windows of the conversation ([`Window::Trusted`]): the fast path
//! gives the whole rendering's ids on every template.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed step fails the test"
)]

use std::path::PathBuf;

use serde_json::{Map, Value, json};

use polar_faithful::{Asked, Chains, Conversation, Fresh, Origin, Renderer, Window, Windows};
use polar_template::{Model, ModelFiles};

const INSTALL: &str = "install them with `cargo xtask chat-models` (cargo xtask test does)";

fn model(name: &str) -> Model {
    let root = std::env::var_os("POLAR_CHAT_MODELS_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../.polar-cache/chat-models"),
        PathBuf::from,
    );
    let dir = root.join(name);
    assert!(
        dir.join("tokenizer.json").is_file(),
        "the model files of {name} are missing from {}: {INSTALL}",
        dir.display()
    );
    Model::load(&ModelFiles::from_dir(&dir)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn tools() -> Vec<Value> {
    vec![json!({"type": "function", "function": {
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
    }})]
}

/// The text after the reply's end-of-turn token in the whole
/// conversation's rendering, through the generation prompt (what the
/// bridge must add), told another way than the bridge tells it: a marker
/// put in the reply's text, and the first end-of-turn token after it.
fn whole_bridge(m: &Model, conv: &Conversation<'_>, reply_at: usize, stop: &str) -> String {
    const MARK: &str = "\u{e001}MARK\u{e001}";
    let messages: Vec<Value> = conv
        .messages
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let mut v = v.clone();
            if v["role"] == "assistant" {
                let o = v.as_object_mut().unwrap();
                o.remove("reasoning");
                o.remove("reasoning_content");
                if i == reply_at {
                    let text = o["content"].as_str().unwrap_or_default().to_owned();
                    o.insert("content".into(), json!(format!("{MARK}{text}")));
                }
            }
            v
        })
        .collect();
    let whole = Renderer::render(
        m,
        &Conversation {
            messages: &messages,
            ..*conv
        },
        true,
    )
    .unwrap();
    let at = whole.find(MARK).expect("the reply's text is rendered");
    let end = at + whole[at..].find(stop).expect("the reply's turn ends") + stop.len();
    whole[end..].to_owned()
}

/// What the model generates for `reply` after the prompt of `conv`: the
/// template's rendering of the reply as the conversation's next turn, up
/// to and with its end-of-turn token.
fn generate(m: &Model, conv: &Conversation<'_>, reply: &Value) -> Vec<u32> {
    let mut with = conv.messages.to_vec();
    with.push(reply.clone());
    let prompt = Renderer::render(m, conv, true).unwrap();
    let whole = Renderer::render(
        m,
        &Conversation {
            messages: &with,
            ..*conv
        },
        false,
    )
    .unwrap();
    let stops: Vec<String> = m
        .stop_ids()
        .iter()
        .filter_map(|&id| m.id_token(id))
        .collect();
    let turn = whole.strip_prefix(prompt.as_str()).unwrap_or("All done.");
    let (text, stop) = stops
        .iter()
        .filter_map(|s| turn.find(s.as_str()).map(|at| (&turn[..at], s.clone())))
        .min_by_key(|(t, _)| t.len())
        .unwrap_or((turn, stops[0].clone()));
    Renderer::encode(m, &format!("{text}{stop}")).unwrap()
}

struct Session {
    messages: Vec<Value>,
    tools: Vec<Value>,
    kwargs: Map<String, Value>,
}

impl Session {
    fn conv(&self) -> Conversation<'_> {
        Conversation {
            messages: &self.messages,
            tools: Some(&self.tools),
            kwargs: &self.kwargs,
        }
    }
}

/// Runs `turns` turns of an agentic session over `name`'s model, checking
/// each call's prompt, and each against the prompt of a chain that renders
/// the whole conversation for every call (its windows refuted); returns
/// how many calls extended the one before and what the chain knows of
/// windows at the end.
fn run(name: &str, turns: usize, kwargs: Map<String, Value>, seed: u64) -> (usize, Window) {
    run_answering(name, turns, kwargs, seed, None)
}

/// [`run`], the model answering in text at turn `answers` too (and the
/// user asking again), as it does at the last turn.
fn run_answering(
    name: &str,
    turns: usize,
    kwargs: Map<String, Value>,
    seed: u64,
    answers: Option<usize>,
) -> (usize, Window) {
    let m = model(name);
    let mut s = Session {
        messages: vec![
            json!({"role": "system", "content": "You are a coding agent. Use the bash tool."}),
            json!({"role": "user", "content": format!("Fix the failing test in repo {seed}.")}),
        ],
        tools: tools(),
        kwargs,
    };
    let mut chains = Chains::new();
    let mut whole_chains = Chains::new();
    let mut seen: Vec<u32> = Vec::new();
    let mut extended = 0;
    for k in 0..turns {
        let conv = s.conv();
        let prompt = chains
            .prompt(&m, &conv)
            .unwrap_or_else(|e| panic!("{name} turn {k}: {e}"));
        let mut whole = whole_chains.prompt(&m, &conv).unwrap();
        let expected = if k == 0 {
            Window::Unchecked
        } else {
            Window::Refuted
        };
        assert_eq!(whole.windows.state(), expected, "{name} turn {k}");
        assert_eq!(
            (&prompt.ids, &prompt.origin),
            (&whole.ids, &whole.origin),
            "{name} turn {k}: a window's ids are the whole rendering's"
        );
        whole.windows = Windows::whole();
        if k == 0 {
            assert_eq!(
                prompt.origin,
                Origin::Fresh {
                    reason: Fresh::FirstCall
                }
            );
            let whole = Renderer::render(&m, &conv, true).unwrap();
            assert_eq!(
                prompt.ids,
                Renderer::encode(&m, &whole).unwrap(),
                "{name}: a fresh prompt is the whole rendering"
            );
        } else {
            let Origin::Extends { kept, added, .. } = prompt.origin else {
                panic!("{name} turn {k}: {:?}", prompt.origin);
            };
            extended += 1;
            assert_eq!(kept, seen.len(), "{name} turn {k}");
            assert_eq!(
                &prompt.ids[..kept],
                seen.as_slice(),
                "{name} turn {k}: the model's own ids"
            );
            let stop = m.id_token(*seen.last().unwrap()).unwrap();
            let reply_at = s
                .messages
                .iter()
                .rposition(|v| v["role"] == "assistant")
                .unwrap();
            let expected = Renderer::encode(&m, &whole_bridge(&m, &conv, reply_at, &stop)).unwrap();
            assert_eq!(
                &prompt.ids[kept..],
                expected.as_slice(),
                "{name} turn {k}: what follows the reply's turn"
            );
            assert_eq!(prompt.ids.len(), kept + added);
            let tail = m.decode(&prompt.ids[kept..], false).unwrap();
            let last = s.messages.last().unwrap()["content"]
                .as_str()
                .unwrap()
                .to_owned();
            // As text, or as a JSON string (gpt-oss writes tool results with
            // `tojson`).
            let quoted = serde_json::to_string(&last).unwrap();
            assert!(
                tail.contains(&last) || tail.contains(&quoted),
                "{name} turn {k}: {tail:?} lacks {last:?}"
            );
        }
        // The model thinks, then calls the tool (or answers, at the end).
        let id = format!("call_{seed}_{k}");
        let last = k + 1 == turns || answers == Some(k);
        let mut reply = json!({"role": "assistant", "content": if last { "Fixed: the test passes now." } else { "" },
            "reasoning_content": format!("Turn {k}: I should look at the files first."),
        });
        if !last {
            reply["tool_calls"] = json!([{"id": id, "type": "function",
                "function": {"name": "bash", "arguments": {"command": format!("ls -la src/{k}")}}}]);
        }
        let generated = generate(&m, &conv, &reply);
        assert!(
            m.stop_ids().contains(generated.last().unwrap()),
            "{name}: the reply ends its turn"
        );
        seen = prompt.ids.clone();
        seen.extend_from_slice(&generated);
        let asked = Asked {
            messages: s.messages.clone(),
            tools: Some(s.tools.clone()),
            kwargs: s.kwargs.clone(),
        };
        whole_chains.finish(&m, asked.clone(), whole, &generated, reply.clone());
        chains.finish(&m, asked, prompt, &generated, reply.clone());
        // The harness echoes it: whitespace-only text, no reasoning.
        let mut echoed = json!({"role": "assistant", "content": if last { reply["content"].clone() } else { json!("\n\n") }});
        if !last {
            echoed["tool_calls"] = reply["tool_calls"].clone();
        }
        s.messages.push(echoed);
        if last {
            s.messages
                .push(json!({"role": "user", "content": "Thanks. Now also update the changelog."}));
        } else {
            s.messages.push(json!({"role": "tool", "tool_call_id": id, "content": format!("total {k}\nfile_{k}.rs")}));
            if (seed + k as u64) % 3 == 2 {
                s.messages.push(
                    json!({"role": "user", "content": format!("Hint {k}: check the imports.")}),
                );
            }
        }
    }
    // The call after the last reply extends it too.
    let prompt = chains.prompt(&m, &s.conv()).unwrap();
    assert!(
        matches!(prompt.origin, Origin::Extends { .. }),
        "{name}: {:?}",
        prompt.origin
    );
    assert_eq!(&prompt.ids[..seen.len()], seen.as_slice());
    let whole = whole_chains.prompt(&m, &s.conv()).unwrap();
    assert_eq!(prompt.ids, whole.ids, "{name}: the last call");
    (extended + 1, prompt.windows.state())
}

#[test]
fn qwen3_sessions_are_one_chain_thinking_or_not() {
    for seed in 0..6 {
        assert_eq!(run("qwen3", 6, Map::new(), seed), (6, Window::Trusted));
        let mut off = Map::new();
        off.insert("enable_thinking".into(), json!(false));
        assert_eq!(run("qwen3", 4, off, seed), (4, Window::Trusted));
    }
}

#[test]
fn deepseek_v3_sessions_are_one_chain() {
    for seed in 0..4 {
        assert_eq!(
            run("deepseek_v3", 5, Map::new(), seed),
            (5, Window::Trusted)
        );
    }
}

/// DeepSeek-V3's template writes the conversation's first tool result
/// unlike the others: once a text answer has left every tool result out
/// of the window, the window's ids differ from the whole rendering's, and
/// the chain renders the whole conversation from then on.
#[test]
fn deepseek_v3_windows_that_leave_every_tool_result_out_are_refuted() {
    for seed in 0..2 {
        let (n, window) = run_answering("deepseek_v3", 7, Map::new(), seed, Some(3));
        assert_eq!((n, window), (7, Window::Refuted));
    }
    // (gpt-oss ends a text answer with `<|return|>` and writes `<|end|>`
    // in the history, which this test's marker cannot follow.)
    for name in ["qwen3", "llama3_1"] {
        let (n, window) = run_answering(name, 7, Map::new(), 0, Some(3));
        assert_eq!((n, window), (7, Window::Trusted), "{name}");
    }
}

#[test]
fn gpt_oss_sessions_are_one_chain() {
    for seed in 0..4 {
        let mut effort = Map::new();
        effort.insert(
            "reasoning_effort".into(),
            json!(["low", "medium", "high"][seed as usize % 3]),
        );
        assert_eq!(run("gptoss", 5, effort, seed), (5, Window::Trusted));
    }
}

#[test]
fn llama3_1_sessions_are_one_chain() {
    for seed in 0..4 {
        assert_eq!(run("llama3_1", 5, Map::new(), seed), (5, Window::Trusted));
    }
}
