//! What the API shows of the scheduler's state (tasks, samples, nodes,
//! totals), and the restoration of that state from the database.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use super::{QueueKey, Scheduler, Session, Task, queue_key};
use polar_rollout_types::{
    API_VERSION, CallbackState, CallbackView, FailureGroup, NodeView, SampleView, SessionCounts,
    SessionKind, SessionState, TaskRequest, TaskStatus, TaskView, failure_groups, session_id,
};

/// A task as stored.
#[derive(Clone, Debug)]
pub struct StoredTask {
    /// The request.
    pub request: TaskRequest,
    /// Submission order.
    pub seq: u64,
    /// Status.
    pub status: TaskStatus,
    /// Submission time.
    pub submitted_unix_ms: u64,
    /// Finish time.
    pub finished_unix_ms: Option<u64>,
    /// Why it was cancelled or stopped early.
    pub reason: Option<String>,
    /// Callback delivery.
    pub callback: CallbackView,
}

/// A session as stored.
#[derive(Clone, Debug)]
pub struct StoredSession {
    /// The session.
    pub session_id: String,
    /// Its task.
    pub task_id: String,
    /// Its index.
    pub sample_index: u32,
    /// Dispatches so far.
    pub attempts: u32,
    /// Re-dispatches so far.
    pub retries: u32,
    /// Its state.
    pub state: SessionState,
    /// Why earlier dispatches ended.
    pub ended: Vec<polar_rollout_api::AttemptEnd>,
    /// The nodes that cannot run it, and why.
    pub unfit: BTreeMap<String, String>,
}

impl Scheduler {
    /// Sample `index` of `task_id` with the task's group id and policy
    /// version (the dashboard's session page).
    pub fn sample_view(
        &self,
        task_id: &str,
        index: u32,
    ) -> Option<(SampleView, String, Option<String>)> {
        let t = self.tasks.get(task_id)?;
        if index >= t.request.num_samples {
            return None;
        }
        let mut view = self.sample_of(task_id, index)?;
        if let Some(s) = self.sessions.get(&view.session_id)
            && s.live.total > 0
        {
            view.live_calls = s.live.calls.clone();
            view.live_calls_total = Some(s.live.total);
        }
        Some((
            view,
            t.group_id.clone(),
            t.request.metadata.policy_version.clone(),
        ))
    }

    fn sample_of(&self, task_id: &str, i: u32) -> Option<SampleView> {
        let sid = session_id(task_id, i);
        let s = self.sessions.get(&sid)?;
        Some(SampleView {
            sample_index: i,
            session_id: sid,
            attempts: s.attempts,
            retries: s.retries,
            state: s.state.clone(),
            ended_attempts: s.ended.clone(),
            live_calls: Vec::new(),
            live_calls_total: None,
        })
    }

    /// The mean and spread (population standard deviation) of the task's
    /// usable samples' rewards (a result stored before rewards were kept
    /// for usable samples only may carry one on another status).
    fn reward_stats(&self, task_id: &str, n: u32) -> Option<(f64, f64)> {
        let rewards: Vec<f64> = (0..n)
            .filter_map(
                |i| match self.sessions.get(&session_id(task_id, i)).map(|s| &s.state) {
                    Some(SessionState::Done { result, .. }) if result.status.is_usable() => {
                        result.reward
                    }
                    _ => None,
                },
            )
            .collect();
        if rewards.is_empty() {
            return None;
        }
        let count = rewards.len() as f64;
        let mean = rewards.iter().sum::<f64>() / count;
        let var = rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / count;
        Some((mean, var.sqrt()))
    }

    /// Why the task's unusable samples ended, grouped.
    fn failures(&self, task_id: &str, n: u32) -> Vec<FailureGroup> {
        failure_groups((0..n).filter_map(|i| {
            self.sessions
                .get(&session_id(task_id, i))
                .map(|s| (i, &s.state))
        }))
    }

    /// A task with or without its samples.
    pub fn task_view(&self, task_id: &str, samples: bool) -> Option<TaskView> {
        let t = self.tasks.get(task_id)?;
        let samples = if samples {
            (0..t.request.num_samples)
                .filter_map(|i| self.sample_of(task_id, i))
                .collect()
        } else {
            Vec::new()
        };
        let stats = self.reward_stats(task_id, t.request.num_samples);
        Some(TaskView {
            version: API_VERSION,
            task_id: task_id.to_owned(),
            status: t.status,
            group_id: t.group_id.clone(),
            policy_version: t.request.metadata.policy_version.clone(),
            extra: t.request.metadata.extra.clone(),
            priority: t.request.priority,
            num_samples: t.request.num_samples,
            early_stop_after: t.request.early_stop_after,
            submitted_unix_ms: t.submitted_unix_ms,
            finished_unix_ms: t.finished_unix_ms,
            reason: t.reason.clone(),
            counts: t.counts,
            callback: t.callback.clone(),
            requested: t.request.requested(),
            mean_reward: stats.map(|s| s.0),
            reward_std: stats.map(|s| s.1),
            failures: self.failures(task_id, t.request.num_samples),
            samples,
        })
    }

    /// Tasks in submission order (without samples), optionally only those
    /// with `status`, at most `limit` of the most recent.
    pub fn list(&self, status: Option<TaskStatus>, limit: usize) -> Vec<TaskView> {
        let mut out: Vec<TaskView> = self
            .order
            .values()
            .rev()
            .filter(|id| status.is_none_or(|s| self.tasks.get(*id).is_some_and(|t| t.status == s)))
            .take(limit)
            .filter_map(|id| self.task_view(id, false))
            .collect();
        out.reverse();
        out
    }

    /// The callback URL and the results of a finished task.
    pub fn callback_target(&self, task_id: &str) -> Option<(String, TaskView)> {
        let t = self.tasks.get(task_id)?;
        let url = t.request.callback_url.clone()?;
        Some((url, self.task_view(task_id, true)?))
    }

    /// The callback delivery of a task.
    pub fn callback_of(&self, task_id: &str) -> Option<CallbackView> {
        self.tasks.get(task_id).map(|t| t.callback.clone())
    }

    /// Nodes by id.
    pub fn node_views(&self, now: Instant) -> Vec<NodeView> {
        self.nodes
            .iter()
            .map(|(id, n)| {
                let max = n.registration.capacity.max_sessions;
                NodeView {
                    node_id: id.clone(),
                    address: n.registration.address.clone(),
                    health: n.health(),
                    capacity: n.registration.capacity.clone(),
                    assigned: u32::try_from(n.assigned.len()).unwrap_or(u32::MAX),
                    load: n.assigned.len() as f64 / f64::from(max.max(1)),
                    last_heartbeat_ms_ago: u64::try_from(
                        now.saturating_duration_since(n.last_seen).as_millis(),
                    )
                    .unwrap_or(u64::MAX),
                    last_heartbeat: n.heartbeat.clone(),
                    labels: n.registration.labels.clone(),
                    backends: n.backends().clone(),
                }
            })
            .collect()
    }

    /// Tasks by status and sessions by state (every name present).
    pub fn totals(&self) -> (BTreeMap<String, u64>, BTreeMap<String, u64>) {
        let mut tasks: BTreeMap<String, u64> = TaskStatus::ALL
            .iter()
            .map(|s| (s.as_str().to_owned(), 0))
            .collect();
        let mut sessions: BTreeMap<String, u64> = SessionKind::ALL
            .iter()
            .map(|s| (s.as_str().to_owned(), 0))
            .collect();
        for t in self.tasks.values() {
            *tasks.entry(t.status.as_str().to_owned()).or_default() += 1;
            let c = &t.counts;
            for (k, v) in [
                (SessionKind::Pending, c.pending),
                (SessionKind::Dispatched, c.dispatched),
                (SessionKind::Running, c.running),
                (SessionKind::Done, c.done),
                (SessionKind::Failed, c.failed),
                (SessionKind::Cancelled, c.cancelled),
            ] {
                *sessions.entry(k.as_str().to_owned()).or_default() += u64::from(v);
            }
        }
        (tasks, sessions)
    }

    /// Rebuilds the state from the database. Sessions that were dispatched
    /// but not reported running are pushed again (gateways treat a repeated
    /// assignment as a no-op); finished tasks whose callback was not
    /// delivered are called back again.
    pub fn restore(
        &mut self,
        tasks: Vec<StoredTask>,
        sessions: Vec<StoredSession>,
        now: Instant,
        wall_ms: u64,
    ) {
        for st in tasks {
            let id = st.request.task_id.clone();
            let group_id = st
                .request
                .metadata
                .group_id
                .clone()
                .unwrap_or_else(|| id.clone());
            self.next_seq = self.next_seq.max(st.seq + 1);
            self.order.insert(st.seq, id.clone());
            if st.status.is_finished() && st.callback.state == CallbackState::Pending {
                self.out.callbacks.push(id.clone());
            }
            self.tasks.insert(
                id,
                Task {
                    request: Arc::new(st.request),
                    seq: st.seq,
                    status: st.status,
                    group_id,
                    submitted_unix_ms: st.submitted_unix_ms,
                    finished_unix_ms: st.finished_unix_ms,
                    cancelled: st.status == TaskStatus::Cancelled,
                    reason: st.reason,
                    counts: SessionCounts::default(),
                    callback: st.callback,
                },
            );
        }
        let mut orphans = Vec::new();
        for ss in sessions {
            let Some(t) = self.tasks.get_mut(&ss.task_id) else {
                continue;
            };
            t.counts.apply(&ss.state, 1);
            let key: QueueKey = queue_key(&t.request, t.seq, ss.sample_index);
            match &ss.state {
                SessionState::Pending => {
                    self.queue.insert(key, ss.session_id.clone());
                }
                SessionState::Dispatched { node, .. } | SessionState::Running { node, .. } => {
                    match self.nodes.get_mut(node) {
                        Some(n) => {
                            n.assigned.insert(ss.session_id.clone());
                        }
                        None => orphans.push(ss.session_id.clone()),
                    }
                }
                _ => {}
            }
            self.sessions.insert(
                ss.session_id.clone(),
                Session {
                    task_id: ss.task_id,
                    index: ss.sample_index,
                    state: ss.state,
                    attempts: ss.attempts,
                    retries: ss.retries,
                    ended: ss.ended,
                    enqueued_at: now,
                    live: super::LiveCalls::default(),
                    unfit: ss.unfit,
                },
            );
        }
        for sid in orphans {
            self.lose(&sid, "its node is not registered", now, wall_ms);
        }
        for id in self.order.values().cloned().collect::<Vec<_>>() {
            self.check_finished(&id, wall_ms);
        }
        self.repush(now);
    }

    /// Pushes again every session dispatched but not reported running.
    fn repush(&mut self, now: Instant) {
        let mut pushes = Vec::new();
        for (sid, s) in &self.sessions {
            let SessionState::Dispatched {
                node,
                attempt,
                deadline_unix_ms,
            } = &s.state
            else {
                continue;
            };
            let (Some(t), Some(n)) = (self.tasks.get(&s.task_id), self.nodes.get(node)) else {
                continue;
            };
            let mut a = super::build_assignment(t, sid, s.index, *attempt);
            a.deadline_unix_ms = *deadline_unix_ms;
            pushes.push(super::Push {
                address: n.registration.address.clone(),
                node_id: node.clone(),
                assignment: a,
                dispatchable_at: now,
            });
        }
        self.out.pushes.extend(pushes);
    }
}
