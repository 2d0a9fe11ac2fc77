//! `polar export`: re-derives training data from captured session logs,
//! without re-running rollouts. Reads each session under a state directory
//! (or the given session directories), or each exported calls file under
//! an export root (`--from`, local or `s3://`: no node needed; selected by
//! task and time range), one at a time, rebuilds its trajectory with any
//! builder, and writes it as JSONL and/or Parquet to a local directory or
//! `s3://bucket/prefix`; returns a [`Summary`].

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;

use serde::Serialize;

use polar_trajectory::{Builder, PrefixMergingOptions, RetryPolicy, TemplateInfo, Trajectory};

use super::dest::{Destination, S3Options};
use super::error::ExportError;
use super::exported::{CallsFile, TimeRange, list_calls, read_calls};
use super::format::{Format, ParquetCompression};
use super::rebuild::rebuild;
use super::source::{SessionLog, list_sessions, read_session};
use super::writer::{BatchFile, ExportOptions, Exporter, Pipeline, WrittenFile};

/// Output formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FormatArg {
    /// JSONL only.
    Jsonl,
    /// Parquet only.
    Parquet,
    /// Both, side by side.
    Both,
}

impl FormatArg {
    fn formats(self) -> Vec<Format> {
        match self {
            Self::Jsonl => vec![Format::Jsonl],
            Self::Parquet => vec![Format::Parquet],
            Self::Both => vec![Format::Parquet, Format::Jsonl],
        }
    }
}

/// Trajectory builders.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BuilderArg {
    /// One trace per call.
    #[value(name = "per_request", alias = "per-request")]
    PerRequest,
    /// Calls extending earlier calls merge into one trace.
    #[value(name = "prefix_merging", alias = "prefix-merging")]
    PrefixMerging,
}

/// What becomes of a call a retry superseded (`prefix_merging`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RetriesArg {
    /// Delivered as its own trace, labelled `superseded_retry`.
    Keep,
    /// Left out, counted as dropped.
    Drop,
}

/// `polar export`.
#[derive(Debug, Clone, clap::Args)]
pub struct ExportArgs {
    /// Destination: a directory (local, NFS, Lustre) or s3://BUCKET/PREFIX.
    #[arg(long, short = 'o', value_name = "DIR|s3://BUCKET/PREFIX")]
    pub out: String,
    /// State directory whose `sessions/*/` are exported [default: the
    /// configuration's agent.state_dir].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Configuration file, read for agent.state_dir.
    #[arg(long, env = "POLAR_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Export only this session directory (repeatable); the state directory
    /// is then not scanned.
    #[arg(long = "session", value_name = "DIR")]
    pub sessions: Vec<PathBuf>,
    /// Re-derive from the calls files exported under this export root
    /// (`task=*/<session>.calls.jsonl.zst`) instead of a node's state
    /// directory.
    #[arg(long, value_name = "DIR|s3://BUCKET/PREFIX", conflicts_with_all = ["state_dir", "sessions"])]
    pub from: Option<String>,
    /// With --from: only this task's sessions (repeatable).
    #[arg(long = "task", value_name = "ID", requires = "from")]
    pub tasks: Vec<String>,
    /// With --from: only sessions whose last call ended at or after this
    /// time (RFC 3339, e.g. 2026-01-31T12:00:00Z, or Unix milliseconds).
    #[arg(long, value_name = "TIME", requires = "from", value_parser = parse_time)]
    pub since: Option<u64>,
    /// With --from: only sessions whose first call arrived before this time
    /// (RFC 3339 or Unix milliseconds).
    #[arg(long, value_name = "TIME", requires = "from", value_parser = parse_time)]
    pub until: Option<u64>,
    /// File format(s).
    #[arg(long, value_enum, default_value_t = FormatArg::Parquet)]
    pub format: FormatArg,
    /// Trajectory builder.
    #[arg(long, value_enum, default_value_t = BuilderArg::PrefixMerging)]
    pub builder: BuilderArg,
    /// prefix_merging: start a new segment at a template mismatch instead
    /// of splicing it.
    #[arg(long)]
    pub no_splice: bool,
    /// prefix_merging: calls superseded by a retry.
    #[arg(long, value_enum, default_value_t = RetriesArg::Keep)]
    pub retries: RetriesArg,
    /// prefix_merging: token ids that end an assistant turn (comma-separated),
    /// for end-of-turn-aware splicing.
    #[arg(long, value_delimiter = ',', value_name = "IDS")]
    pub end_of_turn_ids: Vec<u32>,
    /// prefix_merging: reasoning delimiter token ids (comma-separated).
    #[arg(long, value_delimiter = ',', value_name = "IDS")]
    pub think_ids: Vec<u32>,
    /// prefix_merging: ids of whitespace-only tokens (newline runs,
    /// comma-separated), for splicing echoed whitespace that merged with the
    /// template's newline.
    #[arg(long, value_delimiter = ',', value_name = "IDS")]
    pub whitespace_ids: Vec<u32>,
    /// The builder as JSON (e.g. `{"kind":"prefix_merging","splice":false}`);
    /// replaces --builder and its options.
    #[arg(long, value_name = "JSON")]
    pub builder_json: Option<String>,
    /// Sessions per file, per task; 1 writes one file per session.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub sessions_per_file: usize,
    /// Parquet compression.
    #[arg(long, value_enum, default_value_t = ParquetCompression::Snappy)]
    pub compression: ParquetCompression,
    /// S3-compatible endpoint URL (AWS_ENDPOINT_URL otherwise); plain HTTP
    /// is allowed for loopback endpoints. Credentials come from AWS_*.
    #[arg(long, value_name = "URL")]
    pub s3_endpoint: Option<String>,
    /// S3 region.
    #[arg(long, value_name = "REGION")]
    pub s3_region: Option<String>,
    /// Allow plain HTTP to a non-loopback S3 endpoint.
    #[arg(long)]
    pub s3_allow_http: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

impl ExportArgs {
    /// Arguments with defaults, writing to `out`.
    pub fn new(out: impl Into<String>) -> Self {
        Self {
            out: out.into(),
            state_dir: None,
            config: None,
            sessions: Vec::new(),
            from: None,
            tasks: Vec::new(),
            since: None,
            until: None,
            format: FormatArg::Parquet,
            builder: BuilderArg::PrefixMerging,
            no_splice: false,
            retries: RetriesArg::Keep,
            end_of_turn_ids: Vec::new(),
            think_ids: Vec::new(),
            whitespace_ids: Vec::new(),
            builder_json: None,
            sessions_per_file: 1,
            compression: ParquetCompression::Snappy,
            s3_endpoint: None,
            s3_region: None,
            s3_allow_http: false,
            json: false,
        }
    }

    /// The builder the options describe.
    pub fn builder(&self) -> Result<Builder, ExportError> {
        if let Some(json) = &self.builder_json {
            return serde_json::from_str(json)
                .map_err(|e| ExportError::Usage(format!("--builder-json: {e}")));
        }
        Ok(match self.builder {
            BuilderArg::PerRequest => Builder::PerRequest,
            BuilderArg::PrefixMerging => {
                let template = if self.end_of_turn_ids.is_empty()
                    && self.think_ids.is_empty()
                    && self.whitespace_ids.is_empty()
                {
                    None
                } else {
                    let t = TemplateInfo {
                        end_of_turn: self.end_of_turn_ids.clone(),
                        think: self.think_ids.clone(),
                        whitespace: self.whitespace_ids.clone(),
                    };
                    t.validate()
                        .map_err(|e| ExportError::Usage(format!("template token ids: {e}")))?;
                    Some(t)
                };
                Builder::PrefixMerging(PrefixMergingOptions {
                    template,
                    splice: !self.no_splice,
                    retries: match self.retries {
                        RetriesArg::Keep => RetryPolicy::KeepAsTrace,
                        RetriesArg::Drop => RetryPolicy::Drop,
                    },
                })
            }
        })
    }

    fn s3_options(&self) -> S3Options {
        S3Options {
            endpoint: self.s3_endpoint.clone(),
            region: self.s3_region.clone(),
            allow_http: self.s3_allow_http,
            ..S3Options::default()
        }
    }

    /// The sessions to export: calls files under `--from`, or session
    /// directories.
    async fn inputs(&self) -> Result<Inputs, ExportError> {
        if let Some(from) = &self.from {
            let root = Destination::parse(from, &self.s3_options())?;
            let files = list_calls(&root, &self.tasks).await?;
            let range = TimeRange {
                since: self.since,
                until: self.until,
            };
            return Ok(Inputs::Exported { root, files, range });
        }
        Ok(Inputs::Dirs(self.session_dirs()?))
    }

    /// The session directories to export.
    fn session_dirs(&self) -> Result<Vec<PathBuf>, ExportError> {
        if !self.sessions.is_empty() {
            return Ok(self.sessions.clone());
        }
        // `polar export` resolves `--config` (or the default configuration)
        // into `state_dir` before calling [`run`]: this crate does not read
        // the agent's configuration.
        let Some(state_dir) = &self.state_dir else {
            return Err(ExportError::Usage(
                "no state directory: give --state-dir, --config or session directories".into(),
            ));
        };
        Ok(list_sessions(state_dir)?)
    }
}

/// A time given on the command line: Unix milliseconds or RFC 3339.
fn parse_time(s: &str) -> Result<u64, String> {
    if let Ok(ms) = s.parse::<u64>() {
        return Ok(ms);
    }
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .map_err(|e| format!("{s:?}: neither Unix milliseconds nor RFC 3339 ({e})"))?;
    u64::try_from(t.unix_timestamp_nanos() / 1_000_000).map_err(|_| format!("{s:?}: before 1970"))
}

/// Where the sessions come from.
enum Inputs {
    /// Session directories of a node's state directory.
    Dirs(Vec<PathBuf>),
    /// Calls files under an export root.
    Exported {
        root: Destination,
        files: Vec<CallsFile>,
        range: TimeRange,
    },
}

impl Inputs {
    fn len(&self) -> usize {
        match self {
            Self::Dirs(d) => d.len(),
            Self::Exported { files, .. } => files.len(),
        }
    }

    /// Session `i`: its name (for messages) and its log; `None` when
    /// outside the time range.
    async fn read(&self, i: usize) -> (PathBuf, Result<Option<SessionLog>, ExportError>) {
        match self {
            Self::Dirs(dirs) => {
                let d = dirs[i].clone();
                let read = tokio::task::spawn_blocking(move || read_session(&d)).await;
                let log = match read {
                    Ok(r) => r.map(Some).map_err(ExportError::from),
                    Err(_) => Err(ExportError::Join("session reader")),
                };
                (dirs[i].clone(), log)
            }
            Self::Exported { root, files, range } => (
                PathBuf::from(files[i].name()),
                read_calls(root, &files[i], *range).await,
            ),
        }
    }
}

/// A session that could not be exported.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FailedSession {
    /// Its directory.
    pub dir: PathBuf,
    /// Why.
    pub error: String,
}

/// What an export did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    /// The destination.
    pub destination: String,
    /// Sessions exported.
    pub sessions: u64,
    /// Sessions whose trajectory had no trace (nothing written).
    pub sessions_empty: u64,
    /// Sessions that could not be read or rebuilt.
    pub sessions_failed: Vec<FailedSession>,
    /// Calls files left out by `--since`/`--until`.
    pub sessions_outside_range: u64,
    /// Sessions without a recorded outcome (exported as completed).
    pub outcome_unrecorded: u64,
    /// Records read.
    pub calls: u64,
    /// Calls the builder left out (each with its reason in `stats`).
    pub calls_dropped: u64,
    /// Torn or malformed log lines skipped.
    pub log_problems: u64,
    /// Traces (rows per format).
    pub traces: u64,
    /// Prompt tokens of all traces.
    pub prompt_tokens: u64,
    /// Response tokens of all traces.
    pub response_tokens: u64,
    /// Loss-1 tokens of all traces.
    pub loss_tokens: u64,
    /// Files written.
    pub files: Vec<WrittenFile>,
    /// Bytes written.
    pub bytes: u64,
    /// Why no session was exported, when none was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nothing_exported: Option<String>,
}

impl Summary {
    fn add_trajectory(&mut self, traj: &Trajectory) {
        let s = &traj.stats;
        self.traces += traj.traces.len() as u64;
        self.prompt_tokens += s.prompt_tokens as u64;
        self.response_tokens += s.response_tokens as u64;
        self.loss_tokens += s.loss_tokens as u64;
        self.calls_dropped += s.calls_dropped.len() as u64;
    }

    fn add_files(&mut self, files: Vec<WrittenFile>) {
        self.bytes += files.iter().map(|f| f.bytes).sum::<u64>();
        self.files.extend(files);
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "exported {} sessions to {}",
            self.sessions, self.destination
        )?;
        writeln!(
            f,
            "  traces {}, tokens: prompt {}, response {}, loss {}",
            self.traces, self.prompt_tokens, self.response_tokens, self.loss_tokens
        )?;
        writeln!(f, "  files {}, bytes {}", self.files.len(), self.bytes)?;
        writeln!(
            f,
            "  calls {}, dropped by the builder {}, log lines skipped {}",
            self.calls, self.calls_dropped, self.log_problems
        )?;
        if self.sessions_empty > 0 {
            writeln!(
                f,
                "  sessions without traces (not written): {}",
                self.sessions_empty
            )?;
        }
        if self.sessions_outside_range > 0 {
            writeln!(
                f,
                "  sessions outside the time range (not read): {}",
                self.sessions_outside_range
            )?;
        }
        if self.outcome_unrecorded > 0 {
            writeln!(
                f,
                "  sessions without a recorded outcome (exported as completed): {}",
                self.outcome_unrecorded
            )?;
        }
        for s in &self.sessions_failed {
            writeln!(f, "  FAILED {}: {}", s.dir.display(), s.error)?;
        }
        if let Some(why) = &self.nothing_exported {
            writeln!(f, "nothing exported: {why}")?;
        }
        Ok(())
    }
}

/// Runs `polar export`. Unreadable or invalid sessions are listed in the
/// summary and skipped; a destination error stops the export (files
/// already published stay, the one being written is abandoned).
pub async fn run(args: ExportArgs) -> Result<Summary, ExportError> {
    if args.sessions_per_file == 0 {
        return Err(ExportError::Usage(
            "--sessions-per-file must be at least 1".into(),
        ));
    }
    let builder = args.builder()?;
    let dest = Destination::parse(&args.out, &args.s3_options())?;
    let exporter = Exporter::new(
        dest,
        ExportOptions {
            formats: args.format.formats(),
            compression: args.compression,
            ..ExportOptions::default()
        },
    )?;
    let inputs = args.inputs().await?;
    let mut summary = Summary {
        destination: exporter.destination().to_string(),
        ..Summary::default()
    };
    let mut pipeline = exporter.pipeline();
    let mut batches: HashMap<Option<String>, BatchFile<'_>> = HashMap::new();
    let sessions = Sessions {
        builder: &builder,
        per_file: args.sessions_per_file,
    };
    let result = sessions
        .export_all(
            &exporter,
            &mut pipeline,
            &inputs,
            &mut batches,
            &mut summary,
        )
        .await;
    let result = match result {
        Ok(()) => {
            let mut committed = Ok(());
            for (_, batch) in batches {
                if committed.is_ok() {
                    committed = pipeline.commit(batch).await;
                } else {
                    batch.abort().await;
                }
            }
            committed
        }
        Err(e) => {
            for (_, batch) in batches {
                batch.abort().await;
            }
            Err(e)
        }
    };
    let finished = pipeline.finish().await;
    result?;
    summary.add_files(finished?);
    if summary.sessions == 0 {
        summary.nothing_exported = Some(args.why_none(&inputs, &summary).await);
    }
    Ok(summary)
}

impl ExportArgs {
    /// Why an export found nothing to write: no session there, all left
    /// out by the filters, all failed (named) or without traces.
    async fn why_none(&self, inputs: &Inputs, summary: &Summary) -> String {
        let total = inputs.len();
        if total == 0 {
            return match inputs {
                Inputs::Exported { root, .. } => {
                    let all = if self.tasks.is_empty() {
                        0
                    } else {
                        list_calls(root, &[]).await.map_or(0, |f| f.len())
                    };
                    if all > 0 {
                        format!(
                            "all {all} calls files under {root} are of other tasks than --task {}",
                            self.tasks.join(", ")
                        )
                    } else {
                        format!("no calls file under {root}")
                    }
                }
                Inputs::Dirs(_) => match &self.state_dir {
                    Some(dir) => format!(
                        "no session under {} (none with a calls.jsonl)",
                        dir.join(super::source::SESSIONS_DIR).display()
                    ),
                    None => "no session directory given".into(),
                },
            };
        }
        let mut parts = Vec::new();
        if summary.sessions_outside_range > 0 {
            let filters = match (self.since, self.until) {
                (Some(_), Some(_)) => "--since/--until",
                (Some(_), None) => "--since",
                _ => "--until",
            };
            parts.push(format!(
                "{} outside the time range of {filters}",
                summary.sessions_outside_range
            ));
        }
        if !summary.sessions_failed.is_empty() {
            let names: Vec<String> = summary
                .sessions_failed
                .iter()
                .map(|s| s.dir.display().to_string())
                .collect();
            parts.push(format!(
                "{} failed to read ({})",
                summary.sessions_failed.len(),
                names.join(", ")
            ));
        }
        if summary.sessions_empty > 0 {
            parts.push(format!("{} without traces", summary.sessions_empty));
        }
        let all = if parts.len() == 1 { "all " } else { "" };
        format!("of {total} sessions, {all}{}", parts.join(", "))
    }
}

/// How sessions are turned into files.
struct Sessions<'a> {
    builder: &'a Builder,
    per_file: usize,
}

impl Sessions<'_> {
    async fn export_all<'e>(
        &self,
        exporter: &'e Exporter,
        pipeline: &mut Pipeline<'e>,
        inputs: &Inputs,
        batches: &mut HashMap<Option<String>, BatchFile<'e>>,
        summary: &mut Summary,
    ) -> Result<(), ExportError> {
        for i in 0..inputs.len() {
            let (dir, log) = inputs.read(i).await;
            let log: SessionLog = match log {
                Ok(Some(log)) => log,
                Ok(None) => {
                    summary.sessions_outside_range += 1;
                    continue;
                }
                Err(ExportError::Join(what)) => return Err(ExportError::Join(what)),
                Err(e) => {
                    fail(summary, dir, &e);
                    continue;
                }
            };
            summary.calls += log.records.len() as u64;
            summary.log_problems += log.problems.len() as u64;
            if !log.outcome_recorded {
                summary.outcome_unrecorded += 1;
            }
            let traj = match rebuild(self.builder, &log.records, &log.meta, log.rewards.as_ref()) {
                Ok(t) => t,
                Err(e) => {
                    fail(summary, dir, &e);
                    continue;
                }
            };
            drop(log);
            summary.add_trajectory(&traj);
            if traj.traces.is_empty() {
                summary.sessions_empty += 1;
                tracing::warn!(session = %traj.metadata.session_id, "no trace to export");
                continue;
            }
            if self.per_file <= 1 {
                pipeline.write_session(&traj).await?;
            } else {
                let task = traj.metadata.task_id.clone();
                let mut batch = match batches.remove(&task) {
                    Some(b) => b,
                    None => {
                        let name = format!("batch-{}", traj.metadata.session_id);
                        exporter.open_batch(task.as_deref(), &name).await?
                    }
                };
                if let Err(e) = batch.push(&traj).await {
                    batch.abort().await;
                    return Err(e);
                }
                if batch.sessions() as usize >= self.per_file {
                    pipeline.commit(batch).await?;
                } else {
                    batches.insert(task, batch);
                }
            }
            summary.add_files(pipeline.take_done());
            summary.sessions += 1;
        }
        Ok(())
    }
}

fn fail(summary: &mut Summary, dir: PathBuf, e: &ExportError) {
    tracing::warn!(session = %dir.display(), error = %e, "session not exported");
    summary.sessions_failed.push(FailedSession {
        dir,
        error: e.to_string(),
    });
}
