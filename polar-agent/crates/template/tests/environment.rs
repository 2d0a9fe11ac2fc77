//! Hugging Face's Jinja environment, feature by feature: small templates
//! that use what chat templates use (`tojson` and its arguments, Python's
//! printing and methods, loop controls, namespaces, `strftime_now`,
//! whitespace control, the `{% generation %}` tag, filters and tests whose
//! Jinja2 and minijinja meanings differ), each rendered by this crate and
//! by `transformers` over Qwen3's real tokenizer and compared.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers: a failed step fails the test"
)]

mod support;

use polar_template::{Model, ModelFiles, PromptError, RenderError, RenderInput};
use serde_json::{Value, json};

use support::cases::Case;

fn case(messages: Value, tools: Option<Value>, kwargs: Value) -> Case {
    Case {
        messages: messages.as_array().unwrap().clone(),
        tools: tools.map(|t| t.as_array().unwrap().clone()),
        add_generation_prompt: true,
        kwargs: kwargs.as_object().cloned().unwrap_or_default(),
    }
}

/// Renders `cases` with `template` both ways; returns our texts.
fn agree(template: &str, cases: &[Case], documents: Option<&[Value]>) -> Vec<String> {
    agree_in(
        &support::custom_model(|_| {}, Some(template)),
        cases,
        documents,
    )
}

/// [`agree`] with a model directory of the caller's.
fn agree_in(dir: &tempfile::TempDir, cases: &[Case], documents: Option<&[Value]>) -> Vec<String> {
    let model = Model::load(&ModelFiles::from_dir(dir.path())).unwrap();
    let json: Vec<Value> = cases
        .iter()
        .map(|c| {
            let mut j = c.to_json();
            j["documents"] = json!(documents);
            j
        })
        .collect();
    let reference = support::reference(dir.path(), &json);
    let mut texts = Vec::new();
    for (i, (case, theirs)) in cases.iter().zip(&reference).enumerate() {
        let ours = model.render_ids(&RenderInput {
            messages: &case.messages,
            tools: case.tools.as_deref(),
            documents,
            add_generation_prompt: case.add_generation_prompt,
            kwargs: &case.kwargs,
        });
        match (ours, theirs.get("error").and_then(Value::as_str)) {
            (Ok(ours), None) => {
                let text = theirs["text"].as_str().unwrap();
                assert!(
                    ours.text == text,
                    "case {i}: {}",
                    support::text_diff(&ours.text, text)
                );
                let ids: Vec<u32> = theirs["ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap() as u32)
                    .collect();
                assert!(
                    ours.ids == ids,
                    "case {i}: {}",
                    support::ids_diff(&ours.ids, &ids)
                );
                texts.push(ours.text);
            }
            (Err(PromptError::Render(RenderError::Raised { message })), Some(theirs)) => {
                assert_eq!(
                    Some(message.as_str()),
                    theirs.strip_prefix("TemplateError: "),
                    "case {i}"
                );
                texts.push(String::new());
            }
            (ours, theirs) => panic!("case {i}: ours {ours:?}, transformers {theirs:?}"),
        }
    }
    texts
}

const FEATURES: &str = r#"{{ bos_token }}|{{ eos_token }}|{{ tools | tojson }}|{{ tools[0] | tojson(indent=2) }}|{{ {"b": 1, "a": [1.0, none, true, 2.5e-7, 1e16]} | tojson(separators=(",", ":"), sort_keys=true) }}|{{ "é" | tojson(ensure_ascii=true) }}
{% for m in messages %}
    {% if loop.index0 == 3 %}{% break %}{% endif %}
    {% if m.role == 'system' %}{% continue %}{% endif %}
    [{{ m.content.strip().upper() }}|{{ m.content.split(' ') }}|{{ m.get('missing', 'dflt') }}|{{ m.items() | list | length }}|{{ m.content.startswith(' ') }}|{{ m.content.replace('o', '0') }}|{{ loop.previtem.role if loop.previtem else '-' }}]
{% endfor %}
{% set ns = namespace(n=0, seen=[]) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}|{{ none }}|{{ true }}|{{ 1.0 }}|{{ 3 / 2 }}|{{ 7 // 2 }}|{{ [1, 'a', none] }}|{{ {'k': 'v'} }}|{{ extra }}|{{ strftime_now('%Y') | length }}|{{ tools is none }}|{{ missing is defined }}|{{ missing | default('d') }}
{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(' / ') }}|{{ messages | map(attribute='role') | unique | list }}|{{ messages[-1].content | trim }}|{{ (messages | last).role }}|{{ messages | length }}|{{ range(3) | list }}|{{ '%-5s|' | format('ab') }}|{{ 'x' * 3 }}|{{ [3, 1, 2] | sort | reverse | list }}|{{ 'a' ~ 1 ~ none }}|{{ dict(a=1, b='c') }}|{{ "Tab\tQuote'\"" | string }}|{{ 42 | string }}|{{ '  pad  ' | trim }}|{{ none | trim }}
{% for m in messages %}{% generation %}{{ m.role }}{% endgeneration %}{% if not loop.last %},{% endif %}{% endfor %}
{% if tools is iterable %}I{% endif %}{% if none is iterable %}N{% endif %}{% if 'x' is sequence %}S{% endif %}{% if true is number %}B{% endif %}{% if messages is sequence %}L{% endif %}{% if extra is string %}T{% endif %}{% if documents %}{% for d in documents %}<doc {{ loop.index }}>{{ d.title }}: {{ d.text }}{% endfor %}{% endif %}
{%- if add_generation_prompt %}
<|im_start|>assistant
{% endif %}"#;

#[test]
fn features_render_as_in_transformers() {
    let tools = json!([{"type": "function", "function": {"name": "f", "description": "é \"q\" <b>", "parameters": {"type": "object", "properties": {"x": {"type": "number", "default": 0.5}}}}}]);
    let cases = [
        case(
            json!([
                {"role": "system", "content": "s"},
                {"role": "user", "content": " hello wörld "},
                {"role": "assistant", "content": "ok", "reasoning_content": "r"},
                {"role": "user", "content": "never 🙂"}
            ]),
            Some(tools.clone()),
            json!({"extra": "X"}),
        ),
        case(
            json!([{"role": "user", "content": "only one"}]),
            Some(tools),
            json!({"extra": 5}),
        ),
    ];
    let docs = [json!({"title": "README", "text": "Polar\nruns harnesses."})];
    let texts = agree(FEATURES, &cases, Some(&docs));
    assert!(texts[0].starts_with("|<|im_end|>|"), "{}", texts[0]);
    assert!(
        texts[0].contains("[HELLO WÖRLD|['', 'hello', 'wörld', '']|dflt|2|True|"),
        "{}",
        texts[0]
    );
}

/// A template's refusal, with the message it built, in both.
#[test]
fn raise_exception_matches() {
    let template = "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('Unknown role: ' ~ m.role ~ ' at ' ~ loop.index0) }}{% endif %}{{ m.content }}{% endfor %}";
    let cases = [
        case(
            json!([{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}]),
            None,
            json!({}),
        ),
        case(json!([{"role": "user", "content": "a"}]), None, json!({})),
    ];
    let texts = agree(template, &cases, None);
    assert_eq!(texts, ["", "a"]);
}

/// Messages as apply_chat_template hands them over: `null` keys gone,
/// reasoning under any name read as `reasoning_content` and `thinking`.
#[test]
fn messages_are_normalized_as_in_transformers() {
    let template = "{% for m in messages %}{{ m | tojson }}\n{{ m.content is defined }} {{ m.thinking }} {{ m.reasoning_content }}\n{% endfor %}";
    let cases = [case(
        json!([
            {"role": "user", "content": "q", "name": null},
            {"role": "assistant", "content": null, "reasoning": "r1", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": [1, 2.0, null]}}}]},
            {"role": "assistant", "content": "x", "thinking": "t", "reasoning_content": "rc"},
            {"role": "tool", "content": [{"type": "text", "text": "part"}]}
        ]),
        None,
        json!({}),
    )];
    agree(template, &cases, None);
}

/// Named templates: `default`, or `tool_use` when tools are given, as
/// transformers picks them.
#[test]
fn named_templates_are_picked_as_in_transformers() {
    let list = json!([
        {"name": "default", "template": "D:{% for m in messages %}{{ m.content }}{% endfor %}"},
        {"name": "tool_use", "template": "T:{{ tools | length }}:{% for m in messages %}{{ m.content }}{% endfor %}"},
        {"name": "rag", "template": "R"}
    ]);
    let dir = support::custom_model(|c| drop(c.insert("chat_template".into(), list)), None);
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
    let messages = json!([{"role": "user", "content": "q"}]);
    let cases = [
        case(messages.clone(), None, json!({})),
        case(messages, Some(tools), json!({})),
    ];
    assert_eq!(agree_in(&dir, &cases, None), ["D:q", "T:1:q"]);
}

#[test]
fn the_model_is_shareable() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Model>();
}
