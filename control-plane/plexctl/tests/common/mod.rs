//! A real plexsphere for plexctl's tests: the server's router, store (a SQLite file) and TLS
//! (its dev CA) in this process on 127.0.0.1:0; plexctl runs as a child process against it.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::Arc;

use plexsphere::api::{self, ApiConfig, AppState};
use plexsphere::server::{self, Transport};
use plexsphere::store::Store;
use plexsphere::{operator_tokens, seed, tls};
use plexsphere_wire::RegisterResponse;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;
use serde_json::{Value, json};

pub const PLEXCTL: &str = env!("CARGO_BIN_EXE_plexctl");
pub const LAB_NODES: &str = "019a0816-0000-7000-8000-000000000002";

pub struct Server {
    pub dir: tempfile::TempDir,
    pub base: String,
    pub ca_file: PathBuf,
    pub client: reqwest::Client,
    pub store: Store,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

pub async fn start() -> Server {
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
    let state = Arc::new(AppState::new(store.clone(), dir.path(), config));
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
        store,
        stop,
        task,
    }
}

pub fn client(ca_pem: &str) -> reqwest::Client {
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
    pub async fn plexctl(&self, args: &[&str]) -> (i32, String, String) {
        self.plexctl_as(&self.dir.path().join("operator-token"), args)
            .await
    }

    /// [`Server::plexctl`] with the operator token in `token_file`.
    pub async fn plexctl_as(
        &self,
        token_file: &std::path::Path,
        args: &[&str],
    ) -> (i32, String, String) {
        let out = tokio::process::Command::new(PLEXCTL)
            .args(args)
            .arg("--server")
            .arg(&self.base)
            .arg("--ca-file")
            .arg(&self.ca_file)
            .arg("--token-file")
            .arg(token_file)
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

    pub async fn plexctl_ok(&self, args: &[&str]) -> String {
        let (code, stdout, stderr) = self.plexctl(args).await;
        assert_eq!(code, 0, "plexctl {args:?}: {stderr}");
        stdout
    }

    /// A registration `body` (its token set) with the key of `secret` and the proof of it over
    /// a fresh challenge (`POST /v1/register/challenge`).
    pub async fn proved(&self, mut body: Value, secret: [u8; 32]) -> Value {
        let token = body["bootstrap_token"].as_str().unwrap().to_owned();
        let c: plexsphere_wire::proof::Challenge = self
            .client
            .post(format!("{}/v1/register/challenge", self.base))
            .json(&json!({ "bootstrap_token": token }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let server = plexsphere_wire::key::PublicKey::from_base64(&c.server_public_key).unwrap();
        let id = plexsphere_wire::secret::BootstrapToken::parse(&token)
            .unwrap()
            .id;
        let key = plexsphere_wire::reach::public_key(&secret);
        body["wireguard_public_key"] = key.to_base64().into();
        body["proof"] =
            plexsphere_wire::proof::prove_register(&secret, &server, &id, &c.nonce).into();
        body["nonce"] = c.nonce.into();
        body
    }

    /// A node registered with a token plexctl issued.
    pub async fn enrol(&self, n: u8) -> RegisterResponse {
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
        let mut secret = [7u8; 32];
        secret[1] = n; // not byte 0: X25519 clears its low 3 bits
        let body = self
            .proved(
                json!({
                    "bootstrap_token": issued["token"],
                    "hostname": format!("node-{n}"),
                    "arch": "amd64",
                    "plexd_version": "0.1.0",
                }),
                secret,
            )
            .await;
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
    pub async fn node_post(
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

    pub async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }
}
