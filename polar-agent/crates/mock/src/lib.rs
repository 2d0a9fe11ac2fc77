//! `polar mock-backend`: a real HTTP inference server that speaks the vLLM or
//! SGLang token-id dialect, for tests, benchmarks and the demo, with no GPU
//! and no weights.
//!
//! - [`tokenizer`]: deterministic, reversible ids with the ChatML specials;
//!   [`hf_tokenizer`] writes its vocabulary as a Hugging Face
//!   `tokenizer.json` (`--write-tokenizer PATH`);
//! - [`template`]: the ChatML-like chat template, prefix-preserving unless
//!   switched (`strip_reasoning`, `generation_glue`);
//! - [`constrain`]: constrained decoding imitated (`response_format` JSON
//!   from the schema, `tool_choice`, `parallel_tool_calls`); [`guided`]:
//!   the token-in endpoints' constraint fields (vLLM `structured_outputs`
//!   and `response_format`, SGLang `sampling_params.json_schema`);
//! - [`script`]: what the "model" answers (script file or built-in policy);
//! - [`judge`]: what it answers a judge request of Polar's `llm_judge`
//!   evaluator (scores from what the request's diff adds);
//! - [`generate`]: a plan rendered, tokenized, given logprobs, cut into deltas;
//! - [`server`], [`vllm`], [`sglang`]: the HTTP side;
//! - [`resume`]: continuations of a turn (token-in requests that end
//!   inside one), requests Polar sends again, a replica that goes down.
//! - [`real`]: `--model-dir DIR`, a real model served as vLLM serves it:
//!   the body's messages turned into vLLM's conversation
//!   (`polar_faithful::vllm`), rendered by the model's own chat template
//!   and tokenized by its tokenizer (`polar-template`), the scripted turn
//!   written as the family writes it and parsed as vLLM's parsers for the
//!   family parse it (Qwen3: `qwen3` reasoning, `hermes` tool calls, so a
//!   call after reasoning has content `"\n\n"`), streamed and whole; the
//!   token-in endpoints decode with the real tokenizer (raw text with
//!   special tokens under `skip_special_tokens: false`) and default to
//!   the real servers' token limits (vLLM completions 16, SGLang
//!   `/generate` 128); `/tokenize`, `/detokenize` and `/v1/models`
//!   (`max_model_len`: `config.json`'s, unless set lower) use the model's
//!   files. The mock's template switches do not apply: the template is
//!   the model's. [`codec`] is the one path both modes generate through.
//!
//! Endpoints (both dialects unless noted): `POST /v1/chat/completions`,
//! `POST /v1/completions` (vLLM, `prompt` as ids or text), `POST /tokenize`
//! (vLLM's `TokenizeChatRequest`; SGLang's `TokenizeRequest`, also at
//! `/v1/tokenize`: the chat template of a real call, so a count equals the
//! call's prompt length), `POST /detokenize`, `POST /generate`
//! (SGLang), `GET /v1/models`,
//! `GET /health`, `GET /metrics` (Prometheus text), and admin:
//! `POST /pause_generation` (also `/pause`) holds new generations until
//! `POST /continue_generation` (also `/resume`) while in-flight ones finish;
//! `GET /is_paused`; `POST /update_weight_version` with
//! `{"new_version": "..."}`; `GET /get_weight_version`; `GET /served` (with
//! `--record-served`: every generation served, with its session, prompt
//! ids, generated ids and logprobs, so a test can compare what was captured
//! with what was served). Every reply carries the header `x-weight-version`.
//! With `--json-dumps-arguments`, chat replies send tool call arguments as
//! vLLM's `hermes` tool parser does, re-serialized (`json.dumps` spacing),
//! not as the model's text has them.
//!
//! Layering: above `polar-chat`, `polar-json`, `polar-io`,
//! `polar-inference` (for the dialect names), `polar-template` and
//! `polar-faithful`; it builds and tests without
//! the eBPF toolchain (checked by `cargo xtask layers`). Tests: `tests.rs`,
//! `template_tests.rs`, `dialect_tests.rs` (each reply field against the
//! real servers' protocol definitions), `real_tests.rs` (Qwen3's real
//! files, from `cargo xtask chat-models`: prompt ids against
//! `transformers`, the drift of an echoed reply, token-in continuation),
//! and `tests/inference/` (the inference client and pool against this
//! server).
#![forbid(unsafe_code)]

mod body;
pub mod codec;
pub mod constrain;
mod emit;
pub mod forced;
mod generate;
pub mod guided;
pub mod hf_tokenizer;
pub mod judge;
pub mod openai;
pub mod real;
pub mod resume;
pub mod script;
mod server;
mod sglang;
pub mod template;
pub mod tokenizer;
mod vllm;

#[cfg(test)]
mod dialect_tests;
#[cfg(test)]
mod real_tests;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use polar_inference::Dialect;
pub use server::serve;

use real::RealModel;
use script::Script;
use template::{NO_THINK_GLUE, StripReasoning, TemplateOptions};

/// Which field carries reasoning in vLLM replies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReasoningField {
    /// `reasoning` (vLLM >= 0.10), copied into `reasoning_content` in
    /// whole replies as newer vLLM does.
    #[default]
    Reasoning,
    /// `reasoning_content` (older vLLM, SGLang).
    ReasoningContent,
}

impl ReasoningField {
    /// The JSON field name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reasoning => "reasoning",
            Self::ReasoningContent => "reasoning_content",
        }
    }
}

/// Which field of a request's assistant message the server reads the turn's
/// earlier reasoning from (the one its chat template re-renders); the mock
/// reads it as the server it stands in for does, so a client sending it in
/// another field sees the reasoning dropped from the prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HistoryReasoning {
    /// `reasoning` only: vLLM's `_parse_chat_message_content`
    /// (`vllm/entrypoints/chat_utils.py`) in releases without the request
    /// validator that renames `reasoning_content` (the vLLM default).
    Reasoning,
    /// `reasoning_content` only: SGLang's
    /// `ChatCompletionMessageGenericParam` (the SGLang default).
    ReasoningContent,
    /// `reasoning`, else `reasoning_content`: vLLM releases whose
    /// `ChatCompletionRequest._normalize_messages_before` renames the
    /// deprecated field.
    Either,
}

impl HistoryReasoning {
    /// What the dialect's server reads.
    pub fn default_for(dialect: Dialect) -> Self {
        match dialect {
            Dialect::Vllm => Self::Reasoning,
            Dialect::Sglang => Self::ReasoningContent,
        }
    }

    /// The keys read, in order of precedence.
    pub fn keys(self) -> &'static [&'static str] {
        match self {
            Self::Reasoning => &["reasoning"],
            Self::ReasoningContent => &["reasoning_content"],
            Self::Either => &["reasoning", "reasoning_content"],
        }
    }
}

/// The mock's settings (no CLI types: tests and benches build it directly).
#[derive(Clone, Debug)]
pub struct MockConfig {
    /// Wire dialect.
    pub dialect: Dialect,
    /// The model name served (`/v1/models`, `model` in replies).
    pub served_model: String,
    /// Template switches, overridable per request.
    pub template: TemplateOptions,
    /// The script; `None` uses the built-in policy.
    pub script: Option<Script>,
    /// Wait between generated tokens.
    pub token_latency: Duration,
    /// Wait before the first generated token.
    pub ttft: Duration,
    /// Fraction of generation requests answered with HTTP 500, chosen by a
    /// deterministic function of the request number and `fail_seed`.
    pub fail_rate: f64,
    /// Seed of the failure choice.
    pub fail_seed: u64,
    /// Context length: longer prompts get 400, `max_tokens` is clamped.
    pub max_model_len: usize,
    /// Weight version reported (changed by `/update_weight_version`).
    pub weight_version: String,
    /// Reasoning field of vLLM replies.
    pub reasoning_field: ReasoningField,
    /// Where requests' assistant messages carry earlier reasoning; `None`:
    /// where the dialect's server reads it
    /// ([`HistoryReasoning::default_for`]).
    pub history_reasoning: Option<HistoryReasoning>,
    /// Generated tokens per streamed chunk (at least 1).
    pub tokens_per_chunk: usize,
    /// Keep every generation served for `GET /served` (tests: memory grows
    /// with each call, up to 100,000 generations).
    pub record_served: bool,
    /// After the first request a scripted cut or abort hits, answer every
    /// request with 503, as a replica that died.
    pub down_after_fault: bool,
    /// Send tool call arguments in chat replies as vLLM's `hermes` tool
    /// parser does, re-serialized the way Python's `json.dumps` writes them
    /// (`", "`, `": "` between items), not as the model wrote them (its
    /// token ids, compact JSON, stay the same). Implied with `model`.
    pub json_dumps_arguments: bool,
    /// Serve this real model's template and tokenizer as vLLM serves the
    /// model (see [`real`]); `None`: the mock's own.
    pub model: Option<Arc<RealModel>>,
}

impl MockConfig {
    /// Where requests carry earlier reasoning, resolved for the dialect.
    pub fn history_reasoning(&self) -> HistoryReasoning {
        self.history_reasoning
            .unwrap_or_else(|| HistoryReasoning::default_for(self.dialect))
    }
}

impl Default for MockConfig {
    fn default() -> Self {
        Self {
            dialect: Dialect::Vllm,
            served_model: "polar-mock".to_owned(),
            template: TemplateOptions::default(),
            script: None,
            token_latency: Duration::ZERO,
            ttft: Duration::ZERO,
            fail_rate: 0.0,
            fail_seed: 0,
            max_model_len: 32_768,
            weight_version: "0".to_owned(),
            reasoning_field: ReasoningField::default(),
            history_reasoning: None,
            tokens_per_chunk: 1,
            record_served: false,
            down_after_fault: false,
            json_dumps_arguments: false,
            model: None,
        }
    }
}

/// Errors of the mock backend.
#[derive(Debug, thiserror::Error)]
pub enum MockError {
    /// The listen address is not a loopback address.
    #[error("the mock backend listens on loopback only, not {0}")]
    NotLoopback(SocketAddr),
    /// Binding the listener failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// The script file could not be read.
    #[error("cannot read script {path}: {source}")]
    ScriptRead {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The script file is not a valid script.
    #[error("invalid script {path}: {reason}")]
    ScriptInvalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A setting is out of range.
    #[error("invalid setting: {0}")]
    InvalidSetting(String),
    /// A token id outside the vocabulary.
    #[error("unknown token id {0}")]
    UnknownToken(u32),
    /// A request the mock cannot serve (answered with 400).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The model directory cannot be served.
    #[error(transparent)]
    Model(#[from] real::RealError),
    /// The prompt is longer than the context (answered with 400).
    #[error(
        "This model's maximum context length is {max} tokens. However, your request has {prompt} input tokens."
    )]
    ContextOverflow {
        /// The context length.
        max: usize,
        /// The prompt length.
        prompt: usize,
    },
}

/// `polar mock-backend` arguments.
#[derive(Clone, Debug, clap::Args)]
pub struct MockArgs {
    /// Address to listen on (loopback only).
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    /// Wire dialect.
    #[arg(long, value_enum, default_value_t = Dialect::Vllm)]
    pub dialect: Dialect,
    /// Served model name.
    #[arg(long, default_value = "polar-mock")]
    pub served_model: String,
    /// Script file (TOML, or JSON by extension); the built-in policy without.
    #[arg(long)]
    pub script: Option<PathBuf>,
    /// Wait between generated tokens, in ms.
    #[arg(long, default_value_t = 0)]
    pub token_latency_ms: u64,
    /// Wait before the first token, in ms.
    #[arg(long, default_value_t = 0)]
    pub ttft_ms: u64,
    /// Fraction of generation requests failed with HTTP 500 (0 to 1).
    #[arg(long, default_value_t = 0.0)]
    pub fail_rate: f64,
    /// Seed of the failure choice.
    #[arg(long, default_value_t = 0)]
    pub fail_seed: u64,
    /// Context length [default: the model's with --model-dir, else 32768].
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Weight version to report.
    #[arg(long, default_value = "0")]
    pub weight_version: String,
    /// Reasoning of history assistant turns.
    #[arg(long, value_enum, default_value_t = StripReasoning::Off)]
    pub strip_reasoning: StripReasoning,
    /// Text added to the generation prompt only (`\n` escapes allowed).
    #[arg(long, conflicts_with = "no_think_glue")]
    pub generation_glue: Option<String>,
    /// Shorthand for `--generation-glue '<think>\n\n</think>\n\n'`.
    #[arg(long)]
    pub no_think_glue: bool,
    /// Report reasoning as `reasoning_content` (older vLLM).
    #[arg(long)]
    pub legacy_reasoning_field: bool,
    /// The request field earlier reasoning is read from (default: the
    /// dialect's server's: `reasoning` for vLLM, `reasoning-content` for
    /// SGLang).
    #[arg(long, value_enum)]
    pub history_reasoning: Option<HistoryReasoning>,
    /// Generated tokens per streamed chunk.
    #[arg(long, default_value_t = 1)]
    pub tokens_per_chunk: usize,
    /// Keep every generation served and list them on `GET /served` (for
    /// tests).
    #[arg(long)]
    pub record_served: bool,
    /// Answer 503 to everything after the first scripted cut or abort (a
    /// replica that died).
    #[arg(long)]
    pub down_after_fault: bool,
    /// Send tool call arguments as vLLM's `hermes` tool parser does,
    /// re-serialized as Python's `json.dumps` writes them.
    #[arg(long)]
    pub json_dumps_arguments: bool,
    /// Serve a real model's chat template and tokenizer from this directory
    /// (`tokenizer.json`, `tokenizer_config.json`, optional
    /// `chat_template.jinja`, `generation_config.json`, `config.json`) as
    /// vLLM serves that model: its request-to-conversation rules, the
    /// family's reasoning and tool-call parsers (Qwen3 with Hermes tool
    /// calls). The template switches (`--strip-reasoning`, glue) are the
    /// real template's then.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["strip_reasoning", "generation_glue", "no_think_glue", "write_tokenizer"])]
    pub model_dir: Option<PathBuf>,
    /// Write the mock tokenizer's vocabulary as a Hugging Face
    /// `tokenizer.json` to this file and exit (serves nothing).
    #[arg(long, value_name = "PATH")]
    pub write_tokenizer: Option<PathBuf>,
}

impl MockArgs {
    /// The configuration these arguments describe (reads the script file).
    pub fn to_config(&self) -> Result<MockConfig, MockError> {
        if !(0.0..=1.0).contains(&self.fail_rate) {
            return Err(MockError::InvalidSetting(format!(
                "--fail-rate must be between 0 and 1, not {}",
                self.fail_rate
            )));
        }
        if self.tokens_per_chunk == 0 || self.max_model_len == Some(0) {
            return Err(MockError::InvalidSetting(
                "--tokens-per-chunk and --max-model-len must be at least 1".into(),
            ));
        }
        let model = self
            .model_dir
            .as_deref()
            .map(RealModel::load)
            .transpose()?
            .map(Arc::new);
        let max_model_len = max_model_len(self.max_model_len, model.as_deref())?;
        let glue = match (&self.generation_glue, self.no_think_glue) {
            (Some(g), _) => g.replace("\\n", "\n"),
            (None, true) => NO_THINK_GLUE.to_owned(),
            (None, false) => String::new(),
        };
        Ok(MockConfig {
            dialect: self.dialect,
            served_model: self.served_model.clone(),
            template: TemplateOptions {
                strip_reasoning: self.strip_reasoning,
                generation_glue: glue,
            },
            script: self.script.as_deref().map(Script::load).transpose()?,
            token_latency: Duration::from_millis(self.token_latency_ms),
            ttft: Duration::from_millis(self.ttft_ms),
            fail_rate: self.fail_rate,
            fail_seed: self.fail_seed,
            max_model_len,
            weight_version: self.weight_version.clone(),
            reasoning_field: if self.legacy_reasoning_field {
                ReasoningField::ReasoningContent
            } else {
                ReasoningField::Reasoning
            },
            history_reasoning: self.history_reasoning,
            tokens_per_chunk: self.tokens_per_chunk,
            record_served: self.record_served,
            down_after_fault: self.down_after_fault,
            json_dumps_arguments: self.json_dumps_arguments,
            model,
        })
    }
}

/// The context length served: the setting, else the model's, else 32768;
/// a setting over the model's is refused (as vLLM refuses it).
fn max_model_len(setting: Option<usize>, model: Option<&RealModel>) -> Result<usize, MockError> {
    let derived = model.and_then(RealModel::context_len);
    match (setting, derived) {
        (Some(s), Some(d)) if s > d => Err(MockError::InvalidSetting(format!(
            "--max-model-len {s} is over the model's context length {d}"
        ))),
        (Some(s), _) => Ok(s),
        (None, Some(d)) => Ok(d),
        (None, None) => Ok(32_768),
    }
}

impl TryFrom<&MockArgs> for MockConfig {
    type Error = MockError;

    fn try_from(args: &MockArgs) -> Result<Self, MockError> {
        args.to_config()
    }
}

/// Runs `polar mock-backend` until `shutdown`: validates, binds, serves.
pub async fn run(args: &MockArgs, shutdown: CancellationToken) -> Result<(), MockError> {
    if !args.listen.ip().is_loopback() {
        return Err(MockError::NotLoopback(args.listen));
    }
    let cfg = args.to_config()?;
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|source| MockError::Bind {
            addr: args.listen,
            source,
        })?;
    tracing::info!(listen = %args.listen, dialect = ?cfg.dialect, model = %cfg.served_model,
        model_dir = ?args.model_dir, "mock backend listening");
    serve(listener, cfg, shutdown).await;
    Ok(())
}

/// A mock backend running in the background (for tests and benchmarks).
#[derive(Debug)]
pub struct MockHandle {
    /// The address it listens on.
    pub addr: SocketAddr,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl MockHandle {
    /// `http://<addr>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops it and waits until open connections are done.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

/// Starts a mock backend on `127.0.0.1`, on a free port.
pub async fn start(cfg: MockConfig) -> Result<MockHandle, MockError> {
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let listener = TcpListener::bind(any)
        .await
        .map_err(|source| MockError::Bind { addr: any, source })?;
    let addr = listener
        .local_addr()
        .map_err(|source| MockError::Bind { addr: any, source })?;
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(serve(listener, cfg, shutdown.clone()));
    Ok(MockHandle {
        addr,
        shutdown,
        task,
    })
}
