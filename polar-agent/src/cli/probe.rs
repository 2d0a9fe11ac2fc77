//! `polar config check --probe`: every replica of every backend the file
//! configures is asked `GET /health` (as the agent's health checks do), so
//! that a file that is valid but points at nothing says so before a node
//! registers with it.

use std::fmt::Write as _;

use polar_inference::{BackendConfig, Pool};

/// What one backend's replicas answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendProbe {
    /// The backend's name.
    pub backend: String,
    /// Each replica's URL and whether it answered 2xx in time.
    pub replicas: Vec<(String, bool)>,
    /// How long a replica had to answer.
    pub timeout_ms: u64,
}

impl BackendProbe {
    /// Whether a session could reach the backend.
    pub fn is_up(&self) -> bool {
        self.replicas.is_empty() || self.replicas.iter().any(|(_, ok)| *ok)
    }
}

/// Probes every replica of `backends`, all at once per backend.
pub async fn probe(backends: &[BackendConfig]) -> Result<Vec<BackendProbe>, String> {
    let mut out = Vec::new();
    for cfg in backends {
        let pool = Pool::new(cfg).map_err(|e| format!("backend {}: {e}", cfg.name))?;
        pool.check_health().await;
        out.push(BackendProbe {
            backend: cfg.name.clone(),
            timeout_ms: u64::try_from(
                (cfg.connect_timeout() + polar_inference::HEALTH_GRACE).as_millis(),
            )
            .unwrap_or(u64::MAX),
            replicas: pool
                .stats()
                .replicas
                .into_iter()
                .map(|r| (r.url, r.healthy))
                .collect(),
        });
    }
    Ok(out)
}

/// The probe's report: one line per replica, then whether every backend
/// has a replica that answered.
pub fn report(probes: &[BackendProbe]) -> String {
    let mut t = String::new();
    if probes.is_empty() {
        t.push_str("probe: no backend configured\n");
        return t;
    }
    for p in probes {
        for (url, ok) in &p.replicas {
            let _ = if *ok {
                writeln!(
                    t,
                    "probe: backend {} replica {url}: GET /health answered",
                    p.backend
                )
            } else {
                writeln!(
                    t,
                    "probe: backend {} replica {url}: GET /health did not answer 2xx within {} ms (not running, wrong address, or not a model server)",
                    p.backend, p.timeout_ms
                )
            };
        }
        if !p.is_up() {
            let _ = writeln!(
                t,
                "probe: backend {} has no healthy replica: a node with this file registers but gets no session until one answers",
                p.backend
            );
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_names_each_replica_and_a_backend_that_is_down() {
        let probes = [
            BackendProbe {
                backend: "policy".into(),
                replicas: vec![
                    ("http://127.0.0.1:8000".into(), true),
                    ("http://127.0.0.1:8001".into(), false),
                ],
                timeout_ms: 7000,
            },
            BackendProbe {
                backend: "judge".into(),
                replicas: vec![("http://127.0.0.1:9000".into(), false)],
                timeout_ms: 7000,
            },
        ];
        assert!(probes[0].is_up() && !probes[1].is_up());
        let text = report(&probes);
        assert_eq!(
            text,
            "probe: backend policy replica http://127.0.0.1:8000: GET /health answered\n\
             probe: backend policy replica http://127.0.0.1:8001: GET /health did not answer 2xx within 7000 ms (not running, wrong address, or not a model server)\n\
             probe: backend judge replica http://127.0.0.1:9000: GET /health did not answer 2xx within 7000 ms (not running, wrong address, or not a model server)\n\
             probe: backend judge has no healthy replica: a node with this file registers but gets no session until one answers\n"
        );
        assert_eq!(report(&[]), "probe: no backend configured\n");
    }
}
