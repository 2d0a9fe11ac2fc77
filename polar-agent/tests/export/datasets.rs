//! The Parquet export as the Python training stacks load it: pyarrow
//! (schema, Hive partitions) and Hugging Face `datasets`
//! (`Dataset.from_parquet`, `load_dataset("parquet", ...)`, offline), with
//! every column's type checked by `check_parquet.py`.

use std::process::Command;

use anyhow::{Context as _, Result, ensure};
use polar_trajectory::Builder;

use crate::fixture;

#[test]
fn pyarrow_and_hf_datasets_load_the_parquet_export() -> Result<()> {
    crate::python::ensure(&["pyarrow", "datasets"], &["pyarrow", "datasets"])?;
    let state = tempfile::tempdir()?;
    fixture::write_state_dir(state.path())?;
    let out = tempfile::tempdir()?;
    let state_arg = state.path().display().to_string();
    let out_arg = out.path().display().to_string();
    fixture::polar_export(
        &[
            "--state-dir",
            &state_arg,
            "--out",
            &out_arg,
            "--builder",
            "prefix_merging",
        ],
        &[],
    )?;

    let cache = tempfile::tempdir()?;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/export/check_parquet.py");
    let run = Command::new("python3")
        .arg(script)
        .arg(out.path())
        .arg(cache.path())
        .env("HF_HOME", cache.path())
        .env("HF_DATASETS_OFFLINE", "1")
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .context("running python3")?;
    ensure!(
        run.status.success(),
        "check_parquet.py failed:\n{}\n{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    let last = stdout.lines().last().context("no output")?;
    let got: serde_json::Value = serde_json::from_str(last)?;

    let expected = fixture::expected(&Builder::default())?;
    let rows: usize = expected.values().map(|t| t.traces.len()).sum();
    ensure!(got["rows"] == rows, "{got}");
    let first = &expected["s-0000"].traces[0];
    ensure!(got["first_trace_id"] == "s-0000/0", "{got}");
    ensure!(
        got["first_prompt_ids"] == serde_json::json!(first.prompt_ids),
        "prompt ids differ"
    );
    ensure!(got["first_loss_tokens"] == first.loss_tokens(), "{got}");
    ensure!(
        got["first_reward"] == serde_json::json!(first.reward),
        "{got}"
    );
    ensure!(
        got["labels"] == serde_json::json!(["session_failed", "sub_agent"]),
        "{got}"
    );
    Ok(())
}
