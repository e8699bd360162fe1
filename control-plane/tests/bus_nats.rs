//! The NATS JetStream bus against a real `nats-server` (Debian's 2.9): two buses (two
//! replicas) on one server, a server that goes away and comes back, a replica that starts
//! late and catches up, and the database poller that covers what the bus missed. Without
//! `nats-server` on PATH the tests say so and pass nothing off as tested; under `CI` they fail.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use plexsphere::bus::nats::{NatsBus, NatsConfig, NatsTasks};
use plexsphere::bus::poll;
use plexsphere::bus::{EventBus, InProcessBus};
use tokio::sync::watch;
use uuid::Uuid;

const BOUND: Duration = Duration::from_secs(30);

/// A `nats-server -js` on a loopback port, killed on drop.
struct Nats {
    child: Option<Child>,
    port: u16,
    store: tempfile::TempDir,
}

impl Nats {
    fn start() -> Option<Self> {
        if Command::new("nats-server")
            .arg("--version")
            .output()
            .is_err()
        {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI is set but nats-server is missing: scripts/deps.sh installs it"
            );
            eprintln!("skipping: nats-server is not installed (scripts/deps.sh installs it)");
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut nats = Self {
            child: None,
            port,
            store: tempfile::tempdir().unwrap(),
        };
        nats.restart();
        Some(nats)
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// (Re)starts the server on the same port and store directory.
    fn restart(&mut self) {
        self.stop();
        self.child = Some(spawn_nats(self.port, self.store.path()));
        let deadline = Instant::now() + BOUND;
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "nats-server did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn spawn_nats(port: u16, store: &Path) -> Child {
    Command::new("nats-server")
        .args([
            "-js",
            "-a",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "--store_dir",
        ])
        .arg(store)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn bus(url: &str) -> (NatsBus, NatsTasks) {
    let config = NatsConfig {
        urls: vec![url.to_owned()],
        stream_replicas: 1,
        client_name: "bus-test".into(),
    };
    NatsBus::start(&config, Arc::new(InProcessBus::new()))
        .await
        .unwrap()
}

/// Waits until the receiver holds at least `seq`.
async fn reaches(rx: &mut watch::Receiver<u64>, seq: u64, what: &str) {
    let reached = tokio::time::timeout(BOUND, rx.wait_for(|s| *s >= seq))
        .await
        .is_ok();
    assert!(reached, "{what}: the watch stayed at {}", *rx.borrow());
}

async fn link_up(tasks: &mut NatsTasks) {
    tokio::time::timeout(BOUND, tasks.link.wait_for(|l| *l == poll::Link::Up))
        .await
        .expect("the bus never came up")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_on_one_replica_reaches_the_other_and_survives_a_nats_restart() {
    let Some(mut nats) = Nats::start() else {
        return;
    };
    let (a, mut ta) = bus(&nats.url()).await;
    let (b, mut tb) = bus(&nats.url()).await;
    link_up(&mut ta).await;
    link_up(&mut tb).await;
    assert_eq!(a.check(), Ok(()));
    let d = Uuid::new_v4();
    let mut on_a = a.subscribe(d);
    let mut on_b = b.subscribe(d);
    a.notify(d, 1);
    // The local notice is there at once (no round trip).
    assert_eq!(*on_a.borrow_and_update(), 1);
    reaches(&mut on_b, 1, "b hears a's notice over NATS").await;

    // NATS goes away: the bus says so (readiness), and local notices still work.
    nats.stop();
    tokio::time::timeout(BOUND, async {
        while b.check().is_ok() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("b never noticed that NATS is gone");
    let why = b.check().unwrap_err();
    assert!(why.contains("NATS") && why.contains(&nats.url()), "{why}");
    a.notify(d, 2);
    assert_eq!(*on_a.borrow_and_update(), 2);

    // Back: both reconnect on their own, and a later notice crosses again.
    nats.restart();
    link_up(&mut ta).await;
    link_up(&mut tb).await;
    assert_eq!(b.check(), Ok(()));
    a.notify(d, 3);
    reaches(&mut on_b, 3, "b hears a's notice after the restart").await;
    // And the other way round.
    b.notify(d, 4);
    reaches(&mut on_a, 4, "a hears b's notice after the restart").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_starts_late_catches_up_from_the_stream() {
    let Some(nats) = Nats::start() else {
        return;
    };
    let (a, mut ta) = bus(&nats.url()).await;
    link_up(&mut ta).await;
    let (d1, d2) = (Uuid::new_v4(), Uuid::new_v4());
    a.notify(d1, 5);
    a.notify(d1, 7);
    a.notify(d2, 9);
    // The stream holds them (JetStream acknowledged) before the late replica starts.
    let (b, mut tb) = bus(&nats.url()).await;
    link_up(&mut tb).await;
    reaches(&mut b.subscribe(d1), 7, "the late replica's Domain 1").await;
    reaches(&mut b.subscribe(d2), 9, "the late replica's Domain 2").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bus_whose_nats_never_answers_starts_and_reports_it() {
    // A port nothing listens on: starting must not fail or hang (the poller carries events).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("nats://127.0.0.1:{port}");
    let (a, tasks) = tokio::time::timeout(BOUND, bus(&url)).await.unwrap();
    assert_eq!(*tasks.link.borrow(), poll::Link::Down);
    let why = a.check().unwrap_err();
    assert!(
        why.contains("not connected") && why.contains("polling"),
        "{why}"
    );
    let d = Uuid::new_v4();
    let mut rx = a.subscribe(d);
    a.notify(d, 1);
    assert_eq!(*rx.borrow_and_update(), 1, "local notices need no NATS");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_poller_moves_the_watches_to_the_stored_heads() {
    let srv = common::TestServer::start().await;
    // A registration writes events to the lab Domain's log (and tells the server's own bus,
    // not the one below: only the poller can bring it there).
    let a = srv.enrol(common::LAB_NODES).await;
    let _b = srv.enrol(common::LAB_NODES).await;
    let local = InProcessBus::new();
    let domain = a.domain_id;
    let mut rx = local.subscribe(domain);
    assert_eq!(*rx.borrow_and_update(), 0);
    let moved = poll::poll_once(&srv.store, &local).await.unwrap();
    assert_eq!(moved, 1, "one Domain has events");
    let head = {
        let mut conn = srv.store.acquire().await.unwrap();
        plexsphere::store::events::head(&mut conn, domain)
            .await
            .unwrap()
            .seq
    };
    assert!(head >= 1);
    assert!(rx.has_changed().unwrap());
    assert_eq!(*rx.borrow_and_update(), head);
    // Nothing new: the next poll wakes nobody.
    assert_eq!(poll::poll_once(&srv.store, &local).await.unwrap(), 0);
    assert!(!rx.has_changed().unwrap());
    srv.stop().await;
}

#[test]
fn bad_nats_flags_exit_64_naming_the_flag_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 3] = [
        (&["--nats-url", "http://127.0.0.1:4222"], "nats://"),
        (
            &[
                "--nats-url",
                "nats://127.0.0.1:4222",
                "--nats-stream-replicas",
                "7",
            ],
            "--nats-stream-replicas",
        ),
        (&["--nats-stream-replicas", "3"], "needs --nats-url"),
    ];
    for (flags, says) in cases {
        let out = Command::new(common::dev::BIN)
            .env("PLEXSPHERE_NO_LOCAL_MACHINES", "1")
            .env_remove("PLEXSPHERE_NATS_URL")
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--tls-terminated-by-proxy",
            ])
            .args(flags)
            .arg("--data-dir")
            .arg(dir.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{flags:?}: {stderr}");
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
    }
    assert!(
        !dir.path().join("plexsphere.db").exists(),
        "nothing was opened"
    );
}
