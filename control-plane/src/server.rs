//! Serving the router: HTTPS with rustls, or plain HTTP behind a TLS-terminating proxy, until
//! a shutdown future resolves (mini-redis style `run(listener, shutdown)`).
//!
//! Every connection is bounded ([`ServerLimits`], docs/api.md "Limits"):
//! - a TLS handshake gets [`TLS_HANDSHAKE_TIMEOUT`], the first request [`FIRST_REQUEST_TIMEOUT`];
//! - an HTTP/1.1 request's header must arrive within the header-read timeout, and the same
//!   timeout closes a keep-alive connection idle between requests (hyper starts it when it
//!   waits for a request head): a client trickling one header byte every few seconds is cut
//!   off. An HTTP/2 connection is pinged every [`HTTP2_KEEPALIVE_INTERVAL`] and closed when a
//!   ping goes unanswered for [`HTTP2_KEEPALIVE_TIMEOUT`];
//! - a request body is read whole, within [`BODY_READ_TIMEOUT`] and at most
//!   [`MAX_BUFFERED_BODY`] bytes, before a handler runs. Besides the bound, this is why an
//!   early refusal (a 429 before the JSON is parsed) reaches an HTTP/2 client: a handler that
//!   answered without reading the body made hyper reset the stream (`RST_STREAM`) while the
//!   client was still sending, and Debian 12's curl reported "Stream error in the HTTP/2
//!   framing layer" instead of the 429;
//! - every accepted socket has `TCP_NODELAY`: an event frame is sent when it is written, not
//!   held back by Nagle's algorithm until the client's delayed ACK (up to 40 ms on Linux) when
//!   many frames go out on one connection at once;
//! - beyond `max_connections` open connections, each request is answered `503 unavailable`
//!   with `Retry-After` and its connection is closed after the answer (HTTP/1.1
//!   `Connection: close`, HTTP/2 `GOAWAY`), until the count is back under the cap.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::body::HttpBody as _;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum_server::accept::NoDelayAcceptor;
use axum_server::tls_rustls::RustlsConfig;
use axum_server::{ConnectionShutdown, Handle};

use crate::error::Error;

/// How long a TLS handshake may take.
pub(crate) const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a new connection may take to send its first complete request.
pub(crate) const FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The default header-read (and HTTP/1.1 idle) timeout (`--header-read-timeout-secs`).
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How often an HTTP/2 connection is pinged.
pub(crate) const HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// How long an HTTP/2 ping may go unanswered before the connection is closed.
pub(crate) const HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a request body may take to arrive.
pub(crate) const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest request body any route takes (the node routes' 256 KiB) but the two access
/// policy routes that carry a whole document ([`buffered_body_limit`]); a larger one is
/// answered `413 body_too_large` before any handler runs.
pub(crate) const MAX_BUFFERED_BODY: usize = plexsphere_wire::node::MAX_NODE_BODY;

/// The body bound of a request path: [`crate::policy::ops::POLICY_BODY_LIMIT`] (a policy
/// document up to the policy crate's 1 MiB, JSON-escaped) for `/v1/domains/{domain}/policy`
/// and `.../policy/validate`, [`MAX_BUFFERED_BODY`] for every other path.
pub(crate) fn buffered_body_limit(path: &str) -> usize {
    let policy_route = path
        .strip_prefix("/v1/domains/")
        .and_then(|rest| rest.split_once('/'))
        .is_some_and(|(domain, tail)| {
            !domain.is_empty() && matches!(tail, "policy" | "policy/validate")
        });
    if policy_route {
        crate::policy::ops::POLICY_BODY_LIMIT
    } else {
        MAX_BUFFERED_BODY
    }
}
/// The default cap on open connections (`--max-connections`): room for one event stream per
/// node of a large fleet plus their API calls; mind the process's file descriptor limit
/// (`LimitNOFILE=` in systemd/plexsphere.service).
pub(crate) const MAX_CONNECTIONS: usize = 20_000;
/// The listen backlog: connections the kernel completes and queues before the server accepts
/// them. std's `TcpListener::bind` asks for 128, so a reconnect storm (every node of a large
/// fleet reconnecting after a restart) overflowed the queue and the kernel dropped or reset
/// the rest; the kernel caps it at `net.core.somaxconn` (4096 by default since Linux 5.4).
pub const LISTEN_BACKLOG: i32 = 4096;
/// The `Retry-After` of a request refused because too many connections are open.
pub(crate) const CONNECTIONS_RETRY_AFTER_SECS: u64 = 5;

/// The bounds of every connection (module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    pub header_read_timeout: Duration,
    pub max_connections: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: HEADER_READ_TIMEOUT,
            max_connections: MAX_CONNECTIONS,
        }
    }
}

/// How the listener speaks.
#[derive(Clone)]
pub enum Transport {
    Tls(Arc<rustls::ServerConfig>),
    /// Plain HTTP: only with `--tls-terminated-by-proxy`.
    PlainBehindProxy,
}

impl Transport {
    pub(crate) fn scheme(&self) -> &'static str {
        match self {
            Transport::Tls(_) => "https",
            Transport::PlainBehindProxy => "http",
        }
    }
}

/// How long open connections get to finish after shutdown starts.
const GRACE: Duration = Duration::from_secs(10);

/// The protocol timeouts of a server's HTTP builder (axum-server installs hyper's timer,
/// which they need). A macro: the TLS and plain servers' types differ.
macro_rules! configure {
    ($server:expr, $limits:expr) => {{
        let builder = $server.http_builder();
        builder
            .http1()
            .header_read_timeout(Some($limits.header_read_timeout));
        builder
            .http2()
            .keep_alive_interval(Some(HTTP2_KEEPALIVE_INTERVAL))
            .keep_alive_timeout(HTTP2_KEEPALIVE_TIMEOUT);
    }};
}

/// Serves `app` on an already bound listener until `shutdown` resolves, then drains, with the
/// default [`ServerLimits`].
pub async fn run(
    listener: std::net::TcpListener,
    transport: Transport,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    run_with(listener, transport, app, shutdown, ServerLimits::default()).await
}

/// [`run`] with the given limits.
pub async fn run_with(
    listener: std::net::TcpListener,
    transport: Transport,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    limits: ServerLimits,
) -> std::io::Result<()> {
    let handle: Handle<SocketAddr> = Handle::new();
    let on_shutdown = handle.clone();
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutting down: no new connections, draining open ones");
        on_shutdown.graceful_shutdown(Some(GRACE));
    });
    let guard = Arc::new(Guard {
        handle: handle.clone(),
        max_connections: limits.max_connections,
    });
    let service = app
        .layer(axum::middleware::from_fn_with_state(guard, guard_request))
        .into_make_service_with_connect_info::<SocketAddr>();
    match transport {
        Transport::Tls(config) => {
            let mut server =
                axum_server::from_tcp_rustls(listener, RustlsConfig::from_config(config))?.map(
                    |tls| {
                        tls.handshake_timeout(TLS_HANDSHAKE_TIMEOUT)
                            .acceptor(NoDelayAcceptor::new())
                    },
                );
            configure!(server, limits);
            server
                .first_request_timeout(FIRST_REQUEST_TIMEOUT)
                .handle(handle)
                .serve(service)
                .await
        }
        Transport::PlainBehindProxy => {
            let mut server = axum_server::from_tcp(listener)?.acceptor(NoDelayAcceptor::new());
            configure!(server, limits);
            server
                .first_request_timeout(FIRST_REQUEST_TIMEOUT)
                .handle(handle)
                .serve(service)
                .await
        }
    }
}

struct Guard {
    handle: Handle<SocketAddr>,
    max_connections: usize,
}

/// Every request: the connection cap, then the body read whole (module doc).
async fn guard_request(State(guard): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    let open = guard.handle.connection_count();
    if open > guard.max_connections {
        tracing::warn!(
            open,
            max_connections = guard.max_connections,
            "too many open connections; refusing this request and closing its connection"
        );
        if let Some(conn) = req.extensions().get::<ConnectionShutdown>() {
            conn.graceful_shutdown();
        }
        let mut resp = Error::Unavailable(format!(
            "this server has more than {} connections open; retry after {CONNECTIONS_RETRY_AFTER_SECS} s (on another replica if there is one)",
            guard.max_connections
        ))
        .into_response();
        resp.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(CONNECTIONS_RETRY_AFTER_SECS),
        );
        if req.version() < axum::http::Version::HTTP_2 {
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        return resp;
    }
    let (parts, body) = req.into_parts();
    if body.is_end_stream() {
        return next.run(Request::from_parts(parts, body)).await;
    }
    let limit = buffered_body_limit(parts.uri.path());
    match tokio::time::timeout(BODY_READ_TIMEOUT, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Ok(Err(_)) => Error::BodyTooLarge(limit).into_response(),
        Err(_) => Error::BadRequest(format!(
            "the request body did not arrive within {} s; send the whole body at once",
            BODY_READ_TIMEOUT.as_secs()
        ))
        .into_response(),
    }
}

/// Resolves on SIGTERM or SIGINT. The handlers are installed when this is called (not when
/// the future is first polled), so call it before announcing readiness: a signal sent right
/// after the `listening on` line must not meet the default action.
pub(crate) fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move {
        match (term, int) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = int.recv() => {},
                }
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM/SIGINT; stop the server with SIGKILL");
                std::future::pending::<()>().await;
            }
        }
    }
}
