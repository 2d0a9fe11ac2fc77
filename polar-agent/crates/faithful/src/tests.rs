//! Chains against a small ChatML renderer that drops the reasoning of
//! assistant turns before the last user message (as Qwen3's template
//! does), and a character tokenizer with two special tokens.

use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::*;

const IM_START: u32 = 1;
const IM_END: u32 = 2;

/// ChatML; `unstable` writes into each of the model's turns the length of
/// the message after it (a template whose history changes with what
/// follows); `counting` writes into the generation prompt how many
/// messages the conversation has (a template whose rendering after the
/// reply depends on the whole conversation); `first_output` marks the
/// conversation's first tool result (as DeepSeek-V3's template does).
#[derive(Default)]
struct ChatMl {
    unstable: bool,
    counting: bool,
    first_output: bool,
}

impl ChatMl {
    fn turn(&self, m: &Value, keep_reasoning: bool, next: usize) -> String {
        let role = m["role"].as_str().unwrap_or_default();
        let mut body = String::new();
        if role == "assistant"
            && keep_reasoning
            && let Some(r) = m.get("reasoning_content").and_then(Value::as_str)
        {
            body.push_str(&format!("<think>\n{r}\n</think>\n\n"));
        }
        body.push_str(m["content"].as_str().unwrap_or_default());
        for c in m
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            body.push_str(&format!("\n<tool_call>\n{}\n</tool_call>", c["function"]));
        }
        if self.unstable && role == "assistant" {
            body.push_str(&format!(" (before {next} chars)"));
        }
        format!("<|im_start|>{role}\n{body}<|im_end|>\n")
    }
}

impl Renderer for ChatMl {
    fn render(&self, conv: &Conversation<'_>, gen_prompt: bool) -> Result<String, RenderFailure> {
        let last_user = conv
            .messages
            .iter()
            .rposition(|m| m["role"] == "user")
            .ok_or_else(|| RenderFailure::Template("No user query found in messages.".into()))?;
        let mut out = String::new();
        if let Some(tools) = conv.tools {
            out.push_str(&format!(
                "<|im_start|>system\n# Tools {}<|im_end|>\n",
                tools.len()
            ));
        }
        for (i, m) in conv.messages.iter().enumerate() {
            let next = conv
                .messages
                .get(i + 1)
                .map_or(0, |m| m["content"].as_str().map_or(0, str::len));
            if self.first_output
                && m["role"] == "tool"
                && !conv.messages[..i].iter().any(|m| m["role"] == "tool")
            {
                out.push_str("(outputs)");
            }
            out.push_str(&self.turn(m, i > last_user, next));
        }
        if gen_prompt {
            out.push_str("<|im_start|>assistant\n");
            if self.counting {
                out.push_str(&format!("(message {})", conv.messages.len()));
            }
            if conv.kwargs.get("enable_thinking") == Some(&json!(false)) {
                out.push_str("<think>\n\n</think>\n\n");
            }
        }
        Ok(out)
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, RenderFailure> {
        let mut ids = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            if let Some(r) = rest.strip_prefix("<|im_start|>") {
                ids.push(IM_START);
                rest = r;
            } else if let Some(r) = rest.strip_prefix("<|im_end|>") {
                ids.push(IM_END);
                rest = r;
            } else {
                let c = rest
                    .chars()
                    .next()
                    .ok_or_else(|| RenderFailure::Tokenizer("empty".into()))?;
                ids.push(u32::from(c) + 10);
                rest = &rest[c.len_utf8()..];
            }
        }
        Ok(ids)
    }

    fn token_text(&self, id: u32) -> Option<String> {
        match id {
            IM_START => Some("<|im_start|>".into()),
            IM_END => Some("<|im_end|>".into()),
            n => char::from_u32(n.checked_sub(10)?).map(String::from),
        }
    }

    fn stop_ids(&self) -> &[u32] {
        &[IM_END]
    }
}

fn decode(r: &ChatMl, ids: &[u32]) -> String {
    ids.iter().filter_map(|&id| r.token_text(id)).collect()
}

fn asked(c: &Conversation<'_>) -> Asked {
    Asked {
        messages: c.messages.to_vec(),
        tools: c.tools.map(<[Value]>::to_vec),
        kwargs: c.kwargs.clone(),
    }
}

fn conv<'a>(
    messages: &'a [Value],
    tools: Option<&'a [Value]>,
    kwargs: &'a Map<String, Value>,
) -> Conversation<'a> {
    Conversation {
        messages,
        tools,
        kwargs,
    }
}

/// What the model generates: reasoning, text and one call, ended.
fn generate(
    r: &ChatMl,
    reasoning: &str,
    text: &str,
    call: Option<(&str, Value)>,
) -> (Vec<u32>, Value) {
    let mut raw = format!("<think>\n{reasoning}\n</think>\n\n{text}");
    let mut reply = json!({"role": "assistant", "content": text, "reasoning": reasoning, "reasoning_content": reasoning});
    if let Some((id, args)) = call {
        let f = json!({"name": "bash", "arguments": args});
        raw.push_str(&format!("\n<tool_call>\n{f}\n</tool_call>"));
        reply["tool_calls"] = json!([{"id": id, "type": "function", "function": f}]);
    }
    raw.push_str("<|im_end|>");
    (r.encode(&raw).unwrap(), reply)
}

#[test]
fn a_continuation_is_the_earlier_ids_then_the_new_messages_only() {
    let r = ChatMl::default();
    let kw = Map::new();
    let tools = vec![json!({"type": "function", "function": {"name": "bash"}})];
    let mut chains = Chains::new();
    let mut msgs = vec![
        json!({"role": "system", "content": "sys"}),
        json!({"role": "user", "content": "fix it"}),
    ];
    let c = conv(&msgs, Some(&tools), &kw);
    let p = chains.prompt(&r, &c).unwrap();
    assert_eq!(
        p.origin,
        Origin::Fresh {
            reason: Fresh::FirstCall
        }
    );
    assert_eq!(p.ids, r.encode(&r.render(&c, true).unwrap()).unwrap());
    let (generated, reply) = generate(&r, "look first", "", Some(("call_1", json!({"cmd": "ls"}))));
    let mut seen = p.ids.clone();
    seen.extend_from_slice(&generated);
    assert_eq!(chains.finish(&r, asked(&c), p, &generated, reply), 0);

    // The harness echoes the reply with "\n\n" as its text, without its
    // reasoning, and with the arguments re-serialized; then a tool result.
    msgs.push(json!({"role": "assistant", "content": "\n\n", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": {"cmd": "ls"}}}]}));
    msgs.push(json!({"role": "tool", "tool_call_id": "call_1", "content": "a.txt"}));
    let c = conv(&msgs, Some(&tools), &kw);
    let p = chains.prompt(&r, &c).unwrap();
    let added = r
        .encode("\n<|im_start|>tool\na.txt<|im_end|>\n<|im_start|>assistant\n")
        .unwrap();
    assert_eq!(
        p.origin,
        Origin::Extends {
            call: 0,
            kept: seen.len(),
            added: added.len()
        }
    );
    assert_eq!(
        &p.ids[..seen.len()],
        seen.as_slice(),
        "the model's own tokens, reasoning included"
    );
    assert_eq!(&p.ids[seen.len()..], added.as_slice());
    // The server's rendering would have differed inside the history.
    let served = r.encode(&r.render(&c, true).unwrap()).unwrap();
    assert!(!served.starts_with(&seen));
    assert!(decode(&r, &p.ids).contains("<think>\nlook first\n</think>"));
    let (generated, reply) = generate(&r, "done", "All fixed.", None);
    chains.finish(&r, asked(&c), p, &generated, reply);
    assert_eq!(chains.len(), 1, "a chain keeps its latest call only");
}

#[test]
fn a_side_call_branching_off_keeps_the_main_chain() {
    let r = ChatMl::default();
    let kw = Map::new();
    let mut chains = Chains::new();
    let mut main = vec![json!({"role": "user", "content": "task"})];
    let p = chains.prompt(&r, &conv(&main, None, &kw)).unwrap();
    let (generated, reply) = generate(&r, "", "Step one done.", None);
    chains.finish(&r, asked(&conv(&main, None, &kw)), p, &generated, reply);
    main.push(json!({"role": "assistant", "content": "Step one done."}));
    // A structured-output check asked with the main conversation and a
    // question after it: it extends the main call, and branches off.
    let mut check = main.clone();
    check.push(json!({"role": "user", "content": "Who speaks next? Answer in JSON."}));
    let p = chains.prompt(&r, &conv(&check, None, &kw)).unwrap();
    assert!(
        matches!(p.origin, Origin::Extends { call: 0, .. }),
        "{:?}",
        p.origin
    );
    let (generated, reply) = generate(&r, "", "{\"next\": \"model\"}", None);
    chains.finish_branch(&r, asked(&conv(&check, None, &kw)), p, &generated, reply);
    assert_eq!(chains.len(), 2, "the main call is kept beside the branch");
    // The main chain goes on from its own call.
    main.push(json!({"role": "user", "content": "Please continue."}));
    let p = chains.prompt(&r, &conv(&main, None, &kw)).unwrap();
    assert!(
        matches!(p.origin, Origin::Extends { call: 0, .. }),
        "{:?}",
        p.origin
    );
    // Without branching, the check would have replaced it.
    let mut plain = Chains::new();
    let p = plain.prompt(&r, &conv(&main[..1], None, &kw)).unwrap();
    let (generated, reply) = generate(&r, "", "Step one done.", None);
    plain.finish(
        &r,
        asked(&conv(&main[..1], None, &kw)),
        p,
        &generated,
        reply,
    );
    let p = plain.prompt(&r, &conv(&check, None, &kw)).unwrap();
    let (generated, reply) = generate(&r, "", "{\"next\": \"model\"}", None);
    plain.finish(&r, asked(&conv(&check, None, &kw)), p, &generated, reply);
    let p = plain.prompt(&r, &conv(&main, None, &kw)).unwrap();
    assert!(matches!(p.origin, Origin::Fresh { .. }), "{:?}", p.origin);
}

#[test]
fn retries_new_conversations_and_edits_are_told_apart() {
    let r = ChatMl::default();
    let kw = Map::new();
    let mut chains = Chains::new();
    let main = vec![json!({"role": "user", "content": "task"})];
    let p = chains.prompt(&r, &conv(&main, None, &kw)).unwrap();
    let first = p.ids.clone();
    let (generated, reply) = generate(&r, "r", "step", None);
    chains.finish(
        &r,
        asked(&conv(&main, None, &kw)),
        p,
        &generated,
        reply.clone(),
    );

    // A retry of the same messages: the same prompt.
    let p = chains.prompt(&r, &conv(&main, None, &kw)).unwrap();
    assert_eq!(p.origin, Origin::Repeats { call: 0 });
    assert_eq!(p.ids, first);
    chains.finish(&r, asked(&conv(&main, None, &kw)), p, &generated, reply);

    // A sub-agent: a new conversation, a chain of its own.
    let sub = vec![json!({"role": "user", "content": "sub task"})];
    let p = chains.prompt(&r, &conv(&sub, None, &kw)).unwrap();
    assert_eq!(
        p.origin,
        Origin::Fresh {
            reason: Fresh::HistoryDiffers {
                call: 1,
                message: 0
            }
        }
    );
    let (sub_generated, sreply) = generate(&r, "s", "sub done", None);
    chains.finish(&r, asked(&conv(&sub, None, &kw)), p, &sub_generated, sreply);
    assert_eq!(chains.len(), 2);

    // The main chain goes on past the sub-agent's call.
    let mut next = main.clone();
    next.push(json!({"role": "assistant", "content": " step "}));
    next.push(json!({"role": "user", "content": "more"}));
    let p = chains.prompt(&r, &conv(&next, None, &kw)).unwrap();
    assert!(
        matches!(p.origin, Origin::Extends { call: 1, .. }),
        "{:?}",
        p.origin
    );

    // A reply the harness changed, an edited history, other tools, other
    // template arguments.
    let mut changed = next.clone();
    changed[1] = json!({"role": "assistant", "content": "something else"});
    let p = chains.prompt(&r, &conv(&changed, None, &kw)).unwrap();
    assert!(
        matches!(
            p.origin,
            Origin::Fresh {
                reason: Fresh::ReplyChanged { .. }
            }
        ),
        "{:?}",
        p.origin
    );
    let compacted = vec![
        json!({"role": "user", "content": "summary of the task"}),
        json!({"role": "user", "content": "go on"}),
    ];
    let p = chains.prompt(&r, &conv(&compacted, None, &kw)).unwrap();
    assert!(matches!(
        p.origin,
        Origin::Fresh {
            reason: Fresh::HistoryDiffers { message: 0, .. }
        }
    ));
    let tools = vec![json!({"type": "function"})];
    let p = chains.prompt(&r, &conv(&next, Some(&tools), &kw)).unwrap();
    assert!(matches!(
        p.origin,
        Origin::Fresh {
            reason: Fresh::ToolsChanged { .. }
        }
    ));
    let mut off = Map::new();
    off.insert("enable_thinking".into(), json!(false));
    let p = chains.prompt(&r, &conv(&next, None, &off)).unwrap();
    assert!(matches!(
        p.origin,
        Origin::Fresh {
            reason: Fresh::TemplateArgsChanged { .. }
        }
    ));
}

#[test]
fn a_cut_reply_or_an_unstable_template_starts_a_new_chain() {
    let kw = Map::new();
    let msgs = vec![json!({"role": "user", "content": "q"})];
    let mut next = msgs.clone();
    next.push(json!({"role": "assistant", "content": "a"}));
    next.push(json!({"role": "user", "content": "q2"}));

    let r = ChatMl::default();
    let mut chains = Chains::new();
    let p = chains.prompt(&r, &conv(&msgs, None, &kw)).unwrap();
    let (mut generated, reply) = generate(&r, "r", "a", None);
    generated.pop(); // no end-of-turn token: cut by its length
    chains.finish(&r, asked(&conv(&msgs, None, &kw)), p, &generated, reply);
    let p = chains.prompt(&r, &conv(&next, None, &kw)).unwrap();
    assert_eq!(
        p.origin,
        Origin::Fresh {
            reason: Fresh::ReplyCut { call: 0 }
        }
    );

    let r = ChatMl {
        unstable: true,
        ..ChatMl::default()
    };
    let mut chains = Chains::new();
    let p = chains.prompt(&r, &conv(&msgs, None, &kw)).unwrap();
    let (generated, reply) = generate(&r, "r", "a", None);
    chains.finish(&r, asked(&conv(&msgs, None, &kw)), p, &generated, reply);
    let p = chains.prompt(&r, &conv(&next, None, &kw)).unwrap();
    assert_eq!(
        p.origin,
        Origin::Fresh {
            reason: Fresh::NotPrefixStable { call: 0 }
        }
    );
    assert_eq!(
        p.ids,
        r.encode(&r.render(&conv(&next, None, &kw), true).unwrap())
            .unwrap()
    );
}

/// A session of `turns` tool-call turns over `r`: each call's prompt and
/// the prompt of a chain that renders the whole conversation for every
/// call must be the same; returns what the chain knows of windows after
/// each call.
fn windows(r: &ChatMl, turns: usize) -> Vec<Window> {
    let kw = Map::new();
    let mut chains = Chains::new();
    let mut whole_chains = Chains::new();
    let mut msgs = vec![
        json!({"role": "system", "content": "agent"}),
        json!({"role": "user", "content": "task"}),
    ];
    let mut known = Vec::new();
    for k in 0..turns {
        let c = conv(&msgs, None, &kw);
        let p = chains.prompt(r, &c).unwrap();
        let mut w = whole_chains.prompt(r, &c).unwrap();
        assert_eq!((&p.ids, &p.origin), (&w.ids, &w.origin), "turn {k}");
        if k > 0 {
            assert!(matches!(p.origin, Origin::Extends { .. }), "{:?}", p.origin);
        }
        w.windows = Windows::whole();
        known.push(p.windows.state());
        let id = format!("call_{k}");
        let args = json!({"cmd": format!("ls {k}")});
        // The model answers in text once, and is asked again.
        let answers = k == 3;
        let call = (!answers).then(|| (id.as_str(), args.clone()));
        let (generated, reply) = generate(r, "why", "done", call);
        chains.finish(r, asked(&c), p, &generated, reply.clone());
        whole_chains.finish(r, asked(&c), w, &generated, reply);
        if answers {
            msgs.push(json!({"role": "assistant", "content": "done"}));
            msgs.push(json!({"role": "user", "content": "again"}));
        } else {
            msgs.push(json!({"role": "assistant", "content": "done", "tool_calls": [{"id": id, "type": "function", "function": {"name": "bash", "arguments": args}}]}));
            msgs.push(json!({"role": "tool", "tool_call_id": id, "content": "ok"}));
        }
    }
    known
}

#[test]
fn windows_are_trusted_once_they_give_the_whole_renderings_ids() {
    use Window::{Refuted, Trusted, Unchecked};
    // The first window that leaves messages out (the model's first turn)
    // is that of the fourth call.
    assert_eq!(
        windows(&ChatMl::default(), 7),
        [
            Unchecked, Unchecked, Unchecked, Trusted, Trusted, Trusted, Trusted
        ]
    );
    let counting = ChatMl {
        counting: true,
        ..ChatMl::default()
    };
    assert_eq!(
        windows(&counting, 7),
        [
            Unchecked, Unchecked, Unchecked, Refuted, Refuted, Refuted, Refuted
        ]
    );
    // Windows of tool-call turns are right; the first one after the text
    // answer leaves every earlier tool result out, and is not.
    let first_output = ChatMl {
        first_output: true,
        ..ChatMl::default()
    };
    assert_eq!(
        windows(&first_output, 7),
        [
            Unchecked, Unchecked, Unchecked, Trusted, Trusted, Refuted, Refuted
        ]
    );
}

#[test]
fn a_template_that_refuses_is_an_error_not_a_prompt() {
    let r = ChatMl::default();
    let kw = Map::new();
    let msgs = vec![json!({"role": "system", "content": "only a system prompt"})];
    let err = Chains::new()
        .prompt(&r, &conv(&msgs, None, &kw))
        .unwrap_err();
    assert!(
        matches!(err, RenderFailure::Template(ref m) if m.contains("No user query")),
        "{err}"
    );
}

#[test]
fn messages_are_the_same_whatever_their_keys_order() {
    use crate::chains::same;
    let a = json!({"role": "assistant", "content": "x", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {"a": 1, "b": [2]}}}]});
    let b = json!({"tool_calls": [{"function": {"arguments": {"b": [2], "a": 1}, "name": "f"}, "id": "c"}], "content": "x", "role": "assistant"});
    assert!(same(&a, &a.clone()));
    assert!(same(&a, &b));
    for other in [
        json!({"role": "assistant", "content": "y", "tool_calls": a["tool_calls"]}),
        json!({"role": "assistant", "content": "x", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {"a": 1, "b": [3]}}}]}),
        json!({"role": "assistant", "content": "x"}),
        json!({"role": "assistant", "content": "x", "tool_calls": [], "name": "n"}),
    ] {
        assert!(!same(&a, &other), "{other}");
        assert!(!same(&other, &a), "{other}");
    }
}

#[test]
fn echoed_replies_match_however_the_harness_wrote_them() {
    let served = json!({"role": "assistant", "content": "", "reasoning_content": "why",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": {"a": 1}}}]});
    for echoed in [
        json!({"role": "assistant", "content": "\n\n", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": {"a": 1}}}]}),
        json!({"role": "assistant", "content": [{"type": "text", "text": " "}], "reasoning": "why ", "tool_calls": [{"type": "function", "function": {"name": "bash", "arguments": {"a": 1}}}]}),
    ] {
        assert!(same_reply(&echoed, &served), "{echoed}");
    }
    for echoed in [
        json!({"role": "assistant", "content": "", "tool_calls": [{"id": "c2", "type": "function", "function": {"name": "bash", "arguments": {"a": 1}}}]}),
        json!({"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": {"a": 2}}}]}),
        json!({"role": "assistant", "content": "", "reasoning_content": "other", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": {"a": 1}}}]}),
        json!({"role": "assistant", "content": "text", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": {"a": 1}}}]}),
        json!({"role": "assistant", "content": ""}),
        json!({"role": "user", "content": ""}),
    ] {
        assert!(!same_reply(&echoed, &served), "{echoed}");
    }
}

proptest! {
    /// However a session's turns go (tool results, user messages, text or
    /// calls, with or without thinking), each call after the first extends
    /// the one before: its prompt starts with every id the model saw and
    /// generated, and what it adds is the template's text for the new
    /// messages, from the end of the reply's turn.
    #[test]
    fn every_call_of_a_chain_extends_the_one_before(
        turns in prop::collection::vec((any::<bool>(), "[a-z ]{0,12}", "[a-z]{1,8}", any::<bool>()), 1..12),
        thinking in any::<bool>(),
    ) {
        let r = ChatMl::default();
        let mut kw = Map::new();
        kw.insert("enable_thinking".into(), json!(thinking));
        let mut chains = Chains::new();
        let mut whole_chains = Chains::new();
        let mut msgs = vec![json!({"role": "user", "content": "start"})];
        let mut seen: Vec<u32> = Vec::new();
        for (k, (call, text, reasoning, user_next)) in turns.into_iter().enumerate() {
            let c = conv(&msgs, None, &kw);
            let p = chains.prompt(&r, &c).unwrap();
            let mut w = whole_chains.prompt(&r, &c).unwrap();
            prop_assert_eq!((&p.ids, &p.origin), (&w.ids, &w.origin));
            w.windows = Windows::whole();
            if k == 0 {
                prop_assert_eq!(&p.origin, &Origin::Fresh { reason: Fresh::FirstCall });
            } else {
                prop_assert!(matches!(p.origin, Origin::Extends { .. }), "{:?}", p.origin);
                prop_assert_eq!(&p.ids[..seen.len()], seen.as_slice());
                let tail = decode(&r, &p.ids[seen.len()..]);
                prop_assert!(tail.starts_with('\n'), "{}", tail);
                prop_assert!(tail.ends_with(if thinking { "assistant\n" } else { "</think>\n\n" }), "{}", tail);
            }
            let id = format!("call_{k}");
            let args = json!({"cmd": text.clone()});
            let (generated, reply) = generate(&r, &reasoning, &text, call.then(|| (id.as_str(), args.clone())));
            seen = p.ids.clone();
            seen.extend_from_slice(&generated);
            chains.finish(&r, asked(&c), p, &generated, reply.clone());
            whole_chains.finish(&r, asked(&c), w, &generated, reply);
            let mut echoed = json!({"role": "assistant", "content": text.trim()});
            if call {
                echoed["tool_calls"] = json!([{"id": id, "type": "function", "function": {"name": "bash", "arguments": args}}]);
                msgs.push(echoed);
                msgs.push(json!({"role": "tool", "tool_call_id": id, "content": "ok"}));
            } else {
                msgs.push(echoed);
            }
            if user_next || !call {
                msgs.push(json!({"role": "user", "content": format!("next {k}")}));
            }
        }
    }
}
