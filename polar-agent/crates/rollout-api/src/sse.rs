//! Server-sent events on both ends: a channel-fed response body for the
//! server's `/v1/events`, and [`EventStream`], a reader of that stream for
//! dashboards, the CLI and tests (its framing is [`polar_sse`]).

use std::collections::VecDeque;
use std::pin::Pin;

use bytes::Bytes;
use http::{Request, header};
use http_body_util::Full;
use hyper::body::{Body as _, Incoming};
use polar_io::body::{self, BodySender};
use polar_rollout_types::Numbered;
use polar_sse::{SseEvent, SseParser};

use super::client::ClientError;
use super::http::{Body, HttpClient, bearer_value, default_client, join};

/// A streamed body for `/v1/events` and its sender.
pub fn channel() -> (BodySender, Body) {
    body::channel(64)
}

/// A reader of `/v1/events`.
#[derive(Debug)]
pub struct EventStream {
    body: Incoming,
    /// `None` once the stream turned out not to be SSE.
    parser: Option<SseParser>,
    ready: VecDeque<SseEvent>,
}

impl EventStream {
    /// Connects to `{base}/v1/events` (with `query`, e.g. `task_id=t1`);
    /// an `https://` server is verified against the system's roots.
    pub async fn connect(base: &str, token: &str, query: &str) -> Result<Self, ClientError> {
        Self::connect_via(&default_client(), base, token, query).await
    }

    /// [`EventStream::connect`] through `http` (a client of
    /// [`crate::http::client`] with the cluster's CA bundle).
    pub async fn connect_via(
        http: &HttpClient,
        base: &str,
        token: &str,
        query: &str,
    ) -> Result<Self, ClientError> {
        let mut url = join(base, "/v1/events");
        if !query.is_empty() {
            url.push('?');
            url.push_str(query);
        }
        let req = Request::get(&url)
            .header(header::AUTHORIZATION, bearer_value(token))
            .header(header::ACCEPT, "text/event-stream")
            .body(Full::new(Bytes::new()))
            .map_err(|e| ClientError::Transport {
                url: url.clone(),
                reason: e.to_string(),
            })?;
        let resp = http
            .request(req)
            .await
            .map_err(|e| ClientError::Transport {
                url: url.clone(),
                reason: polar_io::chain(&e),
            })?;
        if !resp.status().is_success() {
            return Err(ClientError::Status {
                status: resp.status(),
                code: "http".into(),
                field: None,
                message: format!("events: {}", resp.status()),
            });
        }
        Ok(Self {
            body: resp.into_body(),
            parser: Some(SseParser::new()),
            ready: VecDeque::new(),
        })
    }

    /// The next event; `None` when the stream ends, breaks off or turns
    /// out not to be SSE (bytes that are not UTF-8: logged, not replaced).
    /// Comments and `lagged` notices are skipped.
    pub async fn next(&mut self) -> Option<Numbered> {
        loop {
            while let Some(ev) = self.ready.pop_front() {
                if let Some(n) = numbered(&ev) {
                    return Some(n);
                }
            }
            let parser = self.parser.as_mut()?;
            let frame = std::future::poll_fn(|cx| Pin::new(&mut self.body).poll_frame(cx)).await?;
            let Ok(frame) = frame else {
                return None;
            };
            if let Ok(data) = frame.into_data() {
                match parser.push(&data) {
                    Ok(events) => self.ready.extend(events),
                    Err(e) => {
                        tracing::warn!(error = %e, "the event stream is not SSE; reading stops");
                        self.parser = None;
                    }
                }
            }
        }
    }
}

/// The rollout event an SSE event carries in its data, if it is one.
fn numbered(ev: &SseEvent) -> Option<Numbered> {
    serde_json::from_str(&ev.data).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: &str = r#"{"id":1,"type":"node","node_id":"n","health":"healthy"}"#;

    #[test]
    fn frames_split_and_parse() {
        let mut p = SseParser::new();
        let raw = format!(": hello\n\nid: 1\nevent: node\ndata: {NODE}\n\nid: 2");
        // The comment-only frame is no event, the second is, the third is
        // not complete.
        let evs = p.push(raw.as_bytes()).unwrap();
        assert_eq!(evs.len(), 1);
        let ev = numbered(&evs[0]).unwrap();
        assert_eq!(ev.id, 1);
        assert_eq!(p.push(b"\n").unwrap(), []);
    }

    #[test]
    fn frames_end_in_any_line_end_and_lagged_notices_are_skipped() {
        let mut p = SseParser::new();
        let raw = format!("event: lagged\r\ndata: {{\"missed\":3}}\r\n\r\ndata: {NODE}\r\r");
        let (a, b) = raw.as_bytes().split_at(raw.len() - 1);
        let mut evs = p.push(a).unwrap();
        evs.extend(p.push(b).unwrap());
        let got: Vec<Option<Numbered>> = evs.iter().map(numbered).collect();
        assert_eq!(got.len(), 2);
        assert!(got[0].is_none());
        assert_eq!(got[1].as_ref().map(|n| n.id), Some(1));
        // Bytes that are not UTF-8 are an error, not replacement characters.
        assert!(p.push(b"data: \xff\n\n").is_err());
    }
}
