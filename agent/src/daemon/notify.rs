//! systemd notifications: READY=1, STATUS=, STOPPING=1 and the watchdog.
//!
//! The sd_notify protocol is one datagram of `KEY=value` lines to the Unix socket named by
//! `$NOTIFY_SOCKET`; the `sd-notify` crate speaks it in Rust, so plexd links no libsystemd and
//! builds as a static musl binary (docs/dependencies.md). The service manager's socket is a
//! path (`/run/systemd/notify`); an abstract one (`@name`) is not reached and is logged.

use std::time::Duration;

use sd_notify::NotifyState;

/// Notifies systemd when it asked for it (`NOTIFY_SOCKET` set).
pub fn notify(state: &[(&str, &str)]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    let lines: Vec<String> = state.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let states: Vec<NotifyState<'_>> = lines.iter().map(|l| NotifyState::Custom(l)).collect();
    if let Err(e) = sd_notify::notify(&states) {
        tracing::warn!(error = %e, ?state, "cannot notify systemd over NOTIFY_SOCKET");
    }
}

/// Half the watchdog period when systemd set `WATCHDOG_USEC` for this process (and
/// `WATCHDOG_PID`, when set, is this process).
pub fn watchdog_interval() -> Option<Duration> {
    let raw = std::env::var_os("WATCHDOG_USEC")?;
    match sd_notify::watchdog_enabled() {
        Some(period) if !period.is_zero() => Some(period / 2),
        Some(_) => None,
        None => {
            tracing::warn!(
                watchdog_usec = ?raw,
                "WATCHDOG_USEC is set but not for this process or not a number; not sending WATCHDOG=1"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixDatagram;
    use std::process::Command;

    use super::*;
    use crate::daemon::core::status::status_line;

    /// Set in the child process of the test below.
    const CHILD: &str = "PLEXD_NOTIFY_TEST_CHILD";

    /// The environment of a test process is shared by its threads, so the notifying side runs
    /// in a child: this test binary again, filtered to this test, with `NOTIFY_SOCKET`,
    /// `WATCHDOG_USEC` and [`CHILD`] set only there; the child notifies and prints the
    /// watchdog interval, the parent checks what arrived.
    #[test]
    fn sends_one_datagram_to_notify_socket_and_reads_the_watchdog() {
        if std::env::var_os(CHILD).is_some() {
            let line = status_line("n1", "10.64.1.2", 0, true);
            notify(&[("READY", "1"), ("STATUS", &line)]);
            println!("watchdog: {:?}", watchdog_interval());
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let socket = UnixDatagram::bind(&path).unwrap();
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "daemon::notify::tests::sends_one_datagram_to_notify_socket_and_reads_the_watchdog",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .env("NOTIFY_SOCKET", &path)
            .env("WATCHDOG_USEC", "30000000")
            .env_remove("WATCHDOG_PID")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("watchdog: Some(15s)"), "{stdout}");
        socket.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 512];
        let n = socket.recv(&mut buf).unwrap();
        assert_eq!(
            std::str::from_utf8(&buf[..n]).unwrap(),
            "READY=1\nSTATUS=node n1 mesh_ip 10.64.1.2: 0 peers, event stream connected\n"
        );
        assert!(socket.recv(&mut buf).is_err(), "a second datagram arrived");
    }
}
