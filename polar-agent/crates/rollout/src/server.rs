//! The rollout server's HTTP side: the accept loop (`polar_rollout_api::
//! serve`: HTTP/1.1 with keep-alive, header-read timeout, connection cap)
//! and [`Api::handle`], which looks the request up in the route
//! table ([`routes`], built once per server), checks the bearer token of
//! the path's side, and maps every failure to a status and an error body.
//! The routes are listed in docs/ROLLOUT-API.md; routing itself
//! (`matchit`, percent-decoding) is `route.rs`.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::broadcast::error::RecvError;

use super::core::Core;
use super::scheduler::{DeleteError, HeartbeatError, ReportError, SubmitError};
use super::store::StoreError;
use polar_rollout_api::http::{Body, RequestBody, bearer, error, json, read_body, token_ok};
use polar_rollout_api::route::{Found, Params, RouteError, Table, method_not_allowed, query};
use polar_rollout_api::serve::PeerCert;
use polar_rollout_api::sse;
use polar_rollout_api::validate::{self, ValidationError};
use polar_rollout_api::{
    API_VERSION, DrainReply, DrainRequest, Heartbeat, MAX_LIVE_CALLS, NodeList, NodeRegistration,
    ServerStatus, SessionProgress, SessionResult, TaskList, TaskRequest, TaskStatus,
};

/// Who may call a route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Anyone (`/health`, the dashboard's static files).
    Open,
    /// Trainers; viewers (read-only tokens) for `GET` only.
    Client,
    /// Gateways.
    Node,
    /// Either.
    Any,
}

/// What a route does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `GET /health`.
    Health,
    /// `GET /metrics`.
    Metrics,
    /// `GET /v1/status`.
    Status,
    /// `POST /v1/tasks`.
    Submit,
    /// `GET /v1/tasks`.
    List,
    /// `GET /v1/tasks/{id}`.
    Task,
    /// `POST /v1/tasks/{id}/cancel`.
    Cancel,
    /// `DELETE /v1/tasks/{id}`.
    Delete,
    /// `GET /v1/events`.
    Events,
    /// `GET /v1/nodes`.
    Nodes,
    /// `POST /v1/nodes/register`.
    Register,
    /// `POST /v1/nodes/{id}/heartbeat`.
    Heartbeat,
    /// `POST /v1/nodes/{id}/drain`.
    Drain,
    /// `POST /v1/sessions/{id}/state`.
    Progress,
    /// `POST /v1/sessions/{id}/result`.
    Result,
    /// `GET /ui`, `/ui/`, `/ui/{*path}`: the dashboard's files.
    Ui,
    /// `GET /v1/whoami`.
    WhoAmI,
    /// `GET /v1/tasks/{id}/samples/{index}`.
    Sample,
    /// `GET /v1/tasks/{id}/samples/{index}/trajectory`.
    Trajectory,
    /// `GET /v1/tasks/{id}/samples/{index}/calls`.
    Calls,
    /// `POST /v1/nodes/{id}/pause`.
    Pause,
    /// `POST /v1/nodes/{id}/resume`.
    Resume,
}

/// The server's route table: who may call each path, and its endpoints.
pub type Routes = Table<Role, Endpoint>;

/// The routes of docs/ROLLOUT-API.md. Paths under `/v1/sessions` are the
/// gateways' even where there is no route, so a trainer's token gets 401
/// there; every other unknown path is the trainers' side.
pub fn routes() -> Result<Routes, RouteError> {
    use Endpoint as E;
    use Method as M;
    Table::new()
        .route("/health", Role::Open, &[(M::GET, E::Health)])?
        .route("/ui", Role::Open, &[(M::GET, E::Ui)])?
        .route("/ui/", Role::Open, &[(M::GET, E::Ui)])?
        .route("/ui/{*path}", Role::Open, &[(M::GET, E::Ui)])?
        .route("/v1/whoami", Role::Client, &[(M::GET, E::WhoAmI)])?
        .route("/metrics", Role::Client, &[(M::GET, E::Metrics)])?
        .route("/v1/status", Role::Client, &[(M::GET, E::Status)])?
        .route(
            "/v1/tasks",
            Role::Client,
            &[(M::POST, E::Submit), (M::GET, E::List)],
        )?
        .route(
            "/v1/tasks/{id}",
            Role::Client,
            &[(M::GET, E::Task), (M::DELETE, E::Delete)],
        )?
        .route(
            "/v1/tasks/{id}/cancel",
            Role::Client,
            &[(M::POST, E::Cancel)],
        )?
        .route(
            "/v1/tasks/{id}/samples/{index}",
            Role::Client,
            &[(M::GET, E::Sample)],
        )?
        .route(
            "/v1/tasks/{id}/samples/{index}/trajectory",
            Role::Client,
            &[(M::GET, E::Trajectory)],
        )?
        .route(
            "/v1/tasks/{id}/samples/{index}/calls",
            Role::Client,
            &[(M::GET, E::Calls)],
        )?
        .route("/v1/events", Role::Client, &[(M::GET, E::Events)])?
        .route("/v1/nodes", Role::Any, &[(M::GET, E::Nodes)])?
        .route("/v1/nodes/register", Role::Node, &[(M::POST, E::Register)])?
        .route(
            "/v1/nodes/{id}/heartbeat",
            Role::Node,
            &[(M::POST, E::Heartbeat)],
        )?
        .route("/v1/nodes/{id}/drain", Role::Any, &[(M::POST, E::Drain)])?
        .route("/v1/nodes/{id}/pause", Role::Client, &[(M::POST, E::Pause)])?
        .route(
            "/v1/nodes/{id}/resume",
            Role::Client,
            &[(M::POST, E::Resume)],
        )?
        .route(
            "/v1/sessions/{id}/state",
            Role::Node,
            &[(M::POST, E::Progress)],
        )?
        .route(
            "/v1/sessions/{id}/result",
            Role::Node,
            &[(M::POST, E::Result)],
        )?
        .route("/v1/sessions", Role::Node, &[])?
        .route("/v1/sessions/{id}", Role::Node, &[])?
        .route("/v1/sessions/{id}/{*rest}", Role::Node, &[])
}

/// The API of a running server: its state and its route table.
#[derive(Debug)]
pub struct Api {
    core: Arc<Core>,
    routes: Routes,
}

/// Why a request failed: one place maps causes to statuses.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Missing or wrong bearer token (401): which token the endpoint
    /// needs, and what the one presented is, if anything (never the
    /// token itself).
    #[error("{0}")]
    Unauthorized(String),
    /// A node's token used for another node (403).
    #[error("{0}")]
    Forbidden(String),
    /// A bad body or parameter (400), naming the field.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// The body is larger than allowed (413).
    #[error("body larger than {0} bytes")]
    TooLarge(usize),
    /// No such task, node, session or route (404).
    #[error("{0}")]
    NotFound(String),
    /// The method is not allowed on this path (405): `Allow` lists those
    /// that are.
    #[error("method not allowed")]
    Method(HeaderValue),
    /// A conflict (409): duplicate task, stale report, wrong instance.
    #[error("{message}")]
    Conflict {
        /// The error code.
        code: &'static str,
        /// For people.
        message: String,
    },
    /// The database failed (503): nothing was acknowledged.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An exported file the dashboard asked for was not read.
    #[error(transparent)]
    Export(#[from] crate::ui::exports::ExportReadError),
    /// A gateway did not take a forwarded pause or resume (502).
    #[error("{0}")]
    Gateway(String),
    /// A bug (500).
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    fn response(&self) -> Response<Body> {
        let msg = self.to_string();
        match self {
            Self::Unauthorized(_) => error(StatusCode::UNAUTHORIZED, "unauthorized", None, &msg),
            Self::Forbidden(_) => error(StatusCode::FORBIDDEN, "forbidden", None, &msg),
            Self::Invalid(v) => error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                Some(&v.field),
                &msg,
            ),
            Self::TooLarge(_) => error(StatusCode::PAYLOAD_TOO_LARGE, "too_large", None, &msg),
            Self::NotFound(_) => error(StatusCode::NOT_FOUND, "not_found", None, &msg),
            Self::Method(allow) => method_not_allowed(allow),
            Self::Conflict { code, .. } => error(StatusCode::CONFLICT, code, None, &msg),
            Self::Store(_) => error(StatusCode::SERVICE_UNAVAILABLE, "storage", None, &msg),
            Self::Export(e) => {
                use crate::ui::exports::ExportReadError as X;
                let (status, code) = match e {
                    X::NoFile(_) | X::NoCalls(_) | X::Missing { .. } => {
                        (StatusCode::NOT_FOUND, "not_found")
                    }
                    X::NoRoots
                    | X::NotLocal(_)
                    | X::Outside(_)
                    | X::Format(_)
                    | X::NoS3Roots(_)
                    | X::BadS3 { .. }
                    | X::OutsideS3(_) => (StatusCode::NOT_FOUND, "not_readable"),
                    X::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
                    X::Store { .. } => (StatusCode::BAD_GATEWAY, "export_store"),
                    X::Decode { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "unreadable_export"),
                };
                error(status, code, None, &msg)
            }
            Self::Gateway(_) => error(StatusCode::BAD_GATEWAY, "gateway", None, &msg),
            Self::Internal(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "internal", None, &msg),
        }
    }
}

impl From<ReportError> for ApiError {
    fn from(e: ReportError) -> Self {
        match e {
            ReportError::UnknownSession(_) => Self::NotFound(e.to_string()),
            ReportError::Stale { .. } => Self::Conflict {
                code: "stale_attempt",
                message: e.to_string(),
            },
        }
    }
}

impl Api {
    /// The API over `core` with `routes` (see [`routes`]).
    pub fn new(core: Arc<Core>, routes: Routes) -> Self {
        Self { core, routes }
    }

    /// Handles one request.
    pub async fn handle<B: RequestBody>(&self, req: Request<B>) -> Response<Body> {
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        let started = Instant::now();
        let resp = match self.route(req).await {
            Ok(r) => r,
            Err(e) => {
                if matches!(e, ApiError::Store(_) | ApiError::Internal(_)) {
                    tracing::error!(%method, %path, error = %e, "request failed");
                }
                e.response()
            }
        };
        tracing::debug!(%method, %path, status = resp.status().as_u16(), micros = started.elapsed().as_micros() as u64, "rollout request");
        resp
    }

    async fn route<B: RequestBody>(&self, req: Request<B>) -> Result<Response<Body>, ApiError> {
        let found = self.routes.find(req.method(), req.uri().path());
        let role = found.data().copied().unwrap_or(Role::Client);
        let caller = authorize(&self.core, &req, role)?;
        match found {
            Found::Endpoint {
                endpoint, params, ..
            } => call(&self.core, &caller, endpoint, &params, req).await,
            Found::WrongMethod { allow, .. } => Err(ApiError::Method(allow.clone())),
            Found::NotFound { .. } => {
                Err(ApiError::NotFound(format!("no route {}", req.uri().path())))
            }
        }
    }
}

/// Serves the API on `listener` (over TLS with `tls`) until the core
/// shuts down (the accept loop, its header-read timeout and connection
/// cap are `polar_rollout_api::serve`'s, shared with the gateway).
pub async fn serve(api: Arc<Api>, listener: TcpListener, tls: Option<Arc<rustls::ServerConfig>>) {
    let tasks = api.core.tasks.clone();
    let limits = api.core.cfg.limits;
    polar_rollout_api::serve::serve("rollout", listener, &tasks, limits, tls, move |req| {
        let api = Arc::clone(&api);
        async move { api.handle(req).await }
    })
    .await;
}

/// Who is calling, from the bearer token.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Caller {
    /// No token needed (`/health`).
    Anyone,
    /// A trainer token.
    Trainer,
    /// A read-only (viewer) token, on a `GET`.
    Viewer,
    /// The token bound to this node id.
    Node(String),
}

impl Caller {
    /// A node may speak only for itself (403 otherwise); trainers for any
    /// node where the route lets them.
    fn may_speak_for(&self, node_id: &str) -> Result<(), ApiError> {
        match self {
            Self::Node(n) if n != node_id => Err(ApiError::Forbidden(format!(
                "this token belongs to node {n:?}, not {node_id:?}"
            ))),
            _ => Ok(()),
        }
    }
}

fn authorize<B>(core: &Core, req: &Request<B>, role: Role) -> Result<Caller, ApiError> {
    if role == Role::Open {
        return Ok(Caller::Anyone);
    }
    let Some(given) = bearer(req.headers()) else {
        return Err(ApiError::Unauthorized(format!(
            "this endpoint needs {}; no bearer token was presented (Authorization: Bearer TOKEN)",
            needs(role)
        )));
    };
    let auth = core.auth();
    let trainer = token_ok(Some(given), &auth.tokens);
    let node = auth.node_of(given).map(str::to_owned);
    let reading = matches!(*req.method(), Method::GET | Method::HEAD);
    match (role, trainer, node) {
        (Role::Client | Role::Any, true, _) => Ok(Caller::Trainer),
        (Role::Client | Role::Any, false, None) if token_ok(Some(given), &auth.viewer_tokens) => {
            if reading {
                Ok(Caller::Viewer)
            } else {
                Err(ApiError::Forbidden(
                    "this token is read-only (rollout.viewer_tokens): it may not change tasks or nodes"
                        .into(),
                ))
            }
        }
        (Role::Node | Role::Any, _, Some(n)) => {
            if core.cfg.tls.client_ca_file.is_some() {
                node_certificate(req, &n)?;
            }
            Ok(Caller::Node(n))
        }
        (_, trainer, node) => {
            let is = if trainer {
                "a trainer token".to_owned()
            } else if let Some(n) = node {
                format!("the node token of {n:?}")
            } else if token_ok(Some(given), &auth.viewer_tokens) {
                "a viewer token (read-only)".to_owned()
            } else if token_ok(Some(given), std::slice::from_ref(&auth.gateway_token)) {
                "the gateway token (rollout.gateway_token: what this server presents to gateways, not a token it accepts)".to_owned()
            } else {
                "not a token this server accepts".to_owned()
            };
            Err(ApiError::Unauthorized(format!(
                "this endpoint needs {}; the token presented is {is}",
                needs(role)
            )))
        }
    }
}

/// The token a route's role takes, for error messages.
fn needs(role: Role) -> &'static str {
    match role {
        Role::Client => {
            "a trainer token (rollout.tokens, POLAR_ROLLOUT_TOKEN), or a viewer token for GET"
        }
        Role::Node => "the node's own token (rollout.node_tokens)",
        Role::Any | Role::Open => "a trainer token or a node's own token",
    }
}

/// With client certificates configured, a node's token is taken only with
/// a certificate of the cluster CA (verified in the handshake) that names
/// the node id among its DNS names.
fn node_certificate<B>(req: &Request<B>, node: &str) -> Result<(), ApiError> {
    let Some(cert) = req.extensions().get::<PeerCert>() else {
        return Err(ApiError::Forbidden(format!(
            "node {node:?}: no client certificate (this server requires nodes to present \
             one of the cluster CA naming their node id)"
        )));
    };
    let names = cert.dns_names();
    if names.iter().any(|n| n == node) {
        return Ok(());
    }
    Err(ApiError::Forbidden(format!(
        "node {node:?}: the client certificate names {names:?}, not this node"
    )))
}

async fn body<T: DeserializeOwned>(
    core: &Core,
    req: Request<impl RequestBody>,
) -> Result<T, ApiError> {
    let limit = core.cfg.max_body_bytes;
    let bytes = read_body(req.into_body(), limit)
        .await
        .ok_or(ApiError::TooLarge(limit))?;
    let bytes = if bytes.iter().all(u8::is_ascii_whitespace) {
        Bytes::from_static(b"{}")
    } else {
        bytes
    };
    Ok(validate::parse(&bytes)?)
}

/// Runs an endpoint; `id` is the path's (percent-decoded) parameter.
async fn call<B: RequestBody>(
    core: &Arc<Core>,
    caller: &Caller,
    endpoint: Endpoint,
    params: &Params<'_>,
    req: Request<B>,
) -> Result<Response<Body>, ApiError> {
    let id = params.get("id").unwrap_or_default();
    match endpoint {
        Endpoint::Ui => Ok(crate::ui::asset(params.get("path").unwrap_or_default())),
        Endpoint::WhoAmI => Ok(crate::ui::whoami(*caller == Caller::Trainer)),
        Endpoint::Sample => {
            crate::ui::sample(core, id, params.get("index").unwrap_or_default()).await
        }
        Endpoint::Trajectory => {
            crate::ui::trajectory(core, id, params.get("index").unwrap_or_default()).await
        }
        Endpoint::Calls => {
            crate::ui::calls::calls(core, id, params.get("index").unwrap_or_default()).await
        }
        Endpoint::Pause => generation(core, id, true, req).await,
        Endpoint::Resume => generation(core, id, false, req).await,
        Endpoint::Health => Ok(json(
            StatusCode::OK,
            &json!({"status": "ok", "version": API_VERSION}),
        )),
        Endpoint::Metrics => metrics(core).await,
        Endpoint::Status => Ok(json(StatusCode::OK, &status(core).await?)),
        Endpoint::Submit => submit(core, req).await,
        Endpoint::List => list(core, &req).await,
        Endpoint::Task => core
            .read(|s| s.task_view(id, true))
            .await?
            .map(|v| json(StatusCode::OK, &v))
            .ok_or_else(|| ApiError::NotFound(format!("unknown task {id:?}"))),
        Endpoint::Cancel => cancel(core, id).await,
        Endpoint::Delete => {
            core.apply(|s, _, _| s.delete(id))
                .await?
                .map_err(|e| match e {
                    DeleteError::Unknown(_) => ApiError::NotFound(e.to_string()),
                    DeleteError::NotFinished { .. } => ApiError::Conflict {
                        code: "task_not_finished",
                        message: e.to_string(),
                    },
                })?;
            Ok(json(
                StatusCode::OK,
                &json!({"version": API_VERSION, "task_id": id, "deleted": true}),
            ))
        }
        Endpoint::Events => Ok(events(core, &req)),
        Endpoint::Nodes => Ok(json(
            StatusCode::OK,
            &NodeList {
                version: API_VERSION,
                nodes: core.read(|s| s.node_views(Instant::now())).await?,
            },
        )),
        Endpoint::Register => register(core, caller, req).await,
        Endpoint::Heartbeat => {
            caller.may_speak_for(id)?;
            heartbeat(core, id, req).await
        }
        Endpoint::Drain => {
            caller.may_speak_for(id)?;
            drain(core, id, req).await
        }
        Endpoint::Progress => {
            let p: SessionProgress = body(core, req).await?;
            caller.may_speak_for(&p.node_id)?;
            if p.calls.len() > MAX_LIVE_CALLS || !p.calls.iter().all(Value::is_object) {
                return Err(ApiError::Invalid(ValidationError {
                    field: "calls".into(),
                    reason: format!("at most {MAX_LIVE_CALLS} objects per report"),
                }));
            }
            // Live calls are published, not committed: the result's list
            // supersedes them.
            if let Some(ev) = core.apply(|s, _, _| s.progress(id, &p)).await?? {
                core.hub.publish(vec![ev]);
            }
            Ok(json(StatusCode::OK, &json!({"version": API_VERSION})))
        }
        Endpoint::Result => {
            let r: SessionResult = body(core, req).await?;
            caller.may_speak_for(&r.node_id)?;
            core.apply(|s, now, wall| s.result(id, &r, now, wall))
                .await??;
            Ok(json(StatusCode::OK, &json!({"version": API_VERSION})))
        }
    }
}

async fn submit<B: RequestBody>(
    core: &Arc<Core>,
    req: Request<B>,
) -> Result<Response<Body>, ApiError> {
    let task: TaskRequest = body(core, req).await?;
    validate::check_task_with(&task, core.cfg.policy.as_ref())?;
    if let Some(url) = &task.callback_url {
        core.cfg
            .tls
            .check_target(url)
            .map_err(|reason| ValidationError {
                field: "callback_url".into(),
                reason,
            })?;
    }
    let id = task.task_id.clone();
    let reply = core
        .apply(move |s, now, wall| s.submit(task, now, wall))
        .await?
        .map_err(|e| match e {
            SubmitError::Duplicate(_) => ApiError::Conflict {
                code: "duplicate_task",
                message: e.to_string(),
            },
        })?;
    tracing::info!(task = %id, samples = reply.session_ids.len(), "task submitted");
    Ok(json(StatusCode::CREATED, &reply))
}

async fn list<B>(core: &Arc<Core>, req: &Request<B>) -> Result<Response<Body>, ApiError> {
    let q = req.uri().query();
    let status = match query(q, "status").as_deref() {
        None | Some("") => None,
        Some(s) => Some(s.parse::<TaskStatus>().map_err(|reason| ValidationError {
            field: "status".into(),
            reason,
        })?),
    };
    let limit = match query(q, "limit") {
        None => 1000,
        Some(l) => l.parse::<usize>().map_err(|_| ValidationError {
            field: "limit".into(),
            reason: "must be a number".into(),
        })?,
    };
    let tasks = core.read(|s| s.list(status, limit)).await?;
    Ok(json(
        StatusCode::OK,
        &TaskList {
            version: API_VERSION,
            tasks,
        },
    ))
}

async fn cancel(core: &Arc<Core>, id: &str) -> Result<Response<Body>, ApiError> {
    let found = core
        .apply(|s, now, wall| s.cancel(id, "cancelled by the caller", now, wall))
        .await?;
    if found.is_none() {
        return Err(ApiError::NotFound(format!("unknown task {id:?}")));
    }
    let view = core
        .read(|s| s.task_view(id, false))
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("unknown task {id:?}")))?;
    Ok(json(StatusCode::OK, &view))
}

async fn register<B: RequestBody>(
    core: &Arc<Core>,
    caller: &Caller,
    req: Request<B>,
) -> Result<Response<Body>, ApiError> {
    let reg: NodeRegistration = body(core, req).await?;
    validate::check_registration(&reg)?;
    caller.may_speak_for(&reg.node_id)?;
    core.cfg
        .tls
        .check_target(&reg.address)
        .map_err(|reason| ValidationError {
            field: "address".into(),
            reason,
        })?;
    // Before the change: its first pushes follow the commit at once.
    core.note_address(&reg.node_id, &reg.address);
    let mut reply = core
        .apply(move |s, now, wall| s.register(reg, now, wall))
        .await?;
    reply.heartbeat_interval_ms =
        u64::try_from(core.cfg.heartbeat_interval.as_millis()).unwrap_or(u64::MAX);
    Ok(json(StatusCode::OK, &reply))
}

async fn heartbeat<B: RequestBody>(
    core: &Arc<Core>,
    id: &str,
    req: Request<B>,
) -> Result<Response<Body>, ApiError> {
    let hb: Heartbeat = body(core, req).await?;
    let reply = core.apply(|s, now, _| s.heartbeat(id, hb, now)).await?;
    match reply {
        Ok(r) => Ok(json(StatusCode::OK, &r)),
        Err(e @ HeartbeatError::UnknownNode(_)) => Err(ApiError::NotFound(e.to_string())),
        Err(e @ HeartbeatError::WrongInstance { .. }) => Err(ApiError::Conflict {
            code: "wrong_instance",
            message: e.to_string(),
        }),
    }
}

async fn drain<B: RequestBody>(
    core: &Arc<Core>,
    id: &str,
    req: Request<B>,
) -> Result<Response<Body>, ApiError> {
    let d: DrainRequest = body(core, req).await?;
    let found = core.apply(|s, now, _| s.drain(id, d.draining, now)).await?;
    if !found {
        return Err(ApiError::NotFound(format!("unknown node {id:?}")));
    }
    Ok(json(
        StatusCode::OK,
        &DrainReply {
            version: API_VERSION,
            node_id: id.to_owned(),
            draining: d.draining,
        },
    ))
}

/// `POST /v1/nodes/{id}/pause` and `/resume`: forwarded to the node's
/// own `POST /v1/pause` or `/v1/resume` with the server's gateway token
/// (a resume's body, `{"policy_version"}`, as given); the node's reply
/// status is the answer (502 when it did not take it).
async fn generation<B: RequestBody>(
    core: &Arc<Core>,
    id: &str,
    pause: bool,
    req: Request<B>,
) -> Result<Response<Body>, ApiError> {
    let limit = core.cfg.max_body_bytes;
    let body = read_body(req.into_body(), limit)
        .await
        .ok_or(ApiError::TooLarge(limit))?;
    let address = core
        .read(|s| {
            s.node_views(Instant::now())
                .into_iter()
                .find(|n| n.node_id == id)
                .map(|n| n.address)
        })
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("unknown node {id:?}")))?;
    let what = if pause { "pause" } else { "resume" };
    let url = polar_rollout_api::http::join(&address, &format!("/v1/{what}"));
    match core.post(&url, body.to_vec(), core.cfg.push_timeout).await {
        Ok(s) if s.is_success() => {
            tracing::info!(node = %id, what, "generation {what} forwarded");
            Ok(json(
                StatusCode::OK,
                &json!({"version": API_VERSION, "node_id": id, "paused": pause}),
            ))
        }
        Ok(s) => Err(ApiError::Gateway(format!(
            "node {id:?} answered {s} to the {what}"
        ))),
        Err(e) => Err(ApiError::Gateway(format!(
            "node {id:?} did not take the {what}: {e}"
        ))),
    }
}

async fn status(core: &Arc<Core>) -> Result<ServerStatus, StoreError> {
    let (tasks, sessions, nodes) = core
        .read(|s| {
            let (t, se) = s.totals();
            (t, se, s.node_views(Instant::now()))
        })
        .await?;
    Ok(ServerStatus {
        version: API_VERSION,
        server_version: env!("CARGO_PKG_VERSION").to_owned(),
        uptime_secs: core.started.elapsed().as_secs(),
        tasks,
        sessions,
        nodes,
    })
}

async fn metrics(core: &Arc<Core>) -> Result<Response<Body>, ApiError> {
    let (tasks, sessions, nodes, counters, queued) = core
        .read(|s| {
            let (t, se) = s.totals();
            (
                t,
                se,
                s.node_views(Instant::now()),
                s.counters(),
                s.queued(),
            )
        })
        .await?;
    let text = core
        .metrics
        .render(&tasks, &sessions, &nodes, counters, queued);
    let mut resp = Response::new(polar_rollout_api::http::full(text));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    Ok(resp)
}

/// `GET /v1/events`: the kept events after `Last-Event-ID` (or `?after=`),
/// then live ones; `?task_id=` keeps one task's. A `: ping` comment every
/// 15 s keeps proxies from closing the stream.
fn events<B>(core: &Arc<Core>, req: &Request<B>) -> Response<Body> {
    let q = req.uri().query();
    let after = req
        .headers()
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(Cow::Borrowed)
        .or_else(|| query(q, "after"))
        .and_then(|v| v.parse::<u64>().ok());
    let task_filter = query(q, "task_id").map(Cow::into_owned);
    let (backlog, mut rx) = core.hub.subscribe(after);
    let (tx, body) = sse::channel();
    core.spawn(async move {
        let keep = |n: &super::events::Numbered| match (&task_filter, &n.event) {
            (None, _) => true,
            (Some(t), super::events::Event::Task { task_id, .. })
            | (Some(t), super::events::Event::Session { task_id, .. })
            | (Some(t), super::events::Event::Calls { task_id, .. }) => t == task_id,
            (Some(_), super::events::Event::Node { .. }) => false,
        };
        if !tx
            .send(Bytes::from_static(b": polar rollout events\n\n"))
            .await
        {
            return;
        }
        for n in backlog.iter().filter(|n| keep(n)) {
            if !tx.send(Bytes::from(n.to_sse())).await {
                return;
            }
        }
        let mut ping = tokio::time::interval(Duration::from_secs(15));
        ping.tick().await;
        loop {
            let frame = tokio::select! {
                _ = ping.tick() => Bytes::from_static(b": ping\n\n"),
                r = rx.recv() => match r {
                    Ok(n) if keep(&n) => Bytes::from(n.to_sse()),
                    Ok(_) => continue,
                    Err(RecvError::Lagged(missed)) => Bytes::from(format!(
                        "event: lagged\ndata: {{\"missed\":{missed}}}\n\n"
                    )),
                    Err(RecvError::Closed) => return,
                },
            };
            if !tx.send(frame).await {
                return;
            }
        }
    });
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}
