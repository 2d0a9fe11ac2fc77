//! The sample rollout as captured session logs in a state directory, the
//! trajectories an export of it must contain, and running `polar export`.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use anyhow::{Context as _, Result, bail, ensure};
use polar_export::sample::{SampleSpec, session, write_session_dir};
use polar_export::{Row, read_jsonl, read_parquet, rebuild, trajectories};
use polar_trajectory::{Builder, Trajectory};

/// The rollout: 6 sessions over 3 tasks, each with a main agent and a
/// sub-agent.
pub fn spec() -> SampleSpec {
    SampleSpec {
        sessions: 6,
        tasks: 3,
        calls: 6,
        sub_agent_calls: 2,
        system_tokens: 200,
        reasoning_tokens: 16,
        answer_tokens: 24,
        tool_tokens: 80,
        seed: 11,
    }
}

/// Writes the rollout's session logs under `state_dir`; the log of session
/// 1 ends with a record torn by a crash.
pub fn write_state_dir(state_dir: &Path) -> Result<()> {
    let spec = spec();
    for i in 0..spec.sessions {
        write_session_dir(state_dir, &session(&spec, i))?;
    }
    let torn = state_dir.join("sessions/s-0001/calls.jsonl");
    let mut bytes = std::fs::read(&torn)?;
    bytes.extend_from_slice(br#"{"version":1,"call_id":"s-0001-c99","seq":99,"sess"#);
    std::fs::write(&torn, bytes)?;
    Ok(())
}

/// The trajectories the export must hold, by session id.
pub fn expected(builder: &Builder) -> Result<BTreeMap<String, Trajectory>> {
    let spec = spec();
    (0..spec.sessions)
        .map(|i| {
            let s = session(&spec, i);
            let t = rebuild(builder, &s.records, &s.meta, Some(&s.rewards))?;
            Ok((s.meta.session_id.clone(), t))
        })
        .collect()
}

/// Decodes exported files (name -> bytes) into trajectories by session id,
/// checking that each file sits in its task's partition.
pub fn decode(files: &BTreeMap<String, Vec<u8>>) -> Result<BTreeMap<String, Trajectory>> {
    let mut out = BTreeMap::new();
    for (name, bytes) in files {
        let rows: Vec<Row<'static>> = if name.ends_with(".parquet") {
            read_parquet(bytes.clone().into())?
        } else if name.ends_with(".jsonl") {
            read_jsonl(bytes)?
        } else {
            bail!("unexpected file {name}");
        };
        for t in trajectories(rows)? {
            let task = t
                .metadata
                .task_id
                .clone()
                .context("sample sessions have tasks")?;
            ensure!(
                name.contains(&format!("task={task}/")),
                "{name} holds session {} of task {task}",
                t.metadata.session_id
            );
            ensure!(
                out.insert(t.metadata.session_id.clone(), t).is_none(),
                "a session is in two files"
            );
        }
    }
    Ok(out)
}

/// Runs the `polar` binary with `args` and extra environment variables.
pub fn polar(args: &[&str], env: &[(&str, &str)]) -> Result<Output> {
    let out = Command::new(env!("CARGO_BIN_EXE_polar"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .context("running polar")?;
    Ok(out)
}

/// Runs `polar export ... --json` and returns its summary.
pub fn polar_export(args: &[&str], env: &[(&str, &str)]) -> Result<serde_json::Value> {
    let mut all = vec!["export", "--json"];
    all.extend_from_slice(args);
    let out = polar(&all, env)?;
    ensure!(
        out.status.success(),
        "polar export failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "summary is not JSON: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}
