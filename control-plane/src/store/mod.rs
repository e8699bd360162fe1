//! The storage layer: one `sqlx::AnyPool` over SQLite (the embedded default) or Postgres.
//!
//! Only portable SQL lives here (`$1` placeholders, `ON CONFLICT`, TEXT ids, BIGINT unix
//! seconds, hex digests). Nothing assumes a single writer: races are settled by constraints
//! and conditional updates, and a transaction that loses to a concurrent writer (SQLite
//! `SQLITE_BUSY`, Postgres `40001`/`40P01`, a unique violation on a mesh IP) is retried whole
//! by [`retry`]. Each table has its own small module of repository functions.

pub mod credentials;
pub mod domain_keys;
pub mod domains;
pub mod error;
pub mod events;
pub(crate) mod fault;
mod health;
pub mod lease;
pub mod mesh_ips;
pub(crate) mod names;
pub mod nodes;
pub(crate) mod observations;
mod open;
pub mod paths;

pub(crate) use open::probe_writable;
pub mod operators;
pub mod policies;
pub mod projects;
pub mod resources;
pub mod roles;
pub mod routes;
pub mod sessions;

pub mod tokens;

use std::borrow::Cow;
use std::future::Future;
use std::path::Path;
use std::time::Duration;

use sqlx::AnyPool;
use sqlx::SqlSafeStr as _;
use sqlx::migrate::{Migration, MigrationType, Migrator};

pub use error::StoreError;
pub(crate) use error::parse_col;
pub use fault::StorageFault;

/// A connection from the store's pool.
pub(crate) type Conn = sqlx::pool::PoolConnection<sqlx::Any>;

/// How many times a transaction that lost a race is tried again before the error surfaces.
pub(crate) const MAX_ATTEMPTS: u32 = 12;

/// The one handle every subsystem uses.
#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
}

impl Store {
    /// Connects to `database_url` (`sqlite://...` or `postgres://...`). A SQLite file is
    /// created when missing and checked first ([`open::prepare_sqlite`]): a full or read-only
    /// disk fails here at once, naming the cause and the path. See [`open`] for the pool's
    /// settings and why each connection is checked when it comes back.
    pub async fn connect(database_url: &str) -> Result<Self, StoreError> {
        Ok(Self {
            pool: open::pool(database_url).await?,
        })
    }

    /// The default database of a data directory: `<dir>/plexsphere.db`, created if missing.
    pub fn sqlite_url(data_dir: &Path) -> String {
        format!(
            "sqlite://{}?mode=rwc",
            data_dir.join("plexsphere.db").display()
        )
    }

    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// A connection from the pool.
    pub async fn acquire(&self) -> Result<Conn, StoreError> {
        Ok(self.pool.acquire().await?)
    }

    /// A transaction on a connection from the pool.
    pub async fn begin(&self) -> Result<sqlx::Transaction<'static, sqlx::Any>, StoreError> {
        Ok(self.pool.begin().await?)
    }

    /// Brings the schema up to date. Safe to run on every start and from several replicas.
    /// Nodes registered before schema version 18 are given DNS names here
    /// ([`names::backfill`]).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        migrator().run(&self.pool).await?;
        let mut conn = self.acquire().await?;
        names::backfill(&mut conn).await?;
        Ok(())
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// The embedded migrations, in order.
pub fn migrator() -> Migrator {
    let migrations = vec![
        Migration::new(
            1,
            Cow::Borrowed("init"),
            MigrationType::Simple,
            include_str!("../../migrations/0001_init.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            2,
            Cow::Borrowed("node api"),
            MigrationType::Simple,
            include_str!("../../migrations/0002_node_api.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            3,
            Cow::Borrowed("broker"),
            MigrationType::Simple,
            include_str!("../../migrations/0003_broker.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            4,
            Cow::Borrowed("observations"),
            MigrationType::Simple,
            include_str!("../../migrations/0004_observations.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            5,
            Cow::Borrowed("ingest batch"),
            MigrationType::Simple,
            include_str!("../../migrations/0005_ingest_batch.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            6,
            Cow::Borrowed("mesh ip cursor"),
            MigrationType::Simple,
            include_str!("../../migrations/0006_mesh_ip_cursor.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            7,
            Cow::Borrowed("node reach"),
            MigrationType::Simple,
            include_str!("../../migrations/0007_node_reach.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            8,
            Cow::Borrowed("operator token scopes"),
            MigrationType::Simple,
            include_str!("../../migrations/0008_operator_scopes.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            9,
            Cow::Borrowed("key rotation"),
            MigrationType::Simple,
            include_str!("../../migrations/0009_key_rotation.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            10,
            Cow::Borrowed("node host"),
            MigrationType::Simple,
            include_str!("../../migrations/0010_node_host.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            11,
            Cow::Borrowed("reusable tokens"),
            MigrationType::Simple,
            include_str!("../../migrations/0011_reusable_tokens.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            12,
            Cow::Borrowed("domain keys"),
            MigrationType::Simple,
            include_str!("../../migrations/0012_domain_keys.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            13,
            Cow::Borrowed("leases"),
            MigrationType::Simple,
            include_str!("../../migrations/0013_leases.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            14,
            Cow::Borrowed("udp offload switch"),
            MigrationType::Simple,
            include_str!("../../migrations/0014_udp_offload.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            15,
            Cow::Borrowed("domain key rotation"),
            MigrationType::Simple,
            include_str!("../../migrations/0015_domain_key_rotation.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            16,
            Cow::Borrowed("unique key prefix"),
            MigrationType::Simple,
            include_str!("../../migrations/0016_key_prefix.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            17,
            Cow::Borrowed("access policy"),
            MigrationType::Simple,
            include_str!("../../migrations/0017_policy.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            18,
            Cow::Borrowed("names and routes"),
            MigrationType::Simple,
            include_str!("../../migrations/0018_names_routes.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            19,
            Cow::Borrowed("auth"),
            MigrationType::Simple,
            include_str!("../../migrations/0019_auth.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            20,
            Cow::Borrowed("audit log"),
            MigrationType::Simple,
            include_str!("../../migrations/0020_audit.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            21,
            Cow::Borrowed("paths"),
            MigrationType::Simple,
            include_str!("../../migrations/0021_paths.sql").into_sql_str(),
            false,
        ),
    ];
    Migrator::with_migrations(migrations)
}

/// Runs `attempt` until it succeeds, fails for a reason other than a lost race, or has been
/// tried [`MAX_ATTEMPTS`] times. Each attempt must open (and commit) its own transaction.
/// Between attempts it waits a short, growing, jittered pause so racing writers spread out.
pub(crate) async fn retry<T, E, F, Fut>(
    what: &'static str,
    is_retryable: impl Fn(&E) -> bool,
    mut attempt: F,
) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut n = 0;
    loop {
        n += 1;
        match attempt().await {
            Err(e) if n < MAX_ATTEMPTS && is_retryable(&e) => {
                tracing::debug!(
                    operation = what,
                    attempt = n,
                    "transaction lost a race; retrying"
                );
                tokio::time::sleep(backoff(n)).await;
            }
            other => return other,
        }
    }
}

/// 2, 4, 8 ... ms capped at 200 ms, plus up to the same again at random.
fn backoff(attempt: u32) -> Duration {
    use ring::rand::SecureRandom as _;
    let base = 2u64.saturating_pow(attempt.min(8)).min(200);
    let mut b = [0u8; 2];
    let jitter = match ring::rand::SystemRandom::new().fill(&mut b) {
        Ok(()) => u64::from(u16::from_le_bytes(b)) % (base + 1),
        Err(_) => 0,
    };
    Duration::from_millis(base + jitter)
}

/// How a secret is stored: the lowercase hex of its SHA-256, never the secret itself.
pub fn secret_digest(secret: &plexsphere_wire::secret::SecretPart) -> String {
    hex::encode(secret.digest())
}

/// Whether `secret` is the one whose [`secret_digest`] is `stored` (in constant time; a
/// malformed stored digest matches nothing).
pub(crate) fn secret_matches(secret: &plexsphere_wire::secret::SecretPart, stored: &str) -> bool {
    secret.matches(&hex::decode(stored).unwrap_or_default())
}

/// Current unix time in seconds from an `OffsetDateTime`.
pub fn unix(t: time::OffsetDateTime) -> i64 {
    t.unix_timestamp()
}

/// A stored unix time back into an `OffsetDateTime`.
pub(crate) fn from_unix(what: &'static str, secs: i64) -> Result<time::OffsetDateTime, StoreError> {
    time::OffsetDateTime::from_unix_timestamp(secs).map_err(|e| StoreError::corrupt(what, e))
}
