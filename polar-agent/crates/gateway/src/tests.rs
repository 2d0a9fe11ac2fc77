//! The stage pipeline with simulated work, in paused tokio time: pool
//! bounds, the READY buffer, budgets and cancellation at each stage,
//! pause/resume.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::stages::{InitError, Interrupt, Job, Reached, Report, Stage, StageLimits, Stages, Work};
use polar_rollout_api::SampleStatus;

fn assignment(i: u32, budget_secs: u64) -> polar_rollout_api::SessionAssignment {
    crate::sim::sample_assignment("t", i, budget_secs)
}

/// Init and run sleep for fixed times; counts how many are in each stage
/// at once and records how each session reached POSTRUN.
#[derive(Default)]
struct Counting {
    init: Duration,
    run: Duration,
    in_init: AtomicUsize,
    max_init: AtomicUsize,
    in_run: AtomicUsize,
    max_run: AtomicUsize,
    torn_down: AtomicUsize,
    reached: Mutex<Vec<String>>,
}

fn bump(now: &AtomicUsize, max: &AtomicUsize) {
    let n = now.fetch_add(1, Ordering::SeqCst) + 1;
    max.fetch_max(n, Ordering::SeqCst);
}

impl Work for Counting {
    type Prepared = ();
    type Ran = ();

    async fn init(&self, _job: &Arc<Job>, stop: CancellationToken) -> Result<(), InitError> {
        bump(&self.in_init, &self.max_init);
        tokio::select! {
            () = stop.cancelled() => {}
            () = tokio::time::sleep(self.init) => {}
        }
        self.in_init.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }

    async fn run(&self, _job: &Arc<Job>, _p: &mut (), stop: CancellationToken) {
        bump(&self.in_run, &self.max_run);
        tokio::select! {
            () = stop.cancelled() => {}
            () = tokio::time::sleep(self.run) => {}
        }
        self.in_run.fetch_sub(1, Ordering::SeqCst);
    }

    async fn postrun(&self, job: &Arc<Job>, p: Option<()>, reached: Reached<()>) -> Report {
        if p.is_some() {
            self.torn_down.fetch_add(1, Ordering::SeqCst);
        }
        let status = match &reached {
            Reached::Ran(()) => SampleStatus::Completed,
            Reached::Interrupted(Interrupt::Budget) => SampleStatus::Timeout,
            Reached::Interrupted(Interrupt::Cancelled) => SampleStatus::Cancelled,
            Reached::InitFailed(_) => SampleStatus::Error,
        };
        self.reached.lock().unwrap().push(format!(
            "{}:{}",
            job.assignment.sample_index,
            status.as_str()
        ));
        Report {
            reward: Some(1.0),
            ..Report::new(status)
        }
    }
}

fn limits(init: usize, ready_buffer: usize, running: usize) -> StageLimits {
    StageLimits {
        init,
        ready_buffer,
        running,
        postrun: 2,
    }
}

async fn run_all(
    stages: Arc<Stages>,
    work: Arc<Counting>,
    jobs: Vec<Arc<Job>>,
) -> Vec<Option<Report>> {
    let handles: Vec<_> = jobs
        .into_iter()
        .map(|j| {
            let (s, w) = (Arc::clone(&stages), Arc::clone(&work));
            tokio::spawn(async move { s.run(&*w, &j, |_| {}).await })
        })
        .collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn pools_bound_each_stage_and_the_ready_buffer_runs_ahead() {
    let work = Arc::new(Counting {
        init: Duration::from_secs(2),
        run: Duration::from_secs(10),
        ..Counting::default()
    });
    let stages = Arc::new(Stages::new(limits(8, 4, 4)));
    let jobs: Vec<_> = (0..16)
        .map(|i| Arc::new(Job::new(assignment(i, 3600))))
        .collect();
    let t0 = Instant::now();
    let reports = run_all(stages, Arc::clone(&work), jobs).await;
    assert!(
        reports
            .iter()
            .all(|r| r.as_ref().unwrap().status == SampleStatus::Completed)
    );
    assert_eq!(work.max_run.load(Ordering::SeqCst), 4);
    // At most running + ready_buffer sessions prepared or running at once:
    // INIT never runs more than the lanes allow, whatever its pool.
    assert!(work.max_init.load(Ordering::SeqCst) <= 8);
    // 16 sessions, 4 at a time, 10 s each: 4 rounds, the first INIT (2 s)
    // is the only start that is not hidden behind a running session.
    assert_eq!(t0.elapsed(), Duration::from_secs(42));
    assert_eq!(work.torn_down.load(Ordering::SeqCst), 16);
}

#[tokio::test(start_paused = true)]
async fn without_a_ready_buffer_each_start_holds_a_running_worker() {
    let work = Arc::new(Counting {
        init: Duration::from_secs(2),
        run: Duration::from_secs(10),
        ..Counting::default()
    });
    let stages = Arc::new(Stages::new(limits(8, 0, 4)));
    let jobs: Vec<_> = (0..16)
        .map(|i| Arc::new(Job::new(assignment(i, 3600))))
        .collect();
    let t0 = Instant::now();
    run_all(stages, work, jobs).await;
    assert_eq!(t0.elapsed(), Duration::from_secs(48));
}

#[tokio::test(start_paused = true)]
async fn the_budget_stops_init_ready_and_running_and_postrun_still_tears_down() {
    let work = Arc::new(Counting {
        init: Duration::from_secs(5),
        run: Duration::from_secs(100),
        ..Counting::default()
    });
    // One running worker: session 0 runs past its 30 s budget; session 1
    // waits in READY past its 8 s budget; session 2's budget (3 s) ends in
    // INIT.
    let stages = Arc::new(Stages::new(limits(4, 4, 1)));
    let jobs = vec![
        Arc::new(Job::new(assignment(0, 30))),
        Arc::new(Job::new(assignment(1, 8))),
        Arc::new(Job::new(assignment(2, 3))),
    ];
    let t0 = Instant::now();
    let reports = run_all(stages, Arc::clone(&work), jobs).await;
    for r in &reports {
        assert_eq!(r.as_ref().unwrap().status, SampleStatus::Timeout);
    }
    assert!(
        t0.elapsed() <= Duration::from_secs(31),
        "{:?}",
        t0.elapsed()
    );
    // Every prepared session was torn down in POSTRUN (init returned).
    assert_eq!(work.torn_down.load(Ordering::SeqCst), 3);
    assert_eq!(work.in_run.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_session_is_torn_down_and_not_reported() {
    let work = Arc::new(Counting {
        init: Duration::from_secs(1),
        run: Duration::from_secs(100),
        ..Counting::default()
    });
    let stages = Arc::new(Stages::new(limits(2, 2, 2)));
    let job = Arc::new(Job::new(assignment(0, 3600)));
    let j = Arc::clone(&job);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        j.stop.cancel();
    });
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = Arc::clone(&seen);
    let r = stages
        .run(&*work, &job, move |st| s2.lock().unwrap().push(st))
        .await;
    assert!(r.is_none());
    assert_eq!(work.torn_down.load(Ordering::SeqCst), 1);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![Stage::Init, Stage::Ready, Stage::Running, Stage::Postrun]
    );
    assert_eq!(
        *work.reached.lock().unwrap(),
        vec!["0:cancelled".to_owned()]
    );
}

#[tokio::test(start_paused = true)]
async fn paused_generations_wait_in_ready_and_resume() {
    let work = Arc::new(Counting {
        init: Duration::from_secs(1),
        run: Duration::from_secs(1),
        ..Counting::default()
    });
    let stages = Arc::new(Stages::new(limits(2, 2, 2)));
    stages.pause();
    let job = Arc::new(Job::new(assignment(0, 3600)));
    let (s, w, j) = (Arc::clone(&stages), Arc::clone(&work), Arc::clone(&job));
    let h = tokio::spawn(async move { s.run(&*w, &j, |_| {}).await });
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(job.stage(), Stage::Ready);
    assert_eq!(stages.loads()["running"].queued, 1);
    stages.resume();
    let r = h.await.unwrap().unwrap();
    assert_eq!(r.status, SampleStatus::Completed);
    let ms = &r.stats["stage_ms"];
    assert!(ms["ready"].as_u64().unwrap() >= 59_000, "{ms}");
}
