//! Serving the router: HTTPS with rustls, or plain HTTP behind a TLS-terminating proxy, until
//! a shutdown future resolves (mini-redis style `run(listener, shutdown)`).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum_server::Handle;
use axum_server::tls_rustls::RustlsConfig;

/// How the listener speaks.
#[derive(Clone)]
pub enum Transport {
    Tls(Arc<rustls::ServerConfig>),
    /// Plain HTTP: only with `--tls-terminated-by-proxy`.
    PlainBehindProxy,
}

impl Transport {
    pub fn scheme(&self) -> &'static str {
        match self {
            Transport::Tls(_) => "https",
            Transport::PlainBehindProxy => "http",
        }
    }
}

/// How long open connections get to finish after shutdown starts.
const GRACE: Duration = Duration::from_secs(10);

/// Serves `app` on an already bound listener until `shutdown` resolves, then drains.
pub async fn run(
    listener: std::net::TcpListener,
    transport: Transport,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let handle: Handle<SocketAddr> = Handle::new();
    let on_shutdown = handle.clone();
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutting down: no new connections, draining open ones");
        on_shutdown.graceful_shutdown(Some(GRACE));
    });
    let service = app.into_make_service_with_connect_info::<SocketAddr>();
    match transport {
        Transport::Tls(config) => {
            axum_server::from_tcp_rustls(listener, RustlsConfig::from_config(config))?
                .handle(handle)
                .serve(service)
                .await
        }
        Transport::PlainBehindProxy => {
            axum_server::from_tcp(listener)?
                .handle(handle)
                .serve(service)
                .await
        }
    }
}

/// Resolves on SIGTERM or SIGINT. The handlers are installed when this is called (not when
/// the future is first polled), so call it before announcing readiness: a signal sent right
/// after the `listening on` line must not meet the default action.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
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
