//! The event stream: one connection attempt at a time, parsed by eventsource-client over a
//! small reqwest transport. The daemon drives reconnects itself (backoff.rs, `Retry-After`,
//! `Last-Event-ID` = the last applied seq, the stall timeout), so the crate's own reconnect
//! is off: every attempt is a fresh client that ends with one `Ended` message. What the parser
//! may buffer is bounded before it sees the bytes (sse_bound.rs).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use eventsource_client::{self as es, Client as _, SSE};
use futures_util::{Stream, StreamExt as _};
use launchdarkly_sdk_transport::{ByteStream, HttpTransport, ResponseFuture, TransportError};
use plexsphere_wire::domain_event::{DOMAIN_ENVELOPES, ENVELOPES_HEADER};
use tokio::sync::{mpsc, oneshot};

use super::core::io::{self, StreamMsg};
use super::input::Input;
use super::sse_bound::FrameBound;
use crate::node_api::{CallError, NodeApi};

/// The largest error body read from a refused stream request.
const MAX_ERROR_BODY: usize = 16 * 1024;

/// Runs one connection until it ends; every message goes to the loop tagged with `conn`.
pub async fn connect_once(
    api: NodeApi,
    last_event_id: Option<u64>,
    conn: u64,
    tx: mpsc::Sender<Input>,
) {
    let post = async |msg: StreamMsg| {
        tx.send(Input::Core(io::Input::Stream { conn, msg }))
            .await
            .is_ok()
    };
    let ended = |reason: String| StreamMsg::Ended {
        reason,
        retry_after: None,
        fatal: None,
    };
    let client = match build(&api, last_event_id) {
        Ok(c) => c,
        Err(e) => {
            post(ended(format!("cannot build the stream request: {e}"))).await;
            return;
        }
    };
    let mut stream = client.stream();
    loop {
        let msg = match stream.next().await {
            None => ended("the stream closed".to_owned()),
            Some(Ok(SSE::Connected(_))) => StreamMsg::Connected,
            Some(Ok(SSE::Event(ev))) => StreamMsg::Frame {
                id: ev.id,
                event: ev.event_type,
                data: ev.data,
            },
            Some(Ok(SSE::Comment(_))) => StreamMsg::Activity,
            Some(Err(e)) => end_of(e).await,
        };
        let last = matches!(msg, StreamMsg::Ended { .. });
        if !post(msg).await || last {
            return;
        }
    }
}

fn build(api: &NodeApi, last_event_id: Option<u64>) -> Result<impl es::Client, es::Error> {
    // Domain envelopes (one signature per event for the whole Domain) are understood.
    let mut b = es::ClientBuilder::for_url(api.url("/events").as_str())?
        .header("Authorization", &api.bearer())?
        .header(ENVELOPES_HEADER, DOMAIN_ENVELOPES)?;
    if let Some(host) = api.host_header() {
        b = b.header(plexsphere_wire::host::HOST_HEADER, &host)?;
    }
    let mut b = b
        .reconnect(es::ReconnectOptions::reconnect(false).build())
        .redirect_limit(0);
    if let Some(id) = last_event_id {
        b = b.last_event_id(id.to_string());
    }
    Ok(b.build_with_transport(ReqwestTransport {
        http: api.api().stream_http().clone(),
        api: api.clone(),
    }))
}

async fn end_of(e: es::Error) -> StreamMsg {
    let (reason, retry_after, fatal) = match e {
        es::Error::UnexpectedResponse(resp, body) => {
            let status = resp.status();
            let retry_after = resp
                .get_header_value("retry-after")
                .ok()
                .flatten()
                .and_then(crate::api_client::parse_retry_after);
            let bytes = read_some(body.into_stream(), MAX_ERROR_BODY).await;
            let err = CallError::from_answer(status, &bytes, retry_after);
            let fatal = matches!(
                err,
                CallError::Revoked | CallError::Unauthorized | CallError::CloneRefused
            )
            .then(|| err.clone());
            (err.to_string(), retry_after, fatal)
        }
        es::Error::Transport(t) => (t.inner().to_string(), None, None),
        es::Error::Eof => ("the server closed the stream".to_owned(), None, None),
        es::Error::UnexpectedEof => (
            "the server closed the stream in the middle of an event".to_owned(),
            None,
            None,
        ),
        es::Error::TimedOut => ("the connection timed out".to_owned(), None, None),
        other => (format!("a malformed stream: {other}"), None, None),
    };
    StreamMsg::Ended {
        reason,
        retry_after,
        fatal,
    }
}

async fn read_some(mut body: ByteStream, limit: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < limit {
        match body.next().await {
            Some(Ok(b)) => out.extend_from_slice(&b[..b.len().min(limit - out.len())]),
            _ => break,
        }
    }
    out
}

/// A launchdarkly-sdk-transport over reqwest. The request runs in a spawned task and the body
/// comes through a channel, so the future and the stream are `Send + Sync` as the trait
/// wants; the task stops when the reader goes away (a stalled connection is dropped).
#[derive(Clone)]
struct ReqwestTransport {
    http: reqwest::Client,
    /// Classifies errors (TLS, refused...) the same way as every other call.
    api: NodeApi,
}

struct ChannelBody(mpsc::Receiver<Result<Bytes, TransportError>>);

impl Stream for ChannelBody {
    type Item = Result<Bytes, TransportError>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

fn transport_error(msg: String) -> TransportError {
    TransportError::new(std::io::Error::other(msg))
}

impl HttpTransport for ReqwestTransport {
    fn request(&self, request: http::Request<Option<Bytes>>) -> ResponseFuture {
        let (parts, body) = request.into_parts();
        let mut req = self
            .http
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers);
        if let Some(b) = body {
            req = req.body(b);
        }
        let (resp_tx, resp_rx) = oneshot::channel();
        let api = self.api.clone();
        tokio::spawn(async move {
            let mut resp = match req.send().await {
                Ok(r) => r,
                Err(e) => {
                    let _ = resp_tx.send(Err(transport_error(api.api().classify(&e).to_string())));
                    return;
                }
            };
            let (body_tx, body_rx) = mpsc::channel(16);
            let mut answer: http::Response<ByteStream> =
                http::Response::new(Box::pin(ChannelBody(body_rx)));
            *answer.status_mut() = resp.status();
            *answer.headers_mut() = resp.headers().clone();
            if resp_tx.send(Ok(answer)).is_err() {
                return;
            }
            let mut bound = FrameBound::default();
            loop {
                tokio::select! {
                    _ = body_tx.closed() => return,
                    chunk = resp.chunk() => {
                        let item = match chunk {
                            Ok(Some(b)) => match bound.feed(&b) {
                                Ok(()) => Ok(b),
                                Err(exceeded) => Err(transport_error(exceeded.to_string())),
                            },
                            Ok(None) => return,
                            Err(e) => Err(transport_error(format!("the stream broke: {}", api.api().classify(&e)))),
                        };
                        let stop = item.is_err();
                        if body_tx.send(item).await.is_err() || stop {
                            return;
                        }
                    }
                }
            }
        });
        Box::pin(async move {
            resp_rx
                .await
                .map_err(|_| transport_error("the request task ended".to_owned()))?
        })
    }
}

#[cfg(test)]
#[path = "sse_tests.rs"]
mod tests;
