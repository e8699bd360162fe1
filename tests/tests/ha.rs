//! The control plane on several machines, for real: three `plexsphere serve` replicas on one
//! Postgres, a three-node NATS JetStream cluster between them and HAProxy in front (TLS there,
//! X-Forwarded-For, `/readyz` health checks), all real processes (tests/src/ha.rs). Nodes
//! registered through different replicas see each other; events written on one replica reach
//! streams held by the others; a replica killed with SIGKILL under registration and event load
//! loses, duplicates and half-creates nothing, and every stream resumes on another replica
//! without missing an event; NATS restarted (one server, the cluster) or one cluster node
//! killed: streams recover, and what happened meanwhile arrives (polling).
//!
//! Needs Postgres (`PLEXSPHERE_TEST_POSTGRES_URL`, as scripts/test sets), nats-server, HAProxy
//! and openssl; under `CI` a missing one fails the test instead of skipping it.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use plexsphere_e2e::LAB_NODES_PROJECT;
use plexsphere_e2e::ha::{Lab, LabOptions, Postgres};
use plexsphere_e2e::ha_client::{self, Node, Operator, Received};
use plexsphere_test_support::metrics;

const BOUND: Duration = Duration::from_secs(60);

/// The lab, or `None` (outside CI) without Postgres or the programs.
fn lab(opts: LabOptions) -> Option<(tempfile::TempDir, Lab)> {
    let missing: Vec<&str> = ["nats-server", "haproxy", "openssl", "psql"]
        .into_iter()
        .filter(|p| {
            std::process::Command::new("sh")
                .args(["-c", &format!("command -v {p}")])
                .output()
                .map_or(true, |o| !o.status.success())
        })
        .collect();
    if !missing.is_empty() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but {missing:?} are missing: scripts/deps.sh installs them"
        );
        eprintln!("skipping: {missing:?} not installed (scripts/deps.sh installs them)");
        return None;
    }
    let pg = Postgres::scratch_from_env().unwrap()?;
    let tmp = tempfile::Builder::new().prefix("ha1-").tempdir().unwrap();
    let lab = Lab::start(tmp.path(), pg, opts).unwrap();
    lab.wait_bus_consuming(1).unwrap();
    Some((tmp, lab))
}

fn operator(lab: &Lab, http: &reqwest::Client) -> Operator {
    Operator {
        http: http.clone(),
        base: lab.api_url.clone(),
        token: lab.operator_token.clone(),
    }
}

async fn enrol(op: &Operator, base: &str, hostname: &str) -> Node {
    let token = op.issue_token(LAB_NODES_PROJECT).await.unwrap();
    ha_client::register(&op.http, base, &token, hostname)
        .await
        .unwrap()
}

/// Waits until every stream has received exactly the events the database addresses to its
/// node (from the start of the log), then checks none came twice.
async fn streams_match_the_log(lab: &Lab, streams: &[(Node, Arc<Mutex<Received>>)], what: &str) {
    let deadline = Instant::now() + BOUND;
    for (node, received) in streams {
        loop {
            let want = ha_client::expected_seqs(&lab.pg.url, node, 0).unwrap();
            let (got, seqs, ends) = {
                let r = received.lock().unwrap();
                (r.set(), r.seqs.clone(), r.ends.clone())
            };
            if got == want && !want.is_empty() {
                assert!(
                    seqs.windows(2).all(|w| w[0] < w[1]),
                    "{what}: node {} got an event twice or out of order: {seqs:?}",
                    node.reg.node_id
                );
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: node {}'s stream has {:?}, the log {:?} (missing {:?}, extra {:?}); its connections ended: {ends:?}",
                node.reg.node_id,
                got.len(),
                want.len(),
                want.difference(&got).collect::<Vec<_>>(),
                got.difference(&want).collect::<Vec<_>>(),
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_on_different_replicas_see_each_other_and_events_cross_replicas() {
    let Some((_tmp, lab)) = lab(LabOptions::default()) else {
        return;
    };
    let http = ha_client::client(&lab.certs.ca_file).unwrap();
    let op = operator(&lab, &http);
    let direct: Vec<String> = (0..3).map(|i| lab.replica(i).unwrap().url()).collect();
    // One node registered straight at each replica.
    let mut nodes = Vec::new();
    for (i, base) in direct.iter().enumerate() {
        nodes.push(enrol(&op, base, &format!("ha1-node-{i}")).await);
    }
    let keys: BTreeSet<&str> = nodes
        .iter()
        .map(|n| n.reg.domain_signing_public_key.as_str())
        .collect();
    assert_eq!(keys.len(), 1, "every replica signs with the one Domain key");
    let ips: BTreeSet<_> = nodes.iter().map(|n| n.reg.mesh_ip).collect();
    assert_eq!(ips.len(), 3, "three distinct mesh IPs");
    // Each node's state, read from the next replica, lists the other two.
    for (i, n) in nodes.iter().enumerate() {
        let state = n.state(&http, &direct[(i + 1) % 3]).await.unwrap();
        let peers: BTreeSet<_> = state.peers.iter().map(|p| p.node_id).collect();
        let others: BTreeSet<_> = nodes
            .iter()
            .filter(|o| o.reg.node_id != n.reg.node_id)
            .map(|o| o.reg.node_id)
            .collect();
        assert_eq!(
            peers,
            others,
            "node {i}'s state from replica {}",
            (i + 1) % 3 + 1
        );
    }
    // Node i's stream is held by replica i+1; node 2 reports an endpoint on replica 1.
    let streams: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let (rx, task) = ha_client::follow_events(
                http.clone(),
                direct[(i + 1) % 3].clone(),
                n.clone(),
                Some(0),
            );
            (n.clone(), rx, task)
        })
        .collect();
    nodes[2]
        .report_endpoint(&http, &direct[0], 51820)
        .await
        .unwrap();
    // And a fourth node, registered through HAProxy: everybody hears of it.
    let fourth = enrol(&op, &lab.api_url, "ha1-node-3").await;
    let held: Vec<_> = streams
        .iter()
        .map(|(n, r, _)| (n.clone(), r.clone()))
        .collect();
    streams_match_the_log(&lab, &held, "events written on other replicas").await;
    let last = held
        .iter()
        .map(|(_, r)| r.lock().unwrap().seqs.clone())
        .collect::<Vec<_>>();
    for (i, seqs) in last.iter().enumerate() {
        assert!(
            seqs.len() >= 3,
            "node {i} got its peers' registrations and the endpoint change: {seqs:?}"
        );
    }
    // The fourth node's state (through HAProxy) lists all three.
    let state = fourth.state(&http, &lab.api_url).await.unwrap();
    assert_eq!(state.peers.len(), 3);
    // plexctl sees all four through HAProxy.
    let list = lab.plexctl(&["node", "list", "--output", "json"]).unwrap();
    for n in nodes.iter().chain([&fourth]) {
        assert!(list.contains(&n.reg.node_id.to_string()), "{list}");
    }
    for (_, _, task) in streams {
        task.abort();
    }
}

/// Registers nodes through HAProxy until `stop`, retrying each one (same token and key) the
/// way plexd does; answers every node registered.
async fn registration_load(op: Operator, stop: Arc<std::sync::atomic::AtomicBool>) -> Vec<Node> {
    let mut done = Vec::new();
    let mut i = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let token = loop {
            match op.issue_token(LAB_NODES_PROJECT).await {
                Ok(t) => break t,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        let node = ha_client::register(&op.http, &op.base, &token, &format!("ha1-load-{i}"))
            .await
            .unwrap();
        done.push(node);
        i += 1;
    }
    done
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_killed_under_load_loses_nothing_and_streams_resume_elsewhere() {
    let opts = LabOptions {
        // Everything comes through HAProxy, so through one client address.
        extra_args: vec!["--register-burst".into(), "100000".into()],
        ..LabOptions::default()
    };
    let Some((_tmp, mut lab)) = lab(opts) else {
        return;
    };
    let http = ha_client::client(&lab.certs.ca_file).unwrap();
    let op = operator(&lab, &http);
    // Nine streaming nodes through HAProxy (round robin: three on each replica).
    let mut streams = Vec::new();
    for i in 0..9 {
        let n = enrol(&op, &lab.api_url, &format!("ha1-stream-{i}")).await;
        let (rx, task) =
            ha_client::follow_events(http.clone(), lab.api_url.clone(), n.clone(), Some(0));
        streams.push((n, rx, task));
    }
    let held: Vec<_> = streams
        .iter()
        .map(|(n, r, _)| (n.clone(), r.clone()))
        .collect();
    streams_match_the_log(&lab, &held, "before the kill").await;

    // Load: registrations, and endpoint reports from the streaming nodes.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let registering = tokio::spawn(registration_load(op.clone(), stop.clone()));
    let reporters: Vec<_> = held
        .iter()
        .map(|(n, _)| {
            let (n, http, base, stop) =
                (n.clone(), http.clone(), lab.api_url.clone(), stop.clone());
            tokio::spawn(async move {
                let mut port = 40_000;
                let mut reported = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    port += 1;
                    // A report lost with the replica is simply sent again (the next port).
                    if n.report_endpoint(&http, &base, port).await.is_ok() {
                        reported += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                reported
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let killed = lab.kill_replica(0).unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let registered = registering.await.unwrap();
    let mut reports = 0;
    for r in reporters {
        reports += r.await.unwrap();
    }
    assert!(
        registered.len() >= 3,
        "the load registered only {}",
        registered.len()
    );
    assert!(reports >= 9, "the load reported only {reports} endpoints");

    // Every stream has every event addressed to it, once, after resuming elsewhere.
    streams_match_the_log(&lab, &held, "after the kill").await;
    let resumed = held
        .iter()
        .filter(|(_, r)| r.lock().unwrap().opens >= 2)
        .count();
    assert!(resumed >= 1, "the kill ended some streams, which reopened");
    eprintln!(
        "kill -9 under load: {} registrations and {reports} endpoint reports meanwhile; {resumed} of {} streams resumed on another replica",
        registered.len(),
        held.len()
    );

    // The database: every registration exactly once and whole, no duplicate mesh IP.
    let pg = &lab.pg;
    let ids: BTreeSet<String> = held
        .iter()
        .map(|(n, _)| n.reg.node_id.to_string())
        .chain(registered.iter().map(|n| n.reg.node_id.to_string()))
        .collect();
    let in_db: BTreeSet<String> = pg
        .query("SELECT id FROM nodes")
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        in_db, ids,
        "the nodes in the database are exactly the ones registered"
    );
    assert_eq!(
        pg.query("SELECT count(*) FROM (SELECT mesh_ip FROM nodes GROUP BY domain_id, mesh_ip HAVING count(*) > 1) d")
            .unwrap(),
        "0",
        "no mesh IP twice"
    );
    assert_eq!(
        pg.query("SELECT count(*) FROM nodes n WHERE NOT EXISTS (SELECT 1 FROM bootstrap_tokens t WHERE t.consumed_by_node = n.id)")
            .unwrap(),
        "0",
        "no node without the token it consumed"
    );
    assert_eq!(
        pg.query("SELECT count(*) FROM bootstrap_tokens WHERE consumed_by_node IS NOT NULL AND consumed_by_node NOT IN (SELECT id FROM nodes)")
            .unwrap(),
        "0",
        "no token consumed by a node that is not there"
    );
    assert_eq!(
        pg.query("SELECT count(*) FROM nodes WHERE credential_sha256 = '' OR mesh_ip = '' OR wireguard_public_key = ''")
            .unwrap(),
        "0",
        "no half-written node"
    );
    for n in &registered {
        let mesh_ip = pg
            .query(&format!(
                "SELECT mesh_ip FROM nodes WHERE id = '{}'",
                n.reg.node_id
            ))
            .unwrap();
        assert_eq!(
            mesh_ip,
            n.reg.mesh_ip.to_string(),
            "the answer's mesh IP is the stored one"
        );
    }

    // The killed replica comes back on its port and serves again.
    lab.restart_replica(0, killed).unwrap();
    lab.wait_bus_consuming(1).unwrap();
    let late = enrol(&op, &lab.replica(0).unwrap().url(), "ha1-after").await;
    streams_match_the_log(&lab, &held, "after the restart").await;
    assert!(
        held.iter().all(|(_, r)| r.lock().unwrap().seqs.len() >= 2),
        "every stream got events"
    );
    assert_eq!(
        late.state(&http, &lab.api_url).await.unwrap().peers.len(),
        ids.len()
    );
    for (_, _, t) in streams {
        t.abort();
    }
}

/// `plexsphere_event_bus_connected` as the replica at `base` reports it on `/metrics`.
async fn bus_gauge(op: &Operator, base: &str) -> i64 {
    metrics::gauge(&op.http, base, &op.token, "plexsphere_event_bus_connected")
        .await
        .unwrap()
}

/// GET `/readyz` of a replica directly: status and body.
async fn readyz(http: &reqwest::Client, base: &str) -> (u16, String) {
    match http.get(format!("{base}/readyz")).send().await {
        Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
        Err(e) => (0, e.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nats_faults_delay_events_but_lose_none() {
    let Some((_tmp, mut lab)) = lab(LabOptions::default()) else {
        return;
    };
    let http = ha_client::client(&lab.certs.ca_file).unwrap();
    let op = operator(&lab, &http);
    let direct: Vec<String> = (0..3).map(|i| lab.replica(i).unwrap().url()).collect();
    let mut held = Vec::new();
    let mut tasks = Vec::new();
    for (i, base) in direct.iter().enumerate() {
        let n = enrol(&op, base, &format!("ha1-nats-{i}")).await;
        let (rx, task) = ha_client::follow_events(http.clone(), base.clone(), n.clone(), Some(0));
        held.push((n, rx));
        tasks.push(task);
    }
    streams_match_the_log(&lab, &held, "at the start").await;
    let mut port = 41_000;
    let mut report = async |lab: &Lab, replica: usize| {
        port += 1;
        let n = &held[(replica + 1) % 3].0;
        n.report_endpoint(&http, &lab.replica(replica).unwrap().url(), port)
            .await
            .unwrap();
    };

    // One node of the three-node cluster killed: the others carry on.
    lab.nats.as_mut().unwrap().kill(0);
    report(&lab, 0).await;
    report(&lab, 1).await;
    streams_match_the_log(&lab, &held, "with one NATS node down").await;
    lab.nats.as_mut().unwrap().restart(0).unwrap();

    // The whole cluster down: replicas say so on /readyz, events still arrive (polling).
    let nats = lab.nats.as_mut().unwrap();
    for i in 0..3 {
        nats.kill(i);
    }
    let deadline = Instant::now() + BOUND;
    loop {
        let (status, body) = readyz(&http, &direct[2]).await;
        if status == 503 {
            assert!(body.contains("NATS"), "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "readyz stayed {status} {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        bus_gauge(&op, &direct[2]).await,
        0,
        "the bus gauge while NATS is down"
    );
    for r in 0..3 {
        report(&lab, r).await;
    }
    streams_match_the_log(&lab, &held, "while NATS is down").await;

    // Back: every replica consumes again, /readyz is ok, and a new event reaches every stream.
    let nats = lab.nats.as_mut().unwrap();
    for i in 0..3 {
        nats.restart(i).unwrap();
    }
    lab.wait_bus_consuming(2).unwrap();
    for base in &direct {
        let deadline = Instant::now() + BOUND;
        while readyz(&http, base).await.0 != 200 {
            assert!(Instant::now() < deadline, "{base} never became ready again");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    for base in &direct {
        assert_eq!(
            bus_gauge(&op, base).await,
            1,
            "{base}: the bus gauge once NATS is back"
        );
    }
    report(&lab, 2).await;
    streams_match_the_log(&lab, &held, "after the cluster restarted").await;
    for t in tasks {
        t.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_single_nats_server_restarted_loses_no_event() {
    let opts = LabOptions {
        replicas: 2,
        nats_nodes: 1,
        ..LabOptions::default()
    };
    let Some((_tmp, mut lab)) = lab(opts) else {
        return;
    };
    let http = ha_client::client(&lab.certs.ca_file).unwrap();
    let op = operator(&lab, &http);
    let (a_url, b_url) = (lab.replica(0).unwrap().url(), lab.replica(1).unwrap().url());
    let a = enrol(&op, &a_url, "ha1-single-a").await;
    let b = enrol(&op, &b_url, "ha1-single-b").await;
    let (rx, task) = ha_client::follow_events(http.clone(), b_url.clone(), b.clone(), Some(0));
    let held = vec![(b.clone(), rx)];
    streams_match_the_log(&lab, &held, "at the start").await;
    lab.nats.as_mut().unwrap().restart(0).unwrap();
    // Written on the other replica right after the restart (NATS may not be back yet).
    a.report_endpoint(&http, &a_url, 42_001).await.unwrap();
    streams_match_the_log(&lab, &held, "right after the restart").await;
    lab.wait_bus_consuming(2).unwrap();
    a.report_endpoint(&http, &a_url, 42_002).await.unwrap();
    streams_match_the_log(&lab, &held, "once NATS is back").await;
    task.abort();
}

/// plexd's config for the mesh test: the userspace data plane, quick intervals.
fn daemon_config(iface: &str) -> String {
    format!(
        "wireguard:\n  backend: userspace\n  interface: {iface}\ndaemon:\n  backoff_initial_ms: 200\n  backoff_cap_secs: 2\n  intervals:\n    heartbeat_secs: 1\n    endpoint_report_secs: 1\n    state_poll_secs: 2\n    ingest_secs: 1\n"
    )
}

struct Daemon {
    ns: String,
    host: plexsphere_e2e::Host,
    proc: plexsphere_e2e::Proc,
}

impl Daemon {
    fn mesh_ip(&self) -> String {
        self.host.identity().unwrap().1
    }

    /// Waits until the daemon's event stream is connected and it applied a state.
    fn wait_streaming(&self) {
        plexsphere_e2e::wait_until(BOUND, "the daemon's event stream connects", || {
            Ok(self
                .host
                .status()?
                .filter(|s| s["event_stream_connected"] == true && !s["state_version"].is_null()))
        })
        .unwrap_or_else(|e| panic!("{e}\n--- plexd:\n{}", self.proc.output()));
    }

    /// `ping -c count -i 0.25 -W 1` of `ip` from this namespace: how many answers came back.
    fn ping(&self, ip: &str, count: u32) -> u32 {
        let out = plexsphere_e2e::netns::exec(
            &self.ns,
            "ping",
            &["-q", "-c", &count.to_string(), "-i", "0.25", "-W", "1", ip],
        )
        .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        text.split(',')
            .find_map(|part| part.trim().strip_suffix(" received")?.parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "no ping summary: {text} {}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })
    }
}

async fn start_daemon(
    net: &mut plexsphere_e2e::netns::Lab,
    lab: &Lab,
    op: &Operator,
    root: &std::path::Path,
) -> Daemon {
    let i = net.nodes_len();
    let ns = net.add_node().unwrap();
    let host = plexsphere_e2e::Host::new(&root.join(format!("ha1-node{i}"))).unwrap();
    host.write_config(
        &lab.api_url,
        &lab.certs.ca_file,
        LAB_NODES_PROJECT,
        &format!("ha1-node{i}"),
        &daemon_config(&net.wg_iface(i)),
    )
    .unwrap();
    host.write_token(&op.issue_token(LAB_NODES_PROJECT).await.unwrap())
        .unwrap();
    let proc = plexsphere_e2e::netns::start_daemon(&ns, &host).unwrap();
    let d = Daemon { ns, host, proc };
    d.wait_streaming();
    d
}

/// Waits until `from` gets an answer from `to`'s mesh IP.
fn wait_ping(from: &Daemon, to: &Daemon) {
    let ip = to.mesh_ip();
    plexsphere_e2e::wait_until(BOUND, &format!("{} pings {ip}", from.ns), || {
        Ok((from.ping(&ip, 1) == 1).then_some(()))
    })
    .unwrap_or_else(|e| {
        panic!(
            "{e}\n--- plexd:\n{}\n--- plexd:\n{}",
            from.proc.output(),
            to.proc.output()
        )
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_mesh_keeps_carrying_traffic_while_replicas_die() {
    if !nix::unistd::Uid::effective().is_root() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but the tests do not run as root: the mesh needs network namespaces"
        );
        eprintln!("skipping: network namespaces need root (scripts/test runs as root)");
        return;
    }
    let mut net = plexsphere_e2e::netns::Lab::new().unwrap();
    let opts = LabOptions {
        // The daemons in their namespaces reach HAProxy on the host's leg of their bridge.
        front_ip: net.host_addr(),
        ..LabOptions::default()
    };
    let Some((tmp, mut lab)) = lab(opts) else {
        return;
    };
    let http = ha_client::client(&lab.certs.ca_file).unwrap();
    let op = operator(&lab, &http);
    let a = start_daemon(&mut net, &lab, &op, tmp.path()).await;
    let b = start_daemon(&mut net, &lab, &op, tmp.path()).await;
    wait_ping(&a, &b);
    wait_ping(&b, &a);

    // Two of the three replicas die while a pings b: the mesh does not need the control plane.
    let b_ip = b.mesh_ip();
    let pinging = {
        let ns = a.ns.clone();
        std::thread::spawn(move || {
            let out = plexsphere_e2e::netns::exec(
                &ns,
                "ping",
                &["-q", "-c", "40", "-i", "0.25", "-W", "1", &b_ip],
            )
            .unwrap();
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    lab.kill_replica(0).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    lab.kill_replica(1).unwrap();
    let summary = tokio::task::spawn_blocking(move || pinging.join().unwrap())
        .await
        .unwrap();
    let received: u32 = summary
        .split(',')
        .find_map(|part| part.trim().strip_suffix(" received")?.parse().ok())
        .unwrap_or_else(|| panic!("no ping summary: {summary}"));
    assert!(
        received >= 36,
        "the mesh lost pings while replicas died: {summary}"
    );

    // The daemons' streams come back on the last replica, and a node that joins now reaches
    // both (its arrival reaches their streams through it).
    a.wait_streaming();
    b.wait_streaming();
    let c = start_daemon(&mut net, &lab, &op, tmp.path()).await;
    wait_ping(&a, &c);
    wait_ping(&c, &b);
    drop((a, b, c));
}
