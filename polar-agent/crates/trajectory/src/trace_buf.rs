//! Assembly of one [`Trace`] from calls: the first call's prompt, then for
//! each call its glue (loss 0) and its generated tokens (loss 1, with the
//! backend's logprobs). Shared by both builders.

use polar_chat::Message;
use polar_record::CompletionRecord;

use super::calls::Call;
use super::off_policy::splice_drift;
use super::types::{
    CallSpan, ChainId, ChainRole, Join, Label, SegmentKind, SegmentLink, Trace, TraceMetadata,
};

/// The policy version `record` ran under: the one its session named, else
/// the backend's weight version.
pub(crate) fn call_policy_version(record: &CompletionRecord) -> Option<&String> {
    record
        .policy_version
        .as_ref()
        .or(record.backend.weight_version.as_ref())
}

/// Appends `v` to `list` unless absent or already there.
pub(crate) fn push_distinct(list: &mut Vec<String>, v: Option<&String>) {
    if let Some(v) = v
        && !list.contains(v)
    {
        list.push(v.clone());
    }
}

/// A trace being assembled.
pub(crate) struct TraceBuf<'a> {
    first: Call<'a>,
    last: Call<'a>,
    response_ids: Vec<u32>,
    loss_mask: Vec<u8>,
    logprobs: Option<Vec<f32>>,
    call_ids: Vec<String>,
    spans: Vec<CallSpan>,
    labels: Vec<Label>,
    policy_versions: Vec<String>,
    weight_versions: Vec<String>,
    /// Tokens of the context so far that differ from what the last call saw.
    off_policy: usize,
}

impl<'a> TraceBuf<'a> {
    /// A trace whose prompt is `call`'s prompt and whose first response is
    /// `call`'s.
    pub fn new(call: Call<'a>) -> Self {
        let mut buf = Self {
            first: call,
            last: call,
            response_ids: Vec::with_capacity(call.response.len()),
            loss_mask: Vec::with_capacity(call.response.len()),
            logprobs: call
                .logprobs
                .map(|_| Vec::with_capacity(call.response.len())),
            call_ids: Vec::new(),
            spans: Vec::new(),
            labels: Vec::new(),
            policy_versions: Vec::new(),
            weight_versions: Vec::new(),
            off_policy: 0,
        };
        buf.push(call, &[], Join::First);
        buf
    }

    /// Appends `glue` (loss 0) and `call`'s response (loss 1).
    pub fn push(&mut self, call: Call<'a>, glue: &[u32], join: Join) {
        if let Join::Splice {
            diverged_at,
            resumed_from,
            ..
        } = join
        {
            self.off_policy += splice_drift(
                self.last.prompt,
                self.last.response,
                call.prompt,
                diverged_at,
                resumed_from,
            );
        }
        self.response_ids.extend_from_slice(glue);
        self.loss_mask.resize(self.response_ids.len(), 0);
        let response_start = self.response_ids.len();
        self.response_ids.extend_from_slice(call.response);
        self.loss_mask.resize(self.response_ids.len(), 1);
        self.logprobs = match (self.logprobs.take(), call.logprobs) {
            (Some(mut lp), Some(call_lp)) => {
                lp.resize(response_start, 0.0);
                lp.extend_from_slice(call_lp);
                Some(lp)
            }
            _ => None,
        };
        self.call_ids.push(call.record.call_id.clone());
        let policy_version = call_policy_version(call.record).cloned();
        let weight_version = call.record.backend.weight_version.clone();
        push_distinct(&mut self.policy_versions, policy_version.as_ref());
        push_distinct(&mut self.weight_versions, weight_version.as_ref());
        self.spans.push(CallSpan {
            response_start,
            response_len: call.response.len(),
            join,
            truncated: call.truncated(),
            policy_version,
            weight_version,
            off_policy_context_tokens: self.off_policy,
            serving: call.record.backend.serving.clone(),
        });
        if call.truncated() {
            self.labels.push(Label::Truncated);
        }
        if matches!(join, Join::Splice { .. }) {
            self.labels.push(Label::TemplateSpliced);
        }
        self.last = call;
    }

    /// The finished trace.
    pub fn finish(
        self,
        chain: ChainId,
        segment: u32,
        segment_kind: SegmentKind,
        previous: Option<SegmentLink>,
    ) -> Trace {
        let first_req = &self.first.record.request;
        let last_rec = self.last.record;
        let mut response_messages: Vec<Message> = if self.call_ids.len() > 1 {
            last_rec
                .request
                .messages
                .get(first_req.messages.len()..)
                .map(<[Message]>::to_vec)
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        if let Some(reply) = &last_rec.response {
            response_messages.push(reply.message.clone());
        }
        let off_policy_context_tokens =
            self.spans.iter().map(|s| s.off_policy_context_tokens).sum();
        let mut trace = Trace {
            prompt_ids: self.first.prompt.to_vec(),
            response_ids: self.response_ids,
            loss_mask: self.loss_mask,
            response_logprobs: self.logprobs,
            prompt_messages: first_req.messages.clone(),
            response_messages,
            tools: first_req.tools.clone(),
            finish_reason: self.last.finish_reason().cloned(),
            reward: None,
            call_ids: self.call_ids,
            spans: self.spans,
            chain,
            role: ChainRole::Main,
            segment,
            segment_kind,
            previous,
            labels: Vec::new(),
            metadata: TraceMetadata {
                policy_versions: self.policy_versions,
                weight_versions: self.weight_versions,
                off_policy_context_tokens,
                ..TraceMetadata::default()
            },
        };
        for label in self.labels {
            trace.add_label(label);
        }
        trace
    }
}
