//! The READY buffer's effect on backend use: a simulated workload
//! of 64 sessions on one gateway node — each runtime takes 2 s to start and
//! each harness keeps the backend busy for 10 s — run through the real stage
//! pipeline (`polar_gateway::Stages`) twice in the same process, with
//! a READY buffer and without one, in tokio's paused (virtual) time, so the
//! figures are exact and the machine's load does not matter.
//!
//! The backend's busy fraction is the harness time over
//! (RUNNING workers x the time to run all 64), i.e. how much of the
//! backend's capacity (one generation stream per RUNNING worker) is used.
//!
//! `cargo bench -p polar-gateway --bench gateway`; figures in BENCHMARKS.md.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use polar_gateway::sim::{SimWork, default_outcome, sample_assignment};
use polar_gateway::stages::{Job, StageLimits, Stages};

const SESSIONS: u32 = 64;
const INIT: Duration = Duration::from_secs(2);
const RUN: Duration = Duration::from_secs(10);
const RUNNING_WORKERS: usize = 16;

/// Runs the workload; returns the time to finish all sessions.
async fn workload(ready_buffer: usize) -> Duration {
    let stages = Arc::new(Stages::new(StageLimits {
        init: 8,
        ready_buffer,
        running: RUNNING_WORKERS,
        postrun: 4,
    }));
    let work = Arc::new(SimWork::new(
        "bench",
        INIT,
        RUN,
        0.0,
        Arc::new(default_outcome),
    ));
    let t0 = tokio::time::Instant::now();
    let handles: Vec<_> = (0..SESSIONS)
        .map(|i| {
            let (s, w) = (Arc::clone(&stages), Arc::clone(&work));
            let job = Arc::new(Job::new(sample_assignment("bench", i, 86_400)));
            tokio::spawn(async move { s.run(&*w, &job, |_| {}).await })
        })
        .collect();
    for h in handles {
        let r = h.await.unwrap().expect("not cancelled");
        assert_eq!(r.status, polar_rollout_api::SampleStatus::Completed);
    }
    t0.elapsed()
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let busy_total = RUN.as_secs_f64() * f64::from(SESSIONS);
    println!(
        "{SESSIONS} sessions, runtime start {INIT:?}, harness {RUN:?}, {RUNNING_WORKERS} RUNNING workers, 8 INIT workers"
    );
    println!("| READY buffer | time for all sessions | backend busy |");
    println!("|---|---|---|");
    for ready in [0, 4, 8, 16] {
        let took = rt.block_on(workload(ready));
        let busy = busy_total / (RUNNING_WORKERS as f64 * took.as_secs_f64());
        println!(
            "| {ready} | {:.1} s | {:.1}% |",
            took.as_secs_f64(),
            busy * 100.0
        );
    }
}
