//! People sign in (issue 28, docs/auth.md): OpenID Connect against any standard issuer,
//! sessions (a cookie for the console, a bearer secret for plexctl), CSRF for cookie writes,
//! and roles bound to the issuer's subjects, e-mail addresses and groups.
//!
//! - [`jwt`]: ID token checks (sans-IO).
//! - [`issuer`]: discovery, JWKS with rotation, the code exchange.
//! - [`session`]: secrets, cookies, `return_to`, the CSRF and Origin checks (sans-IO).
//! - [`roles`]: roles, needs, what a token maps onto (sans-IO).
//!
//! The HTTP side is `api::auth` (sign-in, callback, sign-out, whoami, the plexctl exchange),
//! `api::roles` (bindings) and `api::extract::Operator` (the one check for tokens and
//! sessions).

pub mod issuer;
pub(crate) mod jwt;
pub mod roles;
pub mod session;

use std::path::PathBuf;
use std::time::Duration;

use issuer::IssuerClient;
use roles::{Role, RoleGrant, RoleScope};

use crate::store::{StoreError, roles as role_store, sessions::SessionRow};

/// The sign-in configuration (`--oidc-*` flags of `plexsphere serve` and `dev`).
#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// The issuer URL (https, or http on loopback).
    pub issuer: String,
    /// The console's client id (confidential).
    pub client_id: String,
    pub client_secret: String,
    /// plexctl's client id (public); `None`: `plexctl login` is off.
    pub cli_client_id: Option<String>,
    /// The claim that lists a person's groups.
    pub groups_claim: String,
    /// The scopes asked for (`--oidc-scopes`).
    pub scopes: String,
    /// This API's origin as browsers reach it (`https://host[:port]`).
    pub public_origin: String,
    pub session_lifetime: Duration,
    pub session_idle_timeout: Duration,
    /// A CA file for an issuer under a private CA (beside the system's roots).
    pub ca_file: Option<PathBuf>,
}

/// Sign-in, ready to serve.
pub struct Auth {
    pub config: AuthConfig,
    pub issuer: IssuerClient,
}

impl Auth {
    /// Checks the configuration and builds the issuer's HTTP client (nothing is fetched yet:
    /// discovery happens on the first sign-in, so the server starts while the issuer is down).
    pub fn new(config: AuthConfig) -> Result<Self, String> {
        if !issuer::allowed_url(&config.issuer) {
            return Err(format!(
                "--oidc-issuer {:?} must be an https URL (http only on 127.0.0.1, localhost or [::1])",
                config.issuer
            ));
        }
        if !config.public_origin.starts_with("https://") {
            return Err(format!(
                "sign-in needs the API's https origin (--public-url), not {:?}: its cookies are Secure",
                config.public_origin
            ));
        }
        if config.client_id.is_empty() || config.client_secret.is_empty() {
            return Err("--oidc-client-id and a non-empty --oidc-client-secret-file are required with --oidc-issuer".into());
        }
        let trust = plexsphere_tls_client::Trust::system_and(config.ca_file.clone());
        let tls =
            plexsphere_tls_client::client_config(&trust, plexsphere_tls_client::ALPN_H2_HTTP1)
                .map_err(|e| format!("the OpenID issuer's TLS trust: {e}"))?;
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .connect_timeout(issuer::ISSUER_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("plexsphere/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("the OpenID issuer's HTTP client: {e}"))?;
        Ok(Self {
            issuer: IssuerClient::new(config.issuer.clone(), http),
            config,
        })
    }

    /// The redirect URI registered at the issuer for the console.
    pub(crate) fn redirect_uri(&self) -> String {
        format!("{}/v1/auth/callback", self.config.public_origin)
    }
}

/// A person's roles now: every binding that names their subject, e-mail address or one of
/// their groups (as the session's claims have them). Bindings whose scope cannot be read are
/// skipped (and logged), never widened.
pub(crate) async fn person_grants(
    conn: &mut sqlx::AnyConnection,
    session: &SessionRow,
) -> Result<Vec<RoleGrant>, StoreError> {
    let rows = role_store::for_person(
        conn,
        &session.subject,
        session.email.as_deref(),
        &session.groups,
    )
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for b in rows {
        match (
            Role::parse(&b.role),
            RoleScope::parse(&b.scope_kind, &b.scope_id),
        ) {
            (Some(role), Some(scope)) => out.push(RoleGrant { role, scope }),
            _ => {
                tracing::warn!(binding = %b.id, "a role binding with an unknown role or scope is ignored")
            }
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}
