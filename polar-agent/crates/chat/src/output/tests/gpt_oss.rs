//! `gpt_oss`: Harmony channels as the gpt-oss models write them (the
//! generation prompt ends with `<|start|>assistant`), held markup,
//! malformed headers kept as text, pieces and resumption.

use proptest::prelude::*;

use super::super::*;
use super::{check_pieces, markup_piece, parse_with};

fn parse(text: &str) -> ParsedOutput {
    parse_with(OutputFormat::GptOss, &OutputOptions::default(), text)
}

fn call(name: &str, arguments: &str) -> ParsedCall {
    ParsedCall {
        name: name.into(),
        arguments: arguments.into(),
        done: true,
    }
}

/// A turn: reasoning, an optional preamble, then a call or a final answer.
fn render(
    reasoning: &str,
    preamble: Option<&str>,
    call: Option<(&str, &str)>,
    answer: &str,
) -> String {
    let mut out = format!("<|channel|>analysis<|message|>{reasoning}<|end|>");
    if let Some(p) = preamble {
        out.push_str(&format!(
            "<|start|>assistant<|channel|>commentary<|message|>{p}<|end|>"
        ));
    }
    match call {
        Some((name, args)) => out.push_str(&format!(
            "<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{args}<|call|>"
        )),
        None => out.push_str(&format!("<|start|>assistant<|channel|>final<|message|>{answer}<|return|>")),
    }
    out
}

#[test]
fn channels_parse_into_reasoning_text_and_calls() {
    let p = parse(&render(
        "Need the weather.",
        None,
        Some(("get_weather", r#"{"city":"Paris"}"#)),
        "",
    ));
    assert_eq!(p.reasoning, "Need the weather.");
    assert!(p.reasoning_done);
    assert_eq!(p.content, "");
    assert_eq!(p.calls, vec![call("get_weather", r#"{"city":"Paris"}"#)]);
    let p = parse(&render("Easy.", Some("Let me answer."), None, "It is 4."));
    assert_eq!(p.reasoning, "Easy.");
    assert_eq!(
        p.content, "Let me answer.\nIt is 4.",
        "a preamble, then the answer"
    );
    assert!(p.calls.is_empty());
    // The recipient in the role part, a `json` content type.
    let p = parse(
        "<|channel|>analysis<|message|>r<|end|><|start|>assistant to=functions.ls<|channel|>commentary json<|message|>{}<|call|>",
    );
    assert_eq!(p.calls, vec![call("ls", "{}")]);
    // A final answer with no reasoning; reasoning only (cut).
    let p = parse("<|channel|>final<|message|>Hi.<|return|>");
    assert_eq!((p.reasoning.as_str(), p.content.as_str()), ("", "Hi."));
    let p = parse("<|channel|>analysis<|message|>still");
    assert_eq!((p.reasoning.as_str(), p.content.as_str()), ("still", ""));
}

#[test]
fn markup_is_held() {
    let mut p = OutputParser::new(OutputFormat::GptOss);
    p.push("<|channel|>analy").unwrap();
    assert_eq!(p.parsed(), &ParsedOutput::default());
    p.push("sis<|message|>abc<|en").unwrap();
    assert_eq!(p.parsed().reasoning, "abc");
    assert!(!p.parsed().reasoning_done);
    p.push("d|><|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\"").unwrap();
    assert!(p.parsed().reasoning_done);
    assert_eq!(p.parsed().calls[0].arguments, "{\"a\"");
    p.push(": 1}<|ca").unwrap();
    assert!(!p.parsed().calls[0].done);
    p.push("ll|>").unwrap();
    assert_eq!(p.parsed().calls, vec![call("f", "{\"a\": 1}")]);
    p.push("<|return|>").unwrap();
    assert!(p.is_finished());
}

#[test]
fn what_is_not_harmony_stays_text() {
    assert_eq!(parse("Plain answer.").content, "Plain answer.");
    let text = "<|channel|>final but never a message";
    assert_eq!(parse(text).content, text);
    let p = parse("<|channel|>final<|message|>A<|end|>trailing");
    assert_eq!(p.content, "A\ntrailing");
    let long = format!("<|channel|>{}", "x".repeat(600));
    let mut p = OutputParser::new(OutputFormat::GptOss);
    p.push(&long).unwrap();
    assert_eq!(p.parsed().content, long, "a header too long to be one");
}

fn piece() -> impl Strategy<Value = String> {
    markup_piece(&["<|", "|>", "channel", "to=", "<|message|>"])
}

proptest! {
    #[test]
    fn pieces_parse_like_the_whole_and_resync_completes_them(
        reasoning in piece(),
        preamble in prop::option::of(piece()),
        name in "[a-z_]{1,6}",
        args in piece(),
        answer in piece(),
        calls in any::<bool>(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
        fault in any::<prop::sample::Index>(),
    ) {
        for t in [Some(&reasoning), preamble.as_ref(), Some(&args), Some(&answer)].into_iter().flatten() {
            prop_assume!(!t.contains("<|end|>") && !t.contains("<|call|>"));
        }
        let call = calls.then_some((name.as_str(), args.as_str()));
        let full = render(&reasoning, preamble.as_deref(), call, &answer);
        let whole = parse(&full);
        prop_assert_eq!(&whole.reasoning, &reasoning);
        check_pieces(OutputFormat::GptOss, &OutputOptions::default(), &full, &cuts, fault)?;
    }
}
