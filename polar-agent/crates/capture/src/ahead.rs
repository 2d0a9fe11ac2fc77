//! A record's big parts (the native and normalized requests, the prompt
//! token ids), serialized or written to the log ahead of the call's end, so
//! the end waits only for the completion's few kilobytes.
//!
//! Until the request is sent nothing is done ahead ([`Ahead::Drafting`]).
//! Once it is, the requests are serialized ([`EarlyEncoding`]: on the spot
//! when small, else on a blocking thread). After the backend's first event,
//! the call's request part is written ([`RequestPartWrite`]), unless the
//! whole reply is already in or the requests were small: then the record
//! goes as one whole line at the end, its prompt ids serialized meanwhile
//! ([`PromptEncoding`]).

use std::sync::Arc;

use polar_capture_log::encode::RecordParts;
use polar_inference::ChatStream;

use super::build::{Draft, EarlyEncoding, Produced, PromptEncoding};
use super::part::RequestPartWrite;
use super::store::SessionLog;

/// Where a record's big parts are while its call runs.
#[derive(Debug)]
pub(crate) enum Ahead {
    /// The request is not sent yet: the draft holds its requests, the
    /// record will be serialized whole at the end.
    Drafting,
    /// The requests being serialized (and the prompt ids, for a reply
    /// that came whole): the record will be one whole line.
    Early {
        early: EarlyEncoding,
        prompt: Option<PromptEncoding>,
    },
    /// The call's request part being written from the prompt ids of
    /// `prompt_version`; `prompt_kept` once the stream ended with ids of
    /// that version.
    Part {
        write: RequestPartWrite,
        prompt_version: u32,
        prompt_kept: bool,
    },
}

impl Ahead {
    /// The request is sent: its requests are serialized from now on.
    pub(crate) fn sent(early: EarlyEncoding) -> Self {
        Self::Early {
            early,
            prompt: None,
        }
    }

    /// After the backend's first event: starts writing the request part
    /// with the prompt ids known now, unless the whole reply is already in
    /// (the end is as near as the part's write) or the requests were small
    /// enough to be serialized already ([`EarlyEncoding::is_done`]: the end
    /// writes a few kilobytes either way, and one write costs less than
    /// two). Then the record goes as one line, its prompt ids serialized
    /// meanwhile.
    pub(crate) fn first_event(
        self,
        log: &Arc<SessionLog>,
        draft: &Draft,
        stream: &ChatStream,
    ) -> Self {
        let Self::Early {
            early,
            prompt: None,
        } = self
        else {
            return self;
        };
        let ids = stream.prompt_token_ids().map(<[u32]>::to_vec);
        if stream.timings().finished.is_some() || early.is_done() {
            Self::Early {
                early,
                prompt: ids.map(PromptEncoding::start),
            }
        } else {
            Self::Part {
                write: RequestPartWrite::start(Arc::clone(log), draft, early, ids),
                prompt_version: stream.prompt_ids_version(),
                prompt_kept: false,
            }
        }
    }

    /// What the backend produced besides its events; the stream's token
    /// data is moved out (the stream is done with). Notes first whether the
    /// stream's prompt ids are still the ones the request part is written
    /// from.
    pub(crate) fn produced(&mut self, stream: &mut ChatStream) -> Produced {
        if let Self::Part {
            prompt_version,
            prompt_kept,
            ..
        } = self
        {
            *prompt_kept = *prompt_version == stream.prompt_ids_version();
        }
        let resumed = stream.resumed();
        Produced {
            tokens: stream.take_tokens(),
            backend: Some(stream.backend().clone()),
            timings: Some(stream.timings().clone()),
            backend_name: None,
            resumed,
        }
    }

    /// Gives the requests back to `draft` and tells where the record's big
    /// parts are.
    pub(crate) async fn parts(self, draft: &mut Draft) -> RecordParts {
        match self {
            Self::Drafting => RecordParts::default(),
            Self::Early { early, prompt } => {
                let mut pre = draft.restore(early).await;
                if let Some(p) = prompt {
                    pre.prompt_token_ids = p.finish().await;
                }
                RecordParts::Whole(pre)
            }
            Self::Part {
                write, prompt_kept, ..
            } => {
                let parts = write.finish(draft).await;
                if prompt_kept {
                    parts.prompt_unchanged()
                } else {
                    parts
                }
            }
        }
    }
}
