//! A gateway node's HTTP side: the routes the server calls
//! (`POST /v1/sessions`, `POST /v1/sessions/{id}/cancel`), the node's own
//! (`GET /v1/status`, `GET /metrics`, `POST /v1/pause`, `POST /v1/resume`,
//! `GET /healthz`), and the status and metrics views they serve. The table
//! ([`routes`], built once per node) is a `polar_rollout_api::route::Table`:
//! matchit, percent-decoded session ids, 404 for an unknown path, 405 with
//! `Allow` for a known path under another method.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use http::{Method, Request, Response, StatusCode};
use serde_json::json;
use tokio::net::TcpListener;

use crate::node::{Inner, lock};
use crate::stages::{Stage, Work};
use polar_rollout_api::http::{Body, RequestBody, bearer, error, json, read_body, token_ok};
use polar_rollout_api::route::{Found, RouteError, Table, method_not_allowed};
use polar_rollout_api::serve::PeerCert;
use polar_rollout_api::validate;
use polar_rollout_api::{API_VERSION, CancelSession, SessionAssignment};

/// What a route does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Endpoint {
    /// `POST /v1/sessions`: an assignment.
    Assign,
    /// `POST /v1/sessions/{id}/cancel`.
    Cancel,
    /// `GET /v1/status`.
    Status,
    /// `GET /metrics`.
    Metrics,
    /// `POST /v1/pause`.
    Pause,
    /// `POST /v1/resume`.
    Resume,
    /// `GET /healthz`, the one route without a token.
    Healthz,
}

/// The node's route table.
pub(super) type Routes = Table<(), Endpoint>;

/// The node's routes.
pub(super) fn routes() -> Result<Routes, RouteError> {
    use Endpoint as E;
    use Method as M;
    Table::new()
        .route("/v1/sessions", (), &[(M::POST, E::Assign)])?
        .route("/v1/sessions/{id}/cancel", (), &[(M::POST, E::Cancel)])?
        .route("/v1/status", (), &[(M::GET, E::Status)])?
        .route("/metrics", (), &[(M::GET, E::Metrics)])?
        .route("/v1/pause", (), &[(M::POST, E::Pause)])?
        .route("/v1/resume", (), &[(M::POST, E::Resume)])?
        .route("/healthz", (), &[(M::GET, E::Healthz)])
}

impl<W: Work> Inner<W> {
    fn status(&self) -> serde_json::Value {
        let held = lock(&self.held);
        let mut by_stage: std::collections::BTreeMap<&str, u32> =
            Stage::ALL.iter().map(|s| (s.as_str(), 0)).collect();
        let mut sessions: Vec<serde_json::Value> = held
            .values()
            .map(|j| {
                *by_stage.entry(j.stage().as_str()).or_default() += 1;
                json!({
                    "session_id": j.assignment.session_id,
                    "task_id": j.assignment.task_id,
                    "sample_index": j.assignment.sample_index,
                    "attempt": j.assignment.attempt,
                    "stage": j.stage().as_str(),
                    "age_ms": u64::try_from(j.arrived.elapsed().as_millis()).unwrap_or(u64::MAX),
                })
            })
            .collect();
        sessions.sort_by(|a, b| a["session_id"].as_str().cmp(&b["session_id"].as_str()));
        let l = self.stages.limits();
        json!({
            "version": API_VERSION,
            "node_id": self.opts.node_id,
            "address": self.address,
            "server": self.opts.server_url,
            "instance": self.instance,
            "draining": self.is_draining(),
            "paused": self.stages.paused(),
            "max_sessions": self.opts.max_sessions,
            "pools": {"init": l.init, "ready_buffer": l.ready_buffer, "running": l.running, "postrun": l.postrun},
            "by_stage": by_stage,
            "queues": self.stages.loads(),
            "backends": self.work.backends(),
            "finished": self.finished.load(Ordering::Relaxed),
            "reported": self.reported.load(Ordering::Relaxed),
            "sessions": sessions,
        })
    }

    fn metrics(&self) -> String {
        let by_stage: Vec<(&str, u64)> = {
            let held = lock(&self.held);
            Stage::ALL
                .iter()
                .map(|s| {
                    let n = held.values().filter(|j| j.stage() == *s).count();
                    (s.as_str(), n as u64)
                })
                .collect()
        };
        let loads = self.stages.loads();
        let queued: Vec<(&str, u64)> = loads
            .iter()
            .map(|(k, l)| (k.as_str(), u64::from(l.queued)))
            .collect();
        let extra = lock(&self.extra_metrics).clone();
        let mut page = match extra {
            Some(f) => f(&by_stage, &queued),
            None => {
                let mut page = polar_metrics::Text::new();
                polar_metrics::stage_gauges(&mut page, &by_stage, &queued);
                page.finish()
            }
        };
        let mut out = polar_metrics::Text::new();
        out.family(
            "polar_gateway_stage_active",
            "gauge",
            "Workers busy in a stage.",
        );
        for (stage, l) in &loads {
            out.sample("polar_gateway_stage_active", &[("stage", stage)], l.active);
        }
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        out.single(
            "polar_gateway_sessions_finished_total",
            "counter",
            "Sessions that left the pipeline.",
            n(&self.finished),
        );
        out.single(
            "polar_gateway_results_reported_total",
            "counter",
            "Results the server accepted.",
            n(&self.reported),
        );
        out.single(
            "polar_gateway_paused",
            "gauge",
            "Whether new generations are paused.",
            u8::from(self.stages.paused()),
        );
        page.push_str(&out.finish());
        page
    }
}

pub(super) async fn accept<W: Work>(
    inner: Arc<Inner<W>>,
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
) {
    let tasks = inner.tasks.clone();
    let limits = inner.opts.limits;
    polar_rollout_api::serve::serve("gateway", listener, &tasks, limits, tls, move |req| {
        let i = Arc::clone(&inner);
        async move { handle(i, req).await }
    })
    .await;
}

fn bad(e: &validate::ValidationError) -> Response<Body> {
    error(
        StatusCode::BAD_REQUEST,
        "invalid_request",
        Some(&e.field),
        &e.to_string(),
    )
}

/// Handles one request: `GET /healthz` at once; every other request needs
/// the server's token (and, with `gateway.tls.client_ca_file`, a client
/// certificate of that CA: 403 without) and has its body read (at most
/// 8 MiB) before it is routed.
async fn handle<W: Work, B: RequestBody>(inner: Arc<Inner<W>>, req: Request<B>) -> Response<Body> {
    let found = inner.routes.find(req.method(), req.uri().path());
    if let Found::Endpoint {
        endpoint: Endpoint::Healthz,
        ..
    } = found
    {
        return json(StatusCode::OK, &json!({"ok": true}));
    }
    let given = bearer(req.headers());
    // A token not in force may be one the node's files rotated to.
    let taken = token_ok(given, &inner.tokens().accept)
        || (given.is_some()
            && inner
                .reread_tokens("a request presented a token this node does not take")
                .await
            && token_ok(given, &inner.tokens().accept));
    if !taken {
        let is = if given.is_none() {
            "no bearer token was presented (Authorization: Bearer TOKEN)"
        } else {
            "the token presented is not one of them (a trainer's or a node's own token is not)"
        };
        return error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            None,
            &format!(
                "this gateway takes the token the rollout server presents to it (its gateway.accept_tokens: the server's rollout.gateway_token, POLAR_GATEWAY_TOKEN for a trainer's pause and resume); {is}"
            ),
        );
    }
    let certs_required = inner.opts.tls.as_ref().is_some_and(|t| t.client_certs);
    if certs_required && req.extensions().get::<PeerCert>().is_none() {
        return error(
            StatusCode::FORBIDDEN,
            "forbidden",
            None,
            "this gateway requires a client certificate of its client_ca_file",
        );
    }
    let Some(bytes) = read_body(req.into_body(), 8 << 20).await else {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            None,
            "body too large",
        );
    };
    let (endpoint, params) = match found {
        Found::Endpoint {
            endpoint, params, ..
        } => (endpoint, params),
        Found::WrongMethod { allow, .. } => return method_not_allowed(allow),
        Found::NotFound { .. } => {
            return error(StatusCode::NOT_FOUND, "not_found", None, "no route");
        }
    };
    match endpoint {
        Endpoint::Assign => match validate::parse::<SessionAssignment>(&bytes) {
            Ok(a) => inner.accept_assignment(a),
            Err(e) => bad(&e),
        },
        Endpoint::Cancel => {
            let sid = params.get("id").unwrap_or_default();
            match validate::parse::<CancelSession>(&bytes) {
                Ok(c) if inner.cancel_local(sid, Some(c.attempt)) => {
                    json(StatusCode::OK, &json!({"cancelled": true}))
                }
                Ok(_) => error(
                    StatusCode::NOT_FOUND,
                    "not_found",
                    None,
                    "no such session here",
                ),
                Err(e) => bad(&e),
            }
        }
        Endpoint::Status => json(StatusCode::OK, &inner.status()),
        Endpoint::Metrics => Response::builder()
            .header("content-type", "text/plain; version=0.0.4")
            .body(polar_rollout_api::http::full(inner.metrics()))
            .unwrap_or_else(|_| Response::new(polar_rollout_api::http::full(""))),
        Endpoint::Pause => {
            inner.stages.pause();
            inner.work.pause(true);
            tracing::info!("new generations paused");
            json(StatusCode::OK, &json!({"paused": true}))
        }
        Endpoint::Resume => {
            let version = match resume_version(&bytes) {
                Ok(v) => v,
                Err(e) => return bad(&e),
            };
            // The new version first: no call may start under the old one.
            if let Some(v) = &version {
                inner.work.policy_version(v);
                *crate::node::lock(&inner.policy_version) = Some(v.clone());
            }
            inner.stages.resume();
            inner.work.pause(false);
            tracing::info!(policy_version = ?version, "new generations resumed");
            json(
                StatusCode::OK,
                &json!({"paused": false, "policy_version": version}),
            )
        }
        Endpoint::Healthz => json(StatusCode::OK, &json!({"ok": true})),
    }
}

/// The body of `POST /v1/resume`: empty, or `{"policy_version": "..."}`
/// naming the weights the sessions' calls run under from now on.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ResumeBody {
    #[serde(default)]
    policy_version: Option<String>,
}

/// The policy version a resume's body names, if any.
fn resume_version(bytes: &[u8]) -> Result<Option<String>, validate::ValidationError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let body: ResumeBody = validate::parse(bytes)?;
    if let Some(v) = &body.policy_version {
        // As a task's `metadata.policy_version` is checked.
        validate::check_text("policy_version", v, 256)?;
    }
    Ok(body.policy_version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resume_may_name_the_new_policy_version() {
        assert_eq!(resume_version(b"").unwrap(), None);
        assert_eq!(resume_version(b" \n").unwrap(), None);
        assert_eq!(resume_version(b"{}").unwrap(), None);
        assert_eq!(
            resume_version(br#"{"policy_version": "w-43"}"#).unwrap(),
            Some("w-43".into())
        );
        for bad in [
            &br#"{"policy_version": ""}"#[..],
            br#"{"policy_version": 43}"#,
            br#"{"version": "w-43"}"#,
            b"w-43",
        ] {
            assert!(
                resume_version(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// Every route to its endpoint, under its method only.
    #[test]
    fn route_table() {
        let t = routes().unwrap();
        for (m, path, want) in [
            (Method::POST, "/v1/sessions", Endpoint::Assign),
            (Method::POST, "/v1/sessions/t-s1/cancel", Endpoint::Cancel),
            (Method::GET, "/v1/status", Endpoint::Status),
            (Method::GET, "/metrics", Endpoint::Metrics),
            (Method::POST, "/v1/pause", Endpoint::Pause),
            (Method::POST, "/v1/resume", Endpoint::Resume),
            (Method::GET, "/healthz", Endpoint::Healthz),
        ] {
            let Found::Endpoint { endpoint, .. } = t.find(&m, path) else {
                panic!("{m} {path}: no endpoint");
            };
            assert_eq!(endpoint, want, "{m} {path}");
            let other = if m == Method::GET {
                Method::POST
            } else {
                Method::GET
            };
            let Found::WrongMethod { allow, .. } = t.find(&other, path) else {
                panic!("{other} {path}: not a 405");
            };
            assert_eq!(allow, m.as_str(), "{other} {path}");
        }
        for path in [
            "/",
            "/v1",
            "/v1/sessions/x",
            "/v1/sessions/x/state",
            "/v1/tasks",
        ] {
            assert!(
                matches!(t.find(&Method::POST, path), Found::NotFound { .. }),
                "{path}"
            );
        }
        // A percent-encoded session id comes out decoded.
        let Found::Endpoint { params, .. } = t.find(&Method::POST, "/v1/sessions/t%2Ds1/cancel")
        else {
            panic!("no cancel route");
        };
        assert_eq!(params.get("id"), Some("t-s1"));
    }
}
