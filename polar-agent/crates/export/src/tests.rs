//! Unit tests of the export: lossless round trips through both formats,
//! the schema against its document, row groups per session, partitioning,
//! and atomicity (uncommitted and crashed writes are never visible under
//! a final name; stale temporaries are cleaned).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arrow_schema::DataType;
use futures_util::TryStreamExt as _;
use object_store::memory::InMemory;
use object_store::{ObjectStore, ObjectStoreExt as _};

use polar_trajectory::{Builder, PrefixMergingOptions, Trajectory};

use super::format::{Encoder, Format, ParquetCompression, read_jsonl, read_parquet};
use super::local::{LocalFile, TEMP_PREFIX, clean_stale_temps};
use super::partition::NULL_PARTITION;
use super::sample::{SampleSpec, session, template};
use super::schema::{COLUMNS, arrow_schema};
use super::{Destination, ExportError, ExportOptions, Exporter, rebuild, trajectories};

fn builders() -> Vec<Builder> {
    vec![
        Builder::PerRequest,
        Builder::PrefixMerging(PrefixMergingOptions {
            template: Some(template()),
            ..PrefixMergingOptions::default()
        }),
    ]
}

fn sample_trajectories(builder: &Builder) -> Vec<Trajectory> {
    let spec = SampleSpec::small();
    (0..spec.sessions)
        .map(|i| {
            let s = session(&spec, i);
            rebuild(builder, &s.records, &s.meta, Some(&s.rewards)).unwrap()
        })
        .collect()
}

fn encode(format: Format, trajs: &[Trajectory]) -> Vec<u8> {
    let mut enc = Encoder::new(format, ParquetCompression::Snappy).unwrap();
    let mut out = Vec::new();
    for t in trajs {
        out.extend(enc.push(t).unwrap());
    }
    out.extend(enc.finish().unwrap());
    out
}

#[test]
fn sample_sessions_exercise_the_schema() {
    let trajs = sample_trajectories(&builders()[1]);
    let t = &trajs[0];
    assert!(t.traces.len() >= 2, "main agent and sub-agent chains");
    assert!(t.traces.iter().any(|t| !t.labels.is_empty()));
    assert!(t.traces.iter().all(|t| t.reward.is_some()));
    assert!(trajs.iter().any(|t| t.error.is_some()), "a failed session");
    assert!(t.stats.calls_merged > 0);
}

#[test]
fn parquet_round_trip_is_lossless() {
    for b in builders() {
        let trajs = sample_trajectories(&b);
        let bytes = encode(Format::Parquet, &trajs);
        let rows = read_parquet(bytes.into()).unwrap();
        assert_eq!(
            rows.len(),
            trajs.iter().map(|t| t.traces.len()).sum::<usize>()
        );
        assert_eq!(trajectories(rows).unwrap(), trajs, "builder {b:?}");
    }
}

#[test]
fn jsonl_round_trip_is_lossless_and_agrees_with_parquet() {
    for b in builders() {
        let trajs = sample_trajectories(&b);
        let from_jsonl = read_jsonl(&encode(Format::Jsonl, &trajs)).unwrap();
        let from_parquet = read_parquet(encode(Format::Parquet, &trajs).into()).unwrap();
        assert_eq!(from_jsonl, from_parquet);
        assert_eq!(trajectories(from_jsonl).unwrap(), trajs);
    }
}

#[test]
fn absent_logprobs_and_rewards_are_nulls() {
    let mut trajs = sample_trajectories(&Builder::PerRequest);
    trajs.truncate(1);
    for t in &mut trajs[0].traces {
        t.response_logprobs = None;
        t.reward = None;
        t.finish_reason = Some(polar_chat::FinishReason::Other("eos_token".into()));
    }
    trajs[0].metadata.task_id = None;
    let rows = read_parquet(encode(Format::Parquet, &trajs).into()).unwrap();
    assert!(
        rows.iter()
            .all(|r| r.response_logprobs.is_none() && r.reward.is_none())
    );
    assert!(
        rows.iter()
            .all(|r| r.finish_reason.as_deref() == Some("eos_token"))
    );
    assert_eq!(trajectories(rows).unwrap(), trajs);
}

#[test]
fn parquet_has_the_documented_types_and_one_row_group_per_session() {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let trajs = sample_trajectories(&Builder::PerRequest);
    let bytes = bytes::Bytes::from(encode(Format::Parquet, &trajs));
    let reader = SerializedFileReader::new(bytes.clone()).unwrap();
    assert_eq!(reader.metadata().num_row_groups(), trajs.len());
    let builder =
        parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes).unwrap();
    let schema = builder.schema();
    let expected = arrow_schema();
    assert_eq!(schema.fields(), expected.fields());
    assert_eq!(
        schema.field_with_name("prompt_ids").unwrap().data_type(),
        &DataType::List(super::schema::item_field(DataType::UInt32))
    );
    assert_eq!(
        schema.metadata().get(super::schema::META_SCHEMA_VERSION),
        Some(&"1".to_owned())
    );
}

#[test]
fn the_schema_document_lists_every_column_with_its_type() {
    let doc = include_str!("../../../../docs/EXPORT-SCHEMA.md");
    for c in COLUMNS {
        let row = format!(
            "| `{}` | {} | {} |",
            c.name,
            c.ty.doc_name(),
            if c.nullable { "yes" } else { "no" }
        );
        assert!(doc.contains(&row), "EXPORT-SCHEMA.md lacks the row {row}");
    }
    let documented = doc.lines().filter(|l| l.starts_with("| `")).count();
    assert_eq!(
        documented,
        COLUMNS.len(),
        "the document lists other columns"
    );
    assert!(doc.contains(&format!("version {}", super::EXPORT_SCHEMA_VERSION)));
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = walk(dir)
        .into_iter()
        .map(|p| p.strip_prefix(dir).unwrap().display().to_string())
        .collect();
    names.sort();
    names
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test]
async fn files_are_partitioned_by_task() {
    let dir = tempfile::tempdir().unwrap();
    let exporter = Exporter::new(
        Destination::Local {
            root: dir.path().to_owned(),
        },
        ExportOptions {
            formats: vec![Format::Parquet, Format::Jsonl],
            ..ExportOptions::default()
        },
    )
    .unwrap();
    let mut trajs = sample_trajectories(&Builder::PerRequest);
    trajs[3].metadata.task_id = None;
    for t in &trajs {
        let files = exporter.write_session(t).await.unwrap();
        assert_eq!(files.len(), 2);
    }
    assert_eq!(
        listing(dir.path()),
        [
            format!("task={NULL_PARTITION}/s-0003.jsonl"),
            format!("task={NULL_PARTITION}/s-0003.parquet"),
            "task=task-0/s-0000.jsonl".into(),
            "task=task-0/s-0000.parquet".into(),
            "task=task-0/s-0002.jsonl".into(),
            "task=task-0/s-0002.parquet".into(),
            "task=task-1/s-0001.jsonl".into(),
            "task=task-1/s-0001.parquet".into(),
        ]
    );
    let back = std::fs::read(dir.path().join("task=task-1/s-0001.parquet")).unwrap();
    assert_eq!(
        trajectories(read_parquet(back.into()).unwrap()).unwrap(),
        [trajs[1].clone()]
    );
    let c = exporter.counters();
    assert_eq!(c.files.load(std::sync::atomic::Ordering::Relaxed), 8);
    let on_disk: u64 = walk(dir.path())
        .iter()
        .map(|p| p.metadata().unwrap().len())
        .sum();
    assert_eq!(c.bytes.load(std::sync::atomic::Ordering::Relaxed), on_disk);

    // A batch takes only its task's sessions.
    let mut batch = exporter
        .open_batch(Some("task-0"), "batch-x")
        .await
        .unwrap();
    let err = batch.push(&trajs[1]).await.unwrap_err();
    assert!(matches!(err, ExportError::WrongPartition { .. }), "{err}");
    batch.abort().await;
    assert!(!listing(dir.path()).iter().any(|n| n.contains("batch-x")));
}

#[tokio::test]
async fn a_batch_is_invisible_until_committed_then_whole() {
    let dir = tempfile::tempdir().unwrap();
    let exporter = Exporter::new(
        Destination::Local {
            root: dir.path().to_owned(),
        },
        ExportOptions::default(),
    )
    .unwrap();
    let trajs = sample_trajectories(&Builder::PerRequest);
    let mut batch = exporter
        .open_batch(Some("task-0"), "batch-1")
        .await
        .unwrap();
    batch.push(&trajs[0]).await.unwrap();
    batch.push(&trajs[2]).await.unwrap();
    // Mid-write a reader listing the partition sees only a hidden temporary.
    let names = listing(dir.path());
    assert_eq!(names.len(), 1);
    assert!(
        names[0].starts_with(&format!("task=task-0/{TEMP_PREFIX}")),
        "{names:?}"
    );
    let files = batch.commit().await.unwrap();
    assert_eq!(files[0].sessions, 2);
    assert_eq!(listing(dir.path()), ["task=task-0/batch-1.parquet"]);
    let back = std::fs::read(dir.path().join("task=task-0/batch-1.parquet")).unwrap();
    assert_eq!(
        trajectories(read_parquet(back.into()).unwrap()).unwrap(),
        [trajs[0].clone(), trajs[2].clone()]
    );

    // Dropped without commit: the temporary goes, nothing is published.
    let mut batch = exporter
        .open_batch(Some("task-0"), "batch-2")
        .await
        .unwrap();
    batch.push(&trajs[0]).await.unwrap();
    drop(batch);
    assert_eq!(listing(dir.path()), ["task=task-0/batch-1.parquet"]);
}

/// Writers opening files in a partition that does not exist yet, at the
/// same moment, all find its directory (the second used to race ahead of
/// the first one's creating it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_of_a_new_partition_all_find_its_directory() {
    let trajs = sample_trajectories(&Builder::PerRequest);
    for round in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let exporter = Arc::new(
            Exporter::new(
                Destination::Local {
                    root: dir.path().to_owned(),
                },
                ExportOptions::default(),
            )
            .unwrap(),
        );
        let writers: Vec<_> = (0..8)
            .map(|i| {
                let exporter = Arc::clone(&exporter);
                let traj = trajs[0].clone();
                tokio::spawn(async move {
                    let name = format!("s-{i}");
                    let mut batch = exporter.open_batch(Some("task-0"), &name).await?;
                    batch.push(&traj).await?;
                    batch.commit().await
                })
            })
            .collect();
        for w in writers {
            w.await
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        assert_eq!(listing(dir.path()).len(), 8, "round {round}");
    }
}

#[tokio::test]
async fn a_crashed_write_leaves_no_final_name_and_is_cleaned_when_stale() {
    let dir = tempfile::tempdir().unwrap();
    let part = dir.path().join("task=task-0");
    std::fs::create_dir_all(&part).unwrap();
    // A crash: the process dies mid-write (no drop, no rename).
    let mut crashed = LocalFile::create(part.join("s-0000.parquet"))
        .await
        .unwrap();
    crashed.write(b"PAR1 half a file".to_vec()).await.unwrap();
    let temp = crashed.temp_path().to_owned();
    std::mem::forget(crashed);
    assert!(temp.exists());
    assert!(!part.join("s-0000.parquet").exists());
    // Another writer's fresh temporary must survive the cleanup.
    let mut live = LocalFile::create(part.join("s-0001.parquet"))
        .await
        .unwrap();
    live.write(b"in progress".to_vec()).await.unwrap();
    assert_eq!(
        clean_stale_temps(&part, Duration::from_secs(3600)).unwrap(),
        0
    );
    std::fs::File::options()
        .write(true)
        .open(&temp)
        .unwrap()
        .set_modified(SystemTime::now() - Duration::from_secs(7200))
        .unwrap();

    // The next export into the partition removes the stale one only.
    let exporter = Exporter::new(
        Destination::Local {
            root: dir.path().to_owned(),
        },
        ExportOptions::default(),
    )
    .unwrap();
    let trajs = sample_trajectories(&Builder::PerRequest);
    exporter.write_session(&trajs[0]).await.unwrap();
    assert!(!temp.exists(), "stale temporary not cleaned");
    assert!(live.temp_path().exists());
    live.commit().await.unwrap();
    assert_eq!(
        listing(dir.path()),
        ["task=task-0/s-0000.parquet", "task=task-0/s-0001.parquet"]
    );
}

async fn object_names(store: &Arc<dyn ObjectStore>) -> Vec<String> {
    let mut names: Vec<String> = store
        .list(None)
        .map_ok(|m| m.location.to_string())
        .try_collect()
        .await
        .unwrap();
    names.sort();
    names
}

#[tokio::test]
async fn objects_appear_whole_single_put_and_multipart() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let exporter = Exporter::new(
        Destination::object(Arc::clone(&store), "runs/7/"),
        ExportOptions {
            formats: vec![Format::Jsonl],
            ..ExportOptions::default()
        },
    )
    .unwrap();
    let trajs = sample_trajectories(&Builder::PerRequest);
    exporter.write_session(&trajs[1]).await.unwrap();
    assert_eq!(
        object_names(&store).await,
        ["runs/7/task=task-1/s-0001.jsonl"]
    );

    // Past one part the upload is multipart: still invisible until the end.
    let mut batch = exporter.open_batch(Some("task-0"), "big").await.unwrap();
    let mut expected = Vec::new();
    while (expected.len() as u64) < 2 * super::object::PART_SIZE as u64 + 1 {
        batch.push(&trajs[0]).await.unwrap();
        expected.extend(super::format::jsonl(&trajs[0]).unwrap());
    }
    assert_eq!(
        object_names(&store).await.len(),
        1,
        "partial object visible"
    );
    let files = batch.commit().await.unwrap();
    assert_eq!(files[0].bytes, expected.len() as u64);
    let got = store
        .get(&object_store::path::Path::from(
            "runs/7/task=task-0/big.jsonl",
        ))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(got.len(), expected.len());
    assert!(got == expected.as_slice());
}

#[test]
fn builder_options_come_from_the_arguments() {
    let mut a = super::ExportArgs::new("/tmp/x");
    assert!(
        matches!(a.builder().unwrap(), Builder::PrefixMerging(o) if o.splice && o.template.is_none())
    );
    a.end_of_turn_ids = vec![2];
    a.think_ids = vec![3, 4];
    a.no_splice = true;
    assert!(
        matches!(a.builder().unwrap(), Builder::PrefixMerging(o) if !o.splice && o.template == Some(template()))
    );
    a.end_of_turn_ids.clear();
    assert!(a.builder().is_err(), "think ids without end-of-turn ids");
    a.builder_json = Some(r#"{"kind":"per_request"}"#.into());
    assert_eq!(a.builder().unwrap(), Builder::PerRequest);
    a.builder_json = Some("{".into());
    assert!(a.builder().is_err());
}

#[tokio::test]
async fn run_exports_a_state_dir_in_batches_and_reports_bad_sessions() {
    let state = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let spec = SampleSpec::small();
    for i in 0..spec.sessions {
        super::sample::write_session_dir(state.path(), &session(&spec, i)).unwrap();
    }
    // A session whose log is torn at the end, and one that is unreadable.
    let torn = state.path().join("sessions/s-0001/calls.jsonl");
    let mut text = std::fs::read(&torn).unwrap();
    text.extend_from_slice(b"{\"version\":1,\"call_id\":");
    std::fs::write(&torn, text).unwrap();
    let bad = state.path().join("sessions/s-9999");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(bad.join("calls.jsonl"), b"").unwrap();
    std::fs::write(bad.join("session.json"), b"not json").unwrap();

    let mut args = super::ExportArgs::new(out.path().display().to_string());
    args.state_dir = Some(state.path().to_owned());
    args.sessions_per_file = 2;
    args.format = super::cli::FormatArg::Both;
    let summary = super::run(args).await.unwrap();
    assert_eq!(summary.sessions, 4);
    assert_eq!(summary.sessions_failed.len(), 1);
    assert!(summary.sessions_failed[0].dir.ends_with("s-9999"));
    assert_eq!(summary.log_problems, 1);
    assert_eq!(summary.files.len(), 4, "{:?}", summary.files);
    assert_eq!(
        listing(out.path()),
        [
            "task=task-0/batch-s-0000.jsonl",
            "task=task-0/batch-s-0000.parquet",
            "task=task-1/batch-s-0001.jsonl",
            "task=task-1/batch-s-0001.parquet",
        ]
    );
    let on_disk: u64 = walk(out.path())
        .iter()
        .map(|p| p.metadata().unwrap().len())
        .sum();
    assert_eq!(summary.bytes, on_disk);
    let text = summary.to_string();
    assert!(
        text.contains("exported 4 sessions") && text.contains("FAILED"),
        "{text}"
    );
}

#[test]
fn statistics_are_skipped_only_where_configured() {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let trajs = sample_trajectories(&Builder::PerRequest);
    let bytes = bytes::Bytes::from(encode(Format::Parquet, &trajs[..1]));
    let reader = SerializedFileReader::new(bytes).unwrap();
    let rg = reader.metadata().row_group(0);
    let paths: Vec<String> = rg
        .columns()
        .iter()
        .map(|c| c.column_path().string())
        .collect();
    for c in super::format::NO_STATISTICS_COLUMNS {
        let path = c.join(".");
        let col = rg
            .columns()
            .iter()
            .find(|m| m.column_path().string() == path)
            .unwrap_or_else(|| panic!("no column {path} in {paths:?}"));
        assert!(col.statistics().is_none(), "{path} has statistics");
    }
    let chain = rg
        .columns()
        .iter()
        .find(|m| m.column_path().string() == "chain")
        .unwrap();
    assert!(chain.statistics().is_some());
}

#[tokio::test]
async fn a_pipeline_publishes_every_session() {
    let dir = tempfile::tempdir().unwrap();
    let exporter = Exporter::new(
        Destination::Local {
            root: dir.path().to_owned(),
        },
        ExportOptions {
            commits_in_flight: 1,
            ..ExportOptions::default()
        },
    )
    .unwrap();
    let trajs = sample_trajectories(&Builder::PerRequest);
    let mut pipeline = exporter.pipeline();
    let mut files = Vec::new();
    for t in &trajs {
        pipeline.write_session(t).await.unwrap();
        files.extend(pipeline.take_done());
    }
    assert!(
        files.len() >= trajs.len() - 2,
        "at most one commit in flight"
    );
    files.extend(pipeline.finish().await.unwrap());
    assert_eq!(files.len(), trajs.len());
    let mut back = Vec::new();
    for f in &files {
        back.extend(
            trajectories(read_parquet(std::fs::read(&f.location).unwrap().into()).unwrap())
                .unwrap(),
        );
    }
    back.sort_by(|a, b| a.metadata.session_id.cmp(&b.metadata.session_id));
    assert_eq!(back, trajs);
}

/// One attempt, one trajectory: each row names the attempt it came from
/// (null for a session recorded outside the rollout path), in Parquet as a
/// nullable `uint32` and in JSONL right after `group_id`; the stats count
/// the earlier attempts set apart; files written before the column existed
/// read back with it null.
#[test]
fn the_attempt_column_round_trips_and_is_null_when_absent() {
    let trajs = sample_trajectories(&Builder::PerRequest);
    let attempts: Vec<Option<u32>> = trajs.iter().map(|t| t.metadata.attempt).collect();
    assert_eq!(attempts, [Some(1), None, Some(2), None]);
    let expected: Vec<Option<u32>> = trajs
        .iter()
        .flat_map(|t| t.traces.iter().map(|_| t.metadata.attempt))
        .collect();
    let parquet = bytes::Bytes::from(encode(Format::Parquet, &trajs));
    let jsonl = encode(Format::Jsonl, &trajs);
    for rows in [
        read_parquet(parquet.clone()).unwrap(),
        read_jsonl(&jsonl).unwrap(),
    ] {
        let got: Vec<Option<u32>> = rows.iter().map(|r| r.attempt).collect();
        assert_eq!(got, expected);
        assert_eq!(trajectories(rows).unwrap(), trajs);
    }

    let reader =
        parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(parquet).unwrap();
    let schema = reader.schema().clone();
    let field = schema.field_with_name("attempt").unwrap();
    assert_eq!(
        (field.data_type(), field.is_nullable()),
        (&DataType::UInt32, true)
    );
    let at = schema.index_of("attempt").unwrap();
    assert_eq!(schema.field(at - 1).name(), "group_id");
    let mut column = Vec::new();
    for batch in reader.build().unwrap() {
        let batch = batch.unwrap();
        let values = batch.column(at).as_any();
        let values = values.downcast_ref::<arrow_array::UInt32Array>().unwrap();
        column.extend(values.iter());
    }
    assert_eq!(column, expected, "nulls where there is no attempt");

    let lines: Vec<serde_json::Value> = jsonl
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    for (line, want) in lines.iter().zip(&expected) {
        let keys: Vec<&String> = line.as_object().unwrap().keys().collect();
        let at = keys.iter().position(|k| *k == "attempt").unwrap();
        assert_eq!(keys[at - 1], "group_id");
        assert_eq!(line["attempt"], serde_json::json!(want));
        let superseded = want.map_or(0, |a| a - 1);
        assert_eq!(line["stats"]["superseded_attempts"], superseded);
        match want {
            Some(a) => assert_eq!(line["trajectory_metadata"]["attempt"], *a),
            None => assert!(line["trajectory_metadata"].get("attempt").is_none()),
        }
    }

    // Written before the column existed: no `attempt` column or key.
    let mut old = super::record_batch(&trajs[0]).unwrap();
    old.remove_column(old.schema().index_of("attempt").unwrap());
    let props = super::format::writer_properties(ParquetCompression::Snappy);
    let mut w =
        parquet::arrow::ArrowWriter::try_new(Vec::new(), old.schema(), Some(props)).unwrap();
    w.write(&old).unwrap();
    let rows = read_parquet(w.into_inner().unwrap().into()).unwrap();
    assert!(!rows.is_empty() && rows.iter().all(|r| r.attempt.is_none()));
    let mut line = lines[0].clone();
    line.as_object_mut().unwrap().remove("attempt");
    let rows = read_jsonl(line.to_string().as_bytes()).unwrap();
    assert_eq!(rows[0].attempt, None);
}

/// The off-policy context count is a column (the trace's sum, from its
/// spans in `trace_metadata`), round-trips through both formats, and is
/// null in files written before the column existed, whose rows still
/// rebuild the same trajectories.
#[test]
fn the_off_policy_column_round_trips_and_is_null_when_absent() {
    let mut trajs = sample_trajectories(&builders()[1]);
    let t = trajs[0]
        .traces
        .iter_mut()
        .find(|t| t.spans.len() >= 3)
        .expect("a trace of three calls or more");
    // As after a splice at the second call: each later call carries it.
    for s in &mut t.spans[1..] {
        s.off_policy_context_tokens = 7;
    }
    t.metadata.off_policy_context_tokens = 7 * (t.spans.len() - 1);
    let (sum, joins) = (t.metadata.off_policy_context_tokens, t.spans.len() - 1);
    trajs[0].stats.off_policy_context_tokens = sum;
    trajs[0].stats.off_policy_joins = joins;
    let expected: Vec<Option<u32>> = trajs
        .iter()
        .flat_map(|t| &t.traces)
        .map(|t| Some(u32::try_from(t.metadata.off_policy_context_tokens).unwrap()))
        .collect();
    assert!(expected.contains(&Some(u32::try_from(sum).unwrap())));
    assert!(expected.contains(&Some(0)));

    let parquet = bytes::Bytes::from(encode(Format::Parquet, &trajs));
    let jsonl = encode(Format::Jsonl, &trajs);
    for rows in [
        read_parquet(parquet.clone()).unwrap(),
        read_jsonl(&jsonl).unwrap(),
    ] {
        let got: Vec<Option<u32>> = rows.iter().map(|r| r.off_policy_context_tokens).collect();
        assert_eq!(got, expected);
        assert_eq!(trajectories(rows).unwrap(), trajs);
    }
    let reader =
        parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(parquet).unwrap();
    let field = reader
        .schema()
        .field_with_name("off_policy_context_tokens")
        .unwrap()
        .clone();
    assert_eq!(
        (field.data_type(), field.is_nullable()),
        (&DataType::UInt32, true)
    );
    let line: serde_json::Value =
        serde_json::from_slice(jsonl.split(|&b| b == b'\n').next().unwrap()).unwrap();
    assert_eq!(
        line["trace_metadata"]["off_policy_context_tokens"],
        line["off_policy_context_tokens"]
    );

    // Written before the column existed.
    let mut old = super::record_batch(&trajs[0]).unwrap();
    old.remove_column(old.schema().index_of("off_policy_context_tokens").unwrap());
    let props = super::format::writer_properties(ParquetCompression::Snappy);
    let mut w =
        parquet::arrow::ArrowWriter::try_new(Vec::new(), old.schema(), Some(props)).unwrap();
    w.write(&old).unwrap();
    let rows = read_parquet(w.into_inner().unwrap().into()).unwrap();
    assert!(!rows.is_empty() && rows.iter().all(|r| r.off_policy_context_tokens.is_none()));
    assert_eq!(trajectories(rows).unwrap(), trajs[..1]);
}
