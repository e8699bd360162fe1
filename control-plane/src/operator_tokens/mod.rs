//! Operator tokens: created on the server host (or by an admin token through the API), stored
//! as the SHA-256 of their secret, each with a scope, optionally one project, an expiry and
//! the time of its last use. What a token grants at a given time is the pure [`grant`].
//!
//! May import the store (the `operators` and `projects` rows); the HTTP API, the CLI and the
//! integration tests import it. Its tests are `tests.rs`.

use plexsphere_wire::admin::{OperatorScope, OperatorTokenStatus, OperatorTokenView};
use plexsphere_wire::secret::OperatorToken;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::store::operators::{self, OperatorRow};
use crate::store::{self, Store, StoreError, projects};

/// The expiry of a token created without `--expires-in`.
pub(crate) const DEFAULT_EXPIRES_IN: &str = "90d";
/// The shortest expiry a token may be created with (1 minute).
pub(crate) const MIN_EXPIRES_IN_SECS: u64 = 60;
/// The longest expiry short of `never` (366 days): a yearly rotation with a day of slack.
pub(crate) const MAX_EXPIRES_IN_SECS: u64 = 366 * 86_400;
/// A token's last use is written at most this often (seconds), so that reads do not turn
/// into a database write on every request.
pub const LAST_USE_WRITE_EVERY_SECS: i64 = 60;
/// The longest token name, in bytes.
pub(crate) const MAX_NAME_LEN: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum OperatorTokenError {
    #[error("the operator token name must be 1-{MAX_NAME_LEN} printable characters")]
    BadName,
    /// The duration parser's message (it quotes the text and says what to type).
    #[error("expires-in: {0}; or `never` for an admin token")]
    BadExpiresIn(String),
    #[error(
        "expires-in must be between {MIN_EXPIRES_IN_SECS} s (1 minute) and {} days, or `never` for an admin token",
        MAX_EXPIRES_IN_SECS / 86_400
    )]
    ExpiresInOutOfRange,
    #[error(
        "only an admin token may never expire; give read-only and operator tokens an expiry (e.g. --expires-in 90d)"
    )]
    NeverNeedsAdmin,
    #[error(
        "an admin token cannot be limited to a project (what only admin may do is global); use --scope operator or read-only with --project"
    )]
    AdminWithProject,
    #[error("no project with id {0}; `plexctl project list` shows them")]
    UnknownProject(Uuid),
    #[error("the system random generator failed")]
    Random,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// When a new token stops working.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    Never,
    AfterSecs(u64),
}

/// Pure: `90d`, `12h`, `1d12h`, `45m`, `3600s` (the one duration syntax,
/// `plexsphere_wire::duration`) or `never`, within the limits above.
pub(crate) fn parse_expires_in(text: &str) -> Result<Expiry, OperatorTokenError> {
    let text = text.trim();
    if text == "never" {
        return Ok(Expiry::Never);
    }
    let total = plexsphere_wire::duration::parse(text)
        .map_err(|e| OperatorTokenError::BadExpiresIn(e.to_string()))?;
    if !(MIN_EXPIRES_IN_SECS..=MAX_EXPIRES_IN_SECS).contains(&total) {
        return Err(OperatorTokenError::ExpiresInOutOfRange);
    }
    Ok(Expiry::AfterSecs(total))
}

/// What a new token is.
#[derive(Debug, Clone)]
pub struct TokenSpec {
    pub name: String,
    pub scope: OperatorScope,
    pub project_id: Option<Uuid>,
    pub expiry: Expiry,
}

impl TokenSpec {
    /// Pure: the checks that need no database.
    pub fn check(&self) -> Result<(), OperatorTokenError> {
        let name = &self.name;
        if name.is_empty() || name.len() > MAX_NAME_LEN || name.chars().any(char::is_control) {
            return Err(OperatorTokenError::BadName);
        }
        if self.expiry == Expiry::Never && self.scope != OperatorScope::Admin {
            return Err(OperatorTokenError::NeverNeedsAdmin);
        }
        if self.project_id.is_some() && self.scope == OperatorScope::Admin {
            return Err(OperatorTokenError::AdminWithProject);
        }
        Ok(())
    }
}

/// Creates an admin token for every project with the default expiry (`plexsphere dev`, tests).
pub async fn create(
    store: &Store,
    name: &str,
    now: OffsetDateTime,
) -> Result<OperatorToken, OperatorTokenError> {
    let spec = TokenSpec {
        name: name.to_owned(),
        scope: OperatorScope::Admin,
        project_id: None,
        expiry: parse_expires_in(DEFAULT_EXPIRES_IN)?,
    };
    Ok(create_scoped(store, &spec, now).await?.0)
}

/// Creates a token; the returned text is the only copy that will ever exist.
pub async fn create_scoped(
    store: &Store,
    spec: &TokenSpec,
    now: OffsetDateTime,
) -> Result<(OperatorToken, OperatorRow), OperatorTokenError> {
    spec.check()?;
    let mut conn = store.acquire().await?;
    if let Some(p) = spec.project_id
        && projects::get(&mut conn, p).await?.is_none()
    {
        return Err(OperatorTokenError::UnknownProject(p));
    }
    let token = OperatorToken::generate().map_err(|_| OperatorTokenError::Random)?;
    let created_at = store::unix(now);
    let expires_at = match spec.expiry {
        Expiry::Never => None,
        Expiry::AfterSecs(secs) => Some(
            i64::try_from(secs)
                .ok()
                .and_then(|s| created_at.checked_add(s))
                .ok_or(OperatorTokenError::ExpiresInOutOfRange)?,
        ),
    };
    let row = OperatorRow {
        id: token.id.clone(),
        name: spec.name.clone(),
        secret_sha256: store::secret_digest(&token.secret),
        created_at,
        revoked_at: None,
        scope: Some(spec.scope.as_str().to_owned()),
        project_id: spec.project_id,
        expires_at,
        last_used_at: None,
    };
    operators::insert(&mut conn, &row).await?;
    tracing::info!(
        operator_token_id = %token.id,
        name = %spec.name,
        scope = spec.scope.as_str(),
        project_id = ?spec.project_id,
        expires_at = ?expires_at,
        "operator token created"
    );
    Ok((token, row))
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

/// What a valid token lets its holder do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grant {
    pub scope: OperatorScope,
    pub project_id: Option<Uuid>,
    pub legacy: bool,
}

/// Why a token whose secret matched grants nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Revoked,
    Expired { at: i64 },
}

/// The scope a row holds: `None` is a legacy token (admin); anything else unknown is a
/// corrupt row, refused rather than guessed.
fn row_scope(row: &OperatorRow) -> Result<(OperatorScope, bool), StoreError> {
    match row.scope.as_deref() {
        None => Ok((OperatorScope::Admin, true)),
        Some(s) => OperatorScope::parse(s)
            .map(|scope| (scope, false))
            .ok_or_else(|| StoreError::corrupt("operator_tokens.scope", format!("{s:?}"))),
    }
}

/// Pure: what the token of `row` grants at `now` (unix seconds). The token expires at its
/// `expires_at`: from that second on it is refused.
pub(crate) fn grant(row: &OperatorRow, now: i64) -> Result<Result<Grant, Refusal>, StoreError> {
    let (scope, legacy) = row_scope(row)?;
    if row.revoked_at.is_some() {
        return Ok(Err(Refusal::Revoked));
    }
    if let Some(at) = row.expires_at
        && now >= at
    {
        return Ok(Err(Refusal::Expired { at }));
    }
    Ok(Ok(Grant {
        scope,
        project_id: row.project_id,
        legacy,
    }))
}

/// Pure: whether a use at `now` should be written (none recorded in the last
/// [`LAST_USE_WRITE_EVERY_SECS`]).
pub(crate) fn last_use_due(last_used_at: Option<i64>, now: i64) -> bool {
    last_used_at.is_none_or(|t| now.saturating_sub(t) >= LAST_USE_WRITE_EVERY_SECS)
}

/// Records a use of token `id` at `now` in the background, at most once per
/// [`LAST_USE_WRITE_EVERY_SECS`]; a failed write is logged and never fails the request.
pub(crate) fn record_use(store: &Store, id: &str, last_used_at: Option<i64>, now: i64) {
    if !last_use_due(last_used_at, now) {
        return;
    }
    let store = store.clone();
    let id = id.to_owned();
    tokio::spawn(async move {
        let written = async {
            let mut conn = store.acquire().await?;
            operators::touch_last_used(&mut conn, &id, now, now - LAST_USE_WRITE_EVERY_SECS).await
        }
        .await;
        if let Err(e) = written {
            tracing::warn!(operator_token_id = %id, error = %e, "cannot record the operator token's last use");
        }
    });
}

/// The token as the API and the CLIs show it (never its secret).
pub fn view(row: &OperatorRow, now: i64) -> Result<OperatorTokenView, StoreError> {
    let (scope, legacy) = row_scope(row)?;
    let at = store::from_unix;
    let status = match grant(row, now)? {
        Ok(_) => OperatorTokenStatus::Active,
        Err(Refusal::Revoked) => OperatorTokenStatus::Revoked,
        Err(Refusal::Expired { .. }) => OperatorTokenStatus::Expired,
    };
    Ok(OperatorTokenView {
        id: row.id.clone(),
        name: row.name.clone(),
        scope,
        project_id: row.project_id,
        legacy,
        status,
        created_at: at("operator_tokens.created_at", row.created_at)?,
        expires_at: row
            .expires_at
            .map(|t| at("operator_tokens.expires_at", t))
            .transpose()?,
        last_used_at: row
            .last_used_at
            .map(|t| at("operator_tokens.last_used_at", t))
            .transpose()?,
        revoked_at: row
            .revoked_at
            .map(|t| at("operator_tokens.revoked_at", t))
            .transpose()?,
    })
}

#[cfg(test)]
mod tests;
