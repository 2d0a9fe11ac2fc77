use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use super::resync::Resync;
use super::*;
use crate::{FinishReason, StreamEvent, Usage};

mod deepseek_v3;
mod glm45;
mod gpt_oss;
mod llama3_json;
mod qwen3_coder;

/// `text` parsed whole in `format` with `options`.
pub(super) fn parse_with(
    format: OutputFormat,
    options: &OutputOptions,
    text: &str,
) -> ParsedOutput {
    let mut p = OutputParser::with_options(format, options);
    p.push(text).unwrap();
    p.finish().unwrap();
    p.parsed().clone()
}

/// Cut at `cuts` (moved to character boundaries), `full` parses by
/// prefixes to the parse of the whole; and a reply cut at `fault`, its
/// events sent, is completed by [`Resync`] into the same reply.
pub(super) fn check_pieces(
    format: OutputFormat,
    options: &OutputOptions,
    full: &str,
    cuts: &[prop::sample::Index],
    fault: prop::sample::Index,
) -> Result<(), TestCaseError> {
    let whole = parse_with(format, options, full);
    let mut bounds: Vec<usize> = cuts.iter().map(|i| i.index(full.len() + 1)).collect();
    bounds.push(full.len());
    bounds.sort_unstable();
    let mut p = OutputParser::with_options(format, options);
    let mut at = 0;
    for b in bounds {
        let mut b = b;
        while !full.is_char_boundary(b) {
            b += 1;
        }
        if b < at {
            continue;
        }
        p.push(&full[at..b]).unwrap();
        at = b;
        let now = p.parsed();
        prop_assert!(
            whole.reasoning.starts_with(&now.reasoning),
            "{now:?} / {whole:?}"
        );
        prop_assert!(
            whole.content.starts_with(&now.content),
            "{now:?} / {whole:?}"
        );
        prop_assert!(now.calls.len() <= whole.calls.len());
        for (a, w) in now.calls.iter().zip(&whole.calls) {
            prop_assert_eq!(&a.name, &w.name);
            prop_assert!(w.arguments.starts_with(&a.arguments), "{a:?} / {w:?}");
            prop_assert!(!a.done || a == w);
        }
    }
    p.finish().unwrap();
    prop_assert_eq!(p.parsed(), &whole);

    let mut cut = fault.index(full.len() + 1);
    while !full.is_char_boundary(cut) {
        cut += 1;
    }
    let mut first = OutputParser::with_options(format, options);
    first.push(&full[..cut]).unwrap();
    let sent = events_of(first.parsed());
    let mut r = Resync::new();
    for ev in &sent {
        r.observe(ev);
    }
    let mut again = OutputParser::with_options(format, options);
    again.push(&full[..cut]).unwrap();
    let mut all = sent.clone();
    all.extend(step(&mut r, again.parsed(), false));
    again.push(&full[cut..]).unwrap();
    again.finish().unwrap();
    all.extend(step(&mut r, again.parsed(), true));
    all.push(finish());
    let mut straight = events_of(&whole);
    straight.push(finish());
    let (a, b) = (crate::assemble(&all), crate::assemble(&straight));
    prop_assert_eq!(&a.message.content, &b.message.content);
    let reasoning = |m: &crate::Message| m.reasoning.as_ref().map(|r| r.text.clone());
    prop_assert_eq!(reasoning(&a.message), reasoning(&b.message));
    let names = |m: &crate::Message| {
        m.tool_calls
            .iter()
            .map(|c| (c.name.clone(), c.arguments.clone()))
            .collect::<Vec<_>>()
    };
    prop_assert_eq!(names(&a.message), names(&b.message));
    Ok(())
}

/// Text pieces that look like markup of every format.
pub(super) fn markup_piece(extra: &'static [&'static str]) -> impl Strategy<Value = String> {
    let mut atoms = vec![
        "a",
        "b c",
        "\n",
        " ",
        "{",
        "}",
        "\"",
        ":",
        ",",
        ";",
        "é",
        "<",
        ">",
        "/",
        "|",
        "=",
        "`",
        "think",
        "tool_call",
        "<think>",
        "</think>",
    ];
    atoms.extend_from_slice(extra);
    prop::collection::vec(prop::sample::select(atoms), 0..14).prop_map(|v| v.concat())
}

/// An assistant turn in the format (as the mock backend's template
/// renders it), ending with the end-of-turn marker.
fn render(think: Option<&str>, text: &str, calls: &[(&str, &str)]) -> String {
    let mut out = String::new();
    if let Some(r) = think {
        out.push_str(&format!("<think>\n{r}\n</think>\n\n"));
    }
    out.push_str(text);
    for (i, (name, args)) in calls.iter().enumerate() {
        if i > 0 || !text.is_empty() {
            out.push('\n');
        }
        out.push_str(&format!(
            "<tool_call>\n{{\"name\": {}, \"arguments\": {args}}}\n</tool_call>",
            serde_json::Value::from(*name)
        ));
    }
    out.push_str("<|im_end|>");
    out
}

fn parse_all(text: &str) -> ParsedOutput {
    let mut p = OutputParser::new(OutputFormat::Qwen3);
    p.push(text).unwrap();
    p.finish().unwrap();
    p.parsed().clone()
}

fn call(name: &str, arguments: &str) -> ParsedCall {
    ParsedCall {
        name: name.into(),
        arguments: arguments.into(),
        done: true,
    }
}

#[test]
fn a_whole_turn_parses_into_its_parts() {
    let text = render(
        Some("I should list."),
        "Listing.",
        &[
            ("bash", r#"{"command":"ls"}"#),
            ("read", r#"{"path":"a/b}"}"#),
        ],
    );
    let p = parse_all(&text);
    assert_eq!(p.reasoning, "I should list.");
    assert!(p.reasoning_done);
    assert_eq!(p.content, "Listing.");
    assert_eq!(
        p.calls,
        vec![
            call("bash", r#"{"command":"ls"}"#),
            call("read", r#"{"path":"a/b}"}"#)
        ]
    );
    // No reasoning, no text; multi-line reasoning; text only.
    assert_eq!(
        parse_all(&render(None, "", &[("x", "{}")])).calls,
        vec![call("x", "{}")]
    );
    let p = parse_all(&render(Some("a\n\nb\n"), "hi\nthere", &[]));
    assert_eq!(
        (p.reasoning.as_str(), p.content.as_str()),
        ("a\n\nb\n", "hi\nthere")
    );
    assert!(p.calls.is_empty());
    // The Qwen3 no-thinking glue: an empty reasoning block.
    let p = parse_all("<think>\n\n</think>\n\nok");
    assert_eq!((p.reasoning.as_str(), p.content.as_str()), ("", "ok"));
}

#[test]
fn what_may_be_markup_is_held_until_it_is_known() {
    let mut p = OutputParser::new(OutputFormat::Qwen3);
    p.push("<thi").unwrap();
    assert_eq!(p.parsed(), &ParsedOutput::default());
    p.push("nk>\nabc\n").unwrap();
    assert_eq!(
        p.parsed().reasoning,
        "abc",
        "the newline may precede </think>"
    );
    p.push("</think>\n\nSee:\n").unwrap();
    assert!(p.parsed().reasoning_done);
    assert_eq!(
        p.parsed().content,
        "See:",
        "the newline may precede <tool_call>"
    );
    p.push("<tool_call>\n{\"name\": \"ba").unwrap();
    assert!(
        p.parsed().calls.is_empty(),
        "a call shows once its name is whole"
    );
    p.push("sh\", \"arguments\": {\"command\": \"ls\"}")
        .unwrap();
    assert_eq!(p.parsed().calls[0].name, "bash");
    assert_eq!(
        p.parsed().calls[0].arguments,
        "{\"command\": \"ls\"",
        "the last `}}` may close the call"
    );
    p.push("}\n</tool_").unwrap();
    assert_eq!(
        p.parsed().calls[0].arguments,
        "{\"command\": \"ls\"}",
        "a second `}}` shows the first was the arguments'"
    );
    assert!(!p.parsed().calls[0].done);
    p.push("call><|im_e").unwrap();
    assert_eq!(p.parsed().calls[0], call("bash", "{\"command\": \"ls\"}"));
    p.push("nd|>ignored").unwrap();
    assert!(p.is_finished());
    assert_eq!(p.parsed().content, "See:");
}

#[test]
fn tags_split_anywhere_are_held() {
    let mut p = OutputParser::new(OutputFormat::Qwen3);
    for piece in [
        "<think>ab",
        "</thi",
        "nk>",
        "Hi",
        " <tool_c",
        "all>{\"name\": \"x\", \"arguments\": {}}</tool_call>",
    ] {
        p.push(piece).unwrap();
        assert!(!p.parsed().reasoning.contains('<'), "{:?}", p.parsed());
        assert!(!p.parsed().content.contains('<'), "{:?}", p.parsed());
    }
    p.finish().unwrap();
    assert_eq!(p.parsed().reasoning, "ab");
    assert_eq!(p.parsed().content, "Hi ");
    assert_eq!(p.parsed().calls, vec![call("x", "{}")]);
}

#[test]
fn the_end_decides_what_was_held() {
    let mut p = OutputParser::new(OutputFormat::Qwen3);
    p.push("<think>\ncut here\n").unwrap();
    p.finish().unwrap();
    assert_eq!(p.parsed().reasoning, "cut here\n");
    let mut p = OutputParser::new(OutputFormat::Qwen3);
    p.push("Step 3.\n<tool_c").unwrap();
    p.finish().unwrap();
    assert_eq!(p.parsed().content, "Step 3.\n<tool_c");
}

#[test]
fn a_malformed_call_is_an_error() {
    let mut p = OutputParser::new(OutputFormat::Qwen3);
    let err = p.push("<tool_call>\n[1, 2]").unwrap_err();
    assert!(matches!(err, OutputError::MalformedCall { .. }), "{err}");
    let mut p = OutputParser::new(OutputFormat::Qwen3);
    p.push("<tool_call>\n{\"name\": \"x\", \"arguments\": 1\n</tool_call>")
        .unwrap_err();
}

#[test]
fn hermes_names_the_same_format() {
    #[derive(serde::Deserialize)]
    struct C {
        f: OutputFormat,
    }
    let c: C = serde_json::from_str(r#"{"f": "hermes"}"#).unwrap();
    assert_eq!(c.f, OutputFormat::Qwen3);
    assert_eq!(OutputFormat::Qwen3.as_str(), "qwen3");
    assert!(serde_json::from_str::<C>(r#"{"f": "llama"}"#).is_err());
}

/// The events a server-side parser would have streamed for `parsed`.
fn events_of(parsed: &ParsedOutput) -> Vec<StreamEvent> {
    let mut r = Resync::new();
    r.observe(&StreamEvent::Start {
        id: "r".into(),
        model: "m".into(),
        prompt_tokens: None,
    });
    let mut out = vec![StreamEvent::Start {
        id: "r".into(),
        model: "m".into(),
        prompt_tokens: None,
    }];
    out.extend(step(&mut r, parsed, false));
    out
}

/// A step, its events observed as sent.
fn step(r: &mut Resync, parsed: &ParsedOutput, finished: bool) -> Vec<StreamEvent> {
    let events = r.step(parsed, finished).unwrap();
    for ev in &events {
        r.observe(ev);
    }
    events
}

fn finish() -> StreamEvent {
    StreamEvent::Finish {
        finish_reason: FinishReason::ToolCalls,
        usage: Usage::default(),
    }
}

#[test]
fn resync_sends_only_what_goes_beyond() {
    let text = render(
        Some("think"),
        "Hello there",
        &[("bash", r#"{"command":"ls -l"}"#)],
    );
    let cut = text.find("there").unwrap() + 2;
    let mut first = OutputParser::new(OutputFormat::Qwen3);
    first.push(&text[..cut]).unwrap();
    let sent = events_of(first.parsed());
    let mut r = Resync::new();
    for ev in &sent {
        r.observe(ev);
    }
    let mut p = OutputParser::new(OutputFormat::Qwen3);
    p.push(&text[..cut]).unwrap();
    assert!(
        step(&mut r, p.parsed(), false).is_empty(),
        "nothing new yet"
    );
    p.push(&text[cut..]).unwrap();
    p.finish().unwrap();
    let more = step(&mut r, p.parsed(), true);
    assert_eq!(
        more,
        vec![
            StreamEvent::TextDelta { text: "ere".into() },
            StreamEvent::ToolCallStart {
                index: 0,
                id: "r-call-0".into(),
                name: "bash".into()
            },
            StreamEvent::ToolCallDelta {
                index: 0,
                arguments: r#"{"command":"ls -l"}"#.into()
            },
        ]
    );
    assert_eq!(
        p.parsed().finish_reason(FinishReason::Stop),
        FinishReason::ToolCalls
    );
    assert_eq!(
        parse_all("hi").finish_reason(FinishReason::Stop),
        FinishReason::Stop
    );
}

#[test]
fn resync_refuses_what_disagrees() {
    let mut r = Resync::new();
    r.observe(&StreamEvent::TextDelta {
        text: "Hello!".into(),
    });
    let parsed = parse_all("Hello?");
    assert!(matches!(
        r.step(&parsed, true),
        Err(OutputError::Diverged(_))
    ));
    // Behind but agreeing: wait while the output goes on, refuse at its end.
    let mut p = OutputParser::new(OutputFormat::Qwen3);
    p.push("Hel").unwrap();
    assert_eq!(r.step(p.parsed(), false).unwrap(), vec![]);
    p.finish().unwrap();
    assert!(r.step(p.parsed(), true).is_err());
    // A tool call sent under another name.
    let mut r = Resync::new();
    r.observe(&StreamEvent::ToolCallStart {
        index: 0,
        id: "c".into(),
        name: "read".into(),
    });
    let parsed = parse_all(&render(None, "", &[("write", "{}")]));
    assert!(r.step(&parsed, true).is_err());
    // Reasoning sent that the output does not have.
    let mut r = Resync::new();
    r.observe(&StreamEvent::ReasoningDelta { text: "x".into() });
    assert!(r.step(&parse_all("text"), true).is_err());
}

#[test]
fn resync_takes_whitespace_a_server_kept_before_a_call_as_sent() {
    // vLLM's `hermes` parser sent the newline before `<tool_call>` as text.
    let mut r = Resync::new();
    r.observe(&StreamEvent::TextDelta {
        text: "Listing.\n".into(),
    });
    let parsed = parse_all(&render(None, "Listing.", &[("ls", "{}")]));
    assert_eq!(parsed.content, "Listing.");
    assert_eq!(
        r.step(&parsed, true).unwrap(),
        vec![
            StreamEvent::ToolCallStart {
                index: 0,
                id: "-call-0".into(),
                name: "ls".into()
            },
            StreamEvent::ToolCallDelta {
                index: 0,
                arguments: "{}".into()
            },
        ]
    );
    // Without a call it is text the output does not have.
    assert!(r.step(&parse_all("Listing."), true).is_err());
    // Other text is not.
    let mut r = Resync::new();
    r.observe(&StreamEvent::TextDelta {
        text: "Listing.\nx".into(),
    });
    assert!(r.step(&parsed, true).is_err());
    // The newlines after `</think>`, kept too, then the rest of the text.
    let parsed = parse_all(&render(Some("r"), "Listing.", &[("ls", "{}")]));
    let mut r = Resync::new();
    r.observe(&StreamEvent::ReasoningDelta { text: "r".into() });
    r.observe(&StreamEvent::ReasoningDone { signature: None });
    r.observe(&StreamEvent::TextDelta {
        text: "\n\nList".into(),
    });
    let mut partial = parsed.clone();
    partial.content = "Li".into();
    partial.calls.clear();
    assert_eq!(r.step(&partial, false).unwrap(), vec![], "behind: wait");
    assert_eq!(
        r.step(&parsed, true).unwrap()[0],
        StreamEvent::TextDelta {
            text: "ing.".into()
        }
    );
    assert_eq!(r.step(&parsed, true).unwrap().len(), 3);
}

#[test]
fn resync_takes_the_newlines_a_server_kept_around_reasoning_as_sent() {
    // vLLM's `qwen3` reasoning parser sends `<think>\n{r}\n</think>`'s
    // reasoning with both newlines; Polar's parse has neither.
    let parsed = parse_all(&render(Some("Look first."), "", &[("ls", "{}")]));
    assert_eq!(parsed.reasoning, "Look first.");
    let mut r = Resync::new();
    r.observe(&StreamEvent::ReasoningDelta {
        text: "\nLook".into(),
    });
    let mut partial = parsed.clone();
    partial.reasoning = "Lo".into();
    partial.reasoning_done = false;
    partial.calls.clear();
    assert_eq!(r.step(&partial, false).unwrap(), vec![], "behind: wait");
    assert_eq!(
        r.step(&parsed, true).unwrap()[0],
        StreamEvent::ReasoningDelta {
            text: " first.".into()
        }
    );
    // The whole reasoning sent, its closing newline too: nothing more of it.
    let mut r = Resync::new();
    r.observe(&StreamEvent::ReasoningDelta {
        text: "\nLook first.\n".into(),
    });
    let events = r.step(&parsed, true).unwrap();
    assert_eq!(events[0], StreamEvent::ReasoningDone { signature: None });
    assert!(
        matches!(events[1], StreamEvent::ToolCallStart { .. }),
        "{events:?}"
    );
    // Other reasoning is not.
    let mut r = Resync::new();
    r.observe(&StreamEvent::ReasoningDelta {
        text: "\nLeap".into(),
    });
    assert!(r.step(&parsed, true).is_err());
}

#[test]
fn resync_goes_on_from_arguments_a_server_re_serialized() {
    // vLLM's hermes parser streamed the arguments' first part as
    // `json.dumps` writes it; the model wrote them compact.
    let sent = |args: &str| {
        let mut r = Resync::new();
        r.observe(&StreamEvent::ToolCallStart {
            index: 0,
            id: "c".into(),
            name: "bash".into(),
        });
        r.observe(&StreamEvent::ToolCallDelta {
            index: 0,
            arguments: args.into(),
        });
        r
    };
    let with = |args: &str, done: bool| ParsedOutput {
        calls: vec![ParsedCall {
            done,
            ..call("bash", args)
        }],
        ..ParsedOutput::default()
    };
    let r = sent(r#"{"command": "echo h"#);
    // The parse behind (and agreeing): wait.
    assert_eq!(
        r.step(&with(r#"{"command":"ec"#, false), false).unwrap(),
        vec![]
    );
    // Ahead: the rest of the model's own text.
    let raw = r#"{"command":"echo hi", "timeout":5}"#;
    assert_eq!(
        r.step(&with(raw, true), true).unwrap(),
        vec![StreamEvent::ToolCallDelta {
            index: 0,
            arguments: r#"i", "timeout":5}"#.into()
        }]
    );
    // Sent up to a separator's space: the model's text after the comma.
    let r = sent("{\"command\": \"echo hi\", ");
    assert_eq!(
        r.step(&with(raw, true), true).unwrap(),
        vec![StreamEvent::ToolCallDelta {
            index: 0,
            arguments: r#" "timeout":5}"#.into()
        }]
    );
    // Whitespace inside a string, other escapes, other values: refused.
    for other in [
        r#"{"command":"echo  hi"}"#,
        r#"{"command":"echo h\u0069"}"#,
        r#"{"command":"echo ho"}"#,
    ] {
        assert!(
            matches!(
                sent(r#"{"command": "echo hi"#).step(&with(other, true), true),
                Err(OutputError::Diverged(_))
            ),
            "{other}"
        );
    }
    // Behind at the end of the output: refused.
    assert!(
        sent(r#"{"command": "echo hi"#)
            .step(&with(r#"{"command":"ec"#, false), true)
            .is_err()
    );
}

fn piece() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec![
            "a",
            "b c",
            "\n",
            "{",
            "}",
            "\"",
            ":",
            "é",
            "<",
            ">",
            "/",
            "think",
            "tool_call",
        ]),
        0..12,
    )
    .prop_map(|v| v.concat())
}

fn json_args() -> impl Strategy<Value = String> {
    prop::collection::btree_map("[a-z]{1,4}", piece(), 0..3)
        .prop_map(|m| serde_json::to_string(&m).unwrap_or_default())
}

proptest! {
    /// However the output is cut into pieces, the parse grows by prefixes
    /// to the parse of the whole; and a reply cut anywhere, its events sent,
    /// is completed by Resync into the same reply.
    #[test]
    fn pieces_parse_like_the_whole_and_resync_completes_them(
        think in prop::option::of(piece()),
        text in piece(),
        calls in prop::collection::vec(("[a-z_]{1,6}", json_args()), 0..3),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
        fault in any::<prop::sample::Index>(),
    ) {
        // Text that would be read as markup is not what this checks.
        prop_assume!(!text.contains("<tool_call>") && !text.starts_with("<think>"));
        prop_assume!(!text.starts_with('\n') || think.is_none());
        prop_assume!(think.as_deref().is_none_or(|t| !t.contains("</think>")));
        prop_assume!(calls.iter().all(|(_, a)| !a.contains("</tool_call>")));
        let calls: Vec<(&str, &str)> = calls.iter().map(|(n, a)| (n.as_str(), a.as_str())).collect();
        let full = render(think.as_deref(), &text, &calls);
        check_pieces(OutputFormat::Qwen3, &OutputOptions::default(), &full, &cuts, fault)?;
    }
}

/// Markup atoms of every format, for hostile text.
const EVERY_MARKUP: &[&str] = &[
    "<think>",
    "</think>",
    "\n",
    " ",
    "a",
    "é",
    "{",
    "}",
    "[",
    "]",
    "\"",
    ":",
    ",",
    ";",
    "`",
    "```json\n",
    "<tool_call>",
    "</tool_call>",
    "<function=f>",
    "</function>",
    "<parameter=p>",
    "</parameter>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "{\"name\": \"f\", \"parameters\": ",
    "{\"name\": \"f\", \"arguments\": ",
    "<|python_tag|>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>",
    "function",
    "<|start|>assistant",
    "<|channel|>",
    "analysis",
    "final",
    "commentary",
    " to=functions.f",
    "<|constrain|>json",
    "<|message|>",
    "<|end|>",
    "<|call|>",
    "<|im_end|>",
    "<|return|>",
    "<|eot_id|>",
    "<|user|>",
    "<｜end▁of▁sentence｜>",
    "<",
    "|",
    "｜",
    "▁",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    /// Any text, in any format but `qwen3` (which refuses malformed
    /// calls): it parses without an error, in pieces as whole, the parse
    /// only growing, and a reply cut anywhere is completed by Resync.
    #[test]
    fn any_text_parses_in_every_format(
        atoms in prop::collection::vec(prop::sample::select(EVERY_MARKUP), 0..40),
        format in prop::sample::select(&OutputFormat::ALL[1..]),
        open in any::<bool>(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
        fault in any::<prop::sample::Index>(),
    ) {
        let text = atoms.concat();
        let options = OutputOptions { reasoning_open: open, ..OutputOptions::default() };
        check_pieces(format, &options, &text, &cuts, fault)?;
    }
}

#[test]
fn every_format_has_its_name() {
    for format in OutputFormat::ALL {
        let json = serde_json::to_string(&format).unwrap();
        assert_eq!(json, format!("\"{}\"", format.as_str()));
        assert_eq!(serde_json::from_str::<OutputFormat>(&json).unwrap(), format);
    }
}

#[test]
fn a_prompt_that_opened_the_reasoning_starts_the_output_in_it() {
    let open = OutputOptions {
        reasoning_open: true,
        ..OutputOptions::default()
    };
    // Qwen3 thinking templates end the generation prompt with `<think>\n`.
    for format in [OutputFormat::Qwen3, OutputFormat::Qwen3Coder] {
        let p = parse_with(format, &open, "weigh\nit\n</think>\n\nDone.<|im_end|>");
        assert_eq!(
            (p.reasoning.as_str(), p.content.as_str()),
            ("weigh\nit", "Done.")
        );
        let p = parse_with(format, &open, "cut short");
        assert_eq!(
            (p.reasoning.as_str(), p.content.as_str()),
            ("cut short", "")
        );
    }
    let p = parse_with(OutputFormat::Glm45, &open, "weigh</think>\nDone.");
    assert_eq!(
        (p.reasoning.as_str(), p.content.as_str()),
        ("weigh", "Done.")
    );
    // The formats without a reasoning block ignore it.
    let p = parse_with(OutputFormat::Llama3Json, &open, "Hi.");
    assert_eq!((p.reasoning.as_str(), p.content.as_str()), ("", "Hi."));
}
