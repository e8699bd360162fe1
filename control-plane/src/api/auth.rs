//! `/v1/auth/*` (docs/auth.md): the console's sign-in (authorization code with PKCE, state
//! and nonce kept server-side, bound to the browser), the callback, sign-out, whoami, the
//! public config, and plexctl's exchange of an ID token for a bearer session.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{AppendHeaders, IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::extract::{ApiJson, ClientAddr, Operator, Via};
pub use super::session_check::live_session;
use super::session_check::session_audit;
use super::state::AppState;
use crate::auth::issuer::{IssuerError, url_encode};
use crate::auth::jwt::{CLOCK_SKEW_SECS, Claims};
use crate::auth::roles::RoleGrant;
use crate::auth::session::{self, Kind, SessionSecret};
use crate::auth::{Auth, person_grants};
use crate::error::Error;
use crate::store::{self, sessions};

/// The scopes the console and plexctl ask the issuer for.
pub(crate) const SCOPES: &str = "openid email profile groups";

fn auth(st: &AppState) -> Result<&Arc<Auth>, Error> {
    st.auth.as_ref().ok_or(Error::SignInDisabled)
}

fn issuer_error(e: IssuerError) -> Error {
    match e {
        IssuerError::Token(t) => Error::SignInFailed(format!(
            "the ID token was refused: {t}; nothing was changed, sign in again"
        )),
        other => Error::Unavailable(format!("{other}; sign in again once the issuer answers")),
    }
}

fn random(n: usize) -> Result<String, Error> {
    session::random_b64(n).map_err(|e| Error::Internal(e.to_string()))
}

/// `GET /v1/auth/config` (public): whether sign-in is on, and the issuer.
pub(crate) async fn config(State(st): State<Arc<AppState>>) -> Json<Value> {
    Json(match &st.auth {
        Some(a) => {
            json!({ "enabled": true, "issuer": a.config.issuer, "cli_client_id": a.config.cli_client_id })
        }
        None => json!({ "enabled": false, "issuer": null, "cli_client_id": null }),
    })
}

/// `GET /v1/auth/sign-in?return_to=/path`: 302 to the issuer; the attempt (state, nonce, PKCE
/// verifier, return_to) is kept server-side for [`session::PENDING_SIGN_IN_TTL`], bound to
/// this browser by a short-lived HttpOnly cookie.
pub(crate) async fn sign_in(
    State(st): State<Arc<AppState>>,
    ClientAddr(client): ClientAddr,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, Error> {
    let auth = auth(&st)?;
    let discovery = auth.issuer.discovery().await.map_err(issuer_error)?;
    let now = store::unix(st.now());
    let client_key = crate::ratelimit::client_key(client).to_string();
    let mut conn = st.store.acquire().await?;
    sessions::purge_expired(&mut conn, now).await?;
    let (mine, total) = sessions::count_pending(&mut conn, &client_key, now).await?;
    if mine >= session::MAX_PENDING_PER_CLIENT || total >= session::MAX_PENDING_TOTAL {
        tracing::warn!(client = %client, mine, total, "too many sign-ins in progress");
        return Err(Error::RateLimited(session::PENDING_SIGN_IN_TTL.as_secs()));
    }
    let state = random(32)?;
    let nonce = random(32)?;
    let verifier = random(48)?;
    let browser = random(32)?;
    let ttl = i64::try_from(session::PENDING_SIGN_IN_TTL.as_secs()).unwrap_or(600);
    sessions::insert_pending(
        &mut conn,
        &sessions::PendingRow {
            state_sha256: session::digest(&state),
            browser_sha256: session::digest(&browser),
            nonce: nonce.clone(),
            pkce_verifier: verifier.clone(),
            return_to: session::safe_return_to(q.get("return_to").map(String::as_str)),
            client_key,
            created_at: now,
            expires_at: now + ttl,
        },
    )
    .await?;
    let sep = if discovery.authorization_endpoint.contains('?') {
        '&'
    } else {
        '?'
    };
    let location = format!(
        "{}{sep}response_type=code&client_id={}&redirect_uri={}&scope={}&state={}&nonce={}&code_challenge={}&code_challenge_method=S256",
        discovery.authorization_endpoint,
        url_encode(&auth.config.client_id),
        url_encode(&auth.redirect_uri()),
        url_encode(&auth.config.scopes),
        state,
        nonce,
        session::pkce_challenge(&verifier),
    );
    let cookie = session::set_cookie(
        session::SIGN_IN_COOKIE,
        &browser,
        true,
        "Lax",
        session::PENDING_SIGN_IN_TTL,
    );
    Ok((
        StatusCode::FOUND,
        AppendHeaders([(header::LOCATION, location), (header::SET_COOKIE, cookie)]),
    )
        .into_response())
}

/// The query of the issuer's redirect back.
#[derive(Debug, Deserialize)]
pub(crate) struct CallbackQuery {
    code: Option<String>,
    state: Option<String>,
    iss: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

fn failed(msg: &str) -> Error {
    Error::SignInFailed(format!(
        "{msg}; nothing was changed, start again at /v1/auth/sign-in"
    ))
}

/// `GET /v1/auth/callback`: checks the attempt (known, unexpired, unused, this browser's),
/// exchanges the code with its PKCE verifier, checks the ID token (signature, iss, aud, exp,
/// nonce), refuses a person with no role, and signs in: the session and CSRF cookies, 302 to
/// the attempt's `return_to`.
pub(crate) async fn callback(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    Query(q): Query<CallbackQuery>,
) -> Result<Response, Error> {
    let auth = auth(&st)?;
    if let Some(e) = &q.error {
        let desc: String = q
            .error_description
            .as_deref()
            .unwrap_or("")
            .chars()
            .take(200)
            .collect();
        return Err(failed(&format!(
            "the issuer refused the sign-in: {e} {desc}"
        )));
    }
    let (Some(code), Some(state)) = (q.code.as_deref(), q.state.as_deref()) else {
        return Err(failed("the callback has no code or no state"));
    };
    let now = store::unix(st.now());
    let mut conn = st.store.acquire().await?;
    let pending = sessions::take_pending(&mut conn, &session::digest(state))
        .await?
        .ok_or_else(|| {
            failed("this sign-in attempt is unknown, expired or was already used (state)")
        })?;
    if pending.expires_at <= now {
        return Err(failed("this sign-in attempt expired"));
    }
    let cookies = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok());
    let browser = session::cookie(cookies, session::SIGN_IN_COOKIE);
    if !browser.is_some_and(|b| session::digest_matches(b, &pending.browser_sha256)) {
        return Err(failed(
            "this sign-in was started in another browser (its sign-in cookie is missing or different)",
        ));
    }
    if let Some(iss) = &q.iss
        && iss.trim_end_matches('/') != auth.issuer.issuer
    {
        return Err(failed(&format!(
            "the callback names the issuer {iss:?}, not the configured one"
        )));
    }
    drop(conn);
    let id_token = auth
        .issuer
        .exchange_code(
            code,
            &pending.pkce_verifier,
            &auth.redirect_uri(),
            &auth.config.client_id,
            &auth.config.client_secret,
        )
        .await
        .map_err(|e| match e {
            IssuerError::Status { status, body, .. } if (400..500).contains(&status) => {
                failed(&format!(
                    "the issuer refused the code (replayed, expired or not this client's): {body}"
                ))
            }
            other => issuer_error(other),
        })?;
    let claims = auth
        .issuer
        .verify(&id_token, &auth.config.client_id, Some(&pending.nonce), now)
        .await
        .map_err(issuer_error)?;
    let csrf = random(32)?;
    let (secret, row) = new_session(&st, auth, &claims, Kind::Cookie, Some(&csrf), now).await?;
    st.audit(session_audit(
        &row,
        "auth.sign_in",
        json!({"via": "console"}),
    ))
    .await;
    tracing::info!(session = %row.id, subject = %row.subject, "signed in (console)");
    let max_age = auth.config.session_lifetime;
    Ok((
        StatusCode::FOUND,
        AppendHeaders([
            (header::LOCATION, pending.return_to),
            (
                header::SET_COOKIE,
                session::set_cookie(
                    session::SESSION_COOKIE,
                    &secret.expose(),
                    true,
                    "Lax",
                    max_age,
                ),
            ),
            (
                header::SET_COOKIE,
                session::set_cookie(session::CSRF_COOKIE, &csrf, false, "Strict", max_age),
            ),
            (
                header::SET_COOKIE,
                session::set_cookie(
                    session::SIGN_IN_COOKIE,
                    "",
                    true,
                    "Lax",
                    std::time::Duration::ZERO,
                ),
            ),
        ]),
    )
        .into_response())
}

/// Stores a new session for the person of `claims`, unless no role binding names them.
async fn new_session(
    st: &AppState,
    auth: &Auth,
    claims: &Claims,
    kind: Kind,
    csrf: Option<&str>,
    now: i64,
) -> Result<(SessionSecret, sessions::SessionRow), Error> {
    let secret = SessionSecret::generate().map_err(|e| Error::Internal(e.to_string()))?;
    let lifetime = i64::try_from(auth.config.session_lifetime.as_secs()).unwrap_or(i64::MAX / 2);
    let row = sessions::SessionRow {
        id: secret.id.clone(),
        secret_sha256: store::secret_digest(&secret.secret),
        kind: kind.as_str().into(),
        csrf_sha256: csrf.map(session::digest),
        issuer: auth.issuer.issuer.clone(),
        subject: claims.subject.clone(),
        email: claims.email.as_ref().map(|e| e.to_ascii_lowercase()),
        name: claims.name.clone(),
        groups: claims.groups(&auth.config.groups_claim),
        created_at: now,
        last_seen_at: now,
        expires_at: now.saturating_add(lifetime),
        revoked_at: None,
        revoked_reason: None,
    };
    let mut conn = st.store.acquire().await?;
    if person_grants(&mut conn, &row).await?.is_empty() {
        return Err(Error::Forbidden(format!(
            "signed in at the issuer as {}, but no role is bound to this subject, e-mail address or groups; ask an admin to bind one (`plexctl role bind --role member --project ID --email ...`)",
            row.email.as_deref().unwrap_or(&row.subject)
        )));
    }
    sessions::insert_session(&mut conn, &row).await?;
    Ok((secret, row))
}

/// `POST /v1/auth/sign-out`: revokes the caller's session (a cookie write: CSRF needed) and
/// clears the cookies.
pub(crate) async fn sign_out(
    State(st): State<Arc<AppState>>,
    op: Operator,
) -> Result<Response, Error> {
    let Via::Session { session_id } = &op.via else {
        return Err(Error::BadRequest(
            "sign-out ends a session; an operator token is revoked with `plexctl operator-token revoke`".into(),
        ));
    };
    let now = store::unix(st.now());
    sessions::revoke(
        &mut *st.store.acquire().await?,
        session_id,
        now,
        "signed out",
    )
    .await?;
    st.audit(super::audit_record::by(
        &op,
        None,
        "auth.sign_out",
        format!("session/{session_id}"),
        json!({}),
    ))
    .await;
    tracing::info!(session = %session_id, "signed out");
    let gone = std::time::Duration::ZERO;
    Ok((
        StatusCode::OK,
        AppendHeaders([
            (
                header::SET_COOKIE,
                session::set_cookie(session::SESSION_COOKIE, "", true, "Lax", gone),
            ),
            (
                header::SET_COOKIE,
                session::set_cookie(session::CSRF_COOKIE, "", false, "Strict", gone),
            ),
        ]),
        Json(json!({ "signed_out": true, "session": session_id })),
    )
        .into_response())
}

/// `GET /v1/auth/whoami`: who the caller is, how, its roles, and whether writes need the
/// CSRF header.
pub(crate) async fn whoami(op: Operator, headers: HeaderMap) -> Json<Value> {
    let via = match op.via {
        Via::Token => "token",
        Via::Session { .. } => "session",
    };
    let cookie =
        matches!(op.via, Via::Session { .. }) && headers.get(header::AUTHORIZATION).is_none();
    Json(json!({
        "via": via,
        "id": op.id,
        "name": op.name,
        "person": op.person.as_ref().map(|p| json!({
            "issuer": p.issuer, "subject": p.subject, "email": p.email, "name": p.name,
        })),
        "roles": op.roles.iter().map(RoleGrant::json).collect::<Vec<_>>(),
        "csrf": cookie,
    }))
}

/// The body of `POST /v1/auth/session`.
#[derive(Debug, Deserialize)]
pub(crate) struct ExchangeRequest {
    pub id_token: String,
}

/// `POST /v1/auth/session` (plexctl): an ID token issued to plexctl's client (device grant
/// or loopback redirect), fresh (`iat` within [`session::CLI_ID_TOKEN_MAX_AGE_SECS`]) and
/// never exchanged before, for a bearer session `pxss_...`.
pub(crate) async fn exchange(
    State(st): State<Arc<AppState>>,
    ApiJson(req): ApiJson<ExchangeRequest>,
) -> Result<(StatusCode, Json<Value>), Error> {
    let auth = auth(&st)?;
    let cli = auth.config.cli_client_id.as_deref().ok_or_else(|| {
        Error::SignInFailed(
            "plexctl login is not configured on this server (--oidc-cli-client-id)".into(),
        )
    })?;
    let now = store::unix(st.now());
    let claims = auth
        .issuer
        .verify(&req.id_token, cli, None, now)
        .await
        .map_err(issuer_error)?;
    if now - claims.iat > session::CLI_ID_TOKEN_MAX_AGE_SECS + CLOCK_SKEW_SECS {
        return Err(Error::SignInFailed(format!(
            "the ID token was issued {} s ago; plexctl must exchange it within {} s: run `plexctl login` again",
            now - claims.iat,
            session::CLI_ID_TOKEN_MAX_AGE_SECS
        )));
    }
    let mut conn = st.store.acquire().await?;
    sessions::purge_expired(&mut conn, now).await?;
    if !sessions::use_id_token(
        &mut conn,
        &session::digest(&req.id_token),
        claims.exp + CLOCK_SKEW_SECS,
    )
    .await?
    {
        return Err(Error::SignInFailed(
            "this ID token was exchanged before (each is accepted once); run `plexctl login` again"
                .into(),
        ));
    }
    drop(conn);
    let (secret, row) = new_session(&st, auth, &claims, Kind::Bearer, None, now).await?;
    st.audit(session_audit(
        &row,
        "auth.sign_in",
        json!({"via": "plexctl"}),
    ))
    .await;
    tracing::info!(session = %row.id, subject = %row.subject, "signed in (plexctl)");
    let expires = store::from_unix("auth_sessions.expires_at", row.expires_at)?
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    Ok((
        StatusCode::CREATED,
        Json(json!({ "session": secret.expose(), "id": row.id, "expires_at": expires })),
    ))
}
