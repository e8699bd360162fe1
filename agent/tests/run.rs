//! `plexd run` as a real process: joins, tells systemd READY=1 over a real notify socket,
//! and stops cleanly on SIGTERM.

mod support;

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::*;

#[test]
fn run_joins_notifies_ready_and_exits_0_on_sigterm() {
    let pki = TestPki::new();
    let server = TlsServer::start(&pki, Answer::json(201, REGISTERED));
    let node = Node::new();
    node.write_config(&format!("api_url: {}\n", server.url()));
    std::fs::write(node.config_dir().join("ca.crt"), pki.ca_pem()).unwrap();
    node.write_token();

    let sock_path = node.root.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    // Bounded wait on the observable condition (the notification), not a sleep.
    sock.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();

    let child = Command::new(env!("CARGO_BIN_EXE_plexd"))
        .arg("run")
        .env("PLEXD_CONFIG", node.config_file())
        .env("PLEXD_STATE_DIR", node.state_dir())
        .env("PLEXD_LOG", "info")
        .env("NOTIFY_SOCKET", &sock_path)
        .env_remove("JOURNAL_STREAM")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    let mut buf = [0u8; 4096];
    let n = sock.recv(&mut buf).expect("plexd run sends READY=1");
    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(msg.contains("READY=1"), "{msg}");
    assert!(
        msg.contains("STATUS=enrolled as 019a0816-0000-7000-8000-0000000000aa (10.64.1.2)"),
        "{msg}"
    );
    assert!(node.identity_file().exists());
    assert!(!node.token_file().exists());

    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let log = stderr(&out);
    assert_eq!(log.matches("registered").count(), 1, "{log}");
    assert!(
        log.contains("node_id=019a0816-0000-7000-8000-0000000000aa"),
        "{log}"
    );
    assert!(log.contains("mesh_ip=10.64.1.2"), "{log}");
    assert!(stdout(&out).is_empty(), "run prints nothing on stdout");
    let token_secret = "pxbt_";
    assert!(
        !log.contains(token_secret),
        "tokens are never logged: {log}"
    );
    assert!(
        !log.contains("pxnk_"),
        "credentials are never logged: {log}"
    );
}
