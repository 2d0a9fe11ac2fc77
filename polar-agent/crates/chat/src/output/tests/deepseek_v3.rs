//! `deepseek_v3`: V3 and V3.1 calls, R1 reasoning, held markup, malformed
//! and cut calls, pieces and resumption.

use proptest::prelude::*;

use super::super::*;
use super::{check_pieces, markup_piece, parse_with};

const EOS: &str = "<｜end▁of▁sentence｜>";

/// A turn in V3's markup (`v31`: V3.1's).
fn render(text: &str, calls: &[(&str, &str)], v31: bool) -> String {
    let mut out = text.to_owned();
    if !calls.is_empty() {
        out.push_str("<｜tool▁calls▁begin｜>");
        for (i, (name, args)) in calls.iter().enumerate() {
            if i > 0 && !v31 {
                out.push('\n');
            }
            if v31 {
                out.push_str(&format!(
                    "<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜>"
                ));
            } else {
                out.push_str(&format!(
                    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>"
                ));
            }
        }
        out.push_str("<｜tool▁calls▁end｜>");
    }
    out.push_str(EOS);
    out
}

fn parse(text: &str) -> ParsedOutput {
    parse_with(OutputFormat::DeepseekV3, &OutputOptions::default(), text)
}

fn open() -> OutputOptions {
    OutputOptions {
        reasoning_open: true,
        ..OutputOptions::default()
    }
}

fn call(name: &str, arguments: &str) -> ParsedCall {
    ParsedCall {
        name: name.into(),
        arguments: arguments.into(),
        done: true,
    }
}

#[test]
fn v3_and_v31_calls_parse() {
    let calls = [
        ("bash", r#"{"command": "ls"}"#),
        ("read", r#"{"path":"a```b"}"#),
    ];
    for v31 in [false, true] {
        let p = parse(&render("Let me look.\n\n", &calls, v31));
        assert_eq!(p.content, "Let me look.\n\n", "nothing stripped, as vLLM");
        assert_eq!(
            p.calls,
            vec![call("bash", calls[0].1), call("read", calls[1].1)]
        );
        assert!(p.reasoning.is_empty() && p.reasoning_done);
    }
    // A V3.1 tool named `function` (JSON after the separator).
    let p = parse(
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    );
    assert_eq!(p.calls, vec![call("function", "{}")]);
    // Text after the calls block is text.
    let p = parse(
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>x<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>after",
    );
    assert_eq!(p.content, "after");
}

#[test]
fn reasoning_is_a_think_block_or_what_the_prompt_opened() {
    let p = parse("<think>\nweigh it\n</think>\n\nDone.");
    assert_eq!(
        (p.reasoning.as_str(), p.content.as_str()),
        ("\nweigh it\n", "\n\nDone.")
    );
    let p = parse_with(OutputFormat::DeepseekV3, &open(), "weigh it</think>Done.");
    assert_eq!(
        (p.reasoning.as_str(), p.content.as_str()),
        ("weigh it", "Done.")
    );
    // R1 cut inside its reasoning: all of it is reasoning.
    let p = parse_with(OutputFormat::DeepseekV3, &open(), "still thinking");
    assert_eq!(
        (p.reasoning.as_str(), p.content.as_str()),
        ("still thinking", "")
    );
    // Without a block, `</think>` is text.
    assert_eq!(parse("a</think>b").content, "a</think>b");
}

#[test]
fn markup_is_held_and_arguments_grow() {
    let mut p = OutputParser::new(OutputFormat::DeepseekV3);
    p.push("Hi<｜tool▁calls").unwrap();
    assert_eq!(p.parsed().content, "Hi");
    p.push("▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>ba")
        .unwrap();
    assert!(p.parsed().calls.is_empty());
    p.push("sh\n```json\n{\"a\": 1").unwrap();
    assert_eq!(p.parsed().calls[0].arguments, "{\"a\": 1");
    p.push("}\n``").unwrap();
    assert_eq!(
        p.parsed().calls[0].arguments,
        "{\"a\": 1}",
        "the fence is held"
    );
    assert!(!p.parsed().calls[0].done);
    p.push("`<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sen")
        .unwrap();
    assert!(p.parsed().calls[0].done);
    p.push("tence｜>ignored").unwrap();
    assert!(p.is_finished());
    assert_eq!(p.parsed().calls, vec![call("bash", "{\"a\": 1}")]);
}

#[test]
fn malformed_markup_stays_text_and_a_cut_call_stays_open() {
    let text = "<｜tool▁calls▁begin｜>oops";
    assert_eq!(parse(text).content, text);
    let text = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>x\nnot a fence";
    let p = parse(text);
    assert_eq!(p.content, text);
    assert!(p.calls.is_empty());
    let p = parse("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>x<｜tool▁sep｜>{\"a\":");
    assert_eq!(p.calls[0].arguments, "{\"a\":");
    assert!(!p.calls[0].done);
}

fn piece() -> impl Strategy<Value = String> {
    markup_piece(&["<｜tool▁sep｜>", "```", "function", "｜", "▁"])
}

proptest! {
    // Text that would be read as markup is rejected (often, in long runs).
    #![proptest_config(ProptestConfig { max_global_rejects: 1 << 16, ..ProptestConfig::default() })]
    #[test]
    fn pieces_parse_like_the_whole_and_resync_completes_them(
        think in prop::option::of(piece()),
        text in piece(),
        calls in prop::collection::vec(("[a-z_]{1,6}", piece()), 0..3),
        v31 in any::<bool>(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
        fault in any::<prop::sample::Index>(),
    ) {
        prop_assume!(!text.contains("</think>") && !text.starts_with("<think>"));
        prop_assume!(think.as_deref().is_none_or(|t| !t.contains("</think>")));
        for (_, a) in &calls {
            prop_assume!(!a.contains("<｜tool▁call▁end｜>"));
        }
        let calls: Vec<(&str, &str)> = calls.iter().map(|(n, a)| (n.as_str(), a.as_str())).collect();
        let body = render(&text, &calls, v31);
        let (full, options) = match &think {
            Some(t) => (format!("{t}</think>{body}"), open()),
            None => (body, OutputOptions::default()),
        };
        let whole = parse_with(OutputFormat::DeepseekV3, &options, &full);
        prop_assert_eq!(whole.calls.len(), calls.len(), "{:?}", full);
        check_pieces(OutputFormat::DeepseekV3, &options, &full, &cuts, fault)?;
    }
}
