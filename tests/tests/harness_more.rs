//! The presets past the six, end to end (root only; needs the capture
//! stage): GitHub Copilot CLI (npm, its bring-your-own-model provider set to
//! OpenAI's endpoint, offline) and Hermes Agent (PyPI, in its own virtual
//! environment beside the npm prefix, its DashScope provider), each
//! unmodified in a `native` sandbox with `polar sandbox run --harness NAME`
//! in transparent mode: the redirect and the agent's CA bring their model
//! calls to the capture stage, which the mock vLLM backend answers.
//!
//! The four-step task of `tests/harness_e2e.rs` (the mock's script stepped
//! by the conversation's tool results, each step a call of the harness's
//! own shell tool, Copilot CLI's `bash`, Hermes Agent's `terminal`): create
//! `notes.txt`, run a check that fails, add the missing line, run the check
//! again and write its result. Asserted as there for each session: the
//! harness exits with 0 and the task's check passes in its workspace;
//! every generation the mock served is in exactly one captured record with
//! equal prompt ids, response ids and logprobs, and every record is one the
//! mock served; every captured call is in exactly one exported row, with
//! loss 1 exactly on generated tokens; the main chain saw the four steps'
//! results in one trace; calls offering no tools are `side` rows. The same
//! in base-URL mode (Copilot CLI's provider URL, Hermes Agent's
//! `DASHSCOPE_BASE_URL` the agent's, with the session's key).
//!
//! The CLIs come from `cargo xtask harnesses` (`POLAR_HARNESS_DIR`, else
//! `.polar-cache/harnesses`, and `venvs/hermes` beside it).
#![cfg_attr(not(feature = "privileged"), allow(dead_code, unused_imports))]

use anyhow::Result;
use polar_tests::harness::{Scenario, run_all};

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn copilot_and_hermes_do_a_four_step_task_and_every_served_call_is_captured_exactly() -> Result<()>
{
    run_all(&["copilot", "hermes"], false, None, Scenario::Steps)
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn copilot_and_hermes_in_base_url_mode_are_captured_by_their_session_key() -> Result<()> {
    run_all(&["copilot", "hermes"], true, None, Scenario::Steps)
}
