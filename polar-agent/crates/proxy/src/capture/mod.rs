//! The capture stage: the model pipeline that turns a harness's model call
//! into a call to the team's inference backend, answers in the harness's
//! own API (streamed as generated when it asked for a stream), and records
//! the call at token level in the session's durable log before the last
//! byte of the reply leaves.
//!
//! Per request ([`Capture::call`]):
//! 1. the body is decoded (`content-encoding: gzip` is inflated, within the
//!    body limit and charged to the request's fair share as it inflates;
//!    other encodings are refused with 400) and parsed as JSON;
//! 2. [`provider::detect`] says what it is. Side calls are answered here
//!    ([`side`]): token counts by the backend's tokenizer (an estimate,
//!    labelled, when it cannot count), model lists (the backend's
//!    names), Codex's WebSocket attempt with 426, `HEAD` probes with 200;
//!    anything else goes to the route's `upstream` when it has one, else
//!    gets 404 in the API's error shape;
//! 3. a model call ([`call`]) is parsed into a [`ChatRequest`](polar_chat::ChatRequest)
//!    (400 in the API's shape when that fails), extended with the session's
//!    own history for `previous_response_id`, sent to the route's backend
//!    (the session id keeps it on one replica; the backend config maps the
//!    model name and sets sampling), and answered: a stream event by event
//!    ([`reply`]), or one body;
//! 4. the [`CompletionRecord`](polar_record::CompletionRecord) is
//!    appended to the session log and synced before the final bytes (the
//!    last stream event or the whole body) are released. Failures are
//!    recorded too, as `failed` with the side at fault.
//!
//! Routes without a backend are forwarded whole by the [`Forward`] stage.

mod call;
mod decode;
mod errors;
mod reply;
mod side;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use http::Response;

use polar_capture::CaptureStore;
use polar_chat::Api;
use polar_chat::provider::{self, Detected};
use polar_config::{Config, ProviderHint};
use polar_ids::SessionId;
use polar_inference::{BackendConfig, Client, InferenceError};
use polar_io::tasks::Tasks;
use polar_json::{Doc, Json};

use super::body::ProxyBody;
use super::error::ProxyError;
use super::forward::Forward;
use super::pipeline::{ModelPipeline, ModelRequest, RequestContext, ResponseFuture};

pub use errors::provider_error;

/// Session id used for calls that arrive without one.
pub const UNATTRIBUTED: &str = "unattributed";

/// Errors setting up the capture stage.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// A backend's client could not be built.
    #[error(transparent)]
    Backend(#[from] InferenceError),
    /// The forwarding stage could not be built.
    #[error(transparent)]
    Forward(#[from] ProxyError),
}

/// The capture stage.
pub struct Capture {
    backends: HashMap<Arc<str>, Client>,
    store: Arc<CaptureStore>,
    forward: Option<Arc<Forward>>,
    tasks: Tasks,
    max_body_bytes: u64,
}

impl Capture {
    /// A stage over `backends`, logging to `store`, forwarding with
    /// `forward` (routes without a backend, side traffic with an upstream),
    /// running streamed replies as tasks of `tasks`.
    pub fn new(
        backends: &[BackendConfig],
        store: Arc<CaptureStore>,
        forward: Option<Arc<Forward>>,
        tasks: Tasks,
        max_body_bytes: u64,
    ) -> Result<Self, CaptureError> {
        let backends = backends
            .iter()
            .map(|b| Ok((Arc::from(b.name.as_str()), Client::new(b.clone())?)))
            .collect::<Result<HashMap<_, _>, InferenceError>>()?;
        Ok(Self {
            backends,
            store,
            forward,
            tasks,
            max_body_bytes,
        })
    }

    /// The stage for a validated configuration, with the forwarding stage.
    pub fn from_config(
        config: &Config,
        store: Arc<CaptureStore>,
        tasks: Tasks,
    ) -> Result<Self, CaptureError> {
        let forward = Arc::new(Forward::new(Duration::from_secs(600))?);
        Self::new(
            &config.backends,
            store,
            Some(forward),
            tasks,
            config.proxy.max_body_bytes,
        )
    }

    /// The client of backend `name`.
    pub fn backend(&self, name: &str) -> Option<&Client> {
        self.backends.get(name)
    }

    /// Every backend's client (for pause/resume and statistics).
    pub fn backends(&self) -> impl Iterator<Item = &Client> {
        self.backends.values()
    }

    /// Starts the health checks of every backend's replicas.
    pub fn spawn_health_checks(&self) {
        for c in self.backends.values() {
            c.pool().spawn_health_checks(&self.tasks);
        }
    }

    /// Ends `session`'s capture: its log closed, and what the backends'
    /// clients keep of it (token-faithful chains) dropped.
    pub fn end_session(&self, session: &SessionId) {
        self.store.close(session);
        for c in self.backends.values() {
            c.end_session(session.as_str());
        }
    }

    /// The capture store.
    pub fn store(&self) -> &Arc<CaptureStore> {
        &self.store
    }

    async fn serve(self: Arc<Self>, ctx: RequestContext, req: ModelRequest) -> Response<ProxyBody> {
        if ctx.backend.is_none() {
            return self.forward_or_404(ctx, req, None).await;
        }
        let hinted = api_of_hint(ctx.provider);
        let decoded = match decode::body(
            &req.head.headers,
            &req.body,
            self.max_body_bytes,
            &req.charge,
        ) {
            Ok(d) => d,
            Err(e) => {
                let api = super::http::api_of(&req.head.method, &req.head.uri, &req.head.headers);
                return errors::respond(api.unwrap_or(hinted), &e);
            }
        };
        let path = req
            .head
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let doc = decoded.parse();
        let root = match &doc {
            Ok(Some(d)) => d.root(),
            _ => Json::null(),
        };
        let detected = provider::detect(req.head.method.as_str(), &path, &req.head.headers, &root);
        match detected {
            Detected::Side(side_call) => {
                let json = root.to_value();
                self.side(ctx, req, side_call, &json).await
            }
            Detected::Model(model_call) => {
                let body = call::Body {
                    bytes: &decoded.bytes,
                    json: doc
                        .as_ref()
                        .map(|d| d.as_ref().map_or_else(Json::null, Doc::root)),
                };
                call::run(Arc::clone(&self), ctx, req.head, body, model_call, path).await
            }
        }
    }

    fn session_of(ctx: &RequestContext) -> SessionId {
        ctx.session
            .clone()
            .unwrap_or_else(|| UNATTRIBUTED.parse().unwrap_or_else(|_| SessionId::random()))
    }
}

/// The API whose error shape fits a route's provider hint.
fn api_of_hint(hint: ProviderHint) -> Api {
    match hint {
        ProviderHint::Anthropic => Api::AnthropicMessages,
        ProviderHint::OpenAiResponses => Api::OpenaiResponses,
        ProviderHint::Gemini => Api::Gemini,
        ProviderHint::Auto | ProviderHint::OpenAi => Api::OpenaiChat,
    }
}

impl ModelPipeline for Capture {
    fn call(self: Arc<Self>, ctx: RequestContext, req: ModelRequest) -> ResponseFuture {
        Box::pin(self.serve(ctx, req))
    }
}
