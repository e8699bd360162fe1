//! ID token checks (sans-IO): a compact JWS signed with RS256 or ES256 by a key of the
//! issuer's JWKS, then `iss`, `aud` (and `azp` when there are several audiences), `exp`,
//! `iat`, `nbf` with [`CLOCK_SKEW_SECS`] of skew, and the `nonce` when one is expected.
//! `alg: none`, HS* and every other algorithm are refused before any key is looked at.
//!
//! Imports nothing of the crate (the issuer's keys come in as values); its tests, which forge
//! tokens, are `tests.rs`.

use base64::Engine as _;
use ring::signature::{self, UnparsedPublicKey};
use serde::Deserialize;
use serde_json::Value;

/// How far the issuer's clock may be from ours when checking `exp`, `iat` and `nbf`.
pub(crate) const CLOCK_SKEW_SECS: i64 = 60;
/// The largest ID token accepted (a header, claims with a groups list, a signature).
pub(crate) const MAX_ID_TOKEN_BYTES: usize = 16 * 1024;

/// Why an ID token was refused; every message names the check.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("the ID token is not a compact JWS (three base64url parts)")]
    Malformed,
    #[error("the ID token is larger than {MAX_ID_TOKEN_BYTES} bytes")]
    TooLarge,
    #[error("the ID token is signed with {0:?}; only RS256 and ES256 are accepted")]
    Algorithm(String),
    #[error("the ID token's key {0:?} is not in the issuer's key set")]
    UnknownKey(String),
    #[error("the ID token's signature does not verify with the issuer's key")]
    Signature,
    #[error("the ID token was issued by {0:?}, not the configured issuer")]
    Issuer(String),
    #[error("the ID token is not for this client (aud {0})")]
    Audience(String),
    #[error("the ID token expired at {0} (unix seconds)")]
    Expired(i64),
    #[error("the ID token is not valid yet (iat/nbf {0}, unix seconds)")]
    NotYetValid(i64),
    #[error("the ID token's nonce does not match this sign-in")]
    Nonce,
    #[error("the ID token has no usable `{0}` claim")]
    Missing(&'static str),
}

/// One key of a JWKS (the public parts this check uses).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Jwk {
    pub kty: String,
    #[serde(default)]
    pub kid: Option<String>,
    #[serde(default)]
    pub alg: Option<String>,
    #[serde(default, rename = "use")]
    pub use_: Option<String>,
    #[serde(default)]
    pub n: Option<String>,
    #[serde(default)]
    pub e: Option<String>,
    #[serde(default)]
    pub crv: Option<String>,
    #[serde(default)]
    pub x: Option<String>,
    #[serde(default)]
    pub y: Option<String>,
}

/// An issuer's key set.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct Jwks {
    pub keys: Vec<Jwk>,
}

/// What the caller expects of the token.
#[derive(Debug, Clone)]
pub(crate) struct Expect<'a> {
    pub issuer: &'a str,
    pub client_id: &'a str,
    /// The nonce of the sign-in; `None`: the flow had none (a token from plexctl).
    pub nonce: Option<&'a str>,
    /// Unix seconds.
    pub now: i64,
}

/// The verified claims.
#[derive(Debug, Clone)]
pub struct Claims {
    pub subject: String,
    pub email: Option<String>,
    pub name: Option<String>,
    pub iat: i64,
    pub exp: i64,
    /// Every claim, for the groups claim (its name is configurable).
    pub all: Value,
}

impl Claims {
    /// The strings of the groups claim `name` (an array of strings or one string).
    pub(crate) fn groups(&self, name: &str) -> Vec<String> {
        match self.all.get(name) {
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(|g| g.as_str().map(str::to_owned))
                .collect(),
            Some(Value::String(s)) => vec![s.clone()],
            _ => Vec::new(),
        }
    }
}

fn b64(part: &str) -> Result<Vec<u8>, TokenError> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part.trim_end_matches('='))
        .map_err(|_| TokenError::Malformed)
}

/// The `kid` and `alg` of a token's header, without verifying anything (to pick the key).
pub(crate) fn header(token: &str) -> Result<(Option<String>, String), TokenError> {
    if token.len() > MAX_ID_TOKEN_BYTES {
        return Err(TokenError::TooLarge);
    }
    let head = token.split('.').next().ok_or(TokenError::Malformed)?;
    let h: Value = serde_json::from_slice(&b64(head)?).map_err(|_| TokenError::Malformed)?;
    let alg = h
        .get("alg")
        .and_then(Value::as_str)
        .ok_or(TokenError::Malformed)?
        .to_owned();
    let kid = h.get("kid").and_then(Value::as_str).map(str::to_owned);
    Ok((kid, alg))
}

/// Verifies `token` against `jwks` and `expect`.
pub(crate) fn verify(token: &str, jwks: &Jwks, expect: &Expect<'_>) -> Result<Claims, TokenError> {
    let (kid, alg) = header(token)?;
    let parts: Vec<&str> = token.split('.').collect();
    let [head, body, sig] = parts.as_slice() else {
        return Err(TokenError::Malformed);
    };
    if alg != "RS256" && alg != "ES256" {
        return Err(TokenError::Algorithm(alg));
    }
    let want_kty = if alg == "RS256" { "RSA" } else { "EC" };
    let candidates: Vec<&Jwk> = jwks
        .keys
        .iter()
        .filter(|k| k.kty == want_kty)
        .filter(|k| k.use_.as_deref().is_none_or(|u| u == "sig"))
        .filter(|k| k.alg.as_deref().is_none_or(|a| a == alg))
        .filter(|k| match &kid {
            Some(kid) => k.kid.as_deref() == Some(kid.as_str()),
            None => true,
        })
        .collect();
    if candidates.is_empty() {
        return Err(TokenError::UnknownKey(kid.unwrap_or_default()));
    }
    let signed = format!("{head}.{body}");
    let signature = b64(sig)?;
    let ok = candidates
        .iter()
        .any(|k| verify_with(k, &alg, signed.as_bytes(), &signature));
    if !ok {
        return Err(TokenError::Signature);
    }
    let all: Value = serde_json::from_slice(&b64(body)?).map_err(|_| TokenError::Malformed)?;
    check_claims(all, expect)
}

fn verify_with(key: &Jwk, alg: &str, msg: &[u8], sig: &[u8]) -> bool {
    match alg {
        "RS256" => {
            let (Some(n), Some(e)) = (key.n.as_deref(), key.e.as_deref()) else {
                return false;
            };
            let (Ok(n), Ok(e)) = (b64(n), b64(e)) else {
                return false;
            };
            signature::RsaPublicKeyComponents { n: &n, e: &e }
                .verify(&signature::RSA_PKCS1_2048_8192_SHA256, msg, sig)
                .is_ok()
        }
        "ES256" => {
            if key.crv.as_deref() != Some("P-256") {
                return false;
            }
            let (Some(x), Some(y)) = (key.x.as_deref(), key.y.as_deref()) else {
                return false;
            };
            let (Ok(x), Ok(y)) = (b64(x), b64(y)) else {
                return false;
            };
            if x.len() != 32 || y.len() != 32 {
                return false;
            }
            let mut point = Vec::with_capacity(65);
            point.push(4);
            point.extend_from_slice(&x);
            point.extend_from_slice(&y);
            UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                .verify(msg, sig)
                .is_ok()
        }
        _ => false,
    }
}

fn int(all: &Value, name: &'static str) -> Result<Option<i64>, TokenError> {
    match all.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_i64()
            .or_else(|| v.as_f64().map(|f| f as i64))
            .map(Some)
            .ok_or(TokenError::Missing(name)),
    }
}

/// The claim checks, on claims whose signature was verified.
pub(crate) fn check_claims(all: Value, expect: &Expect<'_>) -> Result<Claims, TokenError> {
    let iss = all
        .get("iss")
        .and_then(Value::as_str)
        .ok_or(TokenError::Missing("iss"))?;
    if iss != expect.issuer {
        return Err(TokenError::Issuer(iss.to_owned()));
    }
    let auds: Vec<&str> = match all.get("aud") {
        Some(Value::String(a)) => vec![a.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => return Err(TokenError::Missing("aud")),
    };
    if !auds.contains(&expect.client_id) {
        return Err(TokenError::Audience(auds.join(",")));
    }
    let azp = all.get("azp").and_then(Value::as_str);
    if (auds.len() > 1 || azp.is_some()) && azp != Some(expect.client_id) {
        return Err(TokenError::Audience(format!(
            "{} (azp {:?})",
            auds.join(","),
            azp
        )));
    }
    let exp = int(&all, "exp")?.ok_or(TokenError::Missing("exp"))?;
    if expect.now > exp + CLOCK_SKEW_SECS {
        return Err(TokenError::Expired(exp));
    }
    let iat = int(&all, "iat")?.ok_or(TokenError::Missing("iat"))?;
    if iat > expect.now + CLOCK_SKEW_SECS {
        return Err(TokenError::NotYetValid(iat));
    }
    if let Some(nbf) = int(&all, "nbf")?
        && nbf > expect.now + CLOCK_SKEW_SECS
    {
        return Err(TokenError::NotYetValid(nbf));
    }
    if let Some(want) = expect.nonce {
        let got = all.get("nonce").and_then(Value::as_str);
        let same = got.is_some_and(|g| {
            plexsphere_wire::secret::constant_time_eq(g.as_bytes(), want.as_bytes())
        });
        if !same {
            return Err(TokenError::Nonce);
        }
    }
    let subject = all
        .get("sub")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty() && s.len() <= 255)
        .ok_or(TokenError::Missing("sub"))?
        .to_owned();
    let text = |name: &str| {
        all.get(name)
            .and_then(Value::as_str)
            .filter(|s| s.len() <= 320)
            .map(str::to_owned)
    };
    // An address the issuer says it did not verify is no address to bind roles to.
    let email = text("email").filter(|_| all.get("email_verified") != Some(&Value::Bool(false)));
    Ok(Claims {
        subject,
        email,
        name: text("name"),
        iat,
        exp,
        all,
    })
}

#[cfg(test)]
mod tests;
