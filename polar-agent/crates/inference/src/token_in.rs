//! A call served token-faithfully ([`crate::faithful`]): the prompt
//! rendered and tokenized here (off the async workers), checked against the
//! model's context, sent to the token-in endpoint with an explicit length,
//! and read as a [`ChatStream`] whose raw output the backend's
//! `output_parser` parses; at the reply's end the session's chain is
//! extended ([`FaithfulEnd`]). A constrained request carries its
//! constraint in the token-in endpoint's fields and its output is read as
//! the chat endpoint would read it ([`crate::guided`]).

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use rand::Rng as _;
use serde_json::Value;

use polar_chat::{ChatRequest, StreamEvent};
use polar_faithful::{Asked, Prompt, RenderFailure};

use super::client::{Client, Reached, weight_version};
use super::faithful::Faithful;
use super::guided::{Guided, Reader};
use super::stream::failover::{Failover, Resend, ResumeBase, token_in_request};
use super::stream::{BackendInfo, ChatStream, StreamParts, Timings};
use super::{Dialect, InferenceError, SamplingMode};
use polar_faithful::Serving;

/// What ends a token-faithful call: the session's chain extended with its
/// reply, once the stream yielded its `Finish`.
pub(crate) struct FaithfulEnd {
    faithful: Arc<Faithful>,
    session: String,
    conv: Asked,
    prompt: Prompt,
    events: Vec<StreamEvent>,
    /// A constrained call: it may branch off its chain.
    branch: bool,
}

impl FaithfulEnd {
    /// Notes an event the consumer got.
    pub(crate) fn observe(&mut self, event: &StreamEvent) {
        self.events.push(event.clone());
    }

    /// The reply ended with `response` ids: the chain goes on from it.
    pub(crate) fn finish(self, response: &[u32]) {
        let reply = polar_chat::assemble(&self.events).message;
        self.faithful.finish(
            &self.session,
            (self.conv, self.prompt),
            response,
            &reply,
            self.branch,
        );
    }
}

impl Client {
    /// Calls the backend token-in with the prompt Polar renders (`f`'s
    /// model and the session's chains).
    /// `chat` is the request's chat body ([`crate::request::chat_body`]),
    /// `guided` its constraint ([`Guided::of`]).
    pub(crate) async fn chat_token_in(
        &self,
        session: &str,
        req: &ChatRequest,
        mode: SamplingMode,
        (f, chat): (Arc<Faithful>, &Value),
        guided: Option<Guided>,
    ) -> Result<ChatStream, InferenceError> {
        let cfg = self.config();
        let backend = cfg.name.clone();
        let base = ResumeBase::token_in(cfg, req, mode).ok_or_else(|| InferenceError::Config {
            backend: backend.clone(),
            key: "output_parser".into(),
            reason: "model_dir sends prompts as token ids: name the model's output format".into(),
        })?;
        let conv = f
            .conversation(chat)
            .map_err(|reason| InferenceError::Unrenderable {
                backend: backend.clone(),
                reason,
            })?;
        let started_at = SystemTime::now();
        let waiting = Instant::now();
        let mut admission = self.pool().admit().await;
        let paused = waiting.elapsed();
        let started = Instant::now();
        // Rendering and tokenizing a long conversation is CPU work.
        let (renderer, who) = (f.clone(), session.to_owned());
        let (conv, prompt) = tokio::task::spawn_blocking(move || {
            let prompt = renderer.prompt(&who, &conv);
            (conv, prompt)
        })
        .await
        .map_err(|e| InferenceError::Tokenizer {
            backend: backend.clone(),
            reason: format!("rendering the prompt stopped: {e}"),
        })?;
        let prompt = prompt.map_err(|e| match e {
            RenderFailure::Template(reason) => InferenceError::Unrenderable {
                backend: backend.clone(),
                reason,
            },
            RenderFailure::Tokenizer(reason) => InferenceError::Tokenizer {
                backend: backend.clone(),
                reason,
            },
        })?;
        let served_model = cfg.map_model(&req.model).to_owned();
        let timeout = cfg.request_timeout();
        let context = match (f.context_len(), self.pool().order(session).first()) {
            (Some(n), _) => Some(n),
            (None, Some(&replica)) => self
                .pool()
                .context_len(replica, &served_model, timeout)
                .await
                .map_err(|last| InferenceError::Unreachable {
                    backend: backend.clone(),
                    attempts: 1,
                    last: format!("asking the model's context length: {last}"),
                })?,
            (None, None) => None,
        };
        let prompt_len = prompt.ids.len();
        if let Some(max) = context
            && prompt_len as u64 >= max
        {
            return Err(InferenceError::PromptTooLong {
                backend,
                prompt: u32::try_from(prompt_len).unwrap_or(u32::MAX),
                max: u32::try_from(max).unwrap_or(u32::MAX),
            });
        }
        let max_tokens =
            base.max_tokens(0, prompt_len, context)
                .map_err(|why| InferenceError::Config {
                    backend: backend.clone(),
                    key: "max_tokens_clamp".into(),
                    reason: format!(
                        "{why}; set max_tokens_clamp, or give model_dir a config.json with \
                         max_position_embeddings"
                    ),
                })?;
        let dialect = cfg.dialect;
        let mut body = base.body(dialect, &prompt.ids, max_tokens);
        if let Some(g) = &guided {
            g.apply(dialect, &mut body);
        }
        let body = Bytes::from(body.to_string());
        let Reached {
            replica,
            base: url,
            resp,
            attempts,
            failed,
        } = self
            .reach(session, |b| {
                token_in_request(dialect, b, session, &body).map_err(|reason| {
                    InferenceError::Config {
                        backend: backend.clone(),
                        key: "replicas".into(),
                        reason,
                    }
                })
            })
            .await?;
        let head = started.elapsed();
        let weight_version = weight_version(resp.headers());
        admission.bind(replica);
        let info = BackendInfo {
            backend,
            dialect,
            replica: url,
            served_model,
            weight_version,
            attempts,
            serving: Some(Serving::TokenIn {
                prompt: prompt.origin.clone(),
            }),
        };
        // A generation prompt that opens the reasoning block (Qwen3 and
        // DeepSeek thinking templates): the output starts as reasoning.
        let tail = &prompt.ids[prompt_len.saturating_sub(4)..];
        let open = f
            .decode(tail)
            .is_ok_and(|t| t.trim_end().ends_with("<think>"));
        let base = base.reasoning_open(open);
        let parser = Reader::new(base.parser(), guided.as_ref().map(Guided::shape));
        let resend = Resend::TokenIn {
            body: body.clone(),
            prompt_len: prompt_len as u32,
            reader: Box::new(parser.clone()),
        };
        // A constrained reply is not resumed from its tokens: the
        // continuation's grammar would start over at the resumption.
        let branch = guided.is_some();
        let resume = guided.is_none().then_some(base);
        let mut failover = Failover::new(cfg, session, resend, resume);
        failover.note_sent_again(&failed, &info.replica);
        let start = StreamEvent::Start {
            id: format!("chatcmpl-{:032x}", rand::rng().random::<u128>()),
            model: req.model.clone(),
            prompt_tokens: Some(prompt_len as u32),
        };
        let ids = prompt.ids.clone();
        let end = FaithfulEnd {
            faithful: f,
            session: session.to_owned(),
            conv,
            prompt,
            events: Vec::new(),
            branch,
        };
        Ok(ChatStream::token_in(
            StreamParts {
                info,
                body: resp.into_body(),
                streaming: dialect == Dialect::Vllm,
                model: req.model.clone(),
                timeout,
                started,
                timings: Timings {
                    started_at,
                    paused,
                    head: Some(head),
                    first_token: None,
                    finished: None,
                },
                pool: self.pool().clone(),
                replica,
                admission,
                failover: Some(Box::new(failover)),
            },
            ids,
            parser,
            start,
            end,
        ))
    }
}
