//! `llama3_json`: calls with and without `<|python_tag|>`, several calls,
//! JSON answers kept as text, held markup, cut calls, pieces and
//! resumption.

use proptest::prelude::*;

use super::super::*;
use super::{check_pieces, markup_piece, parse_with};

fn parse(text: &str) -> ParsedOutput {
    parse_with(OutputFormat::Llama3Json, &OutputOptions::default(), text)
}

fn call(name: &str, arguments: &str) -> ParsedCall {
    ParsedCall {
        name: name.into(),
        arguments: arguments.into(),
        done: true,
    }
}

/// Calls as Llama 3.1's template renders them (`tag`: after
/// `<|python_tag|>`, ended by `<|eom_id|>`).
fn render(calls: &[(&str, &str)], tag: bool) -> String {
    let body: Vec<String> = calls
        .iter()
        .map(|(n, a)| {
            format!(
                "{{\"name\": {}, \"parameters\": {a}}}",
                serde_json::Value::from(*n)
            )
        })
        .collect();
    if tag {
        format!("<|python_tag|>{}<|eom_id|>", body.join("; "))
    } else {
        format!("{}<|eot_id|>", body.join("; "))
    }
}

#[test]
fn calls_parse_with_or_without_the_python_tag() {
    let calls = [
        ("bash", r#"{"command": "ls {x}", "n": [1, {"a": "]"}]}"#),
        ("read", "{}"),
    ];
    for tag in [false, true] {
        let p = parse(&render(&calls, tag));
        assert_eq!(p.calls, vec![call("bash", calls[0].1), call("read", "{}")]);
        assert_eq!(p.content, "");
        assert!(p.reasoning_done && p.reasoning.is_empty());
    }
    // `arguments` for `parameters`, keys after the arguments, spacing.
    let p = parse(r#"{ "name" : "x" , "arguments" : { "a" : 1 } , "id": 3 }"#);
    assert_eq!(p.calls, vec![call("x", r#"{ "a" : 1 }"#)]);
    let p = parse("Plain text answer.<|eot_id|>");
    assert_eq!(p.content, "Plain text answer.");
}

#[test]
fn json_that_is_not_a_call_stays_text() {
    for text in [
        r#"{"answer": 42}"#,
        r#"{"name": 3}"#,
        "{",
        "<|python_tag|>print(1)",
        r#"{"name": "x"}"#,
    ] {
        let p = parse(text);
        assert_eq!(p.content, text, "{text}");
        assert!(p.calls.is_empty());
    }
    // Text after the calls is text.
    let p = parse(r#"{"name": "x", "parameters": {}} and then"#);
    assert_eq!((p.calls.len(), p.content.as_str()), (1, " and then"));
}

#[test]
fn arguments_grow_and_a_cut_call_stays_open() {
    let mut p = OutputParser::new(OutputFormat::Llama3Json);
    p.push("<|python").unwrap();
    assert_eq!(
        p.parsed(),
        &ParsedOutput {
            reasoning_done: true,
            ..Default::default()
        }
    );
    p.push("_tag|>{\"name\": \"bash\", \"parameters\": {\"command\": \"l")
        .unwrap();
    assert_eq!(p.parsed().calls[0].arguments, "{\"command\": \"l");
    p.push("s\"} ").unwrap();
    assert_eq!(p.parsed().calls[0].arguments, "{\"command\": \"ls\"}");
    assert!(!p.parsed().calls[0].done);
    p.push("}<|eom_id|>").unwrap();
    assert!(p.is_finished() && p.parsed().calls[0].done);
    let p = parse(r#"{"name": "x", "parameters": {"a": [1,"#);
    assert_eq!(p.calls[0].arguments, r#"{"a": [1,"#);
    assert!(!p.calls[0].done);
}

fn args() -> impl Strategy<Value = String> {
    prop::collection::btree_map(
        "[a-z]{1,4}",
        markup_piece(&["<|python_tag|>", "[", "]"]),
        0..3,
    )
    .prop_map(|m| serde_json::to_string(&m).unwrap_or_default())
}

proptest! {
    #[test]
    fn pieces_parse_like_the_whole_and_resync_completes_them(
        calls in prop::collection::vec(("[a-z_]{1,6}", args()), 0..3),
        text in markup_piece(&["<|python_tag|>"]),
        tag in any::<bool>(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
        fault in any::<prop::sample::Index>(),
    ) {
        let calls: Vec<(&str, &str)> = calls.iter().map(|(n, a)| (n.as_str(), a.as_str())).collect();
        let full = if calls.is_empty() { format!("{text}<|eot_id|>") } else { render(&calls, tag) };
        let whole = parse_with(OutputFormat::Llama3Json, &OutputOptions::default(), &full);
        prop_assert_eq!(whole.calls.len(), calls.len());
        check_pieces(OutputFormat::Llama3Json, &OutputOptions::default(), &full, &cuts, fault)?;
    }
}
