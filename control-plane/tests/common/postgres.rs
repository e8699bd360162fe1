//! Postgres for the store tests: `PLEXSPHERE_TEST_POSTGRES_URL=postgres://user@host/db` (a role
//! that may create databases); each call creates a fresh database. `scripts/test` starts a
//! throwaway cluster and sets it; without it a test says so and passes nothing off as tested,
//! and under `CI` it fails.

use sqlx::Executor as _;

use super::{Options, TestServer};

/// The in-process test server on a fresh Postgres database, or None (outside CI) without one.
pub async fn server() -> Option<TestServer> {
    server_with(Options::default()).await
}

/// [`server`] with `options` (their `database_url` is replaced by the scratch database).
pub async fn server_with(options: Options) -> Option<TestServer> {
    let database_url = scratch_database().await?;
    let options = Options {
        database_url: Some(database_url),
        ..options
    };
    Some(TestServer::start_with(options).await)
}

/// A fresh database on the server named by the environment, or None (outside CI) without one.
pub async fn scratch_database() -> Option<String> {
    let Ok(admin) = std::env::var("PLEXSPHERE_TEST_POSTGRES_URL") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but PLEXSPHERE_TEST_POSTGRES_URL is not: scripts/test starts a Postgres for this test"
        );
        eprintln!(
            "skipping: set PLEXSPHERE_TEST_POSTGRES_URL (scripts/test does) to run the Postgres tests"
        );
        return None;
    };
    sqlx::any::install_default_drivers();
    let name = format!("plexsphere_test_{}", uuid::Uuid::new_v4().simple());
    let pool = sqlx::AnyPool::connect(&admin).await.unwrap();
    pool.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .await
        .unwrap();
    pool.close().await;
    let (base, query) = admin
        .split_once('?')
        .map_or((admin.as_str(), None), |(b, q)| (b, Some(q)));
    let (server, _db) = base.rsplit_once('/').unwrap();
    Some(match query {
        Some(q) => format!("{server}/{name}?{q}"),
        None => format!("{server}/{name}"),
    })
}
