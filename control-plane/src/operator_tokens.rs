//! Operator tokens: created on the server host, stored as the SHA-256 of their secret.

use plexsphere_wire::secret::OperatorToken;
use time::OffsetDateTime;

use crate::store::operators::{self, OperatorRow};
use crate::store::{self, Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum OperatorTokenError {
    #[error("the operator token name must be 1-64 printable characters")]
    BadName,
    #[error("the system random generator failed")]
    Random,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Creates a token named `name`; the returned text is the only copy that will ever exist.
pub async fn create(
    store: &Store,
    name: &str,
    now: OffsetDateTime,
) -> Result<OperatorToken, OperatorTokenError> {
    if name.is_empty() || name.len() > 64 || name.chars().any(char::is_control) {
        return Err(OperatorTokenError::BadName);
    }
    let token = OperatorToken::generate().map_err(|_| OperatorTokenError::Random)?;
    let mut conn = store.acquire().await?;
    operators::insert(
        &mut conn,
        &OperatorRow {
            id: token.id.clone(),
            name: name.to_owned(),
            secret_sha256: store::secret_digest(&token.secret),
            created_at: store::unix(now),
            revoked_at: None,
        },
    )
    .await?;
    tracing::info!(operator_token_id = %token.id, name, "operator token created");
    Ok(token)
}

pub async fn list(store: &Store) -> Result<Vec<OperatorRow>, StoreError> {
    let mut conn = store.acquire().await?;
    operators::list(&mut conn).await
}

/// Revokes a token; `false` when no token has that id.
pub async fn revoke(store: &Store, id: &str, now: OffsetDateTime) -> Result<bool, StoreError> {
    let mut conn = store.acquire().await?;
    operators::revoke(&mut conn, id, store::unix(now)).await
}
