//! The node registry: registration, heartbeats (with the node's inference
//! backends: a node whose backend has no healthy replica takes no
//! session), drain, and the loss of a node (its sessions go back to the
//! queue).

use std::collections::{BTreeMap, HashSet};
use std::time::Instant;

use super::{Op, Scheduler};
use crate::events::Event;
use polar_rollout_types::{
    API_VERSION, BackendHealth, Heartbeat, HeartbeatReply, NodeHealth, NodeRegistration,
    RegisterReply, backend_down,
};

/// A gateway node in memory.
#[derive(Clone, Debug)]
pub struct Node {
    /// As registered.
    pub registration: NodeRegistration,
    /// Sessions assigned to it now.
    pub assigned: HashSet<String>,
    /// Its last heartbeat or registration.
    pub last_seen: Instant,
    /// The last heartbeat's content.
    pub heartbeat: Heartbeat,
    /// Heartbeating within the timeout.
    pub healthy: bool,
    /// Drained by an operator.
    pub drain_requested: bool,
    /// A push failed since the last heartbeat.
    pub refusing: bool,
    /// Since when it could take a session (for the dispatch latency).
    pub ready_since: Instant,
}

/// Why a heartbeat was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeartbeatError {
    /// The node is not registered: register again.
    #[error("unknown node {0:?}: register first")]
    UnknownNode(String),
    /// The heartbeat comes from another gateway process than the one
    /// registered: register again.
    #[error("node {node:?} is registered with another instance: register again")]
    WrongInstance {
        /// The node.
        node: String,
    },
}

impl Node {
    fn new(registration: NodeRegistration, drain_requested: bool, now: Instant) -> Self {
        Self {
            registration,
            assigned: HashSet::new(),
            last_seen: now,
            heartbeat: Heartbeat::default(),
            healthy: true,
            drain_requested,
            refusing: false,
            ready_since: now,
        }
    }

    /// Its inference backends as last reported: the last heartbeat's, or
    /// the registration's before a heartbeat named any.
    pub fn backends(&self) -> &BTreeMap<String, BackendHealth> {
        if self.heartbeat.backends.is_empty() {
            &self.registration.backends
        } else {
            &self.heartbeat.backends
        }
    }

    /// Its first inference backend with no healthy replica.
    pub fn backend_down(&self) -> Option<(&str, &BackendHealth)> {
        backend_down(self.backends())
    }

    /// Whether it takes new sessions, capacity aside: heartbeating, not
    /// draining, not refusing, and every backend reachable (a session sent
    /// to a node whose backend is down would only fail there).
    pub fn eligible_ignoring_capacity(&self) -> bool {
        self.healthy
            && !self.heartbeat.draining
            && !self.drain_requested
            && !self.refusing
            && self.backend_down().is_none()
    }

    /// Whether it takes a new session now.
    pub fn eligible(&self) -> bool {
        self.eligible_ignoring_capacity()
            && (self.assigned.len() as u64) < u64::from(self.registration.capacity.max_sessions)
    }

    /// Its health as shown.
    pub fn health(&self) -> NodeHealth {
        if !self.healthy {
            NodeHealth::Unhealthy
        } else if self.heartbeat.draining || self.drain_requested {
            NodeHealth::Draining
        } else if self.backend_down().is_some() {
            NodeHealth::BackendDown
        } else {
            NodeHealth::Healthy
        }
    }

    /// Forgets a session; a node that was full is ready again (returns
    /// whether it became able to take a session).
    pub fn release(&mut self, sid: &str, now: Instant) -> bool {
        self.update(now, |n| {
            n.assigned.remove(sid);
        })
    }

    /// Applies a change, stamping `ready_since` when the node becomes able
    /// to take a session (and returning whether it did).
    fn update(&mut self, now: Instant, change: impl FnOnce(&mut Self)) -> bool {
        let before = self.eligible();
        change(self);
        let became = !before && self.eligible();
        if became {
            self.ready_since = now;
        }
        became
    }
}

impl Scheduler {
    /// Registers a node (again). A new `instance` means the gateway process
    /// restarted: sessions the previous one held are lost.
    pub fn register(&mut self, reg: NodeRegistration, now: Instant, wall_ms: u64) -> RegisterReply {
        let id = reg.node_id.clone();
        let mut requeued = 0;
        let drain_requested = self.nodes.get(&id).is_some_and(|n| n.drain_requested);
        if let Some(old) = self.nodes.get(&id)
            && old.registration.instance != reg.instance
        {
            let held: Vec<String> = old.assigned.iter().cloned().collect();
            requeued = u32::try_from(held.len()).unwrap_or(u32::MAX);
            for sid in held {
                self.lose(&sid, &format!("gateway {id} restarted"), now, wall_ms);
            }
        }
        match self.nodes.get_mut(&id) {
            Some(n) => {
                n.update(now, |n| {
                    n.registration = reg.clone();
                    n.last_seen = now;
                    n.healthy = true;
                    n.refusing = false;
                    n.heartbeat = Heartbeat::default();
                });
            }
            None => {
                self.nodes
                    .insert(id.clone(), Node::new(reg.clone(), drain_requested, now));
            }
        }
        self.out.wake = true;
        tracing::info!(node = %id, address = %reg.address, max_sessions = reg.capacity.max_sessions, "node registered");
        self.node_changed(&id);
        RegisterReply {
            version: API_VERSION,
            node_id: id,
            heartbeat_interval_ms: 0,
            heartbeat_timeout_ms: u64::try_from(self.limits.heartbeat_timeout.as_millis())
                .unwrap_or(u64::MAX),
            requeued,
        }
    }

    /// Records the node's row and a health event.
    fn node_changed(&mut self, id: &str) {
        if let Some(n) = self.nodes.get(id) {
            self.out.ops.push(Op::Node {
                registration: n.registration.clone(),
                drain_requested: n.drain_requested,
            });
            self.out.events.push(Event::Node {
                node_id: id.to_owned(),
                health: n.health(),
            });
        }
    }

    /// A heartbeat: the node is alive (healthy again if it was lost), its
    /// load is recorded, and sessions it holds that it should not are
    /// returned to cancel.
    pub fn heartbeat(
        &mut self,
        node_id: &str,
        hb: Heartbeat,
        now: Instant,
    ) -> Result<HeartbeatReply, HeartbeatError> {
        let n = self
            .nodes
            .get(node_id)
            .ok_or_else(|| HeartbeatError::UnknownNode(node_id.to_owned()))?;
        if let Some(instance) = &hb.instance
            && *instance != n.registration.instance
        {
            return Err(HeartbeatError::WrongInstance {
                node: node_id.to_owned(),
            });
        }
        let cancel = hb
            .sessions
            .as_deref()
            .map(|held| self.reconcile(node_id, held))
            .unwrap_or_default();
        let Some(n) = self.nodes.get_mut(node_id) else {
            return Err(HeartbeatError::UnknownNode(node_id.to_owned()));
        };
        let before = n.health();
        let became = n.update(now, |n| {
            n.last_seen = now;
            n.healthy = true;
            n.refusing = false;
            n.heartbeat = hb;
        });
        self.out.wake |= became;
        let drain = n.drain_requested;
        if n.health() != before {
            tracing::info!(
                node = node_id,
                health = n.health().as_str(),
                "node health changed"
            );
            self.out.events.push(Event::Node {
                node_id: node_id.to_owned(),
                health: n.health(),
            });
        }
        Ok(HeartbeatReply {
            version: API_VERSION,
            cancel,
            drain,
        })
    }

    /// Drains a node (no new sessions) or undoes it; `false` for an
    /// unknown node.
    pub fn drain(&mut self, node_id: &str, draining: bool, now: Instant) -> bool {
        let Some(n) = self.nodes.get_mut(node_id) else {
            return false;
        };
        self.out.wake |= n.update(now, |n| n.drain_requested = draining);
        self.node_changed(node_id);
        true
    }

    /// The node stopped heartbeating: its sessions go back to the queue.
    pub(super) fn node_lost(&mut self, node_id: &str, why: &str, now: Instant, wall_ms: u64) {
        let Some(n) = self.nodes.get_mut(node_id) else {
            return;
        };
        n.healthy = false;
        let held: Vec<String> = n.assigned.iter().cloned().collect();
        tracing::warn!(node = node_id, sessions = held.len(), why, "node lost");
        self.out.events.push(Event::Node {
            node_id: node_id.to_owned(),
            health: NodeHealth::Unhealthy,
        });
        let reason = format!("node {node_id} lost ({why})");
        for sid in held {
            self.lose(&sid, &reason, now, wall_ms);
        }
    }

    /// Restores a node from the database: it counts as alive from `now`,
    /// so it has a full heartbeat timeout to show up.
    pub fn restore_node(
        &mut self,
        registration: NodeRegistration,
        drain_requested: bool,
        now: Instant,
    ) {
        let id = registration.node_id.clone();
        self.nodes
            .insert(id, Node::new(registration, drain_requested, now));
    }
}
