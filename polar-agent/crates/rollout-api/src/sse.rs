//! Server-sent events on both ends: a channel-fed response body for the
//! server's `/v1/events`, and [`EventStream`], a reader of that stream for
//! dashboards, the CLI and tests.

use std::pin::Pin;

use bytes::{Bytes, BytesMut};
use http::{Request, header};
use http_body_util::Full;
use hyper::body::{Body as _, Incoming};

use super::client::ClientError;
use super::http::{Body, bearer_value, client, join};
use polar_io::body::{self as http_body, BodySender};
use polar_rollout_types::Numbered;

/// A streamed body for `/v1/events` and its sender.
pub fn channel() -> (BodySender, Body) {
    http_body::channel(64)
}

/// A reader of `/v1/events`.
#[derive(Debug)]
pub struct EventStream {
    body: Incoming,
    buf: BytesMut,
}

impl EventStream {
    /// Connects to `{base}/v1/events` (with `query`, e.g. `task_id=t1`).
    pub async fn connect(base: &str, token: &str, query: &str) -> Result<Self, ClientError> {
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
        let resp = client()
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
            buf: BytesMut::new(),
        })
    }

    /// The next event; `None` when the stream ends. Comments and `lagged`
    /// notices are skipped.
    pub async fn next(&mut self) -> Option<Numbered> {
        loop {
            if let Some(frame) = take_frame(&mut self.buf) {
                if let Some(ev) = parse_frame(&frame) {
                    return Some(ev);
                }
                continue;
            }
            let frame = std::future::poll_fn(|cx| Pin::new(&mut self.body).poll_frame(cx)).await?;
            let Ok(frame) = frame else {
                return None;
            };
            if let Ok(data) = frame.into_data() {
                self.buf.extend_from_slice(&data);
            }
        }
    }
}

/// Splits one `\n\n`-terminated frame off the buffer.
fn take_frame(buf: &mut BytesMut) -> Option<String> {
    let end = buf.windows(2).position(|w| w == b"\n\n")?;
    let frame = buf.split_to(end + 2);
    Some(String::from_utf8_lossy(&frame[..end]).into_owned())
}

/// The event of a frame (its `data` line), if it carries one.
fn parse_frame(frame: &str) -> Option<Numbered> {
    let data: String = frame
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim_start)
        .collect::<Vec<_>>()
        .join("\n");
    if data.is_empty() {
        return None;
    }
    serde_json::from_str(&data).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_and_parse() {
        let mut buf = BytesMut::from(
            &b": hello\n\nid: 1\nevent: node\ndata: {\"id\":1,\"type\":\"node\",\"node_id\":\"n\",\"health\":\"healthy\"}\n\nid: 2"[..],
        );
        let first = take_frame(&mut buf).unwrap();
        assert!(parse_frame(&first).is_none());
        let second = take_frame(&mut buf).unwrap();
        let ev = parse_frame(&second).unwrap();
        assert_eq!(ev.id, 1);
        assert!(take_frame(&mut buf).is_none());
    }
}
