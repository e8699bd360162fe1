//! `plexd run` as a real process: joins, applies the signed state, tells systemd READY=1 over
//! a real notify socket, answers `plexd status` on its socket, and stops cleanly on SIGTERM.

#![allow(clippy::unwrap_used)] // test helpers: a failure here is a test failure

mod support;

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use plexsphere_wire::node::EventKind;
use support::node_api::{self, NODE};
use support::*;

fn notify_socket(node: &Node) -> (UnixDatagram, std::path::PathBuf) {
    let sock_path = node.root.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    // Bounded wait on the observable condition (the notification), not a sleep.
    sock.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    (sock, sock_path)
}

fn run_dir(node: &Node) -> std::path::PathBuf {
    node.root.path().join("run/plexd")
}

fn spawn_run(node: &Node, notify: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_plexd"))
        .arg("run")
        .env("PLEXD_CONFIG", node.config_file())
        .env("PLEXD_STATE_DIR", node.state_dir())
        .env("PLEXD_RUN_DIR", run_dir(node))
        .env("PLEXD_LOG", "info")
        .env("NOTIFY_SOCKET", notify)
        .env_remove("JOURNAL_STREAM")
        .env_remove("WATCHDOG_USEC")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Reads notifications until one contains `needle`.
fn wait_for(sock: &UnixDatagram, needle: &str) -> String {
    let mut buf = [0u8; 4096];
    loop {
        let n = sock
            .recv(&mut buf)
            .expect("plexd run notifies systemd in time");
        let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
        if msg.contains(needle) {
            return msg;
        }
    }
}

fn status_json(node: &Node) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_plexd"))
        .args(["status", "--output", "json"])
        .env("PLEXD_RUN_DIR", run_dir(node))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn term(child: Child) -> Output {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn run_joins_applies_the_state_notifies_ready_and_exits_0_on_sigterm() {
    let pki = TestPki::new();
    let server = TlsServer::start_with(
        &pki,
        node_api::control_plane(
            node_api::state(5, vec![node_api::peer(3)]),
            ": keep-alive\n\n".into(),
        ),
    );
    let node = Node::new();
    node.write_config(&format!(
        "api_url: {}\nwireguard:\n  backend: none\n",
        server.url()
    ));
    std::fs::write(node.config_dir().join("ca.crt"), pki.ca_pem()).unwrap();
    node.write_token();
    let (sock, sock_path) = notify_socket(&node);
    let child = spawn_run(&node, &sock_path);

    let msg = wait_for(&sock, "READY=1");
    assert!(
        msg.contains(&format!(
            "STATUS=node {NODE} mesh_ip 10.64.1.2: 1 peer, event stream"
        )),
        "{msg}"
    );
    assert!(node.identity_file().exists());
    assert!(!node.token_file().exists());
    assert_eq!(mode(&node.state_dir().join("state.json")), 0o600);
    assert_eq!(mode(&run_dir(&node).join("plexd.sock")), 0o600);

    let status = status_json(&node);
    assert_eq!(status["node_id"], NODE);
    assert_eq!(status["state_version"], 5);
    assert_eq!(status["backend"], "none");
    assert_eq!(status["peers"][0]["hostname"], "node-3");
    assert_eq!(status["peers"][0]["endpoint"], "192.0.2.3:51820");

    let out = term(child);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let log = stderr(&out);
    assert_eq!(log.matches("registered").count(), 1, "{log}");
    assert!(
        log.contains("node_id=019a0816-0000-7000-8000-0000000000aa"),
        "{log}"
    );
    assert!(log.contains("mesh_ip=10.64.1.2"), "{log}");
    assert!(
        log.contains("peer added") && log.contains("peer=019a0816-0000-7000-8000-000000000003"),
        "{log}"
    );
    assert!(stdout(&out).is_empty(), "run prints nothing on stdout");
    assert!(!log.contains("pxbt_"), "tokens are never logged: {log}");
    assert!(
        !log.contains("pxnk_"),
        "credentials are never logged: {log}"
    );
    let lines = server.lines.lock().unwrap().clone();
    assert!(lines.iter().any(|l| l.ends_with("/heartbeat")), "{lines:?}");
    assert!(
        !run_dir(&node).join("plexd.sock").exists(),
        "the socket is removed on exit"
    );
}

#[test]
fn cached_state_with_the_api_down_is_applied_and_served() {
    let node = Node::new();
    let origin = dead_origin();
    node.write_config(&format!(
        "api_url: {origin}\nwireguard:\n  backend: none\ndaemon:\n  backoff_initial_ms: 100\n  backoff_cap_secs: 1\n"
    ));
    // An enrolled node with a cached state, as a restart finds it.
    std::fs::create_dir_all(node.state_dir()).unwrap();
    let r: plexsphere_wire::RegisterResponse =
        serde_json::from_str(&node_api::registered()).unwrap();
    let id = plexd::identity::Identity::from_response(r, &origin, time::OffsetDateTime::UNIX_EPOCH);
    id.save(&node.identity_file()).unwrap();
    let env = node_api::state(7, vec![node_api::peer(3), node_api::peer(4)]);
    plexd::daemon::cache::save(&node.state_dir().join("state.json"), &env, &[], 7).unwrap();

    let (sock, sock_path) = notify_socket(&node);
    let child = spawn_run(&node, &sock_path);
    let msg = wait_for(&sock, "READY=1");
    assert!(msg.contains("2 peers, event stream disconnected"), "{msg}");

    let status = status_json(&node);
    assert_eq!(status["state_version"], 7);
    assert_eq!(status["event_stream_connected"], false);
    assert_eq!(status["peers"].as_array().unwrap().len(), 2);
    assert_eq!(status["peers"][1]["mesh_ip"], "10.64.1.4");

    let out = term(child);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let log = stderr(&out);
    assert!(log.contains("applying the cached state"), "{log}");
}

#[test]
fn a_state_signed_by_an_unannounced_key_is_refused_and_a_forged_chain_changes_nothing() {
    use plexsphere_wire::signed::DomainSigner;
    use plexsphere_wire::signing_keys::{KeyTransition, SigningKey, SigningKeyChain};

    // The API answers every state pull with a document signed by a key the node was never
    // told about, and its key chain with a link that key signed itself.
    let foreign = DomainSigner::from_seed(&[7u8; 32]).unwrap();
    let forged_state = node_api::state_signed_by(&foreign, 9, vec![node_api::peer(5)]);
    let forged_chain = SigningKeyChain {
        transitions: vec![KeyTransition::sign(
            &foreign,
            uuid::Uuid::parse_str("019a0816-0000-7000-8000-000000000001").unwrap(),
            SigningKey {
                generation: 2,
                public_key: foreign.public_key_b64(),
                active_from: 0,
            },
        )],
    };
    let chain_json = serde_json::to_string(&forged_chain).unwrap();
    let state_json = serde_json::to_string(&forged_state).unwrap();
    let fake = node_api::control_plane(node_api::state(1, vec![]), ": keep-alive\n\n".into());
    let handler: Handler = std::sync::Arc::new(move |req: &Req| {
        if req.path.ends_with("/signing-keys") {
            Answer::json(200, &chain_json)
        } else if req.path.ends_with("/state") {
            Answer::json(200, &state_json)
        } else {
            fake(req)
        }
    });
    let pki = TestPki::new();
    let server = TlsServer::start_with(&pki, handler);

    // An enrolled node with a good cached state (two peers) signed by its pinned key.
    let node = Node::new();
    node.write_config(&format!(
        "api_url: {}\nwireguard:\n  backend: none\ndaemon:\n  min_interval_secs: 1\n  intervals:\n    state_poll_secs: 1\n",
        server.url()
    ));
    std::fs::write(node.config_dir().join("ca.crt"), pki.ca_pem()).unwrap();
    std::fs::create_dir_all(node.state_dir()).unwrap();
    let r: plexsphere_wire::RegisterResponse =
        serde_json::from_str(&node_api::registered()).unwrap();
    let id = plexd::identity::Identity::from_response(
        r,
        &server.url(),
        time::OffsetDateTime::UNIX_EPOCH,
    );
    id.save(&node.identity_file()).unwrap();
    let before = std::fs::read_to_string(node.identity_file()).unwrap();
    let env = node_api::state(7, vec![node_api::peer(3), node_api::peer(4)]);
    plexd::daemon::cache::save(&node.state_dir().join("state.json"), &env, &[], 7).unwrap();

    let (sock, sock_path) = notify_socket(&node);
    let child = spawn_run(&node, &sock_path);
    wait_for(&sock, "READY=1");
    // Several state pulls are refused; the chain is asked for once (at most once a minute).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let pulls = server
            .lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.ends_with("/state"))
            .count();
        if pulls >= 3 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "fewer than 3 state pulls in 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = status_json(&node);
    assert_eq!(status["state_version"], 7, "{status}");
    assert_eq!(status["peers"].as_array().unwrap().len(), 2, "{status}");
    assert_eq!(
        status["domain_key"]["public_key"],
        node_api::signer().public_key_b64()
    );

    let out = term(child);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let log = stderr(&out);
    assert!(log.contains("refused a state document"), "{log}");
    assert!(
        log.contains("the Domain's key chain does not lead anywhere from the pinned key")
            && log.contains("no transition in the key chain is signed by the pinned Domain key"),
        "{log}"
    );
    let lines = server.lines.lock().unwrap().clone();
    let chains = lines
        .iter()
        .filter(|l| l.ends_with("/signing-keys"))
        .count();
    assert_eq!(chains, 1, "{lines:?}");
    assert_eq!(
        std::fs::read_to_string(node.identity_file()).unwrap(),
        before,
        "the pinned key is unchanged"
    );
}

#[test]
fn a_revocation_event_exits_15_and_keeps_the_identity() {
    let pki = TestPki::new();
    let events = format!(": hi\n\n{}", node_api::frame(9, EventKind::NodeRevoked));
    let server = TlsServer::start_with(
        &pki,
        node_api::control_plane(node_api::state(5, vec![node_api::peer(3)]), events),
    );
    let node = Node::new();
    node.write_config(&format!(
        "api_url: {}\nwireguard:\n  backend: none\n",
        server.url()
    ));
    std::fs::write(node.config_dir().join("ca.crt"), pki.ca_pem()).unwrap();
    node.write_token();
    let (_sock, sock_path) = notify_socket(&node);
    let child = spawn_run(&node, &sock_path);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(15), "{}", stderr(&out));
    let log = stderr(&out);
    assert!(
        log.contains("revoked by an operator (node_revoked)"),
        "{log}"
    );
    assert!(log.contains("plexd leave"), "{log}");
    assert!(
        node.identity_file().exists(),
        "a revocation removes nothing else"
    );
}

#[test]
fn status_without_a_daemon_exits_3() {
    let node = Node::new();
    let out = Command::new(env!("CARGO_BIN_EXE_plexd"))
        .arg("status")
        .env("PLEXD_RUN_DIR", run_dir(&node))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(
        stderr(&out).trim(),
        format!(
            "plexd is not running (no answer on {}/plexd.sock); start it with systemctl start plexd",
            run_dir(&node).display()
        )
    );
}
