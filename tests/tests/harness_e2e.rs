//! The six real harness CLIs, unmodified, end to end (root only; needs the
//! capture stage, whose `[[backend]]` answers each harness's model calls in
//! its own API): each runs in a `native` sandbox with `polar sandbox run
//! --harness NAME`, against `polar mock-backend` on loopback, whose built-in
//! policy makes it call its shell tool to write `polar-demo.txt`, then
//! answers "done". Asserted for each: the harness exits with 0, the file is
//! in its workspace, and every call in the session's capture log has prompt
//! and response token ids, and `docs/CONSUMERS.md`'s row recipe holds on
//! its export (a `main` row carrying the instruction and tools; calls
//! asking for structured output are `side`). The six run at once, each
//! bounded by its budget.
//!
//! The same six run in docker containers too (the test image of
//! `cargo xtask test`'s engine, the CLIs bound read-only from the host),
//! with the same assertions.
//!
//! The multi-step test drives the six through a four-step task with the
//! mock's scripted policy, stepped by the conversation's progress (its tool
//! results), each step a call of the harness's own shell tool: create
//! `notes.txt`, run a check that fails, add the missing line, run the check
//! again and write its result. Asserted for each session: the harness exits
//! with 0 and the task's check passes in its workspace; every generation
//! the mock served (`GET /served`) is in exactly one captured record and
//! every record is one the mock served, with equal prompt ids, response ids
//! and logprobs; every captured call is in exactly one exported row, each
//! row's tokens are its last call's prompt and response with loss 1 exactly
//! on the merged calls' generated tokens (their logprobs there, 0.0
//! elsewhere); the main chain went through the four steps; and every call
//! that offers no tools or asks for structured output is in a `side` row.
//! Its compaction variant runs Codex against a backend that reports a
//! nearly full context after two steps: Codex compacts server-side (Polar
//! answers its `compaction_trigger` with a summary from the backend) and
//! finishes the task from the summary; the same holds, and the main chain
//! has the summary call's `compaction_summary` segment followed by a
//! `compaction` break linked to it, and no call is a superseded retry.
//! Claude Code's compaction variant fills the context past the backend's
//! length after three steps: the backend refuses the request (vLLM's 400),
//! Polar tells Claude Code "prompt is too long" in Anthropic's words, and
//! Claude Code compacts reactively and finishes; the refused calls are in
//! no row but in `stats.calls_dropped`, failed on the harness's side. In
//! the four-step run each main chain is one trace, and every reply to a
//! call that asked for structured output is JSON holding the schema's
//! required properties; Gemini CLI without `-m` (a harness defined in the
//! configuration) routes with such a call.
//!
//! The CLIs come from `cargo xtask harnesses` (`POLAR_HARNESS_DIR`, else
//! `.polar-cache/harnesses`).
#![cfg_attr(not(feature = "privileged"), allow(dead_code, unused_imports))]

use anyhow::Result;
use polar_tests::docker;
use polar_tests::harness::{SIX, Scenario, run_all};

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn six_unmodified_harnesses_call_their_shell_tool_and_every_call_is_captured() -> Result<()> {
    run_all(&SIX, false, None, Scenario::Demo)
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn six_unmodified_harnesses_in_docker_containers_are_captured_the_same() -> Result<()> {
    let engine = docker::engine()?;
    run_all(&SIX, false, Some(&engine), Scenario::Demo)
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn harnesses_in_base_url_mode_are_captured_by_their_session_key() -> Result<()> {
    run_all(&["claude_code", "qwen_code"], true, None, Scenario::Demo)
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn six_unmodified_harnesses_do_a_four_step_task_and_every_served_call_is_captured_exactly()
-> Result<()> {
    run_all(&SIX, false, None, Scenario::Steps)
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn codex_compacts_a_full_context_server_side_and_finishes_with_every_segment_labelled() -> Result<()>
{
    run_all(&["codex"], false, None, Scenario::Compact(2, 262_000))
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn claude_code_compacts_a_full_context_and_finishes_with_every_segment_labelled() -> Result<()> {
    run_all(&["claude_code"], false, None, Scenario::Compact(3, 300_000))
}

/// Gemini CLI choosing its model per prompt asks a classifier for JSON
/// under a schema: served as schema-valid JSON by the backend's constrained
/// decoding, the session goes through the four steps with no retry.
#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn gemini_cli_routing_its_turns_gets_json_for_its_schema_and_does_the_task() -> Result<()> {
    run_all(&["custom:gemini-auto"], false, None, Scenario::Steps)
}
