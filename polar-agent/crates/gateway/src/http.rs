//! A gateway node's HTTP side: the routes the server calls
//! (`POST /v1/sessions`, `POST /v1/sessions/{id}/cancel`), the node's own
//! (`GET /v1/status`, `GET /metrics`, `POST /v1/pause`, `POST /v1/resume`,
//! `GET /healthz`), and the status and metrics views they serve.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpListener;

use crate::node::{Inner, lock};
use crate::stages::{Stage, Work};
use polar_rollout_api::http::{Body, bearer, error, json, read_body, token_ok};
use polar_rollout_api::validate;
use polar_rollout_api::{API_VERSION, CancelSession, SessionAssignment};

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
            "draining": self.draining.load(Ordering::Relaxed),
            "paused": self.stages.paused(),
            "max_sessions": self.opts.max_sessions,
            "pools": {"init": l.init, "ready_buffer": l.ready_buffer, "running": l.running, "postrun": l.postrun},
            "by_stage": by_stage,
            "queues": self.stages.loads(),
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

pub(super) async fn accept<W: Work>(inner: Arc<Inner<W>>, listener: TcpListener) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let i = Arc::clone(&inner);
        inner.spawn(async move {
            let service = service_fn(move |req| {
                let i = Arc::clone(&i);
                async move { Ok::<_, Infallible>(handle(i, req).await) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn bad(e: &validate::ValidationError) -> Response<Body> {
    error(
        StatusCode::BAD_REQUEST,
        "invalid_request",
        Some(&e.field),
        &e.to_string(),
    )
}

async fn handle<W: Work>(inner: Arc<Inner<W>>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    if (method.clone(), path.as_str()) == (Method::GET, "/healthz") {
        return json(StatusCode::OK, &json!({"ok": true}));
    }
    if !token_ok(bearer(req.headers()), &inner.opts.accept_tokens) {
        return error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            None,
            "missing or wrong bearer token",
        );
    }
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let Some(bytes) = read_body(req.into_body(), 8 << 20).await else {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            None,
            "body too large",
        );
    };
    match (method, segs.as_slice()) {
        (Method::POST, ["v1", "sessions"]) => match validate::parse::<SessionAssignment>(&bytes) {
            Ok(a) => inner.accept_assignment(a),
            Err(e) => bad(&e),
        },
        (Method::POST, ["v1", "sessions", sid, "cancel"]) => {
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
        (Method::GET, ["v1", "status"]) => json(StatusCode::OK, &inner.status()),
        (Method::GET, ["metrics"]) => Response::builder()
            .header("content-type", "text/plain; version=0.0.4")
            .body(polar_rollout_api::http::full(inner.metrics()))
            .unwrap_or_else(|_| Response::new(polar_rollout_api::http::full(""))),
        (Method::POST, ["v1", "pause"]) => {
            inner.stages.pause();
            inner.work.pause(true);
            tracing::info!("new generations paused");
            json(StatusCode::OK, &json!({"paused": true}))
        }
        (Method::POST, ["v1", "resume"]) => {
            inner.stages.resume();
            inner.work.pause(false);
            tracing::info!("new generations resumed");
            json(StatusCode::OK, &json!({"paused": false}))
        }
        _ => error(StatusCode::NOT_FOUND, "not_found", None, "no route"),
    }
}
