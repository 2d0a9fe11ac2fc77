//! Token-faithful chains measured with the real harness CLIs: each CLI
//! does the four-step task ([`Scenario::StepsMeasured`]) through the
//! agent against `polar mock-backend --model-dir DIR` serving a real
//! model's files (its chat template, tokenizer and output format, as vLLM
//! serves that model), either server-rendered (the backend's chat
//! endpoint renders every prompt) or token-faithfully (`model_dir` set on
//! the backend: Polar renders and sends ids). [`Figures`] are what the
//! session's export says of its chains: calls, main-chain traces,
//! segments, breaks, template splices, and the loss-1 tokens whose
//! preceding context differs from the prompt the backend saw
//! (`off_policy_context_tokens`); with how each call was served, from its
//! record's `backend.serving`.
//!
//! Shared by `tests/harness_chains.rs` (which asserts the token-faithful
//! targets) and `benches/chains.rs` (which prints the table of
//! BENCHMARKS.md). The model files come from `cargo xtask chat-models`
//! (`POLAR_CHAT_MODELS_DIR`, else `.polar-cache/chat-models`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{Result, ensure};
use polar_capture::read_log;
use serde_json::Value;

use crate::harness::{Backend, Scenario, Session, check, exported_rows, run_sessions};

/// A model family whose real files the mock serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Qwen3 (`qwen3`: ChatML, `<think>`, Hermes tool calls).
    Qwen3,
    /// DeepSeek-V3.1 (`deepseek_v3_1`).
    DeepseekV31,
    /// gpt-oss (`gptoss`: Harmony).
    GptOss,
}

impl Family {
    /// Every family, in the table's order.
    pub const ALL: [Self; 3] = [Self::Qwen3, Self::DeepseekV31, Self::GptOss];

    /// The directory under the chat models' root.
    pub fn dir_name(self) -> &'static str {
        match self {
            Self::Qwen3 => "qwen3",
            Self::DeepseekV31 => "deepseek_v3_1",
            Self::GptOss => "gptoss",
        }
    }

    /// The backend's `output_parser`.
    pub fn output_parser(self) -> &'static str {
        match self {
            Self::Qwen3 => "qwen3",
            Self::DeepseekV31 => "deepseek_v3",
            Self::GptOss => "gpt_oss",
        }
    }

    /// The model's files as served: the installed directory, or for
    /// DeepSeek-V3.1 (whose template lists no tools) one under `tmp` whose
    /// template has the tool section of DeepSeek's model card
    /// (`polar_mock::real::deepseek::tool_model_dir`).
    pub fn served_dir(self, tmp: &Path) -> Result<PathBuf> {
        let dir = self.dir()?;
        if self != Self::DeepseekV31 {
            return Ok(dir);
        }
        let with_tools = tmp.join(self.dir_name());
        polar_mock::real::deepseek::tool_model_dir(&dir, &with_tools)
            .map_err(anyhow::Error::msg)?;
        Ok(with_tools)
    }

    /// The model's files (failing when they are not installed).
    pub fn dir(self) -> Result<PathBuf> {
        let root = std::env::var_os("POLAR_CHAT_MODELS_DIR").map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join("../.polar-cache/chat-models"),
            PathBuf::from,
        );
        let dir = root.join(self.dir_name());
        ensure!(
            dir.join("tokenizer.json").is_file(),
            "{}'s model files are missing from {}: install them with `cargo xtask chat-models`",
            self.dir_name(),
            dir.display()
        );
        Ok(dir)
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Qwen3 => "Qwen3",
            Self::DeepseekV31 => "DeepSeek-V3.1",
            Self::GptOss => "gpt-oss",
        })
    }
}

/// Who renders the prompts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rendering {
    /// The backend's chat endpoint (no `model_dir`).
    Server,
    /// Polar, token-faithfully (`model_dir` set).
    Faithful,
}

impl fmt::Display for Rendering {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Server => "server-rendered",
            Self::Faithful => "token-faithful",
        })
    }
}

/// What one session's export says of its chains.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    /// Captured calls (`stats.calls`).
    pub calls: usize,
    /// Distinct main chains.
    pub main_chains: usize,
    /// Traces (rows) of the main chains.
    pub main_traces: usize,
    /// Main-chain traces that start after a compaction (its summary call
    /// and the segment after it): one trace per main chain is the target
    /// with these aside.
    pub compaction_traces: usize,
    /// Segments of every chain (`stats.segments`).
    pub segments: usize,
    /// Breaks (`stats.breaks`).
    pub breaks: usize,
    /// The main chains' breaks by the reason the export gives
    /// (`break_reason`).
    pub break_reasons: BTreeMap<String, usize>,
    /// Template splices (`stats.template_mismatches_spliced`).
    pub splices: usize,
    /// Loss-1 tokens whose preceding context differs from the prompt the
    /// backend saw (`stats.off_policy_context_tokens`).
    pub off_policy_tokens: usize,
    /// Calls served token-in that extend an earlier call's ids.
    pub extends: usize,
    /// Calls served token-in and rendered whole, by reason.
    pub fresh: BTreeMap<String, usize>,
    /// Calls served through the chat endpoint, by reason (`server` when
    /// the backend has no model files).
    pub chat_endpoint: BTreeMap<String, usize>,
}

/// One measured session: its harness, set-up, figures, and what is wrong
/// with it beside the figures (the harness failed, the task's check
/// failed, the capture is not token-exact against what the mock served).
#[derive(Clone, Debug)]
pub struct Measured {
    /// The harness.
    pub harness: &'static str,
    /// The model family served.
    pub family: Family,
    /// Who rendered the prompts.
    pub rendering: Rendering,
    /// The figures (`None` when the session could not be exported).
    pub figures: Option<Figures>,
    /// Problems with the session itself.
    pub problems: Vec<String>,
}

impl Measured {
    /// What is wrong against the token-faithful target: one trace per main
    /// chain (compaction aside), no break, no splice, no off-policy
    /// context token, every extendable call served as an extension; plus
    /// the session's own problems.
    pub fn faithful_misses(&self) -> Vec<String> {
        let mut misses = self.problems.clone();
        let Some(f) = &self.figures else {
            misses.push("no figures".into());
            return misses;
        };
        if f.main_chains == 0 || f.main_traces - f.compaction_traces != f.main_chains {
            misses.push(format!(
                "{} main-chain traces ({} after compaction) for {} main chains",
                f.main_traces, f.compaction_traces, f.main_chains
            ));
        }
        if f.breaks != 0 || f.splices != 0 || f.off_policy_tokens != 0 {
            misses.push(format!(
                "{} breaks, {} splices, {} off-policy context tokens",
                f.breaks, f.splices, f.off_policy_tokens
            ));
        }
        if !f.chat_endpoint.is_empty() && f.chat_endpoint.keys().any(|r| r == "server") {
            misses.push(format!(
                "calls went to the chat endpoint: {:?}",
                f.chat_endpoint
            ));
        }
        misses
    }
}

/// Runs `harnesses` at once on the four-step task against the mock serving
/// `family`'s real files, rendered as `rendering` says, and measures each
/// session.
pub fn measure(
    harnesses: &[&'static str],
    family: Family,
    rendering: Rendering,
) -> Result<Vec<Measured>> {
    let tmp = tempfile::tempdir()?;
    let dir = family.served_dir(tmp.path())?;
    let mut keys = format!("output_parser = \"{}\"\n", family.output_parser());
    if rendering == Rendering::Faithful {
        keys.push_str(&format!("model_dir = {}\n", toml_path(&dir)));
    }
    let backend = Backend {
        mock_args: vec!["--model-dir".into(), dir.display().to_string()],
        keys,
        tag: format!(
            "{}-{}",
            family.dir_name().replace('_', ""),
            match rendering {
                Rendering::Server => "sr",
                Rendering::Faithful => "tf",
            }
        ),
    };
    let scenario = Scenario::StepsMeasured;
    let sessions = run_sessions(harnesses, false, None, scenario, &backend)?;
    Ok(sessions
        .list
        .iter()
        .map(|s| {
            let problems = check(s.harness, &s.run, scenario, &s.served);
            let (figures, more) = match figures(s) {
                Ok(f) => (Some(f), Vec::new()),
                Err(e) => {
                    let err = s.run.finished.stderr();
                    let tail: Vec<&str> = err.lines().rev().take(15).collect();
                    let tail: Vec<&str> = tail.into_iter().rev().collect();
                    (
                        None,
                        vec![format!("{e:#}\npolar's stderr:\n{}", tail.join("\n"))],
                    )
                }
            };
            Measured {
                harness: s.harness,
                family,
                rendering,
                figures,
                problems: problems.into_iter().chain(more).collect(),
            }
        })
        .collect())
}

/// `path` as a TOML basic string.
fn toml_path(path: &Path) -> String {
    Value::from(path.display().to_string()).to_string()
}

/// The figures of a session, from its export and capture log.
fn figures(session: &Session) -> Result<Figures> {
    let log = session.run.outcome["capture_log"]
        .as_str()
        .unwrap_or_default();
    let rows = exported_rows(Path::new(log))?;
    ensure!(!rows.is_empty(), "no exported row");
    let stats = json_field(&rows[0]["stats"]);
    let count = |k: &str| stats[k].as_u64().unwrap_or_default() as usize;
    let main: Vec<&Value> = rows.iter().filter(|r| r["chain_role"] == "main").collect();
    let chains: BTreeSet<u64> = main.iter().filter_map(|r| r["chain"].as_u64()).collect();
    // A compaction is its summary call's segment and the segment after
    // it, linked to the summary (a `compaction` break that follows no
    // summary is the builder's reading of a shorter prompt, not one).
    let summaries: Vec<(&Value, &Value)> = main
        .iter()
        .filter(|r| r["segment_kind"] == "compaction_summary")
        .map(|r| (&r["chain"], &r["segment"]))
        .collect();
    let compaction_traces = main
        .iter()
        .filter(|r| {
            let previous = &json_field(&r["trace_metadata"])["previous"];
            r["segment_kind"] == "compaction_summary"
                || summaries
                    .iter()
                    .any(|(c, s)| previous["chain"] == **c && previous["segment"] == **s)
        })
        .count();
    let mut break_reasons = BTreeMap::new();
    for r in &main {
        if let Some(why) = r["break_reason"].as_str() {
            *break_reasons.entry(why.to_owned()).or_default() += 1;
        }
    }
    let mut f = Figures {
        break_reasons,
        calls: count("calls"),
        main_chains: chains.len(),
        main_traces: main.len(),
        compaction_traces,
        segments: count("segments"),
        breaks: count("breaks"),
        splices: count("template_mismatches_spliced"),
        off_policy_tokens: count("off_policy_context_tokens"),
        ..Figures::default()
    };
    let (calls, _) = read_log(Path::new(log))?;
    for c in &calls {
        match &c.backend.serving {
            None => *f.chat_endpoint.entry("server".into()).or_default() += 1,
            Some(polar_faithful::Serving::ChatEndpoint { reason }) => {
                *f.chat_endpoint
                    .entry(reason.clone().unwrap_or_else(|| "server".into()))
                    .or_default() += 1;
            }
            Some(polar_faithful::Serving::TokenIn { prompt }) => match prompt {
                polar_faithful::Origin::Extends { .. } | polar_faithful::Origin::Repeats { .. } => {
                    f.extends += 1;
                }
                polar_faithful::Origin::Fresh { reason } => {
                    let why = serde_json::to_value(reason)
                        .ok()
                        .and_then(|v| v["why"].as_str().map(str::to_owned))
                        .unwrap_or_default();
                    *f.fresh.entry(why).or_default() += 1;
                }
            },
        }
    }
    Ok(f)
}

/// A JSON column: an object, or its JSON text.
fn json_field(v: &Value) -> Value {
    match v {
        Value::String(t) => serde_json::from_str(t).unwrap_or(Value::Null),
        other => other.clone(),
    }
}

/// The table's header (Markdown).
pub const TABLE_HEAD: &str = "| CLI | template | serving | calls | main chains | main traces | segments | breaks | splices | off-policy context tokens | prompts extended / rendered whole |\n\
| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |";

/// A session's row of the table (Markdown).
pub fn table_row(m: &Measured) -> String {
    let Some(f) = &m.figures else {
        return format!(
            "| {} | {} | {} | failed: {} |||||||| |",
            m.harness,
            m.family,
            m.rendering,
            m.problems.join("; ").replace('\n', " ")
        );
    };
    let served = if m.rendering == Rendering::Server {
        "chat endpoint".to_owned()
    } else {
        let fresh: Vec<String> = f.fresh.iter().map(|(k, v)| format!("{v} {k}")).collect();
        let chat: Vec<String> = f
            .chat_endpoint
            .iter()
            .map(|(k, v)| format!("{v} chat endpoint ({k})"))
            .collect();
        format!(
            "{} / {}",
            f.extends,
            fresh.into_iter().chain(chat).collect::<Vec<_>>().join(", ")
        )
    };
    let reasons: Vec<String> = f
        .break_reasons
        .iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect();
    let breaks = if reasons.is_empty() {
        f.breaks.to_string()
    } else {
        format!("{} ({})", f.breaks, reasons.join(", "))
    };
    let compaction = if f.compaction_traces > 0 {
        format!(" ({} compaction)", f.compaction_traces)
    } else {
        String::new()
    };
    format!(
        "| {} | {} | {} | {} | {} | {}{compaction} | {} | {breaks} | {} | {} | {served} |",
        m.harness,
        m.family,
        m.rendering,
        f.calls,
        f.main_chains,
        f.main_traces,
        f.segments,
        f.splices,
        f.off_policy_tokens,
    )
}
