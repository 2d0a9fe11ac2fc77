//! Side calls on a model route, answered without the backend:
//!
//! | request | answer |
//! | --- | --- |
//! | token counting (Anthropic `count_tokens`, Gemini `countTokens`) | the backend's count of the conversation with its tokenizer and served chat template ([`Client::count_tokens`](polar_inference::Client::count_tokens)), marked `x-polar-token-count: backend`; when the backend cannot count (no tokenize endpoint, unreachable, an error), an estimate (bytes / 4) marked `x-polar-token-count: estimate-bytes/4` |
//! | model listing (`GET .../models`) | the backend's names (its `model_map` keys and `served_model`) in the API's shape |
//! | Codex's WebSocket attempt (`GET /v1/responses`) | 426, so it falls back to HTTP streaming |
//! | `HEAD` anything (connectivity probes) | 200, empty |
//! | anything else | forwarded to the route's `upstream` when it has one, else 404 in the API's error shape |

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Response, StatusCode};
use serde_json::Value;

use polar_chat::Api;
use polar_chat::provider::canned::{self, CannedResponse, CountSource};
use polar_chat::provider::{ErrorKind, ProviderError, Side, SideCall};
use polar_config::ProviderHint;

use super::super::body::{ProxyBody, full};
use super::super::http::api_of;
use super::super::pipeline::{ModelRequest, RequestContext};
use super::{Capture, api_of_hint, errors};

impl Capture {
    pub(super) async fn side(
        self: Arc<Self>,
        ctx: RequestContext,
        req: ModelRequest,
        call: SideCall,
        json: &Value,
    ) -> Response<ProxyBody> {
        match call {
            SideCall::CountTokens { api } => self.count_tokens(&ctx, &req, api, json).await,
            SideCall::ListModels { api } => {
                let names = self.model_names(&ctx);
                canned_response(canned::list_models(api, &names))
            }
            SideCall::ResponsesWebsocket => canned_response(canned::websocket_refusal()),
            SideCall::Other => {
                let path = req.head.uri.path().to_owned();
                self.forward_or_404(ctx, req, Some(path)).await
            }
        }
    }

    /// A token count: the backend's, else the labelled estimate. A body
    /// that is no conversation is the harness's error (400 in its shape).
    async fn count_tokens(
        &self,
        ctx: &RequestContext,
        req: &ModelRequest,
        api: Api,
        json: &Value,
    ) -> Response<ProxyBody> {
        let path = req.head.uri.path_and_query().map_or("/", |p| p.as_str());
        let request = match canned::count_request(api, path, json) {
            Ok(r) => r,
            Err(e) => return errors::respond(api, &e),
        };
        let client = ctx.backend.as_deref().and_then(|b| self.backend(b));
        let session = Capture::session_of(ctx);
        if let Some(client) = client {
            match client.count_tokens(session.as_str(), &request).await {
                Ok(n) => {
                    return canned_response(canned::count_tokens(api, n, CountSource::Backend));
                }
                Err(e) => {
                    tracing::info!(session = %session, error = %e, "the backend cannot count tokens; answering the estimate");
                }
            }
        }
        let n = canned::estimate_tokens(json);
        canned_response(canned::count_tokens(api, n, CountSource::Estimate))
    }

    /// The model names a listing shows: the backend's mapped names, then its
    /// served name.
    fn model_names(&self, ctx: &RequestContext) -> Vec<String> {
        let Some(cfg) = ctx
            .backend
            .as_deref()
            .and_then(|b| self.backend(b))
            .map(|c| c.config())
        else {
            return Vec::new();
        };
        let mut names: Vec<String> = cfg.model_map.keys().cloned().collect();
        if !names.contains(&cfg.served_model) {
            names.push(cfg.served_model.clone());
        }
        names
    }

    /// Forwards to the route's upstream; without one, `HEAD` gets 200 and
    /// anything else 404 (`what` names it in the message).
    pub(super) async fn forward_or_404(
        self: Arc<Self>,
        ctx: RequestContext,
        req: ModelRequest,
        what: Option<String>,
    ) -> Response<ProxyBody> {
        if ctx.upstream.is_some()
            && let Some(forward) = &self.forward
        {
            return super::super::pipeline::ModelPipeline::call(Arc::clone(forward), ctx, req)
                .await;
        }
        if req.head.method == Method::HEAD {
            let mut r = Response::new(full(Bytes::new()));
            *r.status_mut() = StatusCode::OK;
            return r;
        }
        let api = error_shape(&req, ctx.provider);
        let what = what.unwrap_or_else(|| req.head.uri.path().to_owned());
        tracing::debug!(session = ?ctx.session, host = %ctx.host, method = %req.head.method, path = %what, "side call not served");
        errors::respond(
            api,
            &ProviderError::new(
                Side::Harness,
                ErrorKind::NotFound,
                format!("{} {what} is not served here", req.head.method),
            ),
        )
    }
}

/// The API whose error shape a request expects: detected from method and
/// path, else from the API's marker headers (`anthropic-version`,
/// `x-goog-api-key`) or a `/v1beta/` path, else the route's hint.
fn error_shape(req: &ModelRequest, hint: ProviderHint) -> Api {
    let h = &req.head.headers;
    api_of(&req.head.method, &req.head.uri, h).unwrap_or_else(|| {
        if h.contains_key("anthropic-version") {
            Api::AnthropicMessages
        } else if h.contains_key("x-goog-api-key") || req.head.uri.path().starts_with("/v1beta/") {
            Api::Gemini
        } else {
            api_of_hint(hint)
        }
    })
}

/// A canned answer as a response.
fn canned_response(c: CannedResponse) -> Response<ProxyBody> {
    let mut r = Response::new(full(c.body));
    *r.status_mut() = StatusCode::from_u16(c.status).unwrap_or(StatusCode::OK);
    for (k, v) in c.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(&v),
        ) {
            r.headers_mut().insert(name, value);
        }
    }
    r
}
