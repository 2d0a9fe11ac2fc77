//! `qwen3_coder`: exact turns, typed parameters, held markup, malformed
//! and cut calls, pieces and resumption.

use polar_json::RawJson;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::super::*;
use super::{check_pieces, markup_piece, parse_with};

type Call<'a> = (&'a str, Vec<(&'a str, &'a str)>);

/// An assistant turn as Qwen3-Coder's template renders it.
fn render(think: Option<&str>, text: &str, calls: &[Call<'_>]) -> String {
    let mut out = String::new();
    if let Some(r) = think {
        out.push_str(&format!("<think>\n{r}\n</think>\n\n"));
    }
    out.push_str(text);
    for (i, (name, params)) in calls.iter().enumerate() {
        if i > 0 || !text.is_empty() {
            out.push('\n');
        }
        out.push_str(&format!("<tool_call>\n<function={name}>\n"));
        for (p, v) in params {
            out.push_str(&format!("<parameter={p}>\n{v}\n</parameter>\n"));
        }
        out.push_str("</function>\n</tool_call>");
    }
    out.push_str("<|im_end|>");
    out
}

fn options() -> OutputOptions {
    let tool = |name: &str, params: Value| crate::Tool {
        name: name.into(),
        description: None,
        parameters: RawJson::from_value(&params),
    };
    OutputOptions::with_tools(&[tool(
        "bash",
        json!({"type": "object", "properties": {
            "command": {"type": "string"}, "timeout": {"type": "integer"},
            "env": {"type": "object"}, "dry": {"type": "boolean"}
        }}),
    )])
}

fn parse(text: &str) -> ParsedOutput {
    parse_with(OutputFormat::Qwen3Coder, &options(), text)
}

fn args(call: &ParsedCall) -> Value {
    serde_json::from_str(&call.arguments).unwrap()
}

#[test]
fn a_whole_turn_parses_with_typed_parameters() {
    let text = render(
        Some("Run it."),
        "Running.",
        &[
            (
                "bash",
                vec![
                    ("command", "ls -la\necho 5"),
                    ("timeout", "30"),
                    ("env", r#"{"A": [1, 2]}"#),
                    ("dry", "False"),
                    ("extra", "7"),
                ],
            ),
            ("other", vec![("n", "12")]),
        ],
    );
    let p = parse(&text);
    assert_eq!(p.reasoning, "Run it.");
    assert_eq!(p.content, "Running.");
    assert_eq!(p.calls.len(), 2);
    assert_eq!(p.calls[0].name, "bash");
    assert!(p.calls[0].done && p.calls[1].done);
    assert_eq!(
        p.calls[0].arguments,
        r#"{"command": "ls -la\necho 5", "timeout": 30, "env": {"A": [1, 2]}, "dry": false, "extra": "7"}"#,
        "json.dumps spacing, as vLLM sends them"
    );
    assert_eq!(
        args(&p.calls[1]),
        json!({"n": "12"}),
        "an unknown tool: strings"
    );
    // No reasoning, a call alone, no parameters; text only.
    let p = parse(&render(None, "", &[("bash", vec![])]));
    assert_eq!(
        (p.content.as_str(), p.calls[0].arguments.as_str()),
        ("", "{}")
    );
    let p = parse(&render(None, "just text\n", &[]));
    assert_eq!(p.content, "just text\n");
    assert!(p.calls.is_empty() && p.reasoning.is_empty());
}

#[test]
fn a_call_without_tool_call_tags_or_closing_tags_is_read() {
    // vLLM falls back to bare `<function=` blocks, and ends a parameter at
    // the next one or at `</function>`.
    let p = parse("<function=bash>\n<parameter=command>\npwd\n<parameter=timeout>\n5\n</function>");
    assert_eq!(p.calls.len(), 1);
    assert_eq!(args(&p.calls[0]), json!({"command": "pwd", "timeout": 5}));
    assert!(p.calls[0].done);
}

#[test]
fn parameters_show_whole_and_markup_is_held() {
    let mut p = OutputParser::with_options(OutputFormat::Qwen3Coder, &options());
    p.push("<think>\nhm\n</think>\n\nOK\n<tool_").unwrap();
    assert_eq!(p.parsed().content, "OK");
    p.push("call>\n<function=ba").unwrap();
    assert!(
        p.parsed().calls.is_empty(),
        "a call shows once its name is whole"
    );
    p.push("sh>\n<parameter=command>\nls").unwrap();
    assert_eq!(p.parsed().calls[0].arguments, "{");
    p.push(" -l\n</parameter>\n<parameter=timeout>\n9").unwrap();
    assert_eq!(p.parsed().calls[0].arguments, r#"{"command": "ls -l""#);
    p.push("\n</parameter>\n</function>\n</tool_call><|im_end|>")
        .unwrap();
    assert!(p.is_finished());
    assert_eq!(
        p.parsed().calls[0].arguments,
        r#"{"command": "ls -l", "timeout": 9}"#
    );
    assert!(p.parsed().calls[0].done);
}

#[test]
fn malformed_markup_stays_text_and_a_cut_call_stays_open() {
    let p = parse("See <tool_call> here.\n<tool_call>\nnot a function");
    assert_eq!(
        p.content,
        "See <tool_call> here.\n<tool_call>\nnot a function"
    );
    assert!(p.calls.is_empty());
    let p = parse("x\n<tool_call>\n<function=bash>\n<parameter=command>\nls");
    assert_eq!(p.content, "x");
    assert_eq!(p.calls[0].arguments, r#"{"command": "ls""#);
    assert!(!p.calls[0].done);
    let p = parse("<tool_call>\n<function=");
    assert_eq!(p.content, "<tool_call>\n<function=");
}

fn value() -> impl Strategy<Value = String> {
    markup_piece(&["<parameter=", "</function", "null", "12", "<function="])
}

proptest! {
    // Text that would be read as markup is rejected (often, in long runs).
    #![proptest_config(ProptestConfig { max_global_rejects: 1 << 16, ..ProptestConfig::default() })]
    #[test]
    fn pieces_parse_like_the_whole_and_resync_completes_them(
        think in prop::option::of(value()),
        text in value(),
        calls in prop::collection::vec(
            ("[a-z_]{1,6}", prop::collection::vec((prop::sample::select(vec!["command", "timeout", "env", "x"]), value()), 0..3)),
            0..3,
        ),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
        fault in any::<prop::sample::Index>(),
    ) {
        prop_assume!(!text.starts_with("<think>"));
        prop_assume!(!text.contains("<tool_call>") && !text.contains("<function="));
        prop_assume!(think.as_deref().is_none_or(|t| !t.contains("</think>")));
        for (_, params) in &calls {
            for (_, v) in params {
                prop_assume!(!v.contains("</parameter>") && !v.contains("<parameter=") && !v.contains("</function>"));
            }
        }
        let calls: Vec<Call<'_>> = calls
            .iter()
            .map(|(n, ps)| (n.as_str(), ps.iter().map(|(p, v)| (*p, v.as_str())).collect()))
            .collect();
        let full = render(think.as_deref(), &text, &calls);
        let whole = parse(&full);
        prop_assert_eq!(whole.calls.len(), calls.len());
        for c in &whole.calls {
            prop_assert!(serde_json::from_str::<Value>(&c.arguments).is_ok(), "{}", c.arguments);
        }
        check_pieces(OutputFormat::Qwen3Coder, &options(), &full, &cuts, fault)?;
    }
}
