//! What `/readyz` asks of the database: does it answer a query, and is every embedded
//! migration applied. Cheap: one `SELECT 1` and one read of sqlx's small migrations table.

use sqlx::Row as _;

use super::{Store, StoreError, migrator};

impl Store {
    /// Runs `SELECT 1` on a connection from the pool.
    pub(crate) async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.acquire().await?;
        sqlx::query("SELECT 1").execute(&mut *conn).await?;
        Ok(())
    }

    /// The versions of the embedded migrations that the database has not applied (empty:
    /// the schema is current).
    pub(crate) async fn pending_migrations(&self) -> Result<Vec<i64>, StoreError> {
        let mut conn = self.acquire().await?;
        let rows = sqlx::query("SELECT version FROM _sqlx_migrations WHERE success")
            .fetch_all(&mut *conn)
            .await?;
        let applied = rows
            .iter()
            .map(|r| r.try_get::<i64, _>("version"))
            .collect::<Result<std::collections::BTreeSet<i64>, _>>()?;
        Ok(migrator()
            .iter()
            .map(|m| m.version)
            .filter(|v| !applied.contains(v))
            .collect())
    }
}
