//! `glm45`: exact turns as GLM-4.5's template writes them, typed values,
//! held markup, malformed and cut calls, pieces and resumption.

use polar_json::RawJson;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::super::*;
use super::{check_pieces, markup_piece, parse_with};

type Call<'a> = (&'a str, Vec<(&'a str, &'a str)>);

/// A turn as GLM-4.5's template writes it (after `<|assistant|>`).
fn render(think: &str, text: &str, calls: &[Call<'_>]) -> String {
    let mut out = format!("\n<think>{think}</think>");
    if !text.is_empty() {
        out.push('\n');
        out.push_str(text);
    }
    for (name, args) in calls {
        out.push_str(&format!("\n<tool_call>{name}\n"));
        for (k, v) in args {
            out.push_str(&format!(
                "<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n"
            ));
        }
        out.push_str("</tool_call>");
    }
    out.push_str("<|user|>");
    out
}

fn options() -> OutputOptions {
    OutputOptions::with_tools(&[crate::Tool {
        name: "bash".into(),
        description: None,
        parameters: RawJson::from_value(&json!({"type": "object", "properties": {
            "command": {"type": "string"}, "timeout": {"type": "integer"}
        }})),
    }])
}

fn parse(text: &str) -> ParsedOutput {
    parse_with(OutputFormat::Glm45, &options(), text)
}

#[test]
fn a_whole_turn_parses_with_typed_values() {
    let p = parse(&render(
        "Check the dir.",
        "Listing.",
        &[
            ("bash", vec![("command", "123"), ("timeout", "30")]),
            (
                "other",
                vec![("flags", r#"["-l", "é"]"#), ("name", "plain")],
            ),
        ],
    ));
    assert_eq!(p.reasoning, "Check the dir.");
    assert_eq!(p.content, "Listing.");
    assert_eq!(p.calls[0].arguments, r#"{"command": "123", "timeout": 30}"#);
    assert_eq!(
        p.calls[1].arguments, r#"{"flags": ["-l", "\u00e9"], "name": "plain"}"#,
        "json.dumps as vLLM writes it"
    );
    assert!(p.calls.iter().all(|c| c.done));
    // No thinking (the prompt's empty block), a call alone.
    let p = parse(&render("", "", &[("bash", vec![])]));
    assert_eq!((p.reasoning.as_str(), p.content.as_str()), ("", ""));
    assert_eq!(p.calls[0].arguments, "{}");
    // Text only, no block.
    assert_eq!(parse("Hello<|user|>").content, "Hello");
}

#[test]
fn markup_is_held_and_pairs_show_whole() {
    let mut p = OutputParser::with_options(OutputFormat::Glm45, &options());
    p.push("\n<think>a</think>\nText\n<tool_").unwrap();
    assert_eq!(p.parsed().content, "Text");
    p.push("call>bash\n<arg_key>command</arg_key>\n<arg_value>ls")
        .unwrap();
    assert_eq!(p.parsed().calls[0].arguments, "{");
    p.push("</arg_value>\n</tool_call><|observ").unwrap();
    assert_eq!(p.parsed().calls[0].arguments, r#"{"command": "ls"}"#);
    assert!(p.parsed().calls[0].done);
    p.push("ation|>").unwrap();
    assert!(p.is_finished());
}

#[test]
fn malformed_markup_stays_text_and_a_cut_call_stays_open() {
    let p = parse("Use <tool_call> tags.");
    assert_eq!(p.content, "Use <tool_call> tags.");
    let p = parse("<tool_call>bash\n<arg_key>command</arg_key><arg_value>ls -");
    assert_eq!(p.calls[0].arguments, r#"{"command": "ls -""#);
    assert!(!p.calls[0].done);
    let v: Value = serde_json::from_str(&format!("{}}}", p.calls[0].arguments)).unwrap();
    assert_eq!(v, json!({"command": "ls -"}));
}

fn piece() -> impl Strategy<Value = String> {
    markup_piece(&["<arg_key>", "</arg_value", "12", "true", "[1]"])
}

proptest! {
    // Text that would be read as markup is rejected (often, in long runs).
    #![proptest_config(ProptestConfig { max_global_rejects: 1 << 16, ..ProptestConfig::default() })]
    #[test]
    fn pieces_parse_like_the_whole_and_resync_completes_them(
        think in piece(),
        text in piece(),
        calls in prop::collection::vec(
            ("[a-z_]{1,6}", prop::collection::vec((prop::sample::select(vec!["command", "timeout", "x"]), piece()), 0..3)),
            0..3,
        ),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
        fault in any::<prop::sample::Index>(),
    ) {
        prop_assume!(!think.contains("</think>") && !text.contains("<tool_call>"));
        for (_, args) in &calls {
            for (_, v) in args {
                prop_assume!(!v.contains("</arg_value>") && !v.contains("</tool_call>"));
            }
        }
        let calls: Vec<Call<'_>> = calls
            .iter()
            .map(|(n, ps)| (n.as_str(), ps.iter().map(|(k, v)| (*k, v.as_str())).collect()))
            .collect();
        let full = render(&think, &text, &calls);
        let whole = parse(&full);
        prop_assert_eq!(whole.calls.len(), calls.len());
        check_pieces(OutputFormat::Glm45, &options(), &full, &cuts, fault)?;
    }
}
