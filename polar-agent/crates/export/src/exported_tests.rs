//! Re-derivation from exported calls files: the sessions a node exported
//! (calls file first, as the gateway does) rebuild into the same
//! trajectories from the export root alone as from the node's directories;
//! selection by task and time range; a local root and an object store;
//! a damaged calls file is reported with its name and offset, the rest
//! goes on.

use std::path::Path;
use std::sync::Arc;

use object_store::ObjectStore;
use object_store::memory::InMemory;

use super::calls::{CallsHeader, encode_calls};
use super::cli::FormatArg;
use super::exported::{TimeRange, list_calls, read_calls};
use super::sample::{SampleSpec, session, write_session_dir};
use super::source::{list_sessions, read_session};
use super::{Destination, ExportArgs, ExportOptions, Exporter, read_jsonl, run};

/// Writes the sample sessions under `state` and exports their calls files
/// to `dest` as a gateway does; returns the calls files' locations.
async fn export_calls(state: &Path, dest: Destination, spec: &SampleSpec) -> Vec<String> {
    for i in 0..spec.sessions {
        write_session_dir(state, &session(spec, i)).unwrap();
    }
    let exporter = Exporter::new(dest, ExportOptions::default()).unwrap();
    let mut out = Vec::new();
    for dir in list_sessions(state).unwrap() {
        let log = read_session(&dir).unwrap();
        let header = CallsHeader::new(
            &log.meta.session_id,
            log.meta.task_id.as_deref(),
            log.session_json.as_ref(),
            &log.records,
        );
        let bytes = encode_calls(&header, &log.records).unwrap();
        out.push(
            exporter
                .write_calls(log.meta.task_id.as_deref(), &log.meta.session_id, bytes)
                .await
                .unwrap(),
        );
    }
    out
}

/// Every JSONL row under `dir`, sorted by trace id.
fn rows(dir: &Path) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    for part in std::fs::read_dir(dir).unwrap() {
        for f in std::fs::read_dir(part.unwrap().path()).unwrap() {
            let p = f.unwrap().path();
            if p.extension().is_some_and(|e| e == "jsonl") {
                for r in read_jsonl(&std::fs::read(&p).unwrap()).unwrap() {
                    out.push(serde_json::to_value(&r).unwrap());
                }
            }
        }
    }
    out.sort_by_key(|r| r["trace_id"].as_str().unwrap_or_default().to_owned());
    out
}

#[tokio::test]
async fn trajectories_rebuilt_from_the_export_equal_those_from_the_node() {
    let state = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let spec = SampleSpec::small();
    let files = export_calls(
        state.path(),
        Destination::Local {
            root: root.path().to_owned(),
        },
        &spec,
    )
    .await;
    assert_eq!(files.len(), spec.sessions);
    assert!(
        files[0].ends_with("task=task-0/s-0000.calls.jsonl.zst"),
        "{files:?}"
    );

    let (from_node, from_export) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut a = ExportArgs::new(from_node.path().display().to_string());
    a.state_dir = Some(state.path().to_owned());
    a.format = FormatArg::Jsonl;
    let node = run(a).await.unwrap();
    // The node's copy is gone: the export root is all there is.
    std::fs::remove_dir_all(state.path()).unwrap();
    let mut a = ExportArgs::new(from_export.path().display().to_string());
    a.from = Some(root.path().display().to_string());
    a.format = FormatArg::Jsonl;
    let export = run(a).await.unwrap();
    assert_eq!(export.sessions, spec.sessions as u64, "{export}");
    assert_eq!((export.calls, export.traces), (node.calls, node.traces));
    assert!(export.sessions_failed.is_empty(), "{export}");
    let (a, b) = (rows(from_node.path()), rows(from_export.path()));
    assert!(!a.is_empty());
    assert_eq!(a, b, "re-derived rows differ");

    // One task only; then a time range that holds nothing.
    let out = tempfile::tempdir().unwrap();
    let mut a = ExportArgs::new(out.path().display().to_string());
    a.from = Some(root.path().display().to_string());
    a.tasks = vec!["task-1".into()];
    let s = run(a).await.unwrap();
    assert_eq!(s.sessions, 2, "{s}");
    let mut a = ExportArgs::new(out.path().display().to_string());
    a.from = Some(root.path().display().to_string());
    a.since = Some(u64::MAX - 1);
    let s = run(a).await.unwrap();
    assert_eq!((s.sessions, s.sessions_outside_range), (0, 4), "{s}");
}

#[tokio::test]
async fn a_damaged_calls_file_is_reported_with_its_offset_and_the_rest_exported() {
    let state = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let spec = SampleSpec::small();
    let files = export_calls(
        state.path(),
        Destination::Local {
            root: root.path().to_owned(),
        },
        &spec,
    )
    .await;
    let bytes = std::fs::read(&files[1]).unwrap();
    std::fs::write(&files[1], &bytes[..bytes.len() / 2]).unwrap();
    std::fs::write(&files[2], b"{\"schema_version\": 1}\n").unwrap();
    let out = tempfile::tempdir().unwrap();
    let mut a = ExportArgs::new(out.path().display().to_string());
    a.from = Some(root.path().display().to_string());
    let s = run(a).await.unwrap();
    assert_eq!(s.sessions, 2, "{s}");
    assert_eq!(s.sessions_failed.len(), 2, "{s}");
    let failed = |f: &str| {
        s.sessions_failed
            .iter()
            .find(|x| x.dir == Path::new(f))
            .unwrap_or_else(|| panic!("{f} not reported: {s}"))
    };
    let truncated = failed(&files[1]);
    assert!(
        truncated.error.contains(&files[1])
            && truncated.error.contains(&format!("of {}", bytes.len() / 2)),
        "{}",
        truncated.error
    );
    assert!(failed(&files[2]).error.contains("offset 0"), "{s}");
}

#[tokio::test]
async fn calls_files_are_listed_and_read_from_an_object_store() {
    let state = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let dest = Destination::object(Arc::clone(&store), "runs/7");
    let spec = SampleSpec::small();
    export_calls(state.path(), dest.clone(), &spec).await;
    let all = list_calls(&dest, &[]).await.unwrap();
    assert_eq!(all.len(), spec.sessions);
    assert_eq!(all[0].name(), "runs/7/task=task-0/s-0000.calls.jsonl.zst");
    let some = list_calls(&dest, &["task-1".into()]).await.unwrap();
    assert_eq!(some.len(), 2);
    let log = read_calls(&dest, &some[0], TimeRange::default())
        .await
        .unwrap()
        .unwrap();
    let node = read_session(&state.path().join("sessions/s-0001")).unwrap();
    assert_eq!(log.records, node.records);
    assert_eq!(log.meta, node.meta);
    assert_eq!(log.rewards, node.rewards);
}
