//! The calls of this node's running sessions as they end, for the
//! dashboard's live timeline: the capture store's hook adds each call's
//! timeline entry ([`super::timeline::entry`]) to its session's list, at
//! most [`MAX_CALLS`] per session; the node's reporter takes the entries it
//! has not sent yet and reports them to the rollout server with the
//! session's progress. A session's list goes when its POSTRUN ends (the
//! result's `stats.calls` supersedes it).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde_json::Value;

use super::timeline::{MAX_CALLS, entry};
use polar_ids::SessionId;
use polar_record::CompletionRecord;

/// The live calls of the sessions this node runs.
#[derive(Debug, Default)]
pub struct LiveCalls {
    sessions: Mutex<HashMap<SessionId, Vec<Value>>>,
}

impl LiveCalls {
    fn lock(&self) -> MutexGuard<'_, HashMap<SessionId, Vec<Value>>> {
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts keeping `session`'s calls (the hook ignores the calls of
    /// sessions not started: a standalone agent's, a judge's).
    pub fn start(&self, session: &SessionId) {
        self.lock().insert(session.clone(), Vec::new());
    }

    /// A call of `session` ended (the capture store's hook).
    pub fn ended(&self, session: &SessionId, record: &CompletionRecord) {
        if let Some(calls) = self.lock().get_mut(session)
            && calls.len() < MAX_CALLS
        {
            calls.push(entry(record, None));
        }
    }

    /// `session`'s entries after the first `from`.
    pub fn since(&self, session: &SessionId, from: usize) -> Vec<Value> {
        self.lock()
            .get(session)
            .map(|calls| calls.get(from..).unwrap_or_default().to_vec())
            .unwrap_or_default()
    }

    /// Stops keeping `session`'s calls.
    pub fn forget(&self, session: &SessionId) {
        self.lock().remove(session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seq: u64) -> CompletionRecord {
        let text = format!(
            r#"{{"version":1,"call_id":"c{seq}","seq":{seq},"session_id":"s",
               "native_request":{{"api":"openai_chat","method":"POST","host":"h","path":"/v1/chat/completions","body":{{}}}},
               "request":{{"model":"m","messages":[]}},
               "token_ids_missing":true,
               "backend":{{"name":"local","replica":"http://127.0.0.1:1","served_model":"default"}},
               "timings":{{"received_ms":1,"first_token_ms":2,"finished_ms":3}},"status":"completed"}}"#
        );
        serde_json::from_str(&text).unwrap()
    }

    #[test]
    fn started_sessions_keep_their_calls_bounded_until_forgotten() {
        let live = LiveCalls::default();
        let (s, other): (SessionId, SessionId) = ("t-s0".parse().unwrap(), "t-s1".parse().unwrap());
        live.ended(&s, &record(0));
        assert!(live.since(&s, 0).is_empty(), "not started: not kept");
        live.start(&s);
        live.ended(&s, &record(0));
        live.ended(&s, &record(1));
        live.ended(&other, &record(9));
        assert_eq!(live.since(&s, 0).len(), 2);
        let rest = live.since(&s, 1);
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0]["seq"], 1);
        assert_eq!(rest[0]["call_id"], "c1");
        assert!(live.since(&s, 5).is_empty());
        assert!(live.since(&other, 0).is_empty());
        for i in 2..(MAX_CALLS as u64 + 10) {
            live.ended(&s, &record(i));
        }
        assert_eq!(live.since(&s, 0).len(), MAX_CALLS);
        live.forget(&s);
        assert!(live.since(&s, 0).is_empty());
        live.ended(&s, &record(1000));
        assert!(live.since(&s, 0).is_empty(), "forgotten: not kept");
    }
}
