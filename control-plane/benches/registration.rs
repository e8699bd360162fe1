//! Registrations per second as the node table grows: the same store path `POST /v1/register`
//! takes (token check, transaction, mesh IP allocation, event, commit), without HTTP and TLS,
//! one client after the other. Measured at 0 nodes and again at `PLEXSPHERE_BENCH_NODES`
//! (default 10,000), on SQLite (a file in a temp dir) and, when `PLEXSPHERE_TEST_POSTGRES_URL`
//! names a server, on a scratch Postgres database.
//!
//! `cargo bench -p plexsphere --bench registration`; docs/benchmarks.md has the figures.

use std::time::{Duration, Instant};

use plexsphere::bus::InProcessBus;
use plexsphere::keys::Keyring;
use plexsphere::node::register::Registrar;
use plexsphere::seed;
use plexsphere::store::Store;
use plexsphere::store::tokens::{self, TokenRow};
use plexsphere_wire::RegisterRequest;
use plexsphere_wire::secret::{BootstrapToken, TokenKind};
use time::OffsetDateTime;
use uuid::Uuid;

/// The lab Project without a sub-range: its nodes come from the Domain's /16.
const LAB_NODES: &str = "019a0816-0000-7000-8000-000000000002";
/// Registrations timed at each table size.
const SAMPLE: u32 = 300;

type Failure = Box<dyn std::error::Error>;

struct Bench {
    store: Store,
    keys: Keyring,
    bus: InProcessBus,
    project: Uuid,
    registered: u32,
}

impl Bench {
    async fn open(url: &str, data_dir: &std::path::Path) -> Result<Self, Failure> {
        let store = Store::connect(url).await?;
        store.migrate().await?;
        let manifest = seed::parse(seed::LAB_SEED, "lab")?;
        seed::apply(&store, &manifest, "lab", OffsetDateTime::now_utc()).await?;
        Ok(Self {
            keys: Keyring::with_data_dir_kek(store.clone(), data_dir),
            store,
            bus: InProcessBus::new(),
            project: LAB_NODES.parse()?,
            registered: 0,
        })
    }

    /// Issues `n` tokens (untimed) and answers their texts.
    async fn tokens(&self, n: u32) -> Result<Vec<String>, Failure> {
        let mut conn = self.store.acquire().await?;
        let now = OffsetDateTime::now_utc();
        let mut out = Vec::new();
        for _ in 0..n {
            let t = BootstrapToken::generate("lab", TokenKind::Node)?;
            tokens::insert(
                &mut conn,
                &TokenRow::issued(&t, self.project, now, 3600, None),
            )
            .await?;
            out.push(t.expose());
        }
        Ok(out)
    }

    /// Registers one node per token, one after the other; answers the time it took.
    async fn register(&mut self, tokens: &[String]) -> Result<Duration, Failure> {
        let registrar = Registrar {
            store: &self.store,
            keys: &self.keys,
            bus: &self.bus,
            intervals: Default::default(),
        };
        let start = Instant::now();
        for token in tokens {
            self.registered += 1;
            let mut secret = [0u8; 32];
            secret[..4].copy_from_slice(&self.registered.to_be_bytes());
            secret[31] = 0x5a;
            let key = plexsphere_wire::reach::public_key(&secret);
            // A registration is two calls now: the challenge, then the proved request.
            let now = plexsphere::store::unix(OffsetDateTime::now_utc());
            let ask = plexsphere_wire::proof::RegisterChallengeRequest {
                bootstrap_token: token.clone(),
            };
            let challenge = registrar
                .challenge(&ask, now)
                .await
                .map_err(|e| format!("challenge {}: {e}", self.registered))?;
            let server = plexsphere_wire::key::PublicKey::from_base64(&challenge.server_public_key)
                .map_err(|_| "the challenge's key is not 32 bytes")?;
            let token_id = plexsphere_wire::secret::BootstrapToken::parse(token)?.id;
            let req = RegisterRequest {
                bootstrap_token: token.clone(),
                wireguard_public_key: key.to_base64(),
                hostname: format!("node-{}", self.registered),
                arch: "amd64".into(),
                plexd_version: "0.1.0".into(),
                project_id: None,
                resource_handle: None,
                proof: Some(plexsphere_wire::proof::prove_register(
                    &secret,
                    &server,
                    &token_id,
                    &challenge.nonce,
                )),
                nonce: Some(challenge.nonce),
            };
            registrar
                .register(&req, OffsetDateTime::now_utc())
                .await
                .map_err(|e| format!("registration {}: {e}", self.registered))?;
        }
        Ok(start.elapsed())
    }

    /// Registrations per second over `SAMPLE` registrations.
    async fn rate(&mut self) -> Result<f64, Failure> {
        let tokens = self.tokens(SAMPLE).await?;
        let took = self.register(&tokens).await?;
        Ok(f64::from(SAMPLE) / took.as_secs_f64())
    }
}

async fn run(
    backend: &str,
    url: &str,
    data_dir: &std::path::Path,
    nodes: u32,
) -> Result<(), Failure> {
    let mut bench = Bench::open(url, data_dir).await?;
    let at_zero = bench.rate().await?;
    while bench.registered < nodes {
        let n = (nodes - bench.registered).min(1000);
        let tokens = bench.tokens(n).await?;
        bench.register(&tokens).await?;
    }
    let at_n = bench.rate().await?;
    println!(
        "{backend:<9} {at_zero:>8.0}/s at 0 nodes {at_n:>8.0}/s at {nodes} nodes   ratio {:.2}",
        at_zero / at_n
    );
    bench.store.close().await;
    Ok(())
}

async fn scratch_postgres(admin: &str) -> Result<String, Failure> {
    use sqlx::Executor as _;
    sqlx::any::install_default_drivers();
    let name = format!("plexsphere_bench_{}", Uuid::new_v4().simple());
    let pool = sqlx::AnyPool::connect(admin).await?;
    pool.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .await?;
    pool.close().await;
    let (base, query) = admin.split_once('?').unwrap_or((admin, ""));
    let server = base.rsplit_once('/').map_or(base, |(s, _)| s);
    Ok(if query.is_empty() {
        format!("{server}/{name}")
    } else {
        format!("{server}/{name}?{query}")
    })
}

#[tokio::main]
async fn main() -> Result<(), Failure> {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing else we use.
    let nodes: u32 = match std::env::var("PLEXSPHERE_BENCH_NODES") {
        Ok(v) => v.parse()?,
        Err(_) => 10_000,
    };
    let dir = tempfile::tempdir()?;
    run("sqlite", &Store::sqlite_url(dir.path()), dir.path(), nodes).await?;
    match std::env::var("PLEXSPHERE_TEST_POSTGRES_URL") {
        Ok(admin) => {
            let url = scratch_postgres(&admin).await?;
            let pg_dir = tempfile::tempdir()?;
            run("postgres", &url, pg_dir.path(), nodes).await?;
        }
        Err(_) => println!("postgres  skipped: set PLEXSPHERE_TEST_POSTGRES_URL"),
    }
    Ok(())
}
