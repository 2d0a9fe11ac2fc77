//! `polar export` given the wrong kind of directory, or finding nothing to
//! write: the error names what was given and what was expected; an export
//! of no session says why (none there, all filtered out, all failed, named).

use std::path::Path;

use super::sample::{SampleSpec, session, write_session_dir};
use super::{ExportArgs, run};

fn state_args(out: &Path, state: &Path) -> ExportArgs {
    let mut a = ExportArgs::new(out.display().to_string());
    a.state_dir = Some(state.to_owned());
    a
}

fn from_args(out: &Path, root: &Path) -> ExportArgs {
    let mut a = ExportArgs::new(out.display().to_string());
    a.from = Some(root.display().to_string());
    a
}

/// A state directory holding the sample sessions.
fn sample_state(spec: &SampleSpec) -> tempfile::TempDir {
    let state = tempfile::tempdir().unwrap();
    for i in 0..spec.sessions {
        write_session_dir(state.path(), &session(spec, i)).unwrap();
    }
    state
}

#[tokio::test]
async fn a_directory_without_sessions_is_not_a_state_directory() {
    let dir = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"x").unwrap();
    let e = run(state_args(out.path(), dir.path())).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "{} is not a state directory: it has no sessions/ (expected a node's \
             agent.state_dir, holding sessions/<session>/calls.jsonl)",
            dir.path().display()
        )
    );
    // An export root given as a state directory: pointed at --from.
    std::fs::create_dir(dir.path().join("task=t")).unwrap();
    let e = run(state_args(out.path(), dir.path())).await.unwrap_err();
    assert!(
        e.to_string()
            .ends_with("; it holds task=*/ directories like an export root: use --from"),
        "{e}"
    );
    // A directory that does not exist.
    let gone = dir.path().join("gone");
    let e = run(state_args(out.path(), &gone)).await.unwrap_err();
    assert!(
        e.to_string()
            .starts_with(&format!("{} is not a state directory", gone.display())),
        "{e}"
    );
}

#[tokio::test]
async fn a_directory_without_partitions_is_not_an_export_root() {
    let spec = SampleSpec::small();
    let state = sample_state(&spec);
    let out = tempfile::tempdir().unwrap();
    let e = run(from_args(out.path(), state.path())).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "{} is not an export root: it has no task=*/ directory (expected the --out \
             directory of an export, holding task=<task>/<session>.calls.jsonl.zst); it holds \
             sessions/ like a state directory: use --state-dir",
            state.path().display()
        )
    );
    let gone = state.path().join("gone");
    let e = run(from_args(out.path(), &gone)).await.unwrap_err();
    assert!(
        e.to_string().starts_with(&format!(
            "{} is not an export root: it does not exist (",
            gone.display()
        )),
        "{e}"
    );
}

#[tokio::test]
async fn an_export_of_nothing_says_why() {
    let out = tempfile::tempdir().unwrap();
    // None there: an empty state directory, an empty export root.
    let state = tempfile::tempdir().unwrap();
    std::fs::create_dir(state.path().join("sessions")).unwrap();
    let s = run(state_args(out.path(), state.path())).await.unwrap();
    let why = format!(
        "no session under {} (none with a calls.jsonl)",
        state.path().join("sessions").display()
    );
    assert_eq!(s.nothing_exported.as_deref(), Some(why.as_str()));
    assert!(
        s.to_string()
            .ends_with(&format!("nothing exported: {why}\n")),
        "{s}"
    );
    let root = tempfile::tempdir().unwrap();
    let s = run(from_args(out.path(), root.path())).await.unwrap();
    assert_eq!(
        s.nothing_exported,
        Some(format!("no calls file under {}", root.path().display()))
    );

    // All filtered out by --task, then by --since/--until.
    let spec = SampleSpec::small();
    let node = sample_state(&spec);
    write_calls_root(node.path(), root.path()).await;
    let mut a = from_args(out.path(), root.path());
    a.tasks = vec!["other".into()];
    let s = run(a).await.unwrap();
    assert_eq!(
        s.nothing_exported,
        Some(format!(
            "all {} calls files under {} are of other tasks than --task other",
            spec.sessions,
            root.path().display()
        ))
    );
    let mut a = from_args(out.path(), root.path());
    a.since = Some(u64::MAX - 1);
    let s = run(a).await.unwrap();
    assert_eq!(
        s.nothing_exported,
        Some(format!(
            "of {n} sessions, all {n} outside the time range of --since",
            n = spec.sessions
        ))
    );
    assert!(s.json_has_reason(), "{s}");

    // All failed to read: each named.
    for i in 0..spec.sessions {
        let f = node.path().join(format!("sessions/s-{i:04}/session.json"));
        std::fs::write(f, b"not json").unwrap();
    }
    let s = run(state_args(out.path(), node.path())).await.unwrap();
    let names: Vec<String> = (0..spec.sessions)
        .map(|i| {
            node.path()
                .join(format!("sessions/s-{i:04}"))
                .display()
                .to_string()
        })
        .collect();
    assert_eq!(
        s.nothing_exported,
        Some(format!(
            "of {n} sessions, all {n} failed to read ({})",
            names.join(", "),
            n = spec.sessions
        ))
    );
}

/// Writes the calls files of the sessions under `state` to `root`, as a
/// gateway exports them.
async fn write_calls_root(state: &Path, root: &Path) {
    use super::calls::{CallsHeader, encode_calls};
    use super::source::{list_sessions, read_session};
    let exporter = super::Exporter::new(
        super::Destination::Local {
            root: root.to_owned(),
        },
        super::ExportOptions::default(),
    )
    .unwrap();
    for dir in list_sessions(state).unwrap() {
        let log = read_session(&dir).unwrap();
        let header = CallsHeader::new(
            &log.meta.session_id,
            log.meta.task_id.as_deref(),
            log.session_json.as_ref(),
            &log.records,
        );
        let bytes = encode_calls(&header, &log.records).unwrap();
        exporter
            .write_calls(log.meta.task_id.as_deref(), &log.meta.session_id, bytes)
            .await
            .unwrap();
    }
}

impl super::Summary {
    /// Whether the JSON summary carries the reason.
    fn json_has_reason(&self) -> bool {
        let v = serde_json::to_value(self).unwrap();
        v["nothing_exported"] == serde_json::json!(self.nothing_exported)
            && self.nothing_exported.is_some()
    }
}
