//! [`CaptureStats`]: counters of what the capture logs hold, kept as each
//! record is durably appended (so they equal the logs' contents since the
//! agent started): calls by outcome and side at fault, prompt and response
//! tokens, the backend latency histogram, and backend errors by kind.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use polar_metrics::{Histogram, Text};
use polar_record::{CallStatus, CompletionRecord};

/// Upper bounds of the backend latency buckets, in seconds (model calls
/// take from milliseconds to many minutes).
static LATENCY_BUCKETS: [f64; 14] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
];

/// Counters of the capture stage.
#[derive(Debug)]
pub struct CaptureStats {
    completed: AtomicU64,
    failed: Mutex<BTreeMap<String, u64>>,
    prompt_tokens: AtomicU64,
    response_tokens: AtomicU64,
    latency: Histogram,
    backend_errors: Mutex<BTreeMap<String, u64>>,
}

impl Default for CaptureStats {
    fn default() -> Self {
        Self {
            completed: AtomicU64::new(0),
            failed: Mutex::default(),
            prompt_tokens: AtomicU64::new(0),
            response_tokens: AtomicU64::new(0),
            latency: Histogram::new(&LATENCY_BUCKETS),
            backend_errors: Mutex::default(),
        }
    }
}

fn bump(map: &Mutex<BTreeMap<String, u64>>, key: &str) {
    let mut m = map.lock().unwrap_or_else(PoisonError::into_inner);
    match m.get_mut(key) {
        Some(n) => *n += 1,
        None => {
            m.insert(key.to_owned(), 1);
        }
    }
}

fn len(ids: Option<&Vec<u32>>) -> u64 {
    ids.map_or(0, |v| u64::try_from(v.len()).unwrap_or(u64::MAX))
}

/// What a record adds to the counters, taken before the record is freed
/// (it is counted once durable).
#[derive(Debug)]
pub(crate) struct Tally {
    /// `None` for a completed call, else the side at fault.
    failed_side: Option<String>,
    prompt_tokens: u64,
    response_tokens: u64,
    /// The backend's time, for calls that reached it.
    backend_latency: Option<Duration>,
}

impl Tally {
    /// The counts of `record`.
    pub(crate) fn of(record: &CompletionRecord) -> Self {
        let (failed_side, reached_backend) = match &record.status {
            CallStatus::Completed => (None, true),
            CallStatus::Failed { side, .. } => (Some(side.clone()), side == "backend"),
        };
        let t = record.timings;
        Self {
            failed_side,
            prompt_tokens: len(record.prompt_token_ids.as_ref()),
            response_tokens: len(record.response_token_ids.as_ref()),
            backend_latency: reached_backend
                .then(|| Duration::from_millis(t.finished_ms.saturating_sub(t.received_ms))),
        }
    }
}

impl CaptureStats {
    /// Counts a record that was durably appended.
    pub fn recorded(&self, record: &CompletionRecord) {
        self.add(Tally::of(record));
    }

    /// Counts a record that was durably appended, from its [`Tally`].
    pub(crate) fn add(&self, tally: Tally) {
        match &tally.failed_side {
            None => {
                self.completed.fetch_add(1, Ordering::Relaxed);
            }
            Some(side) => bump(&self.failed, side),
        }
        self.prompt_tokens
            .fetch_add(tally.prompt_tokens, Ordering::Relaxed);
        self.response_tokens
            .fetch_add(tally.response_tokens, Ordering::Relaxed);
        if let Some(latency) = tally.backend_latency {
            self.latency.observe(latency);
        }
    }

    /// Counts a backend failure of `kind` (e.g. `backend_timeout`).
    pub fn backend_error(&self, kind: &str) {
        bump(&self.backend_errors, kind);
    }

    /// Calls recorded as completed.
    pub fn completed(&self) -> u64 {
        self.completed.load(Ordering::Relaxed)
    }

    /// Calls recorded as failed, by side at fault.
    pub fn failed(&self) -> BTreeMap<String, u64> {
        self.failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Prompt and response tokens recorded.
    pub fn tokens(&self) -> (u64, u64) {
        (
            self.prompt_tokens.load(Ordering::Relaxed),
            self.response_tokens.load(Ordering::Relaxed),
        )
    }

    /// Writes the capture families.
    pub fn render(&self, out: &mut Text) {
        out.single(
            "polar_capture_calls_total",
            "counter",
            "Model calls recorded as completed in the capture logs.",
            self.completed(),
        );
        out.family(
            "polar_capture_calls_failed_total",
            "counter",
            "Model calls recorded as failed, by the side at fault (harness, backend, agent).",
        );
        for side in ["harness", "backend", "agent"] {
            let n = self.failed().get(side).copied().unwrap_or(0);
            out.sample("polar_capture_calls_failed_total", &[("side", side)], n);
        }
        let (prompt, response) = self.tokens();
        out.family(
            "polar_capture_tokens_total",
            "counter",
            "Token ids recorded in the capture logs, by kind.",
        );
        out.sample("polar_capture_tokens_total", &[("kind", "prompt")], prompt);
        out.sample(
            "polar_capture_tokens_total",
            &[("kind", "response")],
            response,
        );
        self.latency.render(
            out,
            "polar_backend_latency_seconds",
            "From a model call's arrival to the backend's last token, for calls that reached a backend.",
        );
        out.family(
            "polar_backend_errors_total",
            "counter",
            "Backend failures by kind.",
        );
        let errors = self
            .backend_errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for (kind, n) in &errors {
            out.sample("polar_backend_errors_total", &[("kind", kind)], n);
        }
    }
}
