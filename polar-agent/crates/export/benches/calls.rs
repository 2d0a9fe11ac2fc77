//! The calls files (`<session>.calls.jsonl.zst`, `polar_export::calls`):
//! their size, the export time they add per session, and re-derivation
//! from them.
//!
//! 1. *A 200-call session* (`SampleSpec`, coding-agent-shaped: 160 main
//!    calls and 40 interleaved sub-agent calls, 2,000 system tokens,
//!    600-token tool results): the records as JSON lines and compressed,
//!    bytes per call, encoding and decoding time (median of 5). The file
//!    is left at `$POLAR_BENCH_CALLS_OUT` when set, for
//!    `python/benchmarks/calls_format.py` (the Parquet comparison, read
//!    with pyarrow).
//! 2. *Export time added*: for the export bench's realistic sessions
//!    (48 calls each), per session, the trajectory export alone (build,
//!    check, Parquet, fsync) against the calls file first (encode, write,
//!    fsync, rename) and then the trajectory, as a gateway does.
//! 3. *A 1,000-session task re-derived*: 1,000 smaller sessions' calls
//!    files in one export root, `polar export --from` (`export::run`),
//!    prefix_merging to Parquet, wall time.
//!
//! `cargo bench -p polar-export --bench calls`; figures on stderr.
//! `POLAR_BENCH_SESSIONS` changes the 1,000.

use std::time::Instant;

use polar_export::calls::{CallsHeader, decode_calls, encode_calls};
use polar_export::cli::FormatArg;
use polar_export::sample::{SampleSpec, session};
use polar_export::{Destination, ExportArgs, ExportOptions, Exporter, rebuild, run};
use polar_record::CompletionRecord;
use polar_trajectory::Builder;

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap_or_else(|e| panic!("temporary directory: {e}"))
}

/// The median of `n` timings of `f`, in seconds.
fn median<T>(n: usize, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut times = Vec::with_capacity(n);
    let mut last = None;
    for _ in 0..n {
        let start = Instant::now();
        let out = f();
        times.push(start.elapsed().as_secs_f64());
        last = Some(out);
    }
    times.sort_by(f64::total_cmp);
    let out = last.unwrap_or_else(|| panic!("no round"));
    (times[n / 2], out)
}

fn header(records: &[CompletionRecord]) -> CallsHeader {
    let s = records.first().map(|r| r.session_id.as_str()).unwrap_or("");
    let t = records.first().and_then(|r| r.task_id.as_deref());
    CallsHeader::new(
        s,
        t,
        Some(&serde_json::json!({"outcome": "completed"})),
        records,
    )
}

fn two_hundred_calls() {
    let spec = SampleSpec {
        sessions: 1,
        tasks: 1,
        calls: 160,
        sub_agent_calls: 40,
        ..SampleSpec::realistic()
    };
    let records = session(&spec, 0).records;
    let h = header(&records);
    let jsonl: usize = records
        .iter()
        .map(|r| serde_json::to_vec(r).map_or(0, |v| v.len() + 1))
        .sum();
    let (enc, bytes) = median(5, || {
        encode_calls(&h, &records).unwrap_or_else(|e| panic!("{e}"))
    });
    let (dec, back) = median(5, || {
        decode_calls("bench", &bytes).unwrap_or_else(|e| panic!("{e}"))
    });
    assert_eq!(back.records.len(), records.len());
    let n = records.len();
    eprintln!(
        "200-call session: {n} calls; JSON lines {:.2} MB ({} B/call); .calls.jsonl.zst {:.3} MB ({} B/call, {:.1}x smaller)",
        jsonl as f64 / 1e6,
        jsonl / n,
        bytes.len() as f64 / 1e6,
        bytes.len() / n,
        jsonl as f64 / bytes.len() as f64
    );
    eprintln!(
        "  encode {:.1} ms ({:.0} MB/s of JSON), decode to records {:.1} ms ({:.0} MB/s of JSON)",
        enc * 1e3,
        jsonl as f64 / 1e6 / enc,
        dec * 1e3,
        jsonl as f64 / 1e6 / dec
    );
    if let Some(out) = std::env::var_os("POLAR_BENCH_CALLS_OUT") {
        std::fs::write(&out, &bytes).unwrap_or_else(|e| panic!("{e}"));
        eprintln!("  written to {}", std::path::Path::new(&out).display());
    }
}

fn export_time_added(rt: &tokio::runtime::Runtime) {
    let spec = SampleSpec::realistic();
    let sessions: Vec<_> = (0..spec.sessions).map(|i| session(&spec, i)).collect();
    let builder = Builder::default();
    let one = |with_calls: bool| {
        let dir = tempdir();
        let exporter = Exporter::new(
            Destination::Local {
                root: dir.path().to_owned(),
            },
            ExportOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let start = Instant::now();
        let mut bytes = 0;
        for s in &sessions {
            if with_calls {
                let b =
                    encode_calls(&header(&s.records), &s.records).unwrap_or_else(|e| panic!("{e}"));
                bytes += b.len();
                rt.block_on(exporter.write_calls(s.meta.task_id.as_deref(), &s.meta.session_id, b))
                    .unwrap_or_else(|e| panic!("{e}"));
            }
            let t = rebuild(&builder, &s.records, &s.meta, Some(&s.rewards))
                .unwrap_or_else(|e| panic!("{e}"));
            rt.block_on(exporter.write_session(&t))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        (start.elapsed().as_secs_f64() / sessions.len() as f64, bytes)
    };
    let (_, (alone, _)) = median(3, || one(false));
    let (_, (both, bytes)) = median(3, || one(true));
    let calls = sessions.iter().map(|s| s.records.len()).sum::<usize>() / sessions.len();
    eprintln!(
        "export per session ({calls} calls, {:.2} MB calls file): trajectory alone {:.1} ms; calls file then trajectory {:.1} ms (+{:.1} ms, +{:.0}%)",
        bytes as f64 / 1e6 / sessions.len() as f64,
        alone * 1e3,
        both * 1e3,
        (both - alone) * 1e3,
        (both - alone) / alone * 100.0
    );
}

fn thousand_sessions(rt: &tokio::runtime::Runtime) {
    let n: usize = std::env::var("POLAR_BENCH_SESSIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    // Smaller than the realistic sessions (a 1,000-session root of those
    // is 1 GB compressed): 20 calls, 12,000 tokens of context at the end.
    let spec = SampleSpec {
        sessions: n,
        tasks: 1,
        calls: 16,
        sub_agent_calls: 4,
        system_tokens: 1_000,
        reasoning_tokens: 60,
        answer_tokens: 120,
        tool_tokens: 400,
        seed: 9,
    };
    let root = tempdir();
    let exporter = Exporter::new(
        Destination::Local {
            root: root.path().to_owned(),
        },
        ExportOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mut bytes = 0;
    let mut calls = 0;
    for i in 0..n {
        let s = session(&spec, i);
        calls += s.records.len();
        let mut json = serde_json::to_value(&s.meta).unwrap_or_default();
        if let (Some(m), polar_trajectory::Rewards::Outcome(r)) = (json.as_object_mut(), &s.rewards)
        {
            m.insert("reward".into(), (*r).into());
        }
        let h = CallsHeader::new(
            &s.meta.session_id,
            s.meta.task_id.as_deref(),
            Some(&json),
            &s.records,
        );
        let b = encode_calls(&h, &s.records).unwrap_or_else(|e| panic!("{e}"));
        bytes += b.len();
        rt.block_on(exporter.write_calls(s.meta.task_id.as_deref(), &s.meta.session_id, b))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let out = tempdir();
    let mut args = ExportArgs::new(out.path().display().to_string());
    args.from = Some(root.path().display().to_string());
    args.format = FormatArg::Parquet;
    let start = Instant::now();
    let summary = rt.block_on(run(args)).unwrap_or_else(|e| panic!("{e}"));
    let wall = start.elapsed().as_secs_f64();
    assert_eq!(summary.sessions as usize, n, "{summary}");
    eprintln!(
        "{n}-session task re-derived from its calls files ({calls} calls, {:.1} MB of .calls.jsonl.zst): {:.2} s wall ({:.1} ms/session, {:.0} calls/s), {} traces, {:.1} MB of Parquet",
        bytes as f64 / 1e6,
        wall,
        wall * 1e3 / n as f64,
        calls as f64 / wall,
        summary.traces,
        summary.bytes as f64 / 1e6
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    polar_export::memory::retain_freed_memory();
    two_hundred_calls();
    export_time_added(&rt);
    thousand_sessions(&rt);
}
