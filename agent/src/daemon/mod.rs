//! `plexd run`, what the systemd unit starts: enrol if needed, tell systemd we are ready,
//! and run until SIGTERM/SIGINT.
//!
//! The loop is one `select!` over the node's inputs; today they are only the shutdown signals.
//! The heartbeat, state pull and event stream (next issue) join it as further arms.

use std::ops::ControlFlow;

use crate::exit::{ExitCode, Failure};
use crate::identity::Identity;
use crate::join::{self, JoinSettings, Joined};

/// Why the loop woke up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    Shutdown(&'static str),
}

/// What the daemon does with an input: a pure decision.
pub fn handle(input: Input) -> ControlFlow<&'static str> {
    match input {
        Input::Shutdown(signal) => ControlFlow::Break(signal),
    }
}

/// Runs the daemon: join (once), notify systemd, wait for a signal.
pub async fn run(settings: &JoinSettings) -> Result<(), Failure> {
    let mut signals = Signals::new()?;
    let identity = match join::join(settings).await? {
        Joined::Registered(id) | Joined::AlreadyEnrolled(id) => id,
    };
    announce(&identity);
    loop {
        let input = signals.next().await;
        if let ControlFlow::Break(signal) = handle(input) {
            tracing::info!(signal, node_id = %identity.node_id, "stopping");
            notify(&[("STOPPING", "1")]);
            return Ok(());
        }
    }
}

fn announce(id: &Identity) {
    tracing::info!(node_id = %id.node_id, mesh_ip = %id.mesh_ip, project_id = %id.project_id, api_url = %id.api_url, "enrolled; waiting for the mesh (the heartbeat and event stream come next)");
    let status = format!("enrolled as {} ({})", id.node_id, id.mesh_ip);
    notify(&[("READY", "1"), ("STATUS", status.as_str())]);
}

/// Notifies systemd when it asked for it (`NOTIFY_SOCKET` set).
fn notify(state: &[(&str, &str)]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    match systemd::daemon::notify(state.iter()) {
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "cannot notify systemd"),
    }
}

struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Self, Failure> {
        use tokio::signal::unix::{SignalKind, signal};
        let err = |e: std::io::Error| {
            Failure::new(
                ExitCode::Io,
                format!("cannot install the signal handlers: {e}"),
            )
        };
        Ok(Self {
            term: signal(SignalKind::terminate()).map_err(err)?,
            int: signal(SignalKind::interrupt()).map_err(err)?,
        })
    }

    async fn next(&mut self) -> Input {
        tokio::select! {
            _ = self.term.recv() => Input::Shutdown("SIGTERM"),
            _ = self.int.recv() => Input::Shutdown("SIGINT"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shutdown_breaks_the_loop() {
        assert_eq!(
            handle(Input::Shutdown("SIGTERM")),
            ControlFlow::Break("SIGTERM")
        );
    }
}
