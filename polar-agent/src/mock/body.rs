//! Response bodies of the mock: whole JSON replies, errors in the vLLM
//! error shape, and a channel-fed body for server-sent events that can be
//! cut mid-stream (the body fails, hyper drops the connection).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::body::{Body, Frame};
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// The body type of every mock response.
pub type RespBody = BoxBody<Bytes, io::Error>;

/// A whole body.
pub fn full(bytes: impl Into<Bytes>) -> RespBody {
    polar_io::body::full(bytes)
}

/// A JSON response.
pub fn json_response(status: StatusCode, value: &Value) -> Response<RespBody> {
    let mut resp = Response::new(full(value.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// An error in vLLM's shape (`{"object": "error", "message", "type", "code"}`).
pub fn error_response(status: StatusCode, message: &str) -> Response<RespBody> {
    let kind = match status.as_u16() {
        400 => "BadRequestError",
        404 => "NotFoundError",
        429 => "TooManyRequestsError",
        _ if status.is_server_error() => "InternalServerError",
        _ => "Error",
    };
    json_response(
        status,
        &json!({"object": "error", "message": message, "type": kind, "param": null, "code": status.as_u16()}),
    )
}

/// The sending side of a streamed body.
#[derive(Debug)]
pub struct ChunkSender {
    tx: mpsc::Sender<Result<Bytes, io::Error>>,
}

impl ChunkSender {
    /// Sends raw bytes; false when the client went away.
    pub async fn send(&self, bytes: impl Into<Bytes>) -> bool {
        self.tx.send(Ok(bytes.into())).await.is_ok()
    }

    /// Sends one `data: {json}` event.
    pub async fn event(&self, value: &Value) -> bool {
        self.send(format!("data: {value}\n\n")).await
    }

    /// Sends `data: [DONE]`.
    pub async fn done(&self) -> bool {
        self.send("data: [DONE]\n\n").await
    }

    /// Fails the body once what was sent before is on the wire: the
    /// connection is dropped without a proper end.
    pub async fn cut(self) {
        for _ in 0..1000 {
            if self.tx.capacity() == self.tx.max_capacity() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let _ = self
            .tx
            .send(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "scripted disconnect",
            )))
            .await;
    }
}

/// A body fed through a channel.
#[derive(Debug)]
pub struct ChannelBody {
    rx: mpsc::Receiver<Result<Bytes, io::Error>>,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        self.rx
            .poll_recv(cx)
            .map(|item| item.map(|r| r.map(Frame::data)))
    }
}

/// A channel-fed body and its sender.
pub fn channel() -> (ChunkSender, RespBody) {
    let (tx, rx) = mpsc::channel(16);
    (ChunkSender { tx }, ChannelBody { rx }.boxed())
}

/// A streaming response around `body`, as `text/event-stream` or JSON.
pub fn stream_response(body: RespBody, sse: bool) -> Response<RespBody> {
    let mut resp = Response::new(body);
    let kind = if sse {
        "text/event-stream"
    } else {
        "application/json"
    };
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    resp
}
