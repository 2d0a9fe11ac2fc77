//! What gateways report (progress, results) and the periodic checks
//! (lost nodes, overdue sessions, no node at all).

use std::time::Instant;

use super::{CancelOrder, LiveCalls, Node, ReportError, Scheduler, task_op};
use crate::events::Event;
use polar_rollout_types::{
    CallbackView, CancelNotice, MAX_LIVE_CALLS, SampleStatus, SessionProgress, SessionResult,
    SessionState,
};

impl Scheduler {
    /// Checks that `node`/`attempt` is the session's current dispatch.
    fn check_current(&self, sid: &str, node: &str, attempt: u32) -> Result<(), ReportError> {
        let s = self
            .sessions
            .get(sid)
            .ok_or_else(|| ReportError::UnknownSession(sid.to_owned()))?;
        match s.state.assignment() {
            Some((n, a)) if n == node && a == attempt => Ok(()),
            _ => Err(ReportError::Stale {
                session: sid.to_owned(),
                node: node.to_owned(),
                attempt,
                state: s.state.kind().as_str(),
            }),
        }
    }

    /// A gateway reports a session's stage, and the calls that completed
    /// since its last report: kept with the running dispatch (at most
    /// [`MAX_LIVE_CALLS`], those past it counted) and returned as the
    /// event to publish (not committed: live calls are not stored).
    pub fn progress(
        &mut self,
        sid: &str,
        p: &SessionProgress,
    ) -> Result<Option<Event>, ReportError> {
        self.check_current(sid, &p.node_id, p.attempt)?;
        let Some(s) = self.sessions.get(sid) else {
            return Ok(None);
        };
        let deadline_unix_ms = match &s.state {
            SessionState::Dispatched {
                deadline_unix_ms, ..
            }
            | SessionState::Running {
                deadline_unix_ms, ..
            } => *deadline_unix_ms,
            _ => return Ok(None),
        };
        let next = SessionState::Running {
            node: p.node_id.clone(),
            attempt: p.attempt,
            deadline_unix_ms,
            stage: Some(p.stage.clone()),
        };
        if next != s.state {
            self.set_state(sid, next);
        }
        if p.calls.is_empty() {
            return Ok(None);
        }
        let Some(s) = self.sessions.get_mut(sid) else {
            return Ok(None);
        };
        if s.live.attempt != p.attempt {
            s.live = LiveCalls {
                attempt: p.attempt,
                ..LiveCalls::default()
            };
        }
        let room = MAX_LIVE_CALLS.saturating_sub(s.live.calls.len());
        s.live.calls.extend(p.calls.iter().take(room).cloned());
        s.live.total += p.calls.len();
        Ok(Some(Event::Calls {
            session_id: sid.to_owned(),
            task_id: s.task_id.clone(),
            sample_index: s.index,
            attempt: p.attempt,
            calls: p.calls.clone(),
        }))
    }

    /// A gateway reports a session's result.
    pub fn result(
        &mut self,
        sid: &str,
        r: &SessionResult,
        now: Instant,
        wall_ms: u64,
    ) -> Result<(), ReportError> {
        self.check_current(sid, &r.node_id, r.attempt)?;
        self.counters.results += 1;
        if r.retry && r.node_unfit && r.status != SampleStatus::Completed {
            // This node would fail it again: another node only, or it
            // fails now with the node's reason.
            let error = r.error.as_deref().unwrap_or("no reason given").to_owned();
            let Some(s) = self.sessions.get_mut(sid) else {
                return Ok(());
            };
            s.unfit.insert(r.node_id.clone(), error.clone());
            let unfit = s.unfit.clone();
            if self.another_node_for(&unfit) {
                let reason = format!("node {} cannot run the session: {error}", r.node_id);
                self.lose(sid, &reason, now, wall_ms);
            } else {
                if let Some(n) = self.nodes.get_mut(&r.node_id) {
                    n.release(sid, now);
                }
                self.end_attempt(
                    sid,
                    &format!("node {} cannot run the session: {error}", r.node_id),
                );
                self.fail_unfit(sid, wall_ms);
            }
            return Ok(());
        }
        if r.retry && r.status != SampleStatus::Completed {
            // An attempt the infrastructure ended is run again while the
            // retry limit allows, and kept (with its exported trajectory)
            // once it does not; a node's own failure is run again or fails.
            let at_limit = self
                .sessions
                .get(sid)
                .is_some_and(|s| s.retries >= self.limits.max_retries);
            if !(r.infra_fault && at_limit) {
                let reason = format!(
                    "node {} failed the session: {}",
                    r.node_id,
                    r.error.as_deref().unwrap_or("no reason given")
                );
                if r.infra_fault {
                    self.counters.infra_reruns += 1;
                }
                self.lose(sid, &reason, now, wall_ms);
                return Ok(());
            }
        }
        if let Some(n) = self.nodes.get_mut(&r.node_id) {
            n.release(sid, now);
        }
        self.set_state(
            sid,
            SessionState::Done {
                node: r.node_id.clone(),
                attempt: r.attempt,
                result: r.to_result(),
            },
        );
        let Some(task_id) = self.sessions.get(sid).map(|s| s.task_id.clone()) else {
            return Ok(());
        };
        if let Some(t) = self.tasks.get_mut(&task_id)
            && let Some(n) = t.request.early_stop_after
            && t.counts.usable >= n
            && t.counts.open() > 0
        {
            let reason = format!("early stop: {n} usable samples");
            t.reason = Some(reason.clone());
            let total = t.request.num_samples;
            self.cancel_open(&task_id, total, &reason, now);
        }
        self.check_finished(&task_id, wall_ms);
        Ok(())
    }

    /// Periodic checks: lost nodes, sessions past their deadline, pending
    /// sessions without any node.
    pub fn tick(&mut self, now: Instant, wall_ms: u64) {
        self.expire(wall_ms);
        let lost: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, n)| {
                n.healthy && now.duration_since(n.last_seen) > self.limits.heartbeat_timeout
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in lost {
            self.node_lost(&id, "no heartbeat", now, wall_ms);
        }
        let grace = u64::try_from(self.limits.result_grace.as_millis()).unwrap_or(u64::MAX);
        let mut overdue = Vec::new();
        for n in self.nodes.values() {
            for sid in &n.assigned {
                if let Some(s) = self.sessions.get(sid)
                    && let SessionState::Dispatched {
                        deadline_unix_ms, ..
                    }
                    | SessionState::Running {
                        deadline_unix_ms, ..
                    } = &s.state
                    && deadline_unix_ms.saturating_add(grace) < wall_ms
                {
                    overdue.push((sid.clone(), n.registration.address.clone()));
                }
            }
        }
        for (sid, address) in overdue {
            self.overdue(&sid, &address, now, wall_ms);
        }
        if self.nodes.values().any(Node::eligible_ignoring_capacity) {
            self.last_healthy = now;
        } else if !self.queue.is_empty()
            && now.duration_since(self.last_healthy) > self.limits.no_node_timeout
        {
            let waiting: Vec<String> = self.queue.values().cloned().collect();
            self.queue.clear();
            let error = self.no_node_error();
            for sid in waiting {
                self.set_state(
                    &sid,
                    SessionState::Failed {
                        error: error.clone(),
                    },
                );
                if let Some(task_id) = self.sessions.get(&sid).map(|s| s.task_id.clone()) {
                    self.check_finished(&task_id, wall_ms);
                }
            }
        }
    }

    /// Why pending sessions fail after `no_node_timeout`: no node at all,
    /// or the nodes there are cannot reach an inference backend.
    fn no_node_error(&self) -> String {
        let ms = self.limits.no_node_timeout.as_millis();
        let down: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.healthy)
            .filter_map(|(id, n)| {
                n.backend_down().map(|(b, h)| {
                    format!(
                        "node {id}: backend {b} has no healthy replica (0 of {})",
                        h.replicas
                    )
                })
            })
            .collect();
        if down.is_empty() {
            format!("no healthy node for {ms} ms")
        } else {
            format!(
                "no healthy node for {ms} ms; inference backend down: {}",
                down.join("; ")
            )
        }
    }

    fn overdue(&mut self, sid: &str, address: &str, now: Instant, wall_ms: u64) {
        let Some(s) = self.sessions.get(sid) else {
            return;
        };
        let Some((node, attempt)) = s.state.assignment() else {
            return;
        };
        let node = node.to_owned();
        let task_id = s.task_id.clone();
        if let Some(n) = self.nodes.get_mut(&node) {
            n.release(sid, now);
        }
        let error = format!(
            "no result from node {node} within {} ms of the deadline",
            self.limits.result_grace.as_millis()
        );
        self.out.cancels.push(CancelOrder {
            address: address.to_owned(),
            session_id: sid.to_owned(),
            attempt,
            reason: error.clone(),
        });
        self.end_attempt(sid, &error);
        self.set_state(sid, SessionState::Failed { error });
        self.check_finished(&task_id, wall_ms);
    }

    /// A task's callback delivery changed.
    pub fn callback_update(&mut self, task_id: &str, callback: CallbackView) {
        if let Some(t) = self.tasks.get_mut(task_id) {
            t.callback = callback;
            self.out.ops.push(task_op(task_id, t));
        }
    }

    /// The cancellations a heartbeat's session list calls for.
    pub(super) fn reconcile(&self, node_id: &str, held: &[String]) -> Vec<CancelNotice> {
        held.iter()
            .filter_map(|sid| {
                let reason = match self.sessions.get(sid) {
                    None => "unknown session".to_owned(),
                    Some(s) => match s.state.assignment() {
                        Some((n, _)) if n == node_id => return None,
                        Some((n, _)) => format!("dispatched to node {n}"),
                        None => format!("session is {}", s.state.kind().as_str()),
                    },
                };
                Some(CancelNotice {
                    session_id: sid.clone(),
                    reason,
                })
            })
            .collect()
    }
}
