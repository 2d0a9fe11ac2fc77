//! `polar export` to a local directory, with both builders and formats:
//! every session's trajectory comes back exactly as rebuilt from its
//! records, in its task's partition, and the torn log record is skipped.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Result, ensure};
use polar_trajectory::Builder;

use crate::fixture;

fn read_tree(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) -> Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            read_tree(root, &p, out)?;
        } else {
            let name = p.strip_prefix(root)?.display().to_string();
            ensure!(!name.contains("/.tmp-"), "temporary left behind: {name}");
            out.insert(name, std::fs::read(&p)?);
        }
    }
    Ok(())
}

#[test]
fn polar_export_to_a_local_directory_with_each_builder() -> Result<()> {
    let state = tempfile::tempdir()?;
    fixture::write_state_dir(state.path())?;
    let state_arg = state.path().display().to_string();
    for (name, builder) in [
        ("per_request", Builder::PerRequest),
        ("prefix_merging", Builder::default()),
    ] {
        let out = tempfile::tempdir()?;
        let out_arg = out.path().display().to_string();
        let summary = fixture::polar_export(
            &[
                "--state-dir",
                &state_arg,
                "--out",
                &out_arg,
                "--format",
                "both",
                "--builder",
                name,
            ],
            &[],
        )?;
        ensure!(summary["sessions"] == 6, "{summary}");
        ensure!(summary["log_problems"] == 1, "the torn record: {summary}");
        ensure!(
            summary["files"].as_array().map(Vec::len) == Some(12),
            "{summary}"
        );

        let mut files = BTreeMap::new();
        read_tree(out.path(), out.path(), &mut files)?;
        ensure!(files.len() == 12, "{:?}", files.keys());
        ensure!(
            files.keys().all(|k| k.starts_with("task=task-")),
            "{:?}",
            files.keys()
        );
        let bytes: u64 = files.values().map(|b| b.len() as u64).sum();
        ensure!(
            summary["bytes"] == bytes,
            "summary bytes {} != {bytes}",
            summary["bytes"]
        );

        let expected = fixture::expected(&builder)?;
        let parquet: BTreeMap<_, _> = files
            .iter()
            .filter(|(k, _)| k.ends_with(".parquet"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let jsonl: BTreeMap<_, _> = files
            .into_iter()
            .filter(|(k, _)| k.ends_with(".jsonl"))
            .collect();
        ensure!(
            fixture::decode(&parquet)? == expected,
            "{name}: Parquet differs"
        );
        ensure!(
            fixture::decode(&jsonl)? == expected,
            "{name}: JSONL differs"
        );
    }
    Ok(())
}

#[test]
fn polar_export_of_named_sessions_in_batches() -> Result<()> {
    let state = tempfile::tempdir()?;
    fixture::write_state_dir(state.path())?;
    let out = tempfile::tempdir()?;
    let s = |i: usize| {
        state
            .path()
            .join(format!("sessions/s-000{i}"))
            .display()
            .to_string()
    };
    let (s0, s3, s4) = (s(0), s(3), s(4));
    let out_arg = out.path().display().to_string();
    let summary = fixture::polar_export(
        &[
            "--session",
            &s0,
            "--session",
            &s3,
            "--session",
            &s4,
            "--out",
            &out_arg,
            "--sessions-per-file",
            "2",
            "--builder",
            "per_request",
        ],
        &[],
    )?;
    // s-0000 and s-0003 share task-0; s-0004 is alone in task-1.
    ensure!(summary["sessions"] == 3, "{summary}");
    let mut files = BTreeMap::new();
    read_tree(out.path(), out.path(), &mut files)?;
    let names: Vec<&String> = files.keys().collect();
    ensure!(
        names
            == [
                "task=task-0/batch-s-0000.parquet",
                "task=task-1/batch-s-0004.parquet"
            ],
        "{names:?}"
    );
    let got = fixture::decode(&files)?;
    let mut expected = fixture::expected(&Builder::PerRequest)?;
    expected.retain(|k, _| ["s-0000", "s-0003", "s-0004"].contains(&k.as_str()));
    ensure!(got == expected, "batched export differs");
    Ok(())
}
