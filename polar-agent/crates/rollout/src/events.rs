//! Events for dashboards (`GET /v1/events`, server-sent events): every task,
//! session and node state change, numbered in the order it was committed to
//! the database. [`EventHub`] keeps the last few thousand so a client that
//! reconnects with `Last-Event-ID` misses nothing recent.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::broadcast;

pub use polar_rollout_types::{Event, Numbered};

/// Events kept for clients that reconnect.
const BACKLOG: usize = 4096;

/// Numbers events, keeps a backlog and fans them out.
#[derive(Debug)]
pub struct EventHub {
    inner: Mutex<Backlog>,
    tx: broadcast::Sender<Numbered>,
}

#[derive(Debug, Default)]
struct Backlog {
    next: u64,
    recent: VecDeque<Numbered>,
}

impl Default for EventHub {
    fn default() -> Self {
        Self::new()
    }
}

impl EventHub {
    /// An empty hub.
    pub fn new() -> Self {
        Self {
            inner: Mutex::new(Backlog {
                next: 1,
                recent: VecDeque::new(),
            }),
            tx: broadcast::channel(BACKLOG).0,
        }
    }

    /// Publishes events in order.
    pub fn publish(&self, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        let mut b = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        for event in events {
            let n = Numbered { id: b.next, event };
            b.next += 1;
            if b.recent.len() == BACKLOG {
                b.recent.pop_front();
            }
            b.recent.push_back(n.clone());
            // No subscriber is fine.
            let _ = self.tx.send(n);
        }
    }

    /// A subscription, with the kept events after `after` (all kept events
    /// for 0) to send first.
    pub fn subscribe(&self, after: Option<u64>) -> (Vec<Numbered>, broadcast::Receiver<Numbered>) {
        let b = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let rx = self.tx.subscribe();
        let backlog = match after {
            Some(after) => b.recent.iter().filter(|n| n.id > after).cloned().collect(),
            None => Vec::new(),
        };
        (backlog, rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use polar_rollout_api::NodeHealth;

    #[test]
    fn events_are_numbered_and_replayed() {
        let hub = EventHub::new();
        let ev = |i: u32| Event::Node {
            node_id: format!("n{i}"),
            health: NodeHealth::Healthy,
        };
        hub.publish(vec![ev(1), ev(2)]);
        let (backlog, mut rx) = hub.subscribe(Some(1));
        assert_eq!(backlog.len(), 1);
        assert_eq!(backlog[0].id, 2);
        hub.publish(vec![ev(3)]);
        let n = rx.try_recv().unwrap();
        assert_eq!(n.id, 3);
        let sse = n.to_sse();
        assert!(sse.starts_with("id: 3\nevent: node\ndata: {"), "{sse}");
        assert!(sse.contains(r#""type":"node""#), "{sse}");
    }
}
