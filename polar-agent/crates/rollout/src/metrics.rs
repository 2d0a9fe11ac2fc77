//! Dispatch latency (from the moment a session could go to a node to the
//! gateway's acceptance of it) as a Prometheus histogram, and the
//! `/metrics` text. Each latency is also in the `assignment accepted` debug
//! event (`latency_us`, see `core.rs`), which is where a benchmark reads the
//! raw values.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::scheduler::Counters;
use polar_metrics::{Histogram, Text};
use polar_rollout_api::NodeView;

/// Upper bounds of the histogram buckets, in seconds.
static BUCKETS: [f64; 13] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// The dispatch latency histogram.
#[derive(Debug)]
pub struct Metrics {
    latency: Histogram,
    callback_failures: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            latency: Histogram::new(&BUCKETS),
            callback_failures: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    /// Records one dispatch latency.
    pub fn observe(&self, d: Duration) {
        self.latency.observe(d);
    }

    /// Counts a callback attempt that failed.
    pub fn callback_failed(&self) {
        self.callback_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus text exposition.
    pub fn render(
        &self,
        tasks: &BTreeMap<String, u64>,
        sessions: &BTreeMap<String, u64>,
        nodes: &[NodeView],
        counters: Counters,
        queued: usize,
    ) -> String {
        let mut out = Text::new();
        out.family("polar_rollout_tasks", "gauge", "Tasks by status.");
        for (k, v) in tasks {
            out.sample("polar_rollout_tasks", &[("status", k)], v);
        }
        out.family("polar_rollout_sessions", "gauge", "Sessions by state.");
        for (k, v) in sessions {
            out.sample("polar_rollout_sessions", &[("state", k)], v);
        }
        out.single(
            "polar_rollout_queue_depth",
            "gauge",
            "Sessions waiting for a node.",
            queued,
        );
        out.family(
            "polar_rollout_nodes",
            "gauge",
            "Registered nodes by health.",
        );
        for health in ["healthy", "draining", "backend_down", "unhealthy"] {
            let n = nodes.iter().filter(|n| n.health.as_str() == health).count();
            out.sample("polar_rollout_nodes", &[("health", health)], n);
        }
        out.family(
            "polar_rollout_node_backend_healthy_replicas",
            "gauge",
            "Replicas of each inference backend a node's last health check found healthy (0: the node takes no session).",
        );
        for n in nodes {
            for (backend, h) in &n.backends {
                out.sample(
                    "polar_rollout_node_backend_healthy_replicas",
                    &[("node", n.node_id.as_str()), ("backend", backend.as_str())],
                    h.healthy,
                );
            }
        }
        out.family(
            "polar_rollout_node_assigned",
            "gauge",
            "Sessions assigned per node.",
        );
        for n in nodes {
            out.sample(
                "polar_rollout_node_assigned",
                &[("node", n.node_id.as_str())],
                n.assigned,
            );
        }
        for (name, help, v) in [
            (
                "dispatches",
                "Sessions assigned to nodes.",
                counters.dispatches,
            ),
            (
                "redispatches",
                "Sessions dispatched again after a loss or a retryable failure.",
                counters.redispatches,
            ),
            (
                "infra_reruns",
                "Sessions run again because the inference backend or Polar ended their attempt.",
                counters.infra_reruns,
            ),
            (
                "push_failures",
                "Assignments a gateway refused or did not answer.",
                counters.push_failures,
            ),
            ("results", "Session results accepted.", counters.results),
            (
                "callback_failures",
                "Callback attempts that failed.",
                self.callback_failures.load(Ordering::Relaxed),
            ),
        ] {
            out.single(&format!("polar_rollout_{name}_total"), "counter", help, v);
        }
        self.latency.render(
            &mut out,
            "polar_rollout_dispatch_latency_seconds",
            "From a session becoming dispatchable to its gateway accepting it.",
        );
        out.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = Metrics::default();
        m.observe(Duration::from_micros(300));
        m.observe(Duration::from_millis(3));
        let text = m.render(
            &BTreeMap::new(),
            &BTreeMap::new(),
            &[],
            Counters::default(),
            0,
        );
        assert!(
            text.contains("polar_rollout_dispatch_latency_seconds_bucket{le=\"0.0005\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("polar_rollout_dispatch_latency_seconds_bucket{le=\"0.005\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("polar_rollout_dispatch_latency_seconds_count 2\n"),
            "{text}"
        );
        // Both observations are in the sum (0.0003 + 0.003 s).
        let sum: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("polar_rollout_dispatch_latency_seconds_sum "))
            .and_then(|v| v.parse().ok())
            .unwrap();
        assert!((sum - 0.0033).abs() < 1e-9, "{text}");
    }
}
