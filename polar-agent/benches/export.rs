//! Export throughput to local disk on a synthetic multi-session rollout
//! (coding-agent-shaped sessions: `export::sample::SampleSpec::realistic`,
//! 16 sessions of 40 main-agent + 8 sub-agent calls, ~40,000 tokens of
//! context at the end of each).
//!
//! 1. *Export*: the sessions' trajectories, built beforehand, written
//!    through a [`Pipeline`] (encode, write, fsync file and directory,
//!    rename), per builder and format; sequentially (each file durable
//!    before the next session is encoded) and pipelined (fsyncs in the
//!    background while the next session is encoded). Throughput is bytes
//!    written over wall time from the first encode to the last fsync, and
//!    over the process's CPU time; the disk's own ceiling is measured in the
//!    same run by writing raw buffers of the same sizes, fsynced the same
//!    way.
//! 2. *polar export*: the same rollout as captured session logs on disk,
//!    re-derived end to end by `export::run` (read and parse `calls.jsonl`,
//!    build, check, export), one session in memory at a time, in a child
//!    process whose peak resident memory is reported.
//!
//! `cargo bench -p polar-agent --bench export`; figures on stderr.
//! `POLAR_BENCH_SESSIONS` changes the number of sessions. The process
//! tunes the allocator as `polar export` does (`export::memory`);
//! `POLAR_BENCH_DEFAULT_MALLOC=1` keeps glibc's defaults. Wall time on a
//! shared machine includes other jobs' load: CPU seconds are shown too.

use std::time::Instant;

use polar_export::cli::BuilderArg;
use polar_export::sample::{SampleSpec, session, template, write_session_dir};
use polar_export::{
    Destination, ExportArgs, ExportOptions, Exporter, Format, Pipeline, WrittenFile, rebuild, run,
};
use polar_trajectory::{Builder, PrefixMergingOptions, Trajectory};

fn status_kib(key: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0)
}

fn cpu_seconds() -> f64 {
    let text = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = text
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 (11 and 12 after the name).
    (ticks(11) + ticks(12)) / 100.0
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap_or_else(|e| panic!("temporary directory: {e}"))
}

async fn write_all(pipeline: &mut Pipeline<'_>, trajs: &[Trajectory]) -> Vec<WrittenFile> {
    for t in trajs {
        pipeline
            .write_session(t)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    pipeline.take_done()
}

struct Run {
    bytes: u64,
    files: u64,
    wall: f64,
    cpu: f64,
}

const ROUNDS: usize = 3;

/// Runs `f` [`ROUNDS`] times; the run of median wall time.
fn median(mut f: impl FnMut() -> Run) -> Run {
    let mut runs: Vec<Run> = (0..ROUNDS).map(|_| f()).collect();
    runs.sort_by(|a, b| a.wall.total_cmp(&b.wall));
    runs.swap_remove(ROUNDS / 2)
}

fn show(name: &str, r: &Run, tokens: usize, traces: usize) {
    eprintln!(
        "{name:<42} {:>7.1} MB {:>4} files {:>5} traces | {:>6.3} s wall = {:>6.1} MB/s, {:>5.1} M tokens/s | {:>6.3} CPU s = {:>6.1} MB/CPU-s",
        r.bytes as f64 / 1e6,
        r.files,
        traces,
        r.wall,
        r.bytes as f64 / 1e6 / r.wall,
        tokens as f64 / 1e6 / r.wall,
        r.cpu,
        r.bytes as f64 / 1e6 / r.cpu.max(1e-3),
    );
}

/// The disk's ceiling: the same file sizes written raw, each fsynced with
/// its directory, one after another.
fn raw_disk(sizes: &[u64]) -> Run {
    use std::io::Write as _;
    let dir = tempdir();
    let (start, cpu) = (Instant::now(), cpu_seconds());
    for (i, &n) in sizes.iter().enumerate() {
        let data = vec![0x5au8; usize::try_from(n).unwrap_or(0)];
        let path = dir.path().join(format!("f{i}"));
        let mut f = std::fs::File::create(&path).unwrap_or_else(|e| panic!("{e}"));
        f.write_all(&data).unwrap_or_else(|e| panic!("{e}"));
        f.sync_all().unwrap_or_else(|e| panic!("{e}"));
        std::fs::File::open(dir.path())
            .and_then(|d| d.sync_all())
            .unwrap_or_else(|e| panic!("{e}"));
    }
    Run {
        bytes: sizes.iter().sum(),
        files: sizes.len() as u64,
        wall: start.elapsed().as_secs_f64(),
        cpu: cpu_seconds() - cpu,
    }
}

fn export_run(
    rt: &tokio::runtime::Runtime,
    trajs: &[Trajectory],
    format: Format,
    in_flight: usize,
    sizes: &mut Vec<u64>,
) -> Run {
    let dir = tempdir();
    let exporter = Exporter::new(
        Destination::Local {
            root: dir.path().to_owned(),
        },
        ExportOptions {
            formats: vec![format],
            commits_in_flight: in_flight,
            ..ExportOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let (start, cpu) = (Instant::now(), cpu_seconds());
    let files = rt.block_on(async {
        let mut p = exporter.pipeline();
        let mut files = write_all(&mut p, trajs).await;
        files.extend(p.finish().await.unwrap_or_else(|e| panic!("{e}")));
        files
    });
    let (wall, cpu) = (start.elapsed().as_secs_f64(), cpu_seconds() - cpu);
    *sizes = files.iter().map(|f| f.bytes).collect();
    Run {
        bytes: files.iter().map(|f| f.bytes).sum(),
        files: files.len() as u64,
        wall,
        cpu,
    }
}

fn main() {
    let mut spec = SampleSpec::realistic();
    if let Some(n) = std::env::var("POLAR_BENCH_SESSIONS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        spec.sessions = n;
    }
    // As `polar export` does (see export::memory); POLAR_BENCH_DEFAULT_MALLOC
    // keeps glibc's defaults, for comparison.
    if std::env::var_os("POLAR_BENCH_DEFAULT_MALLOC").is_none() {
        polar_export::memory::retain_freed_memory();
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    if std::env::var("POLAR_BENCH_PART").as_deref() == Ok("logs") {
        logs_part(&rt, &spec);
        return;
    }
    let merging = Builder::PrefixMerging(PrefixMergingOptions {
        template: Some(template()),
        ..PrefixMergingOptions::default()
    });
    eprintln!(
        "rollout: {} sessions x ({} main + {} sub-agent calls), {} system / {} reasoning / {} answer / {} tool tokens per turn",
        spec.sessions,
        spec.calls,
        spec.sub_agent_calls,
        spec.system_tokens,
        spec.reasoning_tokens,
        spec.answer_tokens,
        spec.tool_tokens
    );
    for (bname, builder) in [
        ("per_request", &Builder::PerRequest),
        ("prefix_merging", &merging),
    ] {
        let trajs: Vec<Trajectory> = (0..spec.sessions)
            .map(|i| {
                let s = session(&spec, i);
                rebuild(builder, &s.records, &s.meta, Some(&s.rewards))
                    .unwrap_or_else(|e| panic!("{e}"))
            })
            .collect();
        let tokens: usize = trajs.iter().map(|t| t.stats.total_tokens()).sum();
        let traces: usize = trajs.iter().map(|t| t.traces.len()).sum();
        for format in [Format::Parquet, Format::Jsonl] {
            let mut sizes = Vec::new();
            // Warm-up: page cache, allocator, the disk's journal.
            export_run(&rt, &trajs[..2.min(trajs.len())], format, 4, &mut sizes);
            for (mode, in_flight) in [("sequential", 0), ("pipelined", 4)] {
                let r = median(|| export_run(&rt, &trajs, format, in_flight, &mut sizes));
                show(&format!("{bname} -> {format}, {mode}"), &r, tokens, traces);
            }
            let r = median(|| raw_disk(&sizes));
            show("  raw fsync'd writes of the same sizes", &r, tokens, traces);
        }
    }

    // polar export's path, in a fresh process so its peak RSS is its own.
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
    let status = std::process::Command::new(exe)
        .env("POLAR_BENCH_PART", "logs")
        .env("POLAR_BENCH_SESSIONS", spec.sessions.to_string())
        .status()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(status.success(), "the logs part failed");
}

/// `polar export`'s path: logs on disk -> parse -> build -> check -> files.
fn logs_part(rt: &tokio::runtime::Runtime, spec: &SampleSpec) {
    let state = tempdir();
    let mut log_bytes = 0;
    for i in 0..spec.sessions {
        let dir =
            write_session_dir(state.path(), &session(spec, i)).unwrap_or_else(|e| panic!("{e}"));
        log_bytes += std::fs::metadata(dir.join("calls.jsonl")).map_or(0, |m| m.len());
    }
    for (bname, builder, per_file) in [
        ("per_request", BuilderArg::PerRequest, 1),
        ("prefix_merging", BuilderArg::PrefixMerging, 1),
        (
            "prefix_merging, 1 file per task",
            BuilderArg::PrefixMerging,
            spec.sessions,
        ),
    ] {
        let out = tempdir();
        let mut args = ExportArgs::new(out.path().display().to_string());
        args.state_dir = Some(state.path().to_owned());
        args.builder = builder;
        args.sessions_per_file = per_file;
        args.end_of_turn_ids = template().end_of_turn;
        args.think_ids = template().think;
        let (start, cpu) = (Instant::now(), cpu_seconds());
        let summary = rt.block_on(run(args)).unwrap_or_else(|e| panic!("{e}"));
        let (wall, cpu) = (start.elapsed().as_secs_f64(), cpu_seconds() - cpu);
        eprintln!(
            "polar export from logs, {bname:<32} {:>6.1} MB of logs -> {:>6.1} MB in {:>3} files | {:>6.3} s wall = {:>6.1} MB/s of logs | {:>6.3} CPU s | peak RSS so far {:>6.1} MiB",
            log_bytes as f64 / 1e6,
            summary.bytes as f64 / 1e6,
            summary.files.len(),
            wall,
            log_bytes as f64 / 1e6 / wall,
            cpu,
            status_kib("VmHWM:") / 1024.0,
        );
    }
    let largest = (0..spec.sessions)
        .map(|i| {
            std::fs::metadata(state.path().join(format!("sessions/s-{i:04}/calls.jsonl")))
                .map_or(0, |m| m.len())
        })
        .max()
        .unwrap_or(0);
    eprintln!(
        "  (largest session log {:.1} MB; the whole rollout's logs {:.1} MB)",
        largest as f64 / 1e6,
        log_bytes as f64 / 1e6
    );
}
