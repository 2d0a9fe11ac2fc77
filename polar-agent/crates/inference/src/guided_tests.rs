//! The constraint of each kind in both dialects' token-in bodies, what
//! stays with the chat endpoint, and the output read back.

use serde_json::{Value, json};

use polar_chat::output::{OutputFormat, OutputParser, ParsedCall};

use super::*;

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "bash", "parameters": {
            "type": "object",
            "properties": {"command": {"$ref": "#/$defs/cmd"}},
            "required": ["command"],
            "$defs": {"cmd": {"type": "string"}},
        }}},
        {"type": "function", "function": {"name": "done"}},
    ])
}

fn body(extra: Value) -> Value {
    let mut b = json!({"model": "m", "messages": [], "tools": tools()});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

fn vllm_body() -> Value {
    json!({"model": "m", "prompt": [1, 2], "max_tokens": 10})
}

fn sglang_body() -> Value {
    json!({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 10}})
}

/// The token-in bodies of a chat body's constraint in both dialects.
fn applied(chat: &Value) -> (Value, Value) {
    let mut v = vllm_body();
    let mut s = sglang_body();
    Guided::of(Dialect::Vllm, OutputFormat::Qwen3, chat)
        .unwrap()
        .unwrap()
        .apply(Dialect::Vllm, &mut v);
    Guided::of(Dialect::Sglang, OutputFormat::Qwen3, chat)
        .unwrap()
        .unwrap()
        .apply(Dialect::Sglang, &mut s);
    (v, s)
}

fn sglang_schema(s: &Value) -> Value {
    let text = s["sampling_params"]["json_schema"].as_str().unwrap();
    serde_json::from_str(text).unwrap()
}

#[test]
fn free_output_has_no_constraint() {
    for choice in [json!("auto"), json!("none"), Value::Null] {
        let b = body(json!({"tool_choice": choice, "response_format": {"type": "text"}}));
        assert_eq!(Guided::of(Dialect::Vllm, OutputFormat::Qwen3, &b), Ok(None));
    }
}

#[test]
fn json_object_is_any_object() {
    let (v, s) = applied(&body(json!({"response_format": {"type": "json_object"}})));
    assert_eq!(v["structured_outputs"], json!({"json_object": true}));
    assert_eq!(v["prompt"], json!([1, 2]), "the rest stays");
    assert_eq!(
        s["sampling_params"]["json_schema"],
        json!(r#"{"type": "object"}"#)
    );
    assert_eq!(s["sampling_params"]["max_new_tokens"], json!(10));
}

#[test]
fn a_json_schema_is_compiled_as_given() {
    let schema =
        json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]});
    let chat = body(
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}}),
    );
    let (v, s) = applied(&chat);
    assert_eq!(v["structured_outputs"], json!({"json": schema}));
    assert_eq!(sglang_schema(&s), schema);
    // Python's json.dumps spacing, as SGLang's chat endpoint writes it.
    assert_eq!(
        s["sampling_params"]["json_schema"],
        json!(
            r#"{"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}"#
        )
    );
    let g = Guided::of(Dialect::Vllm, OutputFormat::Qwen3, &chat)
        .unwrap()
        .unwrap();
    assert_eq!(g.shape(), &Shape::Content);
}

#[test]
fn a_named_tool_is_its_parameters_on_vllm_and_an_array_on_sglang() {
    let chat = body(json!({"tool_choice": {"type": "function", "function": {"name": "bash"}}}));
    let (v, s) = applied(&chat);
    assert_eq!(
        v["structured_outputs"]["json"],
        tools()[0]["function"]["parameters"]
    );
    assert_eq!(
        sglang_schema(&s),
        json!({
            "type": "array", "minItems": 1,
            "items": {
                "properties": {
                    "name": {"type": "string", "enum": ["bash"]},
                    "parameters": tools()[0]["function"]["parameters"],
                },
                "required": ["name", "parameters"],
            },
        })
    );
    let g = Guided::of(Dialect::Vllm, OutputFormat::Qwen3, &chat)
        .unwrap()
        .unwrap();
    assert_eq!(g.shape(), &Shape::Arguments("bash".into()));
    // A tool without parameters takes any object; one call only on
    // SGLang when parallel calls are off.
    let mut chat = body(json!({"tool_choice": {"type": "function", "function": {"name": "done"}}}));
    let (v, _) = applied(&chat);
    assert_eq!(
        v["structured_outputs"]["json"],
        json!({"type": "object", "properties": {}})
    );
    chat["parallel_tool_calls"] = json!(false);
    let (_, s) = applied(&chat);
    let schema = sglang_schema(&s);
    assert_eq!(schema["maxItems"], json!(1));
    assert_eq!(
        schema["items"]["properties"]["parameters"],
        json!({"type": "object", "properties": {}})
    );
}

#[test]
fn required_is_an_array_of_any_tool_with_the_defs_on_top() {
    let chat = body(json!({"tool_choice": "required"}));
    let (v, s) = applied(&chat);
    let vs = &v["structured_outputs"]["json"];
    assert_eq!(vs["type"], "array");
    assert_eq!(vs["minItems"], 1);
    assert_eq!(vs["$defs"], json!({"cmd": {"type": "string"}}));
    let any = vs["items"]["anyOf"].as_array().unwrap();
    assert_eq!(any.len(), 2);
    assert_eq!(any[0]["properties"]["name"]["enum"], json!(["bash"]));
    // vLLM moves the defs out of the tool's schema; SGLang copies them.
    assert!(any[0]["properties"]["parameters"].get("$defs").is_none());
    let ss = sglang_schema(&s);
    assert_eq!(ss["$defs"], vs["$defs"]);
    assert!(
        ss["items"]["anyOf"][0]["properties"]["parameters"]
            .get("$defs")
            .is_some()
    );
    assert!(ss.get("maxItems").is_none());
    assert_eq!(
        Guided::of(Dialect::Sglang, OutputFormat::Qwen3, &chat)
            .unwrap()
            .unwrap()
            .shape(),
        &Shape::Calls
    );
}

#[test]
fn what_the_chat_endpoint_keeps_says_why() {
    let both = body(json!({"tool_choice": "required", "response_format": {"type": "json_object"}}));
    let unknown = body(json!({"tool_choice": {"type": "function", "function": {"name": "nope"}}}));
    let mut clash = body(json!({"tool_choice": "required"}));
    clash["tools"][1]["function"]["parameters"] =
        json!({"type": "object", "$defs": {"cmd": {"type": "integer"}}});
    let no_schema =
        body(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}));
    for (chat, says) in [
        (&both, "together"),
        (&unknown, "not among the tools"),
        (&clash, "multiple schemas"),
        (&no_schema, "without a schema"),
    ] {
        let why = Guided::of(Dialect::Vllm, OutputFormat::Qwen3, chat).unwrap_err();
        assert!(why.contains(says), "{why}");
        assert!(why.starts_with("constrained output"), "{why}");
    }
    let named = body(json!({"tool_choice": "required"}));
    for format in [OutputFormat::Llama3Json, OutputFormat::GptOss] {
        let why = Guided::of(Dialect::Vllm, format, &named).unwrap_err();
        assert!(why.contains(format.as_str()), "{why}");
        // Structured output is read as the format's parser reads any text.
        let rf = body(json!({"response_format": {"type": "json_object"}}));
        assert!(Guided::of(Dialect::Vllm, format, &rf).unwrap().is_some());
    }
}

#[test]
fn dumps_writes_as_python_does() {
    let v = json!({"a": [1, 2.5, "x, y: z"], "é": {"q": "\"", "n": null}});
    assert_eq!(
        dumps(&v),
        r#"{"a": [1, 2.5, "x, y: z"], "é": {"q": "\"", "n": null}}"#
    );
}

#[test]
fn forced_output_becomes_calls() {
    let named = Shape::Arguments("bash".into());
    assert_eq!(
        forced_calls(&named, "\n\n{\"command\":\"ls\"}"),
        Ok(vec![ParsedCall {
            name: "bash".into(),
            arguments: "{\"command\":\"ls\"}".into(),
            done: true,
        }])
    );
    let calls = forced_calls(
        &Shape::Calls,
        r#"[{"name":"bash","parameters":{"command":"ls -l"}},{"name":"done","parameters":{}}]"#,
    )
    .unwrap();
    let pairs: Vec<(&str, &str)> = calls
        .iter()
        .map(|c| (c.name.as_str(), c.arguments.as_str()))
        .collect();
    assert_eq!(pairs, [("bash", r#"{"command": "ls -l"}"#), ("done", "{}")]);
    assert!(forced_calls(&Shape::Calls, r#"{"name":"bash"}"#).is_err());
    assert!(forced_calls(&Shape::Calls, r#"[{"parameters":{}}]"#).is_err());
    assert_eq!(forced_calls(&Shape::Content, "{}"), Ok(Vec::new()));
}

#[test]
fn a_reader_streams_reasoning_and_makes_the_calls_at_the_end() {
    let shape = Shape::Calls;
    let mut r = Reader::new(OutputParser::new(OutputFormat::Qwen3), Some(&shape));
    r.push("<think>\nLet me list.\n</think>\n\n[{\"name\":\"bash\",")
        .unwrap();
    assert_eq!(r.parsed().reasoning, "Let me list.");
    assert!(r.parsed().calls.is_empty() && r.parsed().content.is_empty());
    r.push("\"parameters\":{\"command\":\"ls\"}}]<|im_end|>")
        .unwrap();
    assert!(r.is_finished());
    let p = r.parsed();
    assert_eq!(p.content, "");
    assert_eq!(p.calls.len(), 1);
    assert_eq!(p.calls[0].arguments, r#"{"command": "ls"}"#);
    // A forced output that is no array fails the reply.
    let mut bad = Reader::new(OutputParser::new(OutputFormat::Qwen3), Some(&shape));
    assert!(bad.push("{\"command\": \"ls\"}").is_ok());
    assert!(bad.finish().is_err());
    // Structured output is the text, parsed as any.
    let mut text = Reader::new(
        OutputParser::new(OutputFormat::Qwen3),
        Some(&Shape::Content),
    );
    text.push("{\"ok\": true}").unwrap();
    text.finish().unwrap();
    assert_eq!(text.parsed().content, "{\"ok\": true}");
    assert!(text.parsed().calls.is_empty());
}
