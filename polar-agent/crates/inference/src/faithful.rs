//! Token-faithful serving: with the model's own files configured
//! ([`BackendConfig::model_dir`]), a call's prompt is rendered here with the
//! model's chat template and tokenizer, as vLLM would render the chat body
//! ([`polar_faithful::vllm`]), and a call that continues one of the
//! session's chains is sent as that chain's exact ids plus the ids of its
//! new messages ([`polar_faithful::Chains`]). The ids go to the token-in
//! endpoint (vLLM `/v1/completions` with the ids as `prompt`, SGLang
//! `/generate` with `input_ids`), the raw output is parsed with the
//! backend's `output_parser`, as a resumed reply is
//! ([`crate::stream::failover`]), and the reply ends the chain's latest
//! call ([`Faithful::finish`]).
//!
//! Requests whose output is constrained (structured output, a required or
//! named tool choice) are served token-in too, with the constraint the
//! chat endpoint would compile in the token-in endpoint's own fields and
//! their output read as the chat endpoint reads it ([`crate::guided`]);
//! the few the chat endpoint keeps say why in their records
//! ([`polar_faithful::Serving::ChatEndpoint`]).
//!
//! The chains live in memory, per session, until [`Faithful::end_session`]
//! (the agent calls it when the session's capture closes); a restarted
//! agent starts every chain afresh, and says so (`first_call`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;

use polar_chat::{Message, Role};
use polar_faithful::vllm::{ContentFormat, conversation};
use polar_faithful::{Asked, Chains, Prompt, RenderFailure};
use polar_template::{Model, ModelFiles};

use super::{BackendConfig, InferenceError};

/// A loaded model and the chains of every session.
pub struct Faithful {
    model: Model,
    format: ContentFormat,
    sessions: Mutex<HashMap<String, Arc<Mutex<Chains>>>>,
}

impl std::fmt::Debug for Faithful {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faithful")
            .field("model", &self.model)
            .field("format", &self.format)
            .finish_non_exhaustive()
    }
}

impl Faithful {
    /// The model of `cfg`'s `model_dir`, loaded and checked; `None` without
    /// one. Errors name the key and the file.
    pub fn load(cfg: &BackendConfig) -> Result<Option<Self>, InferenceError> {
        let Some(dir) = &cfg.model_dir else {
            return Ok(None);
        };
        let mut files = ModelFiles::from_dir(dir);
        if let Some(name) = &cfg.chat_template_name {
            files = files.with_template_name(name.clone());
        }
        let model = Model::load(&files).map_err(|e| InferenceError::Config {
            backend: cfg.name.clone(),
            key: "model_dir".into(),
            reason: format!("{}: {e}", dir.display()),
        })?;
        let format = polar_faithful::model::content_format(&model);
        Ok(Some(Self {
            model,
            format,
            sessions: Mutex::new(HashMap::new()),
        }))
    }

    /// The model's context length, when its files say.
    pub fn context_len(&self) -> Option<u64> {
        self.model.context_len().map(u64::from)
    }

    /// The conversation vLLM would render for a chat `body`.
    pub fn conversation(&self, body: &Value) -> Result<Asked, String> {
        let messages = body
            .get("messages")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let messages = conversation(messages, self.format).map_err(|e| e.to_string())?;
        Ok(Asked {
            messages,
            tools: body
                .get("tools")
                .and_then(Value::as_array)
                .filter(|t| !t.is_empty())
                .cloned(),
            kwargs: body
                .get("chat_template_kwargs")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
        })
    }

    fn chains(&self, session: &str) -> Arc<Mutex<Chains>> {
        self.sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(session.to_owned())
            .or_default()
            .clone()
    }

    /// The prompt of `session`'s call asked with `conv` (CPU work: call it
    /// off the async workers).
    pub fn prompt(&self, session: &str, conv: &Asked) -> Result<Prompt, RenderFailure> {
        let chains = self.chains(session);
        let chains = chains.lock().unwrap_or_else(PoisonError::into_inner);
        chains.prompt(&self.model, &conv.conversation())
    }

    /// Ends `session`'s call asked with `conv`: its prompt, the ids it
    /// generated and its reply. A `branch` (a constrained call, often a
    /// harness's side check asked with the main conversation) keeps the
    /// call it extends beside it ([`Chains::finish_branch`]).
    pub fn finish(
        &self,
        session: &str,
        (conv, prompt): (Asked, Prompt),
        response: &[u32],
        reply: &Message,
        branch: bool,
    ) {
        let reply = reply_message(reply, self.format);
        let chains = self.chains(session);
        let mut chains = chains.lock().unwrap_or_else(PoisonError::into_inner);
        if branch {
            chains.finish_branch(&self.model, conv, prompt, response, reply);
        } else {
            chains.finish(&self.model, conv, prompt, response, reply);
        }
    }

    /// Forgets `session`'s chains.
    pub fn end_session(&self, session: &str) {
        self.sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(session);
    }

    /// The text of `ids`, special tokens included (for parsing output).
    pub fn decode(&self, ids: &[u32]) -> Result<String, String> {
        self.model.decode(ids, false).map_err(|e| e.to_string())
    }
}

/// A reply as the conversation message the harness's next request will
/// carry for it (through the same chat body and vLLM rules).
fn reply_message(reply: &Message, format: ContentFormat) -> Value {
    let mut m = Message::new(Role::Assistant);
    m.content.clone_from(&reply.content);
    m.reasoning.clone_from(&reply.reasoning);
    m.tool_calls.clone_from(&reply.tool_calls);
    // In the field vLLM reads (the chain compares reasoning by its text,
    // whichever field the harness's next request carries it in).
    let body = super::request::message(&m, super::ReasoningField::Reasoning);
    conversation(std::slice::from_ref(&body), format)
        .ok()
        .and_then(|mut c| c.pop())
        .unwrap_or(body)
}
