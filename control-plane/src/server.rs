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

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
