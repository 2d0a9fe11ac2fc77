//! The six real harness CLIs, unmodified, through backend faults (root
//! only): the four-step task of `harness_e2e.rs` (the same runs and checks,
//! `polar_tests::harness`), with a fault scripted on the mock's turns, each
//! CLI's session against `polar mock-backend` replicas whose backend names
//! the model's `output_parser` (so a reply cut after output reached the
//! harness can be resumed). A fault hits a step's first attempt; the six
//! CLIs of a variant run at once.
//!
//! - vLLM, two replicas: an HTTP 503 before the first step's reply, an
//!   `abort` finish with no token at the second, a cut inside the third
//!   step's tool call's arguments (after 55 ids: they begin after 40 to 46,
//!   whatever the CLI names its shell tool), an `abort` inside the fourth
//!   step's text (after 6 ids);
//! - SGLang, two replicas: an HTTP 500 at the first step, aborts inside the
//!   second step's tool call's head (20 ids) and the third's arguments (55
//!   ids), an abort with no token at the fourth.
//!
//! Asserted for each session, as for the unfaulted runs: the harness exits
//! with 0 and the task's check passes; every generation the mock served is
//! exactly in the captured records (a resumed call's parts included) and
//! the exported rows are exactly the records' tokens, loss mask and
//! logprobs. And: no call failed on the backend's side (the harness never
//! saw a fault, an abort was never relayed as an end of turn), and each
//! faulted step has a call resumed on the other replica with the expected
//! first part (0 ids when it was sent again whole).
//!
//! - A replica set that stays down (one vLLM replica per session, which
//!   dies at its cut in the second step's text, `--down-after-fault`;
//!   the session's budget, 90 s, bounds the CLIs that keep retrying):
//!   whatever each CLI
//!   does then (most exit at the in-stream error, Codex CLI retries, see
//!   docs/ROLLOUT-API.md "Faults"), the session's export is an
//!   infrastructure fault: every row `error`, labelled `infra_fault` and
//!   `session_failed`, `ended_by` `backend`, never `completed` with reward
//!   0. (Re-running such a sample is the rollout server's:
//!   `gateway_e2e.rs`.)
//!
//! The CLIs come from `cargo xtask harnesses` (`POLAR_HARNESS_DIR`, else
//! `.polar-cache/harnesses`).
#![cfg_attr(not(feature = "privileged"), allow(dead_code, unused_imports))]

use anyhow::Result;
use polar_tests::harness::{Fault, Faults, SIX, Scenario, run_all};

static VLLM: Faults = Faults {
    name: "faults-vllm",
    dialect: "vllm",
    replicas: 2,
    down: false,
    steps: [
        Some(Fault {
            script: "error = { status = 503, message = \"overloaded\" }",
            first_part: 0,
        }),
        Some(Fault {
            script: "abort_after = 0",
            first_part: 0,
        }),
        Some(Fault {
            script: "disconnect_after = 55",
            first_part: 55,
        }),
        Some(Fault {
            script: "abort_after = 6",
            first_part: 6,
        }),
    ],
    budget_secs: 400,
};

static SGLANG: Faults = Faults {
    name: "faults-sglang",
    dialect: "sglang",
    replicas: 2,
    down: false,
    steps: [
        Some(Fault {
            script: "error = { status = 500 }",
            first_part: 0,
        }),
        Some(Fault {
            script: "abort_after = 20",
            first_part: 20,
        }),
        Some(Fault {
            script: "abort_after = 55",
            first_part: 55,
        }),
        Some(Fault {
            script: "abort_after = 0",
            first_part: 0,
        }),
    ],
    budget_secs: 400,
};

static DOWN: Faults = Faults {
    name: "faults-down",
    dialect: "vllm",
    replicas: 1,
    down: true,
    steps: [
        None,
        Some(Fault {
            script: "disconnect_after = 5",
            first_part: 5,
        }),
        None,
        None,
    ],
    budget_secs: 90,
};

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn six_real_clis_go_on_through_vllm_faults_and_their_trace_stays_exact() -> Result<()> {
    run_all(&SIX, false, None, Scenario::Faults(&VLLM))
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn six_real_clis_go_on_through_sglang_faults_and_their_trace_stays_exact() -> Result<()> {
    run_all(&SIX, false, None, Scenario::Faults(&SGLANG))
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn six_real_clis_whose_replica_set_stays_down_are_exported_as_infra_faults() -> Result<()> {
    run_all(&SIX, false, None, Scenario::Faults(&DOWN))
}
