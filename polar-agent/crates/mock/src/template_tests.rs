use serde_json::json;

use super::*;
use crate::generate::{Generation, generate};
use crate::script::Plan;
use crate::tokenizer::{self, THINK};
use polar_chat::{Reasoning, ToolCall};

fn bash() -> Tool {
    Tool {
        name: "bash".into(),
        description: Some("Run a command".into()),
        parameters: polar_json::RawJson::from_value(
            &json!({"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}),
        ),
    }
}

/// The assistant message a harness sends back for a generation.
fn echo(g: &Generation, turn: usize) -> Message {
    let p = &g.parsed;
    let mut m = Message::text(Role::Assistant, p.content.clone());
    m.reasoning = p.reasoning.clone().map(|text| Reasoning {
        text,
        ..Reasoning::default()
    });
    m.tool_calls = p
        .tool_calls
        .iter()
        .enumerate()
        .map(|(i, c)| ToolCall {
            id: format!("call_{turn}_{i}"),
            name: c.name.clone(),
            arguments: c.arguments.clone(),
        })
        .collect();
    m
}

fn tool_result(id: &str, text: &str) -> Message {
    let mut m = Message::text(Role::Tool, text);
    m.tool_call_id = Some(id.into());
    m
}

fn plan(think: Option<&str>, text: &str, calls: &[(&str, serde_json::Value)]) -> Plan {
    Plan {
        think: think.map(str::to_owned),
        text: text.into(),
        tool_calls: calls
            .iter()
            .map(|(n, a)| ((*n).to_owned(), a.to_string()))
            .collect(),
        ..Plan::default()
    }
}

/// Runs a four-turn tool-use conversation (two user messages); returns each
/// turn's prompt ids and generation.
fn conversation(opts: &TemplateOptions, think: bool) -> Vec<(Vec<u32>, Generation)> {
    let t = |s: &'static str| think.then_some(s);
    let plans = [
        plan(
            t("I should use bash."),
            "",
            &[("bash", json!({"command": "echo hi > a.txt"}))],
        ),
        plan(t("It worked."), "Wrote a.txt.", &[]),
        plan(
            t("Delete it."),
            "Deleting.",
            &[("bash", json!({"command": "rm a.txt", "cwd": "/tmp"}))],
        ),
        plan(t("Gone."), "Done — a.txt is gone.", &[]),
    ];
    let tools = vec![bash()];
    let mut messages = vec![
        Message::text(Role::System, "You are a coder."),
        Message::text(Role::User, "write a file"),
    ];
    let mut out = Vec::new();
    for (turn, p) in plans.iter().enumerate() {
        let prompt = tokenizer::encode(&render_prompt(&messages, &tools, opts, true));
        let g = generate(prompt.clone(), p, 4096);
        let reply = echo(&g, turn);
        let ids: Vec<String> = reply.tool_calls.iter().map(|c| c.id.clone()).collect();
        messages.push(reply);
        for id in ids {
            messages.push(tool_result(&id, "ok"));
        }
        if turn == 1 {
            messages.push(Message::text(Role::User, "now delete it"));
        }
        out.push((prompt, g));
    }
    out
}

fn concat(prompt: &[u32], g: &Generation) -> Vec<u32> {
    prompt.iter().chain(&g.ids).copied().collect()
}

fn first_difference(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[test]
fn prompts_extend_the_previous_prompt_and_response() {
    let turns = conversation(&TemplateOptions::default(), true);
    for pair in turns.windows(2) {
        let (p0, g0) = &pair[0];
        let (p1, _) = &pair[1];
        let earlier = concat(p0, g0);
        assert_eq!(&p1[..earlier.len()], earlier.as_slice());
        assert_eq!(g0.ids.last(), Some(&tokenizer::IM_END));
    }
    assert_eq!(turns[0].1.finish, crate::generate::Finish::ToolCalls);
    assert_eq!(turns[1].1.finish, crate::generate::Finish::Stop);
}

#[test]
fn rendering_is_reversible() {
    for (prompt, g) in conversation(&TemplateOptions::default(), true) {
        let text = tokenizer::decode(&prompt).unwrap();
        assert_eq!(tokenizer::encode(&text), prompt);
        assert_eq!(tokenizer::decode(&g.ids).unwrap(), g.text);
        assert_eq!(g.ids.len(), g.logprobs.len());
        assert!(g.logprobs.iter().all(|lp| *lp > -5.0 && *lp <= 0.0));
    }
}

#[test]
fn strip_all_drops_every_think_block_from_history() {
    let opts = TemplateOptions {
        strip_reasoning: StripReasoning::All,
        ..TemplateOptions::default()
    };
    let turns = conversation(&opts, true);
    for pair in turns.windows(2) {
        let (p0, g0) = &pair[0];
        let (p1, _) = &pair[1];
        let earlier = concat(p0, g0);
        assert_ne!(&p1[..earlier.len().min(p1.len())], earlier.as_slice());
        // The break is exactly at the <think> token of the last response...
        let at = first_difference(p1, &earlier);
        assert_eq!(earlier[at], THINK);
        // ...and the history turn is the response without its think block.
        let p = &g0.parsed;
        let calls: Vec<(&str, &str)> = p
            .tool_calls
            .iter()
            .map(|c| (c.name.as_str(), c.arguments.as_str()))
            .collect();
        let stripped =
            tokenizer::encode(&(render_assistant_body(None, &p.content, &calls) + "<|im_end|>"));
        assert_eq!(&p1[at..at + stripped.len()], stripped.as_slice());
    }
}

#[test]
fn strip_before_last_user_breaks_only_after_a_new_user_message() {
    let opts = TemplateOptions {
        strip_reasoning: StripReasoning::BeforeLastUser,
        ..TemplateOptions::default()
    };
    let turns = conversation(&opts, true);
    let prefix = |n: usize| {
        let earlier = concat(&turns[n].0, &turns[n].1);
        turns[n + 1].0.starts_with(&earlier)
    };
    // turn 0 -> 1: the same user message, prefix kept (Qwen3 keeps reasoning after the last user message).
    assert!(prefix(0));
    // turn 1 -> 2: a new user message came: earlier turns lose their reasoning, starting with turn 0's.
    assert!(!prefix(1));
    let earlier = concat(&turns[1].0, &turns[1].1);
    let at = first_difference(&turns[2].0, &earlier);
    assert_eq!(at, turns[0].0.len());
    assert_eq!(earlier[at], THINK);
    // turn 2 -> 3: no new user message: kept again.
    assert!(prefix(2));
}

#[test]
fn generation_glue_is_only_in_the_generation_prompt() {
    let opts = TemplateOptions {
        generation_glue: NO_THINK_GLUE.into(),
        ..TemplateOptions::default()
    };
    let glue = tokenizer::encode(NO_THINK_GLUE);
    let turns = conversation(&opts, false);
    for pair in turns.windows(2) {
        let (p0, g0) = &pair[0];
        let (p1, _) = &pair[1];
        assert!(p0.ends_with(&glue));
        assert!(!p1.starts_with(&concat(p0, g0)));
        let without_glue: Vec<u32> = p0[..p0.len() - glue.len()]
            .iter()
            .chain(&g0.ids)
            .copied()
            .collect();
        assert!(p1.starts_with(&without_glue));
        assert_eq!(first_difference(p1, &concat(p0, g0)), p0.len() - glue.len());
    }
}

#[test]
fn generated_text_parses_back() {
    let body = render_assistant_body(
        Some("line one\nline two"),
        "Sure.",
        &[
            ("bash", r#"{"command": "ls",  "a": 1}"#),
            ("write_file", "{}"),
        ],
    );
    let text = format!("{body}<|im_end|>");
    let p = parse_output(&text);
    assert_eq!(p.reasoning.as_deref(), Some("line one\nline two"));
    assert_eq!(p.content, "Sure.");
    assert_eq!(
        p.tool_calls,
        vec![
            ParsedCall {
                name: "bash".into(),
                arguments: r#"{"command":"ls","a":1}"#.into()
            },
            ParsedCall {
                name: "write_file".into(),
                arguments: "{}".into()
            },
        ]
    );
    let mut pos = 0;
    for (_, span) in &p.spans {
        assert_eq!(span.start, pos);
        pos = span.end;
    }
    assert_eq!(pos, text.len());
    let only_call = parse_output(&render_assistant_body(None, "", &[("x", "{}")]));
    assert_eq!(only_call.content, "");
    assert_eq!(only_call.tool_calls.len(), 1);
}

#[test]
fn truncated_text_parses_leniently() {
    let p = parse_output("<think>\nstill thinking");
    assert_eq!(p.reasoning.as_deref(), Some("still thinking"));
    let body = render_assistant_body(None, "Hi", &[("bash", "{}")]);
    let cut = &body[..body.len() - 5];
    let p = parse_output(cut);
    assert!(p.tool_calls.is_empty());
    assert_eq!(p.content, cut);
}

#[test]
fn facts_sniffed_from_text_match_the_messages() {
    let mut messages = vec![Message::text(Role::User, "write a file")];
    let mut a = Message::text(Role::Assistant, "");
    a.tool_calls = vec![ToolCall {
        id: "c1".into(),
        name: "bash".into(),
        arguments: "{}".into(),
    }];
    messages.push(a);
    messages.push(tool_result("c1", "ok"));
    let tools = vec![bash()];
    let text = render_prompt(&messages, &tools, &TemplateOptions::default(), true);
    let sniffed = PromptFacts::sniff(&text);
    assert_eq!(sniffed, PromptFacts::of_messages(&messages, &tools));
    assert!(sniffed.tool_result_after_last_user);
    assert_eq!(sniffed.first_user.as_deref(), Some("write a file"));
}
