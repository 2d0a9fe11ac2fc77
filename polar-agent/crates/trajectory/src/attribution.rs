//! Which infrastructure fault, if any, ended a session, read from its
//! capture log: the session's last model call (the one that finished last)
//! failed on the backend's side (an HTTP error status, a cut stream, a
//! timeout, an unreachable replica), on the agent's (Polar could not make
//! or record the call), or was answered with an `abort` finish (SGLang and
//! vLLM stop a request so, e.g. around a weight update). A harness stops
//! after such a call whatever it does next (exits 1, or prints what it had
//! and exits 0), so its exit says nothing about the policy.
//!
//! A failure the harness got past (a later call answered) is no fault of
//! the session's end; a call the harness gave up itself (side `harness`:
//! it closed the connection, or sent a bad request) is the harness's doing.
//! Pure: the runner combines it with the harness's exit and the
//! evaluation (`polar-agent`'s `gateway::verdict`).

use polar_chat::FinishReason;
use polar_record::{CallStatus, CompletionRecord};

use super::types::EndedBy;

/// The infrastructure fault that ended a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// [`EndedBy::Backend`] or [`EndedBy::Polar`].
    pub ended_by: EndedBy,
    /// The failed call.
    pub call_id: String,
    /// Its position in the session.
    pub seq: u64,
    /// What went wrong, as recorded.
    pub error: String,
}

/// The fault that ended the session whose calls are `records` (any order),
/// if its last call failed on the backend's or the agent's side.
pub fn ending_fault(records: &[CompletionRecord]) -> Option<Fault> {
    let last = records
        .iter()
        .max_by_key(|r| (r.timings.finished_ms, r.seq))?;
    let (ended_by, error) = match &last.status {
        CallStatus::Failed { side, error } => match side.as_str() {
            "backend" => (EndedBy::Backend, error.clone()),
            "agent" => (EndedBy::Polar, error.clone()),
            _ => return None,
        },
        // Recorded before aborts were failures: an abort is no end of turn.
        CallStatus::Completed if last.finish_reason == Some(FinishReason::Abort) => (
            EndedBy::Backend,
            "the backend aborted generation (finish reason abort)".to_owned(),
        ),
        CallStatus::Completed => return None,
    };
    Some(Fault {
        ended_by,
        call_id: last.call_id.clone(),
        seq: last.seq,
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::kit::{Convo, Render, Sim, Turn};

    fn session(calls: usize) -> Vec<CompletionRecord> {
        let mut sim = Sim::new(Render::default());
        let mut c = Convo::new("sys", "do it");
        for i in 0..calls {
            c.step(&mut sim, Turn::new("", &format!("step {i}")));
            c.tool("ok");
        }
        for (i, r) in sim.records.iter_mut().enumerate() {
            r.timings.finished_ms = 1000 + i as u64;
        }
        sim.records
    }

    fn fail(r: &mut CompletionRecord, side: &str) {
        r.status = CallStatus::Failed {
            side: side.into(),
            error: format!("{side} failed"),
        };
    }

    #[test]
    fn a_session_whose_last_call_answered_has_no_fault() {
        assert_eq!(ending_fault(&[]), None);
        let mut records = session(3);
        assert_eq!(ending_fault(&records), None);
        // A failure the harness got past (it retried, went on) is no fault.
        fail(&mut records[1], "backend");
        assert_eq!(ending_fault(&records), None);
    }

    #[test]
    fn the_last_calls_side_names_who_ended_it() {
        for (side, who) in [
            ("backend", Some(EndedBy::Backend)),
            ("agent", Some(EndedBy::Polar)),
        ] {
            let mut records = session(3);
            fail(&mut records[2], side);
            let f = ending_fault(&records).map(|f| (f.ended_by, f.seq, f.error));
            assert_eq!(f, who.map(|w| (w, 2, format!("{side} failed"))));
        }
        // The harness closed the connection itself: its doing.
        let mut records = session(3);
        fail(&mut records[2], "harness");
        assert_eq!(ending_fault(&records), None);
    }

    #[test]
    fn an_abort_finish_is_the_backends() {
        let mut records = session(2);
        records[1].finish_reason = Some(FinishReason::Abort);
        let f = ending_fault(&records);
        assert_eq!(f.map(|f| (f.ended_by, f.seq)), Some((EndedBy::Backend, 1)));
    }

    #[test]
    fn the_call_that_finished_last_counts_not_the_last_started() {
        // Two calls in flight (a sub-agent's and the main agent's): the one
        // that started last (seq 2) failed early, the other finished after.
        let mut records = session(3);
        fail(&mut records[2], "backend");
        records[2].timings.finished_ms = 1000;
        assert_eq!(ending_fault(&records), None);
        // Reversed: the earlier-started call failed last.
        let mut records = session(3);
        fail(&mut records[1], "backend");
        records[1].timings.finished_ms = 5000;
        assert_eq!(ending_fault(&records).map(|f| f.seq), Some(1));
        // Order of the slice does not matter.
        records.reverse();
        assert_eq!(ending_fault(&records).map(|f| f.seq), Some(1));
    }
}
