//! plexd's opt-in metrics listener (root: two real nodes in network namespaces with the
//! userspace data plane, against the real control plane): once the mesh is up the scrape shows
//! one peer with a handshake age, a state version and a connected stream; a node without
//! `metrics.listen` has no listener; a bad `metrics.listen` is a clear config error.
//! The exposition is read with a real parser (`prometheus-parse`).

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::time::Duration;

use plexsphere_e2e::netns::{self, Lab};
use plexsphere_e2e::scrape;
use plexsphere_e2e::{ControlPlane, Host, LAB_NODES_PROJECT, Proc, wait_until};
use prometheus_parse::{Scrape, Value};

const BOUND: Duration = Duration::from_secs(60);
const METRICS: &str = "127.0.0.1:9586";

fn config(iface: &str, metrics: &str) -> String {
    format!(
        "wireguard:\n  backend: userspace\n  interface: {iface}\ndaemon:\n  backoff_initial_ms: 200\n  backoff_cap_secs: 2\n  intervals:\n    heartbeat_secs: 1\n    endpoint_report_secs: 1\n    state_poll_secs: 2\n    ingest_secs: 1\n{metrics}"
    )
}

struct Node {
    ns: String,
    host: Host,
    proc: Proc,
}

fn start(lab: &mut Lab, cp: &ControlPlane, root: &std::path::Path, metrics: &str) -> Node {
    let i = lab.nodes_len();
    let ns = lab.add_node().unwrap();
    let host = Host::new(&root.join(format!("node{i}"))).unwrap();
    host.write_config(
        &cp.url,
        &cp.ca_file(),
        LAB_NODES_PROJECT,
        &format!("node{i}"),
        &config(&lab.wg_iface(i), metrics),
    )
    .unwrap();
    host.write_token(&cp.issue_token(LAB_NODES_PROJECT).unwrap())
        .unwrap();
    let proc = netns::start_daemon(&ns, &host).unwrap();
    wait_until(BOUND, "the daemon's event stream connects", || {
        Ok(host
            .status()?
            .filter(|s| s["event_stream_connected"] == true && !s["state_version"].is_null()))
    })
    .unwrap_or_else(|e| panic!("{e}\n--- plexd output:\n{}", proc.output()));
    Node { ns, host, proc }
}

fn parse(body: &str) -> Scrape {
    Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).unwrap()
}

/// The value of the one sample `name` whose labels include `labels`.
fn value(s: &Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut hits = s
        .samples
        .iter()
        .filter(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)));
    let hit = hits.next()?;
    assert!(hits.next().is_none(), "more than one {name} {labels:?}");
    match &hit.value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => Some(*v),
        _ => None,
    }
}

#[test]
fn the_metrics_listener_shows_the_mesh_and_is_off_unless_configured() {
    let tmp = tempfile::tempdir().unwrap();
    let mut lab = Lab::new().unwrap();
    let cp = netns::start_control_plane(&tmp.path().join("cp"), lab.host_addr(), &[]).unwrap();
    let a = start(
        &mut lab,
        &cp,
        tmp.path(),
        &format!("metrics:\n  listen: {METRICS}\n"),
    );
    let b = start(&mut lab, &cp, tmp.path(), "");
    let addr: SocketAddr = METRICS.parse().unwrap();
    let b_id = b.host.identity().unwrap().0;
    let b_ip = b.host.identity().unwrap().1;

    // Traffic brings up the WireGuard session, so a handshake age exists.
    wait_until(BOUND, "node a pings node b over the mesh", || {
        let out = netns::exec(&a.ns, "ping", &["-c", "1", "-W", "1", &b_ip])?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !err.contains("exec of"),
            "ping is not installed: apt-get install iputils-ping ({err})"
        );
        Ok(out.status.success().then_some(()))
    })
    .unwrap_or_else(|e| {
        panic!(
            "{e}\n--- a:\n{}\n--- b:\n{}",
            a.proc.output(),
            b.proc.output()
        )
    });

    let handshake = "plexd_peer_last_handshake_age_seconds";
    let peer = ("peer", b_id.as_str());
    let m = wait_until(BOUND, "the scrape shows b's handshake", || {
        let (status, body) = scrape::get_in(&a.ns, addr, "/metrics", BOUND)?;
        assert_eq!(status, 200, "{body}");
        let m = parse(&body);
        Ok(value(&m, handshake, &[peer]).is_some().then_some(m))
    })
    .unwrap_or_else(|e| panic!("{e}\n--- a:\n{}", a.proc.output()));

    assert_eq!(value(&m, "plexd_up", &[]), Some(1.0));
    assert_eq!(value(&m, "plexd_peers", &[]), Some(1.0));
    assert!(value(&m, "plexd_state_version", &[]).unwrap() > 0.0);
    assert_eq!(value(&m, "plexd_event_stream_connected", &[]), Some(1.0));
    assert!(value(&m, "plexd_event_stream_reconnects_total", &[]).is_some());
    assert!(value(&m, "plexd_ingest_queue_length", &[]).unwrap() >= 0.0);
    let age = value(&m, handshake, &[peer]).unwrap();
    assert!((0.0..180.0).contains(&age), "handshake age {age}");
    assert!(value(&m, "plexd_peer_rx_bytes_total", &[peer]).unwrap() > 0.0);
    assert!(value(&m, "plexd_peer_tx_bytes_total", &[peer]).unwrap() > 0.0);
    // One peer, on exactly one path.
    let by_path: f64 = ["direct", "relay_udp", "relay_tcp", "none"]
        .iter()
        .map(|p| value(&m, "plexd_peers_by_path", &[("path", p)]).unwrap())
        .sum();
    assert_eq!(by_path, 1.0);
    // Labels never carry free-form text from the network (the hostname).
    assert!(
        m.samples
            .iter()
            .all(|s| s.labels.get("peer").is_none_or(|p| p == b_id)),
        "{:?}",
        m.samples
    );

    let (status, _) = scrape::get_in(&a.ns, addr, "/", BOUND).unwrap();
    assert_eq!(status, 404);

    // b has no metrics section: nothing listens there.
    let refused = scrape::get_in(&b.ns, addr, "/metrics", BOUND).unwrap_err();
    let io = refused.downcast_ref::<std::io::Error>();
    assert_eq!(
        io.map(std::io::Error::kind),
        Some(std::io::ErrorKind::ConnectionRefused),
        "{refused:#}"
    );
    drop((a, b, cp));
}

#[test]
fn a_bad_metrics_listen_is_a_config_error_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let host = Host::new(&tmp.path().join("node")).unwrap();
    for (listen, says) in [
        ("0.0.0.0:9586", "not a loopback address"),
        ("localhost:9586", "metrics.listen"),
    ] {
        host.write_config(
            "https://127.0.0.1:9",
            &tmp.path().join("ca.crt"),
            LAB_NODES_PROJECT,
            "node",
            &format!("metrics:\n  listen: {listen}\n"),
        )
        .unwrap();
        let out = host.plexd(&["run"]).unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{listen}: {err}");
        assert!(err.contains(says), "{listen}: {err}");
        assert!(err.contains("config.yaml:"), "names the file: {err}");
    }
    // Allowed explicitly: the config is accepted (plexd goes on to enrol, and fails there).
    host.write_config(
        "https://127.0.0.1:9",
        &tmp.path().join("ca.crt"),
        LAB_NODES_PROJECT,
        "node",
        "metrics:\n  listen: 0.0.0.0:9586\n  allow_non_loopback: true\n",
    )
    .unwrap();
    let out = host.plexd(&["run", "--max-wait", "1s"]).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("metrics.listen"), "{err}");
}
