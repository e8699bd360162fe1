//! The in-process test server: the real router over real TLS (a lab CA from our own `tls`
//! module) on 127.0.0.1:0, with a real SQLite file in a temp dir.
#![allow(dead_code, clippy::unwrap_used)]

pub mod backup;
pub mod broker;
pub mod dev;
pub mod nodes;
pub mod operators;
pub mod postgres;
pub mod process;
pub mod prove;
pub mod replica;
pub mod store;

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use plexsphere::api::{self, ApiConfig, AppState, EventConfig};
use plexsphere::broker::BrokerConfig;
use plexsphere::ratelimit::RateLimit;
use plexsphere::server::{self, Transport};
use plexsphere::store::Store;
use plexsphere::{operator_tokens, tls};
use plexsphere_wire::admin::{IssuedToken, List, TokenView};
use reqwest::StatusCode;
use serde_json::Value;
use tokio::sync::oneshot;

pub const LAB_NODES: &str = "019a0816-0000-7000-8000-000000000002";
pub const OPENSTACK: &str = "019a0816-0000-7000-8000-000000000001";

pub struct Options {
    pub rate_limit: RateLimit,
    /// The node routes' budget per node (tests/limits.rs sets a small one).
    pub node_rate_limit: RateLimit,
    pub trusted_proxies: Vec<IpNet>,
    pub offline_after: Option<Duration>,
    pub events: EventConfig,
    /// Another database than a fresh SQLite file (e.g. a scratch Postgres database).
    pub database_url: Option<String>,
    /// The relays and STUN servers every node's state lists.
    pub relays: Vec<plexsphere_wire::node::RelaySpec>,
    pub stun_advertise: Vec<std::net::SocketAddr>,
    /// Sign-in (sessions are answered only with it).
    pub auth: Option<Arc<plexsphere::auth::Auth>>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            // Tests that do not test the limit must not trip over it.
            rate_limit: RateLimit {
                burst: 100_000,
                refill: Duration::from_secs(1),
            },
            node_rate_limit: RateLimit {
                burst: 100_000,
                refill: Duration::from_millis(1),
            },
            trusted_proxies: Vec::new(),
            offline_after: None,
            events: EventConfig::default(),
            database_url: None,
            relays: Vec::new(),
            stun_advertise: Vec::new(),
            auth: None,
        }
    }
}

pub struct TestServer {
    pub dir: tempfile::TempDir,
    pub base: String,
    pub client: reqwest::Client,
    pub store: Store,
    pub operator_token: String,
    pub state: Arc<AppState>,
    pub ca_pem: String,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

pub fn client_for(ca_pem: &str) -> reqwest::Client {
    client_with_alpn(ca_pem, &[b"h2", b"http/1.1"])
}

/// A client that speaks HTTP/1.1 only (its connection reads a body only as fast as the
/// caller consumes it, unlike HTTP/2's connection-wide buffering).
pub fn client_h1(ca_pem: &str) -> reqwest::Client {
    client_with_alpn(ca_pem, &[b"http/1.1"])
}

fn client_with_alpn(ca_pem: &str, alpn: &[&[u8]]) -> reqwest::Client {
    tls::install_ring_provider();
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(
        rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()).map(|c| c.unwrap()),
    );
    assert_eq!(added, 1);
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    reqwest::Client::builder()
        .tls_backend_preconfigured(config)
        .build()
        .unwrap()
}

use rustls::pki_types::pem::PemObject as _;

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(Options::default()).await
    }

    pub async fn start_with(opts: Options) -> Self {
        // `PLEXSPHERE_TEST_LOG=warn` (an env-filter) shows the server's log in a test's output.
        if let Ok(filter) = std::env::var("PLEXSPHERE_TEST_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_test_writer()
                .try_init();
        }
        let dir = tempfile::tempdir().unwrap();
        let certs = tls::ensure_dev_certs(&dir.path().join("tls"), &[]).unwrap();
        tls::install_ring_provider();
        let tls_config = tls::server_config(&certs.server_cert, &certs.server_key).unwrap();
        let url = opts
            .database_url
            .clone()
            .unwrap_or_else(|| Store::sqlite_url(dir.path()));
        let store = store::seeded(&url).await;
        let operator_token =
            operator_tokens::create(&store, "test", time::OffsetDateTime::now_utc())
                .await
                .unwrap()
                .expose();
        let config = ApiConfig {
            register_rate_limit: opts.rate_limit,
            node_rate_limit: api::NodeRateLimit(opts.node_rate_limit),
            trusted_proxies: opts.trusted_proxies,
            ca_pem: Some(certs.ca_pem.clone()),
            offline_after: opts.offline_after,
            events: opts.events,
            relays: opts.relays,
            stun_advertise: opts.stun_advertise,
            ..ApiConfig::default()
        };
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let broker = BrokerConfig {
            public_url: Some(format!("https://localhost:{port}")),
            ca_pem: Some(certs.ca_pem.clone()),
            reconcile_every: Duration::from_millis(200),
            ..BrokerConfig::default()
        };
        let state = Arc::new(
            AppState::with_broker_config(store.clone(), dir.path(), config, broker)
                .with_auth(opts.auth),
        );
        plexsphere::maintenance::spawn(&state);
        plexsphere::broker::reconcile::spawn(&state);
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(server::run(
            listener,
            Transport::Tls(tls_config),
            api::router(state.clone()),
            async move {
                let _ = rx.await;
            },
        ));
        Self {
            base: format!("https://localhost:{port}"),
            client: client_for(&certs.ca_pem),
            ca_pem: certs.ca_pem.clone(),
            state,
            dir,
            store,
            operator_token,
            shutdown: Some(tx),
            task: Some(task),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Stops the server and waits until it has drained.
    pub async fn stop(mut self) {
        self.state.streams.close_all();
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
        }
    }

    /// An operator request (with the operator token): its status and JSON body.
    async fn op_send(&self, req: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let r = req.bearer_auth(&self.operator_token).send().await.unwrap();
        let status = r.status();
        (status, r.json().await.unwrap())
    }

    pub async fn op_get(&self, path: &str) -> (StatusCode, Value) {
        self.op_send(self.client.get(self.url(path))).await
    }

    pub async fn op_delete(&self, path: &str) -> (StatusCode, Value) {
        self.op_send(self.client.delete(self.url(path))).await
    }

    pub async fn op_post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.op_send(self.client.post(self.url(path)).json(&body))
            .await
    }

    pub async fn issue_token(&self, project: &str) -> IssuedToken {
        let (status, body) = self
            .op_post(
                &format!("/v1/projects/{project}/bootstrap-tokens"),
                serde_json::json!({"kind": "node", "env_prefix": "lab", "ttl_secs": 3600}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        serde_json::from_value(body).unwrap()
    }

    pub async fn tokens(&self, project: &str) -> Vec<TokenView> {
        let (status, body) = self
            .op_get(&format!("/v1/projects/{project}/bootstrap-tokens"))
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        serde_json::from_value::<List<TokenView>>(body)
            .unwrap()
            .items
    }

    /// POSTs a registration body; answers status, Retry-After and the JSON body.
    pub async fn register_raw(
        &self,
        body: &Value,
        xff: Option<&str>,
    ) -> (StatusCode, Option<String>, Value) {
        let body = prove::prove_body(&self.client, &self.base, body).await;
        self.register_unproved(&body, xff).await
    }

    /// POSTs a registration body as it is (no challenge, no proof added).
    pub async fn register_unproved(
        &self,
        body: &Value,
        xff: Option<&str>,
    ) -> (StatusCode, Option<String>, Value) {
        let mut req = self.client.post(self.url("/v1/register")).json(body);
        if let Some(x) = xff {
            req = req.header("x-forwarded-for", x);
        }
        let r = req.send().await.unwrap();
        let status = r.status();
        let retry = r
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        (status, retry, r.json().await.unwrap())
    }

    pub async fn register(&self, body: &Value) -> (StatusCode, Value) {
        let (s, _, b) = self.register_raw(body, None).await;
        (s, b)
    }
}

/// A distinct, valid WireGuard public key per number (of the secret [`prove::wg_secret`]).
pub fn wg_key(n: u32) -> String {
    prove::remember(prove::wg_secret(n))
}

pub fn register_body(token: &str, key: &str) -> Value {
    serde_json::json!({
        "bootstrap_token": token,
        "wireguard_public_key": key,
        "hostname": "node-1",
        "arch": "amd64",
        "plexd_version": "0.1.0",
    })
}

pub fn assert_code(status: StatusCode, body: &Value, want_status: u16, want_code: &str) {
    assert_eq!(status.as_u16(), want_status, "{body}");
    assert_eq!(body["code"], want_code, "{body}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
}

/// Every `table.column` of the SQLite file where some row holds `needle` (text, blob or number).
pub async fn cells_holding(pool: &sqlx::AnyPool, needle: &str) -> Vec<String> {
    let mut conn = pool.acquire().await.unwrap();
    let tables: Vec<String> =
        sqlx::query("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .fetch_all(&mut *conn)
            .await
            .unwrap()
            .iter()
            .map(|r| sqlx::Row::get(r, "name"))
            .collect();
    assert!(
        tables.iter().any(|t| t == "resources") && tables.iter().any(|t| t == "bootstrap_tokens"),
        "{tables:?}"
    );
    let mut found = Vec::new();
    for t in tables {
        let sql = format!("SELECT name FROM pragma_table_info('{t}')");
        let columns: Vec<String> = sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_all(&mut *conn)
            .await
            .unwrap()
            .iter()
            .map(|r| sqlx::Row::get(r, "name"))
            .collect();
        assert!(!columns.is_empty(), "{t} has no columns");
        for c in columns {
            // hex() reads every storage class (text, blob, number) as its bytes.
            let sql = format!("SELECT hex(\"{c}\") AS v FROM \"{t}\"");
            for row in sqlx::query(sqlx::AssertSqlSafe(sql))
                .fetch_all(&mut *conn)
                .await
                .unwrap()
            {
                let bytes = hex::decode(sqlx::Row::get::<String, _>(&row, "v")).unwrap();
                if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                    found.push(format!("{t}.{c}"));
                }
            }
        }
    }
    found
}
