//! Token-faithful chains with the six real harness CLIs (root only): each
//! does the four-step task through the agent against `polar mock-backend
//! --model-dir` serving Qwen3's real files (its chat template, tokenizer
//! and output format, as vLLM serves Qwen3). With the backend's
//! `model_dir` set, Polar renders every prompt and sends ids: asserted for
//! each session, besides the task done and the capture token-exact against
//! what the mock served (`polar_tests::harness`'s checks): one trace per
//! main chain (compaction aside), no break, no template splice, no loss-1
//! token whose preceding context differs from the prompt the backend saw,
//! and every call served token-in. The same sessions server-rendered (no
//! `model_dir`: the mock's chat endpoint renders with the same template)
//! each miss that: the template re-renders the history differently from
//! what the model generated, so the main chain breaks or is spliced (the
//! harness still does the task). Their labels stay true: no break is
//! called a compaction (none happens in the task), and every session
//! passes `docs/CONSUMERS.md`'s recipe check (a title call that comes
//! first is not the main chain's start).
//!
//! DeepSeek-V3.1's and gpt-oss's real files are served to two CLIs each,
//! token-faithfully, with the same assertions; gpt-oss's also
//! server-rendered, with the same assertions as Qwen3's.
//!
//! The CLIs come from `cargo xtask harnesses`, the model files from
//! `cargo xtask chat-models`. `cargo bench -p polar-tests --bench chains`
//! prints the figures of every combination (BENCHMARKS.md).
#![cfg_attr(not(feature = "privileged"), allow(dead_code, unused_imports))]

use anyhow::{Result, bail};
use polar_tests::chains::{Family, Measured, Rendering, TABLE_HEAD, measure, table_row};
use polar_tests::harness::SIX;

/// Fails with every miss of every session against the token-faithful
/// target (after printing the figures).
fn assert_faithful(measured: &[Measured]) -> Result<()> {
    eprintln!("{TABLE_HEAD}");
    let mut problems = Vec::new();
    for m in measured {
        eprintln!("{}", table_row(m));
        problems.extend(
            m.faithful_misses()
                .into_iter()
                .map(|p| format!("{} ({}, {}): {p}", m.harness, m.family, m.rendering)),
        );
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("\n"));
    }
    Ok(())
}

/// Fails unless every server-rendered session drifts (its main chain broke
/// or was spliced) with true labels: no break called a compaction (none
/// happens in the task) and no problem with the session itself (the task
/// done, the capture token-exact, `docs/CONSUMERS.md`'s recipe check
/// passed).
fn assert_server_rendered(measured: &[Measured]) -> Result<()> {
    eprintln!("{TABLE_HEAD}");
    let mut problems = Vec::new();
    for m in measured {
        eprintln!("{}", table_row(m));
        for p in &m.problems {
            problems.push(format!("{} (server-rendered): {p}", m.harness));
        }
        if let Some(f) = &m.figures
            && (f.break_reasons.contains_key("compaction") || f.compaction_traces > 0)
        {
            problems.push(format!(
                "{}: server-rendered, a break is labelled compaction where none happened: {:?}",
                m.harness, f.break_reasons
            ));
        }
        let drifts = m.figures.as_ref().is_some_and(|f| {
            f.main_traces > f.main_chains || f.splices > 0 || f.off_policy_tokens > 0
        });
        if !drifts {
            problems.push(format!(
                "{}: server-rendered, its main chain neither broke nor was spliced: {:?}",
                m.harness, m.figures
            ));
        }
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("\n"));
    }
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn six_harnesses_on_qwen3_are_one_trace_per_chain_token_faithfully_and_break_server_rendered()
-> Result<()> {
    assert_faithful(&measure(&SIX, Family::Qwen3, Rendering::Faithful)?)?;
    assert_server_rendered(&measure(&SIX, Family::Qwen3, Rendering::Server)?)
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn two_harnesses_on_deepseek_v3_1_and_gpt_oss_are_faithful_and_gpt_oss_breaks_server_rendered()
-> Result<()> {
    let mut measured = measure(
        &["codex", "claude_code"],
        Family::DeepseekV31,
        Rendering::Faithful,
    )?;
    measured.extend(measure(
        &["codex", "claude_code"],
        Family::GptOss,
        Rendering::Faithful,
    )?);
    assert_faithful(&measured)?;
    assert_server_rendered(&measure(
        &["codex", "claude_code"],
        Family::GptOss,
        Rendering::Server,
    )?)
}
