//! Sessions, cookies and CSRF (sans-IO): the secrets a sign-in hands out, the cookies that
//! carry them, the `return_to` rule and the checks of a cookie-authenticated write.

use std::time::Duration;

use base64::Engine as _;
use plexsphere_wire::secret::{SecretPart, constant_time_eq, sha256};
use ring::rand::{SecureRandom, SystemRandom};

/// The session cookie (HttpOnly, Secure, SameSite=Lax, Path=/).
pub(crate) const SESSION_COOKIE: &str = "__Host-plexsphere-session";
/// The CSRF cookie (Secure, SameSite=Strict, Path=/, readable by the console's script).
pub(crate) const CSRF_COOKIE: &str = "__Host-plexsphere-csrf";
/// The header a cookie-authenticated write repeats the CSRF value in.
pub(crate) const CSRF_HEADER: &str = "x-plexsphere-csrf";
/// The cookie binding a sign-in in progress to the browser that started it.
pub(crate) const SIGN_IN_COOKIE: &str = "__Host-plexsphere-signin";
/// The prefix of a session secret (`pxss_<id>_<secret>`).
pub(crate) const SESSION_PREFIX: &str = "pxss_";

/// A session's default lifetime from sign-in (`--session-lifetime`).
pub(crate) const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// A session's default idle timeout (`--session-idle-timeout`).
pub(crate) const SESSION_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);
/// How long a sign-in may take from `/v1/auth/sign-in` to the callback.
pub(crate) const PENDING_SIGN_IN_TTL: Duration = Duration::from_secs(600);
/// Sign-ins in progress per client address; past it, 429 until older ones expire.
pub(crate) const MAX_PENDING_PER_CLIENT: i64 = 20;
/// Sign-ins in progress in all; past it, 429 (a flood of abandoned sign-ins).
pub(crate) const MAX_PENDING_TOTAL: i64 = 10_000;
/// A session's `last_seen_at` is written at most this often (the idle timeout's resolution).
pub(crate) const LAST_SEEN_WRITE_EVERY_SECS: i64 = 30;
/// The longest `return_to` accepted.
pub(crate) const MAX_RETURN_TO: usize = 512;
/// How fresh an ID token plexctl exchanges must be (`iat` within this of now).
pub(crate) const CLI_ID_TOKEN_MAX_AGE_SECS: i64 = 300;

/// How a session's secret travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The console's cookie (CSRF needed for writes).
    Cookie,
    /// `Authorization: Bearer pxss_...` (plexctl).
    Bearer,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Cookie => "cookie",
            Kind::Bearer => "bearer",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "cookie" => Some(Kind::Cookie),
            "bearer" => Some(Kind::Bearer),
            _ => None,
        }
    }
}

/// A session secret: `pxss_<id>_<secret>`; the id is public (audit, whoami), the server
/// keeps only the secret's SHA-256.
#[derive(Clone)]
pub struct SessionSecret {
    pub id: String,
    pub secret: SecretPart,
}

impl std::fmt::Debug for SessionSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SessionSecret(pxss_{}_<redacted>)", self.id)
    }
}

/// The random source failed (the kernel's RNG); nothing was handed out.
#[derive(Debug, thiserror::Error)]
#[error("the system's random number generator failed")]
pub struct RandomFailed;

/// `n` random bytes as unpadded base64url.
pub(crate) fn random_b64(n: usize) -> Result<String, RandomFailed> {
    let mut bytes = vec![0u8; n];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| RandomFailed)?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// `n` random bytes as lowercase hex (ids).
pub(crate) fn random_hex(n: usize) -> Result<String, RandomFailed> {
    let mut bytes = vec![0u8; n];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| RandomFailed)?;
    Ok(hex::encode(bytes))
}

impl SessionSecret {
    pub fn generate() -> Result<Self, RandomFailed> {
        let mut id = [0u8; 8];
        SystemRandom::new()
            .fill(&mut id)
            .map_err(|_| RandomFailed)?;
        Ok(Self {
            id: hex::encode(id),
            secret: SecretPart::generate().map_err(|_| RandomFailed)?,
        })
    }

    /// `None` for anything that is not a well-formed session secret.
    pub fn parse(text: &str) -> Option<Self> {
        let rest = text.trim().strip_prefix(SESSION_PREFIX)?;
        let (id, secret) = rest.split_once('_')?;
        let id_ok = id.len() == 16
            && id
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
        if !id_ok {
            return None;
        }
        Some(Self {
            id: id.to_owned(),
            secret: SecretPart::parse(secret).ok()?,
        })
    }

    pub fn expose(&self) -> String {
        format!("{SESSION_PREFIX}{}_{}", self.id, self.secret.expose())
    }
}

/// The hex SHA-256 of a value the server keeps only digested (CSRF values, states, the
/// sign-in cookie, exchanged ID tokens).
pub(crate) fn digest(value: &str) -> String {
    hex::encode(sha256(value.as_bytes()))
}

/// Whether `value` digests to `stored` (constant time).
pub(crate) fn digest_matches(value: &str, stored: &str) -> bool {
    constant_time_eq(digest(value).as_bytes(), stored.as_bytes())
}

/// The PKCE S256 challenge of a verifier.
pub(crate) fn pkce_challenge(verifier: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sha256(verifier.as_bytes()))
}

/// A `Set-Cookie` value. `http_only` false only for the CSRF cookie; `max_age` 0 deletes.
pub(crate) fn set_cookie(
    name: &str,
    value: &str,
    http_only: bool,
    same_site: &str,
    max_age: Duration,
) -> String {
    format!(
        "{name}={value}; Path=/; Secure;{} SameSite={same_site}; Max-Age={}",
        if http_only { " HttpOnly;" } else { "" },
        max_age.as_secs()
    )
}

/// A cookie's value from a request's `Cookie` headers.
pub(crate) fn cookie<'a>(
    headers: impl IntoIterator<Item = &'a str>,
    name: &str,
) -> Option<&'a str> {
    headers
        .into_iter()
        .flat_map(|h| h.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// The `return_to` of a sign-in: a same-origin absolute path only (`/nodes?x=1`), never
/// `//host`, `/\host`, a scheme, or control characters; anything else is `/`.
pub(crate) fn safe_return_to(raw: Option<&str>) -> String {
    let Some(p) = raw else {
        return "/".into();
    };
    let ok = p.len() <= MAX_RETURN_TO
        && p.starts_with('/')
        && !p.starts_with("//")
        && !p.starts_with("/\\")
        && !p.chars().any(|c| c.is_control() || c == '\\')
        && !p.contains("://");
    if ok { p.to_owned() } else { "/".into() }
}

/// The origin (`scheme://host[:port]`) of a URL, lower-cased, default ports dropped.
pub(crate) fn origin_of(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let authority = rest.split(['/', '?', '#']).next()?.to_ascii_lowercase();
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    let authority = match (scheme.as_str(), authority.rsplit_once(':')) {
        ("https", Some((host, "443"))) | ("http", Some((host, "80"))) => host.to_owned(),
        _ => authority,
    };
    Some(format!("{scheme}://{authority}"))
}

/// Why a cookie-authenticated write was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum CsrfRefusal {
    /// The `Origin` header names another origin.
    Origin(String),
    /// No `X-Plexsphere-CSRF`, or not the session's value.
    Token,
}

/// The checks of a cookie-authenticated request with an unsafe method: an `Origin` header,
/// if sent, must be `own_origin`; the CSRF header must be the session's CSRF value.
pub(crate) fn check_write(
    origin_header: Option<&str>,
    own_origin: &str,
    csrf_header: Option<&str>,
    stored_csrf_digest: Option<&str>,
) -> Result<(), CsrfRefusal> {
    if let Some(o) = origin_header
        && origin_of(o).as_deref() != Some(own_origin)
    {
        return Err(CsrfRefusal::Origin(o.chars().take(100).collect()));
    }
    match (csrf_header, stored_csrf_digest) {
        (Some(h), Some(stored)) if !h.is_empty() && digest_matches(h, stored) => Ok(()),
        _ => Err(CsrfRefusal::Token),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn return_to_keeps_only_same_origin_paths() {
        assert_eq!(safe_return_to(Some("/nodes?x=1")), "/nodes?x=1");
        for bad in [
            "//evil.test/x",
            "/\\evil.test",
            "https://evil.test/",
            "nodes",
            "/a\r\nb",
            "/x?u=https://e",
        ] {
            assert_eq!(safe_return_to(Some(bad)), "/", "{bad:?}");
        }
        assert_eq!(safe_return_to(None), "/");
    }

    #[test]
    fn session_secrets_round_trip_and_reject_other_text() {
        let s = SessionSecret::generate().unwrap();
        let p = SessionSecret::parse(&s.expose()).unwrap();
        assert_eq!(p.id, s.id);
        assert!(SessionSecret::parse("pxop_0123456789abcdef_x").is_none());
        assert!(SessionSecret::parse(&s.expose().replace("pxss_", "pxss_A")).is_none());
    }

    #[test]
    fn a_write_needs_the_sessions_csrf_value_and_our_origin() {
        let own = "https://cp.example:8443";
        let stored = digest("c1");
        assert_eq!(check_write(None, own, Some("c1"), Some(&stored)), Ok(()));
        assert_eq!(
            check_write(
                Some("https://cp.example:8443"),
                own,
                Some("c1"),
                Some(&stored)
            ),
            Ok(())
        );
        assert_eq!(
            check_write(None, own, None, Some(&stored)),
            Err(CsrfRefusal::Token)
        );
        assert_eq!(
            check_write(None, own, Some("c2"), Some(&stored)),
            Err(CsrfRefusal::Token)
        );
        assert_eq!(
            check_write(None, own, Some(""), Some(&digest(""))),
            Err(CsrfRefusal::Token)
        );
        assert!(matches!(
            check_write(Some("https://evil.test"), own, Some("c1"), Some(&stored)),
            Err(CsrfRefusal::Origin(_))
        ));
        assert_eq!(
            origin_of("https://H.example:443/x").as_deref(),
            Some("https://h.example")
        );
    }

    #[test]
    fn cookies_are_found_by_name() {
        let h = ["a=1; __Host-plexsphere-session=pxss_x; b=2"];
        assert_eq!(cookie(h, SESSION_COOKIE), Some("pxss_x"));
        assert_eq!(cookie(h, CSRF_COOKIE), None);
    }
}
