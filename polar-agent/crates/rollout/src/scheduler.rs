//! The scheduler: every task, session and node in memory, and every state
//! change, with no I/O. Each change appends to [`Changes`] what must follow
//! it: rows to write ([`Op`]), events to publish, assignments to push,
//! cancellations to send, finished tasks to call back. The caller
//! ([`super::core`]) commits the rows before acknowledging anything.
//!
//! Dispatch: the pending sessions wait in one queue ordered by task
//! priority (higher first), then submission order, then sample index. Each
//! goes to the least loaded eligible node (load = assigned / max_sessions,
//! ties to the smallest node id); a node is eligible while healthy, not
//! draining, not refusing since its last heartbeat, and below capacity.
//! A node whose heartbeat is older than the timeout is lost: its sessions
//! are dispatched again up to `max_retries` times, then fail.

mod nodes;
mod reports;
pub mod views;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::events::Event;
use polar_rollout_api::{
    API_VERSION, AttemptEnd, CallbackState, CallbackView, MAX_ENDED_ATTEMPTS, NodeRegistration,
    SessionAssignment, SessionCounts, SessionState, SubmitReply, TaskMetadata, TaskRequest,
    TaskStatus, session_id,
};

pub use nodes::{HeartbeatError, Node};

/// The scheduler's limits (from the config).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// A node without a heartbeat this long is lost.
    pub heartbeat_timeout: Duration,
    /// Re-dispatches per session.
    pub max_retries: u32,
    /// Wait after a deadline before failing the session.
    pub result_grace: Duration,
    /// Pending sessions fail after this long without a healthy node.
    pub no_node_timeout: Duration,
    /// Finished tasks are deleted this long after they finished (`None`:
    /// kept until deleted).
    pub retention: Option<Duration>,
}

/// Finished tasks deleted per tick at most (the rest on the next ticks).
const EXPIRE_BATCH: usize = 1000;

/// A row to write.
#[derive(Clone, Debug)]
pub enum Op {
    /// A new task and its sessions.
    InsertTask {
        /// The request.
        request: Arc<TaskRequest>,
        /// Submission order.
        seq: u64,
        /// Submission time.
        submitted_unix_ms: u64,
    },
    /// A task's status, reason and callback delivery.
    Task {
        /// The task.
        task_id: String,
        /// Its status.
        status: TaskStatus,
        /// When it finished.
        finished_unix_ms: Option<u64>,
        /// Why it was cancelled or stopped early.
        reason: Option<String>,
        /// Callback delivery.
        callback: CallbackView,
    },
    /// A session's state.
    Session {
        /// The session.
        session_id: String,
        /// Its task.
        task_id: String,
        /// Its index.
        sample_index: u32,
        /// Dispatches so far.
        attempts: u32,
        /// Re-dispatches after losses so far.
        retries: u32,
        /// The state.
        state: SessionState,
        /// Why earlier dispatches ended.
        ended: Vec<AttemptEnd>,
        /// The nodes that cannot run it, and why.
        unfit: BTreeMap<String, String>,
    },
    /// A finished task and its sessions, gone.
    DeleteTask {
        /// The task.
        task_id: String,
    },
    /// A node's registration and drain flag.
    Node {
        /// The registration.
        registration: NodeRegistration,
        /// Drained by an operator.
        drain_requested: bool,
    },
}

/// An assignment to send to a gateway.
#[derive(Clone, Debug)]
pub struct Push {
    /// The gateway's base URL.
    pub address: String,
    /// The node.
    pub node_id: String,
    /// What to send.
    pub assignment: SessionAssignment,
    /// When the session could first have gone to this node (for the
    /// dispatch latency).
    pub dispatchable_at: Instant,
}

/// A cancellation to send to a gateway.
#[derive(Clone, Debug)]
pub struct CancelOrder {
    /// The gateway's base URL.
    pub address: String,
    /// The session.
    pub session_id: String,
    /// The dispatch.
    pub attempt: u32,
    /// Why.
    pub reason: String,
}

/// What must follow a batch of state changes.
#[derive(Debug, Default)]
pub struct Changes {
    /// Rows to write, in order.
    pub ops: Vec<Op>,
    /// Events to publish once written.
    pub events: Vec<Event>,
    /// Assignments to push once written.
    pub pushes: Vec<Push>,
    /// Cancellations to send.
    pub cancels: Vec<CancelOrder>,
    /// Tasks whose results go to their callback URL.
    pub callbacks: Vec<String>,
    /// A node became able to take sessions: run the dispatcher.
    pub wake: bool,
}

impl Changes {
    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
            && self.events.is_empty()
            && self.pushes.is_empty()
            && self.cancels.is_empty()
            && self.callbacks.is_empty()
            && !self.wake
    }
}

/// A task in memory.
#[derive(Clone, Debug)]
pub struct Task {
    /// The request as submitted.
    pub request: Arc<TaskRequest>,
    /// Submission order.
    pub seq: u64,
    /// Status.
    pub status: TaskStatus,
    /// The group id (resolved).
    pub group_id: String,
    /// Submission time.
    pub submitted_unix_ms: u64,
    /// Finish time.
    pub finished_unix_ms: Option<u64>,
    /// Why it was cancelled or stopped early.
    pub reason: Option<String>,
    /// Sessions by state.
    pub counts: SessionCounts,
    /// Callback delivery.
    pub callback: CallbackView,
    cancelled: bool,
}

/// A session in memory.
#[derive(Clone, Debug)]
pub struct Session {
    /// Its task.
    pub task_id: String,
    /// Its index.
    pub index: u32,
    /// Its state.
    pub state: SessionState,
    /// Dispatches so far.
    pub attempts: u32,
    /// Re-dispatches after losses so far.
    pub retries: u32,
    /// Why earlier dispatches ended (the last [`MAX_ENDED_ATTEMPTS`]).
    pub ended: Vec<AttemptEnd>,
    enqueued_at: Instant,
    /// The calls its running dispatch reported so far (in memory only:
    /// the result's `stats.calls` supersedes them).
    live: LiveCalls,
    /// The nodes that reported they cannot run it (`node_unfit`), and why:
    /// it is not dispatched to them again (stored with the session, so a
    /// restarted server remembers them).
    unfit: BTreeMap<String, String>,
}

/// The calls a running dispatch reported (at most
/// [`polar_rollout_api::MAX_LIVE_CALLS`]).
#[derive(Clone, Debug, Default)]
pub struct LiveCalls {
    /// The dispatch they are of.
    pub attempt: u32,
    /// The calls, in the order reported.
    pub calls: Vec<serde_json::Value>,
    /// How many were reported (those past the bound are counted only).
    pub total: usize,
}

/// Queue order: priority (higher first), submission, index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct QueueKey {
    neg_priority: i64,
    seq: u64,
    index: u32,
}

/// Why a submission was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// A task with this id exists.
    #[error("task {0:?} already exists")]
    Duplicate(String),
}

/// Why a task could not be deleted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeleteError {
    /// No such task.
    #[error("unknown task {0:?}")]
    Unknown(String),
    /// It has not finished: cancel it first.
    #[error("task {task:?} is {status}: cancel it first")]
    NotFinished {
        /// The task.
        task: String,
        /// Its status.
        status: &'static str,
    },
}

/// Why a gateway's report was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    /// No such session.
    #[error("unknown session {0:?}")]
    UnknownSession(String),
    /// The session is not assigned to this node and attempt (it was
    /// dispatched again, cancelled or already reported).
    #[error("session {session} is not assigned to node {node} attempt {attempt} (now {state})")]
    Stale {
        /// The session.
        session: String,
        /// The reporting node.
        node: String,
        /// The reported attempt.
        attempt: u32,
        /// The session's state.
        state: &'static str,
    },
}

/// Counters for `/metrics`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    /// Assignments made.
    pub dispatches: u64,
    /// Sessions dispatched again after a loss or retryable failure.
    pub redispatches: u64,
    /// Of those, sessions run again because the infrastructure (the
    /// inference backend, Polar) ended their attempt.
    pub infra_reruns: u64,
    /// Pushes a gateway refused or did not answer.
    pub push_failures: u64,
    /// Results accepted.
    pub results: u64,
}

/// All state.
#[derive(Debug)]
pub struct Scheduler {
    limits: Limits,
    tasks: HashMap<String, Task>,
    order: BTreeMap<u64, String>,
    sessions: HashMap<String, Session>,
    queue: BTreeMap<QueueKey, String>,
    nodes: BTreeMap<String, Node>,
    next_seq: u64,
    last_healthy: Instant,
    counters: Counters,
    out: Changes,
}

impl Scheduler {
    /// An empty scheduler.
    pub fn new(limits: Limits, now: Instant) -> Self {
        Self {
            limits,
            tasks: HashMap::new(),
            order: BTreeMap::new(),
            sessions: HashMap::new(),
            queue: BTreeMap::new(),
            nodes: BTreeMap::new(),
            next_seq: 1,
            last_healthy: now,
            counters: Counters::default(),
            out: Changes::default(),
        }
    }

    /// What the changes since the last call require.
    pub fn take_changes(&mut self) -> Changes {
        std::mem::take(&mut self.out)
    }

    /// Counters.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Carries counters over to a rebuilt scheduler.
    pub fn set_counters(&mut self, counters: Counters) {
        self.counters = counters;
    }

    /// Sessions waiting for a node.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Accepts a (checked) task: its sessions wait in the queue.
    pub fn submit(
        &mut self,
        request: TaskRequest,
        now: Instant,
        wall_ms: u64,
    ) -> Result<SubmitReply, SubmitError> {
        if self.tasks.contains_key(&request.task_id) {
            return Err(SubmitError::Duplicate(request.task_id));
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let request = Arc::new(request);
        let id = request.task_id.clone();
        self.out.ops.push(Op::InsertTask {
            request: Arc::clone(&request),
            seq,
            submitted_unix_ms: wall_ms,
        });
        let mut counts = SessionCounts::default();
        let mut session_ids = Vec::with_capacity(request.num_samples as usize);
        for index in 0..request.num_samples {
            let sid = session_id(&id, index);
            counts.apply(&SessionState::Pending, 1);
            self.queue
                .insert(queue_key(&request, seq, index), sid.clone());
            self.sessions.insert(
                sid.clone(),
                Session {
                    task_id: id.clone(),
                    index,
                    state: SessionState::Pending,
                    attempts: 0,
                    retries: 0,
                    ended: Vec::new(),
                    enqueued_at: now,
                    live: LiveCalls::default(),
                    unfit: BTreeMap::new(),
                },
            );
            session_ids.push(sid);
        }
        let callback = CallbackView {
            state: if request.callback_url.is_some() {
                CallbackState::Waiting
            } else {
                CallbackState::None
            },
            ..CallbackView::default()
        };
        let task = Task {
            group_id: request
                .metadata
                .group_id
                .clone()
                .unwrap_or_else(|| id.clone()),
            request,
            seq,
            status: TaskStatus::Queued,
            submitted_unix_ms: wall_ms,
            finished_unix_ms: None,
            reason: None,
            counts,
            callback,
            cancelled: false,
        };
        self.out.events.push(Event::Task {
            task_id: id.clone(),
            status: TaskStatus::Queued,
            counts,
        });
        self.tasks.insert(id.clone(), task);
        self.order.insert(seq, id.clone());
        Ok(SubmitReply {
            version: API_VERSION,
            task_id: id,
            status: TaskStatus::Queued,
            session_ids,
        })
    }

    /// Deletes a finished task and its sessions (memory and rows).
    pub fn delete(&mut self, task_id: &str) -> Result<(), DeleteError> {
        let t = self
            .tasks
            .get(task_id)
            .ok_or_else(|| DeleteError::Unknown(task_id.to_owned()))?;
        if !t.status.is_finished() {
            return Err(DeleteError::NotFinished {
                task: task_id.to_owned(),
                status: t.status.as_str(),
            });
        }
        if let Some(t) = self.tasks.remove(task_id) {
            self.order.remove(&t.seq);
            for i in 0..t.request.num_samples {
                self.sessions.remove(&session_id(task_id, i));
            }
        }
        self.out.ops.push(Op::DeleteTask {
            task_id: task_id.to_owned(),
        });
        Ok(())
    }

    /// Deletes the finished tasks past the retention (at most
    /// [`EXPIRE_BATCH`] a call, oldest submission first); how many.
    pub fn expire(&mut self, wall_ms: u64) -> usize {
        let Some(keep) = self.limits.retention else {
            return 0;
        };
        let keep = u64::try_from(keep.as_millis()).unwrap_or(u64::MAX);
        let old: Vec<String> = self
            .order
            .values()
            .filter(|id| {
                self.tasks.get(*id).is_some_and(|t| {
                    t.status.is_finished()
                        && t.finished_unix_ms
                            .is_some_and(|f| f.saturating_add(keep) < wall_ms)
                })
            })
            .take(EXPIRE_BATCH)
            .cloned()
            .collect();
        for id in &old {
            let _ = self.delete(id);
        }
        old.len()
    }

    /// Cancels a task's open sessions; `None` for an unknown task. A
    /// finished task is left as it is.
    pub fn cancel(
        &mut self,
        task_id: &str,
        reason: &str,
        now: Instant,
        wall_ms: u64,
    ) -> Option<TaskStatus> {
        let task = self.tasks.get_mut(task_id)?;
        if task.status.is_finished() {
            return Some(task.status);
        }
        task.cancelled = true;
        task.reason = Some(reason.to_owned());
        let n = task.request.num_samples;
        self.cancel_open(task_id, n, reason, now);
        self.check_finished(task_id, wall_ms);
        self.tasks.get(task_id).map(|t| t.status)
    }

    /// Moves every open session of a task to `cancelled`, telling gateways.
    fn cancel_open(&mut self, task_id: &str, n: u32, reason: &str, now: Instant) {
        for index in 0..n {
            let sid = session_id(task_id, index);
            let Some(s) = self.sessions.get(&sid) else {
                continue;
            };
            if s.state.is_terminal() {
                continue;
            }
            if let Some((node, attempt)) = s.state.assignment() {
                let node = node.to_owned();
                if let Some(nd) = self.nodes.get_mut(&node) {
                    nd.release(&sid, now);
                    self.out.cancels.push(CancelOrder {
                        address: nd.registration.address.clone(),
                        session_id: sid.clone(),
                        attempt,
                        reason: reason.to_owned(),
                    });
                }
            } else if s.state == SessionState::Pending {
                let key = self.key_of(&sid);
                if let Some(k) = key {
                    self.queue.remove(&k);
                }
            }
            self.set_state(
                &sid,
                SessionState::Cancelled {
                    reason: reason.to_owned(),
                },
            );
        }
    }

    fn key_of(&self, sid: &str) -> Option<QueueKey> {
        let s = self.sessions.get(sid)?;
        let t = self.tasks.get(&s.task_id)?;
        Some(queue_key(&t.request, t.seq, s.index))
    }

    /// Sets a session's state, updating counts, and records the row and
    /// event.
    fn set_state(&mut self, sid: &str, state: SessionState) {
        let Some(s) = self.sessions.get_mut(sid) else {
            return;
        };
        if let Some(t) = self.tasks.get_mut(&s.task_id) {
            t.counts.apply(&s.state, -1);
            t.counts.apply(&state, 1);
        }
        s.state = state;
        // Live calls belong to one running dispatch.
        if s.state
            .assignment()
            .is_none_or(|(_, a)| a != s.live.attempt)
        {
            s.live = LiveCalls::default();
        }
        self.out.ops.push(Op::Session {
            session_id: sid.to_owned(),
            task_id: s.task_id.clone(),
            sample_index: s.index,
            attempts: s.attempts,
            retries: s.retries,
            state: s.state.clone(),
            ended: s.ended.clone(),
            unfit: s.unfit.clone(),
        });
        self.out.events.push(Event::Session {
            session_id: sid.to_owned(),
            task_id: s.task_id.clone(),
            sample_index: s.index,
            state: s.state.clone(),
        });
    }

    fn set_task_status(&mut self, task_id: &str, status: TaskStatus, wall_ms: u64) {
        let Some(t) = self.tasks.get_mut(task_id) else {
            return;
        };
        t.status = status;
        if status.is_finished() {
            t.finished_unix_ms = Some(wall_ms);
            if t.callback.state == CallbackState::Waiting {
                t.callback.state = CallbackState::Pending;
                self.out.callbacks.push(task_id.to_owned());
            }
        }
        self.out.ops.push(task_op(task_id, t));
        self.out.events.push(Event::Task {
            task_id: task_id.to_owned(),
            status,
            counts: t.counts,
        });
    }

    /// Finishes the task once no session is open.
    fn check_finished(&mut self, task_id: &str, wall_ms: u64) {
        let Some(t) = self.tasks.get(task_id) else {
            return;
        };
        if t.status.is_finished() || t.counts.open() > 0 {
            return;
        }
        let status = if t.cancelled {
            TaskStatus::Cancelled
        } else if t.counts.usable == 0 {
            TaskStatus::Failed
        } else if t.counts.usable < t.request.requested() {
            TaskStatus::Partial
        } else {
            TaskStatus::Completed
        };
        self.set_task_status(task_id, status, wall_ms);
    }

    /// Puts a session back in the queue.
    fn enqueue(&mut self, sid: &str, now: Instant) {
        if let Some(s) = self.sessions.get_mut(sid) {
            s.enqueued_at = now;
        }
        if let Some(k) = self.key_of(sid) {
            self.queue.insert(k, sid.to_owned());
        }
        self.set_state(sid, SessionState::Pending);
    }

    /// A session's node was lost (or it failed in a retryable way): dispatch
    /// it again within the retry limit, else fail it.
    fn lose(&mut self, sid: &str, reason: &str, now: Instant, wall_ms: u64) {
        self.end_attempt(sid, reason);
        let Some(s) = self.sessions.get_mut(sid) else {
            return;
        };
        if let Some((node, _)) = s.state.assignment() {
            let node = node.to_owned();
            if let Some(nd) = self.nodes.get_mut(&node) {
                nd.release(sid, now);
            }
        }
        let task_id = s.task_id.clone();
        if s.retries < self.limits.max_retries {
            s.retries += 1;
            self.counters.redispatches += 1;
            tracing::info!(
                session = sid,
                reason,
                retry = s.retries,
                "dispatching the session again"
            );
            self.enqueue(sid, now);
        } else {
            let error = format!(
                "{reason}; retry limit ({}) reached",
                self.limits.max_retries
            );
            tracing::warn!(session = sid, %error, "session failed");
            self.set_state(sid, SessionState::Failed { error });
            self.check_finished(&task_id, wall_ms);
        }
    }

    /// Records why the session's current dispatch ends (before its state
    /// changes); the last [`MAX_ENDED_ATTEMPTS`] are kept.
    pub(super) fn end_attempt(&mut self, sid: &str, reason: &str) {
        let Some(s) = self.sessions.get_mut(sid) else {
            return;
        };
        let Some((node, attempt)) = s.state.assignment() else {
            return;
        };
        let end = AttemptEnd {
            attempt,
            node: node.to_owned(),
            reason: reason.to_owned(),
        };
        if s.ended.len() >= MAX_ENDED_ATTEMPTS {
            s.ended.remove(0);
        }
        s.ended.push(end);
    }

    /// Assigns queued sessions to nodes, at most `max`; the pushes are in
    /// [`Changes::pushes`]. Returns how many were assigned. A session
    /// dispatched again goes to another node than the one its last
    /// dispatch ended on when another is eligible.
    pub fn assign(&mut self, wall_ms: u64, max: usize) -> usize {
        let mut assigned = 0;
        while assigned < max {
            let Some((&key, sid)) = self.queue.first_key_value() else {
                break;
            };
            let Some(s) = self.sessions.get(sid) else {
                break;
            };
            let avoid = s.ended.last().map(|e| e.node.as_str());
            let Some(node_id) = self
                .least_loaded(avoid, &s.unfit)
                .or_else(|| avoid.and_then(|_| self.least_loaded(None, &s.unfit)))
            else {
                // Every node left that could run it is gone: it fails now
                // rather than wait for one; else it waits for room (at the
                // head of the queue, as any session).
                if !s.unfit.is_empty() && !self.another_node_for(&s.unfit) {
                    let sid = sid.clone();
                    self.queue.remove(&key);
                    self.fail_unfit(&sid, wall_ms);
                    continue;
                }
                break;
            };
            let Some(sid) = self.queue.remove(&key) else {
                break;
            };
            self.dispatch(&sid, &node_id, wall_ms);
            assigned += 1;
        }
        assigned
    }

    /// Whether a node outside `unfit` is heartbeating and not draining (it
    /// may take the session once it has room or its backend is back).
    pub(super) fn another_node_for(&self, unfit: &BTreeMap<String, String>) -> bool {
        self.nodes.iter().any(|(id, n)| {
            n.healthy && !n.heartbeat.draining && !n.drain_requested && !unfit.contains_key(id)
        })
    }

    /// Fails a session no node left can run, with the nodes' reasons.
    pub(super) fn fail_unfit(&mut self, sid: &str, wall_ms: u64) {
        let Some(s) = self.sessions.get(sid) else {
            return;
        };
        let why: Vec<String> = s
            .unfit
            .iter()
            .map(|(node, e)| format!("node {node} cannot run it: {e}"))
            .collect();
        let task_id = s.task_id.clone();
        let error = format!("{} (no other node to try)", why.join("; "));
        tracing::warn!(session = sid, %error, "session failed");
        self.set_state(sid, SessionState::Failed { error });
        self.check_finished(&task_id, wall_ms);
    }

    /// The eligible node with the lowest load, ties to the smallest id;
    /// never `avoid` nor a node in `unfit`.
    fn least_loaded(
        &self,
        avoid: Option<&str>,
        unfit: &BTreeMap<String, String>,
    ) -> Option<String> {
        let mut best: Option<(&String, &Node)> = None;
        for (id, n) in &self.nodes {
            if !n.eligible() || avoid == Some(id.as_str()) || unfit.contains_key(id) {
                continue;
            }
            let better = match best {
                None => true,
                // a/b < c/d  <=>  a*d < c*b
                Some((_, b)) => {
                    (n.assigned.len() as u64) * u64::from(b.registration.capacity.max_sessions)
                        < (b.assigned.len() as u64)
                            * u64::from(n.registration.capacity.max_sessions)
                }
            };
            if better {
                best = Some((id, n));
            }
        }
        best.map(|(id, _)| id.clone())
    }

    fn dispatch(&mut self, sid: &str, node_id: &str, wall_ms: u64) {
        let Some(s) = self.sessions.get_mut(sid) else {
            return;
        };
        let Some(task) = self.tasks.get(&s.task_id) else {
            return;
        };
        let Some(node) = self.nodes.get_mut(node_id) else {
            return;
        };
        s.attempts += 1;
        let attempt = s.attempts;
        let mut assignment = build_assignment(task, sid, s.index, attempt);
        let deadline_unix_ms =
            wall_ms.saturating_add(task.request.timeout_secs.saturating_mul(1000));
        assignment.deadline_unix_ms = deadline_unix_ms;
        let dispatchable_at = s.enqueued_at.max(node.ready_since);
        node.assigned.insert(sid.to_owned());
        self.out.pushes.push(Push {
            address: node.registration.address.clone(),
            node_id: node_id.to_owned(),
            assignment,
            dispatchable_at,
        });
        self.counters.dispatches += 1;
        let task_id = s.task_id.clone();
        self.set_state(
            sid,
            SessionState::Dispatched {
                node: node_id.to_owned(),
                attempt,
                deadline_unix_ms,
            },
        );
        if self.tasks.get(&task_id).map(|t| t.status) == Some(TaskStatus::Queued) {
            self.set_task_status(&task_id, TaskStatus::Running, wall_ms);
        }
    }

    /// A push was refused or not answered: the session waits again (this
    /// does not count as a retry) and the node gets nothing until its next
    /// heartbeat. A session the node already reported running for this
    /// attempt was delivered (only the answer was lost, say the node died
    /// while sending it): it stays, and the node's loss or its result
    /// decides.
    pub fn push_failed(
        &mut self,
        sid: &str,
        node_id: &str,
        attempt: u32,
        reason: &str,
        now: Instant,
    ) {
        self.counters.push_failures += 1;
        if let Some(SessionState::Running {
            node, attempt: a, ..
        }) = self.sessions.get(sid).map(|s| &s.state)
            && node == node_id
            && *a == attempt
        {
            tracing::debug!(
                session = sid,
                node = node_id,
                reason,
                "push answer lost, but the node reported the session running"
            );
            return;
        }
        if let Some(n) = self.nodes.get_mut(node_id) {
            n.refusing = true;
            n.release(sid, now);
        }
        let current = self.sessions.get(sid).and_then(|s| {
            s.state
                .assignment()
                .map(|(n, a)| (n == node_id, a == attempt))
        });
        if current == Some((true, true)) {
            tracing::warn!(
                session = sid,
                node = node_id,
                reason,
                "push failed, the session waits again"
            );
            self.end_attempt(sid, &format!("push to node {node_id} failed: {reason}"));
            self.enqueue(sid, now);
        }
    }
}

fn queue_key(req: &TaskRequest, seq: u64, index: u32) -> QueueKey {
    QueueKey {
        neg_priority: -i64::from(req.priority),
        seq,
        index,
    }
}

/// The assignment of a session (deadline left at 0 for the caller).
fn build_assignment(task: &Task, sid: &str, index: u32, attempt: u32) -> SessionAssignment {
    let req = &task.request;
    SessionAssignment {
        version: API_VERSION,
        session_id: sid.to_owned(),
        attempt,
        task_id: req.task_id.clone(),
        sample_index: index,
        instruction: req.instruction.clone(),
        runtime: req.runtime.clone(),
        agent: req.agent.clone(),
        builder: req.builder.clone(),
        evaluator: req.evaluator.clone(),
        metadata: TaskMetadata {
            group_id: Some(task.group_id.clone()),
            policy_version: req.metadata.policy_version.clone(),
            extra: req.metadata.extra.clone(),
        },
        timeout_secs: req.timeout_secs,
        deadline_unix_ms: 0,
    }
}

fn task_op(task_id: &str, t: &Task) -> Op {
    Op::Task {
        task_id: task_id.to_owned(),
        status: t.status,
        finished_unix_ms: t.finished_unix_ms,
        reason: t.reason.clone(),
        callback: t.callback.clone(),
    }
}

/// Sessions of a node, for tests.
#[cfg(test)]
impl Scheduler {
    /// The sessions assigned to a node now.
    pub fn assigned_to(&self, node_id: &str) -> std::collections::HashSet<String> {
        self.nodes
            .get(node_id)
            .map(|n| n.assigned.clone())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests;
