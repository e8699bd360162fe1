//! systemd notifications: READY=1, STATUS=, STOPPING=1 and the watchdog.

use std::time::Duration;

/// Notifies systemd when it asked for it (`NOTIFY_SOCKET` set).
pub fn notify(state: &[(&str, &str)]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    #[cfg(feature = "systemd")]
    if let Err(e) = systemd::daemon::notify(state.iter()) {
        tracing::warn!(error = %e, "cannot notify systemd");
    }
    #[cfg(not(feature = "systemd"))]
    tracing::warn!(
        ?state,
        "built without the systemd feature: cannot notify systemd"
    );
}

/// Half the watchdog period when systemd set `WATCHDOG_USEC` for this process.
#[cfg(feature = "systemd")]
pub fn watchdog_interval() -> Option<Duration> {
    std::env::var_os("WATCHDOG_USEC")?;
    match systemd::daemon::watchdog_enabled() {
        Ok(usec) if usec > 0 => Some(Duration::from_micros(usec) / 2),
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(error = %e, "WATCHDOG_USEC is set but unusable; not sending WATCHDOG=1");
            None
        }
    }
}

/// Without the systemd feature (the fuzz build) there is no watchdog to feed.
#[cfg(not(feature = "systemd"))]
pub fn watchdog_interval() -> Option<Duration> {
    None
}

/// The one-line STATUS= summary.
pub fn status_line(node: &str, mesh_ip: &str, peers: usize, connected: bool) -> String {
    let s = if peers == 1 { "" } else { "s" };
    let stream = if connected {
        "connected"
    } else {
        "disconnected"
    };
    format!("node {node} mesh_ip {mesh_ip}: {peers} peer{s}, event stream {stream}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_line_reads_well() {
        assert_eq!(
            status_line("n1", "10.64.1.2", 3, true),
            "node n1 mesh_ip 10.64.1.2: 3 peers, event stream connected"
        );
        assert_eq!(
            status_line("n1", "10.64.1.2", 1, false),
            "node n1 mesh_ip 10.64.1.2: 1 peer, event stream disconnected"
        );
    }
}
