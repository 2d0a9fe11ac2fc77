//! The tokens in force and their rotation: [`Node::set_tokens`] puts new
//! ones in force (the agent does on SIGHUP), and a node given a
//! [`TokenSource`] reads its tokens again by itself when they may have
//! rotated under it: the server refuses the node's token (401 to a
//! heartbeat), or a request presents a token the node does not take. So
//! tokens kept in files that are replaced in place (a mounted Kubernetes
//! Secret, which sends no signal) rotate without an operator's step.
//! Reads are at most one a second ([`REREAD_EVERY`]), whatever a caller
//! presents, and run on a blocking thread.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::node::{Inner, Node, Tokens, lock};
use crate::stages::Work;

/// Reads the node's tokens again from where they came from (blocking):
/// the token it presents and the tokens it takes, or why it cannot.
pub type TokenSource = Arc<dyn Fn() -> Result<(String, Vec<String>), String> + Send + Sync>;

/// The shortest time between two reads of a [`TokenSource`].
pub const REREAD_EVERY: Duration = Duration::from_secs(1);

impl<W: Work> Node<W> {
    /// Puts new tokens in force (rotation): `token` is presented to the
    /// server from the next call on, `accept` are the server's tokens
    /// taken from the next request on. Calls in flight finish with the old
    /// ones.
    pub fn set_tokens(&self, token: &str, accept: Vec<String>) {
        self.inner().set_tokens(token, accept);
    }

    /// Where the node reads its tokens again when they may have rotated
    /// (see the module doc).
    pub fn set_token_source(&self, source: TokenSource) {
        *lock(&self.inner().token_source) = Some(source);
    }
}

impl<W: Work> Inner<W> {
    pub(crate) fn set_tokens(&self, token: &str, accept: Vec<String>) {
        let client = self.client().with_token(Some(token.to_owned()));
        *self.tokens.write().unwrap_or_else(|e| e.into_inner()) =
            Arc::new(Tokens { accept, client });
        tracing::info!(node = %self.opts.node_id, "gateway tokens reloaded");
    }

    /// Reads the tokens again from the node's [`TokenSource`] and puts
    /// them in force when they changed; whether they did. Nothing when the
    /// node has no source or read them less than [`REREAD_EVERY`] ago.
    pub(crate) async fn reread_tokens(&self, why: &str) -> bool {
        let Some(source) = lock(&self.token_source).clone() else {
            return false;
        };
        {
            let mut last = lock(&self.tokens_read_at);
            let now = Instant::now();
            if last.is_some_and(|t| now.duration_since(t) < REREAD_EVERY) {
                return false;
            }
            *last = Some(now);
        }
        let read = tokio::task::spawn_blocking(move || source()).await;
        let (token, accept) = match read {
            Ok(Ok(tokens)) => tokens,
            Ok(Err(e)) => {
                tracing::warn!(node = %self.opts.node_id, error = %e, "{why}; reading the tokens again failed");
                return false;
            }
            Err(e) => {
                tracing::warn!(node = %self.opts.node_id, error = %e, "{why}; reading the tokens again did not finish");
                return false;
            }
        };
        let current = self.tokens();
        if current.client.token() == Some(token.as_str()) && current.accept == accept {
            return false;
        }
        tracing::info!(node = %self.opts.node_id, "{why}; the token files changed");
        self.set_tokens(&token, accept);
        true
    }
}
