//! `plexctl node observations` against a real plexsphere: the server's router, store (a SQLite
//! file) and TLS (its dev CA) in this process on 127.0.0.1:0; the plexctl binary in a child
//! process; a node registered and its ingest batch sent over HTTPS as plexd would. Also
//! `plexctl node get`, which shows the node's last heartbeat and its dropped-observation count,
//! and its candidates by kind, home relay and NAT from its last endpoint report.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use std::path::PathBuf;
use std::sync::Arc;

use base64::Engine as _;
use plexsphere::api::{self, ApiConfig, AppState};
use plexsphere::server::{self, Transport};
use plexsphere::store::Store;
use plexsphere::{operator_tokens, seed, tls};
use plexsphere_wire::RegisterResponse;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;
use serde_json::{Value, json};

const PLEXCTL: &str = env!("CARGO_BIN_EXE_plexctl");
const LAB_NODES: &str = "019a0816-0000-7000-8000-000000000002";

struct Server {
    dir: tempfile::TempDir,
    base: String,
    ca_file: PathBuf,
    client: reqwest::Client,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn start() -> Server {
    let dir = tempfile::tempdir().unwrap();
    let certs = tls::ensure_dev_certs(&dir.path().join("tls"), &[]).unwrap();
    tls::install_ring_provider();
    let tls_config = tls::server_config(&certs.server_cert, &certs.server_key).unwrap();
    let store = Store::connect(&Store::sqlite_url(dir.path()))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let now = time::OffsetDateTime::now_utc();
    let manifest = seed::parse(seed::LAB_SEED, "lab").unwrap();
    seed::apply(&store, &manifest, "lab", now).await.unwrap();
    let token = operator_tokens::create(&store, "test", now).await.unwrap();
    std::fs::write(dir.path().join("operator-token"), token.expose()).unwrap();
    let config = ApiConfig {
        ca_pem: Some(certs.ca_pem.clone()),
        relays: vec![plexsphere_wire::node::RelaySpec {
            name: "r1".to_owned(),
            public_key: "AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=".to_owned(),
            udp: Some("203.0.113.5:3479".parse().unwrap()),
            tls: None,
            tls_server_name: None,
        }],
        ..ApiConfig::default()
    };
    let state = Arc::new(AppState::new(store, dir.path(), config));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server::run(
        listener,
        Transport::Tls(tls_config),
        api::router(state),
        async move {
            let _ = stopped.await;
        },
    ));
    Server {
        base: format!("https://localhost:{port}"),
        ca_file: certs.ca_cert.clone(),
        client: client(&certs.ca_pem),
        dir,
        stop,
        task,
    }
}

fn client(ca_pem: &str) -> reqwest::Client {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    reqwest::Client::builder()
        .tls_backend_preconfigured(config)
        .build()
        .unwrap()
}

impl Server {
    /// Runs plexctl with this server, its CA and the operator token; answers (exit, stdout, stderr).
    async fn plexctl(&self, args: &[&str]) -> (i32, String, String) {
        let out = tokio::process::Command::new(PLEXCTL)
            .args(args)
            .arg("--server")
            .arg(&self.base)
            .arg("--ca-file")
            .arg(&self.ca_file)
            .arg("--token-file")
            .arg(self.dir.path().join("operator-token"))
            .env_clear()
            .env("HOME", self.dir.path())
            .output()
            .await
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    }

    async fn plexctl_ok(&self, args: &[&str]) -> String {
        let (code, stdout, stderr) = self.plexctl(args).await;
        assert_eq!(code, 0, "plexctl {args:?}: {stderr}");
        stdout
    }

    /// A node registered with a token plexctl issued.
    async fn enrol(&self, n: u8) -> RegisterResponse {
        let issued: Value = serde_json::from_str(
            &self
                .plexctl_ok(&[
                    "bootstrap-token",
                    "issue",
                    "--project",
                    LAB_NODES,
                    "--env-prefix",
                    "lab",
                    "-o",
                    "json",
                ])
                .await,
        )
        .unwrap();
        let mut key = [7u8; 32];
        key[0] = n;
        let body = json!({
            "bootstrap_token": issued["token"],
            "wireguard_public_key": base64::engine::general_purpose::STANDARD.encode(key),
            "hostname": format!("node-{n}"),
            "arch": "amd64",
            "plexd_version": "0.1.0",
        });
        let r = self
            .client
            .post(format!("{}/v1/register", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), reqwest::StatusCode::CREATED);
        r.json().await.unwrap()
    }

    /// POSTs `body` to the node API call `call` (`ingest`, `heartbeat`) as `node`.
    async fn node_post(
        &self,
        node: &RegisterResponse,
        call: &str,
        body: Value,
        expected: reqwest::StatusCode,
    ) {
        let r = self
            .client
            .post(format!("{}/v1/nodes/{}/{call}", self.base, node.node_id))
            .bearer_auth(&node.node_credential)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), expected, "POST {call}");
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }
}

fn columns(line: &str) -> Vec<&str> {
    line.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_observations_prints_a_table_and_json() {
    let srv = start().await;
    let a = srv.enrol(1).await;
    let b = srv.enrol(2).await;
    let (a_id, b_id) = (a.node_id.to_string(), b.node_id.to_string());
    srv.node_post(
        &a,
        "ingest",
        json!({"batch_id": "5f0c7a4e-2b1d-4c3e-9a8b-7d6e5f4a3b2c", "dropped": 7, "observations": [
            {"at": 1796032800, "type": "handshake", "peer_node_id": b.node_id, "endpoint": "192.0.2.7:51820"},
            {"at": 1796032801, "type": "traffic", "peer_node_id": b.node_id, "rx_bytes": 2048, "tx_bytes": 10},
            {"at": 1796032802, "type": "error", "message": "\u{1b}[2Jboom\nfake"},
        ]}),
        reqwest::StatusCode::ACCEPTED,
    )
    .await;

    let table = srv.plexctl_ok(&["node", "observations", &a_id]).await;
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 5, "{table}");
    assert_eq!(columns(lines[0]), ["TIME", "KIND", "PEER", "DETAIL"]);
    assert_eq!(
        columns(lines[1]),
        [
            "2026-11-30T10:00:02Z",
            "error",
            "-",
            "\\u{1b}[2Jboom\\nfake"
        ]
    );
    assert_eq!(
        columns(lines[2]),
        [
            "2026-11-30T10:00:01Z",
            "traffic",
            b_id.as_str(),
            "rx 2.0 KiB tx 10 B"
        ]
    );
    assert_eq!(
        columns(lines[3]),
        [
            "2026-11-30T10:00:00Z",
            "handshake",
            b_id.as_str(),
            "endpoint 192.0.2.7:51820"
        ]
    );
    assert_eq!(lines[4], "dropped by the node before sending: 7");
    assert!(!table.contains('\u{1b}'), "{table:?}");

    let filtered = srv
        .plexctl_ok(&[
            "node",
            "observations",
            &a_id,
            "--kind",
            "handshake",
            "--limit",
            "5",
        ])
        .await;
    assert_eq!(filtered.lines().count(), 3, "{filtered}");
    assert!(
        filtered.lines().nth(1).unwrap().contains("handshake"),
        "{filtered}"
    );

    let json: Value = serde_json::from_str(
        &srv.plexctl_ok(&[
            "node",
            "observations",
            &a_id,
            "--output",
            "json",
            "--limit",
            "2",
        ])
        .await,
    )
    .unwrap();
    assert_eq!(json["node_id"], a_id.as_str());
    assert_eq!(json["dropped"], 7);
    let items = json["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["type"], "error");
    assert_eq!(items[0]["message"], "\u{1b}[2Jboom\nfake");
    assert_eq!(items[1]["type"], "traffic");
    assert_eq!(items[1]["peer_node_id"], b_id.as_str());
    assert_eq!(items[1]["rx_bytes"], 2048);

    // An unknown node: the server's 404 (exit 1); a bad id or limit: usage (exit 64).
    let unknown = "019a0816-0000-7000-8000-0000000000ff";
    let (code, stdout, stderr) = srv.plexctl(&["node", "observations", unknown]).await;
    assert_eq!((code, stdout.as_str()), (1, ""), "{stderr}");
    assert!(
        stderr.contains(unknown) && stderr.contains("not_found"),
        "{stderr}"
    );
    let (code, _, stderr) = srv.plexctl(&["node", "observations", "nope"]).await;
    assert_eq!(code, 64, "{stderr}");
    let (code, _, stderr) = srv
        .plexctl(&["node", "observations", &a_id, "--limit", "501"])
        .await;
    assert_eq!(code, 64, "{stderr}");
    srv.stop().await;
}

/// The value of a `label:  value` line of `node get`.
fn field<'a>(text: &'a str, label: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(label)?.strip_prefix(':'))
        .map(str::trim)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_get_shows_the_last_heartbeat_and_dropped_observations() {
    let srv = start().await;
    let a = srv.enrol(3).await;
    let id = a.node_id.to_string();

    let before = srv.plexctl_ok(&["node", "get", &id]).await;
    for label in ["last heartbeat", "uptime", "state applied", "peers"] {
        assert_eq!(field(&before, label), Some("-"), "{label}: {before}");
    }
    assert_eq!(field(&before, "observations dropped"), None, "{before}");

    srv.node_post(
        &a,
        "heartbeat",
        json!({"uptime_secs": 3723, "plexd_version": "0.3.0", "state_version": 1,
               "peers": {"configured": 3, "connected": 2}}),
        reqwest::StatusCode::OK,
    )
    .await;
    srv.node_post(
        &a,
        "ingest",
        json!({"batch_id": "6a1d8b5f-3c2e-4d4f-8b9c-8e7f6a5b4c3d", "dropped": 9, "observations": []}),
        reqwest::StatusCode::ACCEPTED,
    )
    .await;

    let after = srv.plexctl_ok(&["node", "get", &id]).await;
    let at = field(&after, "last heartbeat").unwrap();
    time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339).unwrap();
    assert_eq!(field(&after, "uptime"), Some("1h 2m 3s"), "{after}");
    assert_eq!(field(&after, "state applied"), Some("1"), "{after}");
    assert_eq!(field(&after, "peers"), Some("2 of 3 connected"), "{after}");
    assert_eq!(field(&after, "observations dropped"), Some("9"), "{after}");
    assert_eq!(field(&after, "version"), Some("0.3.0"), "{after}");

    let json: Value =
        serde_json::from_str(&srv.plexctl_ok(&["node", "get", &id, "-o", "json"]).await).unwrap();
    assert_eq!(json["last_heartbeat_at"], at);
    assert_eq!(json["uptime_secs"], 3723);
    assert_eq!(json["applied_state_version"], 1);
    assert_eq!(json["peers_configured"], 3);
    assert_eq!(json["peers_connected"], 2);
    assert_eq!(json["observations_dropped"], 9);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_get_shows_candidates_by_kind_home_relay_and_nat() {
    let srv = start().await;
    let a = srv.enrol(4).await;
    let id = a.node_id.to_string();
    let before = srv.plexctl_ok(&["node", "get", &id]).await;
    for label in ["local", "reflexive", "observed", "home relay", "nat"] {
        assert_eq!(field(&before, label), Some("-"), "{label}: {before}");
    }

    srv.node_post(
        &a,
        "endpoints",
        json!({"listen_port": 51820, "addresses": ["192.168.7.2", "2001:db8::7"],
               "reflexive": ["198.51.100.7:40001"], "home_relay": "r1",
               "nat": {"mapping": "endpoint_dependent", "udp_blocked": false}}),
        reqwest::StatusCode::OK,
    )
    .await;
    let after = srv.plexctl_ok(&["node", "get", &id]).await;
    assert_eq!(
        field(&after, "local"),
        Some("192.168.7.2:51820, [2001:db8::7]:51820"),
        "{after}"
    );
    assert_eq!(
        field(&after, "reflexive"),
        Some("198.51.100.7:40001"),
        "{after}"
    );
    // The report came over loopback: not a candidate peers could use.
    assert_eq!(field(&after, "observed"), Some("-"), "{after}");
    assert_eq!(field(&after, "home relay"), Some("r1"), "{after}");
    assert_eq!(
        field(&after, "nat"),
        Some("endpoint-dependent mapping (peers behind NAT reach it through a relay)"),
        "{after}"
    );

    let json: Value =
        serde_json::from_str(&srv.plexctl_ok(&["node", "get", &id, "-o", "json"]).await).unwrap();
    assert_eq!(
        json["candidates"],
        json!([
            {"kind": "local", "address": "192.168.7.2:51820"},
            {"kind": "local", "address": "[2001:db8::7]:51820"},
            {"kind": "reflexive", "address": "198.51.100.7:40001"},
        ])
    );
    assert_eq!(json["home_relay"], "r1");
    assert_eq!(
        json["nat"],
        json!({"mapping": "endpoint_dependent", "udp_blocked": false})
    );
    srv.stop().await;
}
