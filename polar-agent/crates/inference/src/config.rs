//! Settings of one inference backend (plain serde structs with
//! `deny_unknown_fields`; the agent's TOML config embeds them): its replicas,
//! dialect, model names, sampling policy, limits and timeouts.
//!
//! ```toml
//! name = "qwen"
//! dialect = "vllm"                      # or "sglang"
//! replicas = ["http://10.0.0.5:8000", "http://10.0.0.6:8000"]
//! served_model = "Qwen/Qwen3-8B"
//! model_map = { "claude-sonnet-4-5" = "Qwen/Qwen3-8B" }   # default: every name -> served_model
//! max_tokens_clamp = 8192
//! request_timeout_ms = 600000           # to the reply head, and between two body chunks
//! connect_timeout_ms = 2000
//! health_check_interval_ms = 5000
//! constrained_decoding = true           # JSON schema / JSON mode / required or named tool choice
//! output_parser = "qwen3"               # the model's output format (qwen3, qwen3_coder,
//!                                       # deepseek_v3, llama3_json, gpt_oss, glm45): lets a
//!                                       # reply go on on another replica after a mid-stream fault
//! model_dir = "/models/Qwen3-8B"        # the model's own files: Polar renders prompts and
//!                                       # sends token ids (token-faithful serving)
//! reasoning_field = "reasoning"         # where an earlier assistant turn's reasoning goes
//!                                       # (default: the field the dialect's server reads)
//!
//! [sampling]
//! mode = "train"                        # which overrides apply: train or eval
//! train = { temperature = 1.0, top_p = 1.0, top_k = -1 }
//! eval = { temperature = 0.6, top_p = 0.95 }
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use polar_chat::output::OutputFormat;
use polar_spec::{KeyError, KeyPath};

/// The wire dialect of a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Dialect {
    /// vLLM's OpenAI-compatible server (`return_token_ids`).
    Vllm,
    /// SGLang (`return_prompt_token_ids`, `return_meta_info`).
    Sglang,
}

impl Dialect {
    /// `vllm` or `sglang`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Vllm => "vllm",
            Self::Sglang => "sglang",
        }
    }
}

/// The field of an assistant message that carries its earlier reasoning in
/// the chat body Polar sends: what the server hands the chat template as the
/// turn's reasoning (a template such as Qwen3's re-renders the think block
/// from it). A server ignores fields it does not read, so the wrong one
/// drops the reasoning from the prompt it renders.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasoningField {
    /// `reasoning`: what vLLM reads (`vllm/entrypoints/chat_utils.py`,
    /// `_parse_chat_message_content`, which hands it to the template as
    /// both `reasoning` and `reasoning_content`); releases whose request
    /// validator renames `reasoning_content` read that too.
    Reasoning,
    /// `reasoning_content`: what SGLang reads
    /// (`ChatCompletionMessageGenericParam.reasoning_content` in
    /// `python/sglang/srt/entrypoints/openai/protocol.py`; other fields are
    /// dropped when the request is parsed).
    ReasoningContent,
    /// Both fields, with the same text (a server of unknown version).
    Both,
    /// Neither: earlier reasoning is never sent back.
    None,
}

impl ReasoningField {
    /// The field the dialect's server reads.
    pub fn default_for(dialect: Dialect) -> Self {
        match dialect {
            Dialect::Vllm => Self::Reasoning,
            Dialect::Sglang => Self::ReasoningContent,
        }
    }

    /// The JSON keys written, in order.
    pub fn keys(self) -> &'static [&'static str] {
        match self {
            Self::Reasoning => &["reasoning"],
            Self::ReasoningContent => &["reasoning_content"],
            Self::Both => &["reasoning", "reasoning_content"],
            Self::None => &[],
        }
    }
}

/// Which sampling overrides apply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SamplingMode {
    /// Training rollouts.
    #[default]
    Train,
    /// Evaluation.
    Eval,
}

/// Sampling values that replace what the harness asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplingOverrides {
    /// Temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Top-k (`-1` disables it, as vLLM and SGLang read it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i64>,
}

/// The sampling policy: overrides for training and for evaluation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplingPolicy {
    /// Which set applies by default.
    #[serde(default)]
    pub mode: SamplingMode,
    /// Overrides in training.
    #[serde(default)]
    pub train: SamplingOverrides,
    /// Overrides in evaluation.
    #[serde(default)]
    pub eval: SamplingOverrides,
}

impl SamplingPolicy {
    /// The overrides of `mode`.
    pub fn overrides(&self, mode: SamplingMode) -> &SamplingOverrides {
        match mode {
            SamplingMode::Train => &self.train,
            SamplingMode::Eval => &self.eval,
        }
    }
}

/// One inference backend.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// Name, for logs and records.
    pub name: String,
    /// Wire dialect.
    pub dialect: Dialect,
    /// Base URLs of the replicas (`http://host:port`, optional path prefix).
    pub replicas: Vec<String>,
    /// The model name the backend serves.
    pub served_model: String,
    /// Harness model names mapped to served names; unmapped names map to
    /// `served_model`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub model_map: BTreeMap<String, String>,
    /// Sampling policy.
    #[serde(default)]
    pub sampling: SamplingPolicy,
    /// Upper bound of `max_tokens` (also the value when the harness gives none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens_clamp: Option<u32>,
    /// Longest wait for the reply head and between two body chunks, in ms.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// Longest wait for a TCP connection, in ms.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Period of `GET /health` checks, in ms.
    #[serde(default = "default_health_check_interval_ms")]
    pub health_check_interval_ms: u64,
    /// Whether the backend can constrain decoding: structured output
    /// (`response_format` JSON schema or JSON mode) and a required or named
    /// tool choice, which vLLM and SGLang compile into a grammar (both can,
    /// the default). `false` for a server without a grammar backend: such
    /// requests are then refused with 400 in the harness's API instead of
    /// being answered with unconstrained text.
    #[serde(default = "default_true")]
    pub constrained_decoding: bool,
    /// The format of the model's raw output (`qwen3`, also named
    /// `hermes`, `qwen3_coder`, `deepseek_v3`, `llama3_json`, `gpt_oss`,
    /// `glm45`: see [`OutputFormat`]). With
    /// it, a reply whose replica fails after output reached the harness is
    /// resumed from its tokens through the token-in endpoint (vLLM
    /// `/v1/completions`, SGLang `/generate`), whose raw text Polar parses
    /// itself; without it such a fault is answered with a retryable error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_parser: Option<OutputFormat>,
    /// The model's own files: the directory vLLM or SGLang loads
    /// (`tokenizer.json`, `tokenizer_config.json` or `chat_template.jinja`,
    /// `generation_config.json`, `config.json`). With them every prompt is
    /// rendered by Polar and sent as token ids, and a call that continues
    /// one of the session's chains is sent as the exact ids the model saw
    /// and generated plus those of its new messages (token-faithful
    /// serving, `faithful`); needs `output_parser`. Loaded and
    /// checked when the client is made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_dir: Option<PathBuf>,
    /// Which named template of `tokenizer_config.json` to render with
    /// (`tool_use`, ...), when it holds several; `default` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_name: Option<String>,
    /// Where an assistant message's earlier reasoning goes in the chat body
    /// ([`ReasoningField`]); unset: the field the dialect's server reads
    /// (see [`BackendConfig::reasoning_field`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_field: Option<ReasoningField>,
}

fn default_true() -> bool {
    true
}

fn default_request_timeout_ms() -> u64 {
    600_000
}

fn default_connect_timeout_ms() -> u64 {
    2_000
}

fn default_health_check_interval_ms() -> u64 {
    5_000
}

impl BackendConfig {
    /// A backend with defaults for everything but the essentials.
    pub fn new(name: &str, dialect: Dialect, replicas: Vec<String>, served_model: &str) -> Self {
        Self {
            name: name.to_owned(),
            dialect,
            replicas,
            served_model: served_model.to_owned(),
            model_map: BTreeMap::new(),
            sampling: SamplingPolicy::default(),
            max_tokens_clamp: None,
            request_timeout_ms: default_request_timeout_ms(),
            connect_timeout_ms: default_connect_timeout_ms(),
            health_check_interval_ms: default_health_check_interval_ms(),
            constrained_decoding: true,
            output_parser: None,
            model_dir: None,
            chat_template_name: None,
            reasoning_field: None,
        }
    }

    /// The field earlier reasoning is sent in: the configured one, else the
    /// one the dialect's server reads.
    pub fn reasoning_field(&self) -> ReasoningField {
        self.reasoning_field
            .unwrap_or_else(|| ReasoningField::default_for(self.dialect))
    }

    /// The served name for a harness model name.
    pub fn map_model(&self, harness_model: &str) -> &str {
        self.model_map
            .get(harness_model)
            .map_or(self.served_model.as_str(), String::as_str)
    }

    /// The request timeout.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    /// The connect timeout.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    /// The health-check period.
    pub fn health_check_interval(&self) -> Duration {
        Duration::from_millis(self.health_check_interval_ms)
    }

    /// Checks the settings; the error names the key.
    pub fn validate(&self) -> Result<(), KeyError> {
        let at = |key: &str| KeyPath::root().key(key);
        let bad = |key: &str, why: String| KeyError::new(at(key), why);
        if self.name.is_empty() {
            return Err(bad("name", "must not be empty".into()));
        }
        if self.served_model.is_empty() {
            return Err(bad("served_model", "must not be empty".into()));
        }
        if self.replicas.is_empty() {
            return Err(bad("replicas", "give at least one replica URL".into()));
        }
        if self.model_dir.is_some() && self.output_parser.is_none() {
            return Err(bad(
                "output_parser",
                "model_dir sends prompts as token ids, whose raw output Polar parses: \
                 name the model's output format"
                    .into(),
            ));
        }
        if self.chat_template_name.is_some() && self.model_dir.is_none() {
            return Err(bad(
                "chat_template_name",
                "names a template of model_dir's files: set model_dir".into(),
            ));
        }
        for (i, url) in self.replicas.iter().enumerate() {
            super::pool::parse_base(url)
                .map_err(|why| KeyError::new(at("replicas").index(i), why))?;
        }
        for (key, ms) in [
            ("request_timeout_ms", self.request_timeout_ms),
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("health_check_interval_ms", self.health_check_interval_ms),
        ] {
            if ms == 0 {
                return Err(bad(key, "must be at least 1".into()));
            }
        }
        if self.connect_timeout_ms >= self.request_timeout_ms {
            return Err(bad(
                "connect_timeout_ms",
                "must be shorter than request_timeout_ms, or an unreachable replica looks like a slow one".into(),
            ));
        }
        if self.max_tokens_clamp == Some(0) {
            return Err(bad("max_tokens_clamp", "must be at least 1".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_from_toml_with_defaults() {
        let cfg: BackendConfig = toml::from_str(
            r#"
            name = "qwen"
            dialect = "sglang"
            replicas = ["http://127.0.0.1:30000/", "http://127.0.0.2:30000"]
            served_model = "Qwen/Qwen3-8B"
            model_map = { "claude-sonnet-4-5" = "Qwen/Qwen3-8B-alt" }
            output_parser = "hermes"
            [sampling]
            mode = "eval"
            eval = { temperature = 0.6 }
            "#,
        )
        .unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.dialect, Dialect::Sglang);
        assert_eq!(cfg.map_model("claude-sonnet-4-5"), "Qwen/Qwen3-8B-alt");
        assert_eq!(cfg.map_model("anything"), "Qwen/Qwen3-8B");
        assert_eq!(
            cfg.sampling.overrides(SamplingMode::Eval).temperature,
            Some(0.6)
        );
        assert_eq!(cfg.request_timeout(), Duration::from_secs(600));
        assert_eq!(cfg.output_parser, Some(OutputFormat::Qwen3));
        assert_eq!(cfg.reasoning_field(), ReasoningField::ReasoningContent);
        let unknown = toml::from_str::<BackendConfig>(
            "name = \"x\"\ndialect = \"vllm\"\nreplicas = []\nserved_model = \"m\"\noutput_parser = \"llama3\"",
        )
        .unwrap_err();
        for name in OutputFormat::ALL.map(OutputFormat::as_str) {
            assert!(unknown.to_string().contains(name), "{unknown}");
            let cfg: BackendConfig = toml::from_str(&format!(
                "name = \"x\"\ndialect = \"vllm\"\nreplicas = []\nserved_model = \"m\"\noutput_parser = \"{name}\""
            ))
            .unwrap();
            assert_eq!(cfg.output_parser.map(OutputFormat::as_str), Some(name));
        }
        assert!(
            toml::from_str::<BackendConfig>(
                "name = \"x\"\ndialect = \"vllm\"\nreplicas = []\nserved_model = \"m\"\nbogus = 1"
            )
            .is_err()
        );
    }

    /// The reasoning field defaults to the one the dialect's server reads;
    /// each setting parses; anything else is refused with the choices.
    #[test]
    fn reasoning_field_defaults_per_dialect_and_parses() {
        let base = "name = \"x\"\nreplicas = [\"http://127.0.0.1:1\"]\nserved_model = \"m\"\n";
        for (dialect, want) in [
            ("vllm", ReasoningField::Reasoning),
            ("sglang", ReasoningField::ReasoningContent),
        ] {
            let cfg: BackendConfig =
                toml::from_str(&format!("{base}dialect = \"{dialect}\"")).unwrap();
            assert_eq!(cfg.reasoning_field, None);
            assert_eq!(cfg.reasoning_field(), want, "{dialect}");
        }
        for (value, want) in [
            ("reasoning", ReasoningField::Reasoning),
            ("reasoning_content", ReasoningField::ReasoningContent),
            ("both", ReasoningField::Both),
            ("none", ReasoningField::None),
        ] {
            let cfg: BackendConfig = toml::from_str(&format!(
                "{base}dialect = \"sglang\"\nreasoning_field = \"{value}\""
            ))
            .unwrap();
            cfg.validate().unwrap();
            assert_eq!(cfg.reasoning_field(), want);
        }
        let bad = toml::from_str::<BackendConfig>(&format!(
            "{base}dialect = \"vllm\"\nreasoning_field = \"thinking\""
        ))
        .unwrap_err()
        .to_string();
        assert!(
            bad.contains("reasoning_field") && bad.contains("reasoning_content"),
            "{bad}"
        );
    }

    #[test]
    fn validation_names_the_key() {
        let ok = BackendConfig::new(
            "b",
            Dialect::Vllm,
            vec!["http://127.0.0.1:8000".into()],
            "m",
        );
        ok.validate().unwrap();
        for (cfg, key) in [
            (
                BackendConfig {
                    replicas: vec![],
                    ..ok.clone()
                },
                "replicas",
            ),
            (
                BackendConfig {
                    replicas: vec!["http://127.0.0.1:8000".into(), "https://x:1".into()],
                    ..ok.clone()
                },
                "replicas[1]",
            ),
            (
                BackendConfig {
                    replicas: vec!["not a url".into()],
                    ..ok.clone()
                },
                "replicas[0]",
            ),
            (
                BackendConfig {
                    connect_timeout_ms: 0,
                    ..ok.clone()
                },
                "connect_timeout_ms",
            ),
            (
                BackendConfig {
                    max_tokens_clamp: Some(0),
                    ..ok.clone()
                },
                "max_tokens_clamp",
            ),
            (
                BackendConfig {
                    served_model: String::new(),
                    ..ok.clone()
                },
                "served_model",
            ),
        ] {
            match cfg.validate() {
                Err(e) => assert_eq!(e.key.to_string(), key),
                other => panic!("{key}: {other:?}"),
            }
        }
    }
}
