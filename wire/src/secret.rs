//! The text forms of the three secrets plexsphere hands out, and how they are checked.
//!
//! Every secret reads `<prefix>_..._<secret>` so that secret scanners (and people) recognise
//! it at a glance, and carries a public lookup id beside a 256-bit random part. The server
//! stores only the SHA-256 of the random part and compares digests in constant time.
//!
//! - bootstrap token: `pxbt_<env>_<kind>_<id>_<secret>`, e.g. `pxbt_lab_node_1f2e..._Zm9v...`
//! - node credential: `pxnk_<node id, 32 hex>_<secret>`
//! - operator token:  `pxop_<id>_<secret>`
//!
//! `<id>` is 16 lowercase hex characters, `<secret>` 43 characters of unpadded base64url.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::{SecureRandom, SystemRandom};
use uuid::Uuid;

const SECRET_BYTES: usize = 32;
const SECRET_CHARS: usize = 43;
const ID_CHARS: usize = 16;

/// Why a secret's text was refused. The messages never echo the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretFormatError {
    #[error("it does not start with `{0}_`")]
    Prefix(&'static str),
    #[error("it has the wrong number of `_`-separated parts")]
    Parts,
    #[error("its environment prefix must be 1-16 characters of a-z and 0-9")]
    EnvPrefix,
    #[error("its kind `{0}` is not one plexsphere issues (node)")]
    Kind(String),
    #[error("its id is not {ID_CHARS} lowercase hex characters")]
    Id,
    #[error("its node id is not 32 lowercase hex characters")]
    NodeId,
    #[error("its secret part is not {SECRET_CHARS} base64url characters")]
    Secret,
    #[error("the system random generator failed")]
    Random,
}

/// The kinds of bootstrap token. Only `node` exists today.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenKind {
    Node,
}

impl TokenKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenKind::Node => "node",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "node" => Some(TokenKind::Node),
            _ => None,
        }
    }
}

impl std::fmt::Display for TokenKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A 256-bit random value in its text form, and what the server stores of it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretPart(String);

impl SecretPart {
    pub fn generate() -> Result<Self, SecretFormatError> {
        let mut bytes = [0u8; SECRET_BYTES];
        SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| SecretFormatError::Random)?;
        Ok(Self(URL_SAFE_NO_PAD.encode(bytes)))
    }

    /// Parses the text form of a secret (43 base64url characters of 32 bytes).
    pub fn parse(s: &str) -> Result<Self, SecretFormatError> {
        if s.len() != SECRET_CHARS {
            return Err(SecretFormatError::Secret);
        }
        let bytes = URL_SAFE_NO_PAD
            .decode(s)
            .map_err(|_| SecretFormatError::Secret)?;
        if bytes.len() != SECRET_BYTES {
            return Err(SecretFormatError::Secret);
        }
        Ok(Self(s.to_owned()))
    }

    /// The SHA-256 of the secret part: the only form the server stores.
    pub fn digest(&self) -> [u8; 32] {
        sha256(self.0.as_bytes())
    }

    /// Whether this secret matches a stored digest, in constant time.
    pub fn matches(&self, stored_digest: &[u8]) -> bool {
        constant_time_eq(&self.digest(), stored_digest)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SecretPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretPart(<redacted>)")
    }
}

/// SHA-256 of some bytes.
pub fn sha256(data: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, data);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Compares two byte strings without an early exit on the first difference.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn random_id() -> Result<String, SecretFormatError> {
    let mut bytes = [0u8; ID_CHARS / 2];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| SecretFormatError::Random)?;
    Ok(hex_lower(&bytes))
}

fn hex_lower(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 0xf) as usize] as char);
    }
    s
}

fn check_id(id: &str) -> Result<(), SecretFormatError> {
    if id.len() == ID_CHARS
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(())
    } else {
        Err(SecretFormatError::Id)
    }
}

/// Whether an environment prefix is acceptable: 1-16 of `a-z0-9`.
pub fn valid_env_prefix(env: &str) -> bool {
    (1..=16).contains(&env.len())
        && env
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// A single-use bootstrap token: `pxbt_<env>_<kind>_<id>_<secret>`.
#[derive(Clone, PartialEq, Eq)]
pub struct BootstrapToken {
    pub env_prefix: String,
    pub kind: TokenKind,
    /// The public lookup id (16 hex characters).
    pub id: String,
    pub secret: SecretPart,
}

impl BootstrapToken {
    pub const PREFIX: &'static str = "pxbt";

    pub fn generate(env_prefix: &str, kind: TokenKind) -> Result<Self, SecretFormatError> {
        if !valid_env_prefix(env_prefix) {
            return Err(SecretFormatError::EnvPrefix);
        }
        Ok(Self {
            env_prefix: env_prefix.to_owned(),
            kind,
            id: random_id()?,
            secret: SecretPart::generate()?,
        })
    }

    /// Parses a token's text. Surrounding whitespace (a trailing newline from a file) is ignored.
    pub fn parse(text: &str) -> Result<Self, SecretFormatError> {
        let text = text.trim();
        let rest = text
            .strip_prefix("pxbt_")
            .ok_or(SecretFormatError::Prefix(Self::PREFIX))?;
        let mut parts = rest.splitn(4, '_');
        let (Some(env), Some(kind), Some(id), Some(secret)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(SecretFormatError::Parts);
        };
        if !valid_env_prefix(env) {
            return Err(SecretFormatError::EnvPrefix);
        }
        let kind =
            TokenKind::parse(kind).ok_or_else(|| SecretFormatError::Kind(kind.to_owned()))?;
        check_id(id)?;
        Ok(Self {
            env_prefix: env.to_owned(),
            kind,
            id: id.to_owned(),
            secret: SecretPart::parse(secret)?,
        })
    }

    /// The full text, shown to the operator exactly once.
    pub fn expose(&self) -> String {
        format!(
            "pxbt_{}_{}_{}_{}",
            self.env_prefix,
            self.kind,
            self.id,
            self.secret.expose()
        )
    }
}

impl std::fmt::Debug for BootstrapToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "BootstrapToken(pxbt_{}_{}_{}_<redacted>)",
            self.env_prefix, self.kind, self.id
        )
    }
}

/// The credential a node authenticates with after registration: `pxnk_<node id>_<secret>`.
#[derive(Clone, PartialEq, Eq)]
pub struct NodeCredential {
    pub node_id: Uuid,
    pub secret: SecretPart,
}

impl NodeCredential {
    pub fn generate(node_id: Uuid) -> Result<Self, SecretFormatError> {
        Ok(Self {
            node_id,
            secret: SecretPart::generate()?,
        })
    }

    pub fn parse(text: &str) -> Result<Self, SecretFormatError> {
        let rest = text
            .trim()
            .strip_prefix("pxnk_")
            .ok_or(SecretFormatError::Prefix("pxnk"))?;
        let (id, secret) = rest.split_once('_').ok_or(SecretFormatError::Parts)?;
        if id.len() != 32
            || !id
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(SecretFormatError::NodeId);
        }
        let node_id = Uuid::parse_str(id).map_err(|_| SecretFormatError::NodeId)?;
        Ok(Self {
            node_id,
            secret: SecretPart::parse(secret)?,
        })
    }

    pub fn expose(&self) -> String {
        format!("pxnk_{}_{}", self.node_id.simple(), self.secret.expose())
    }
}

impl std::fmt::Debug for NodeCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NodeCredential(pxnk_{}_<redacted>)",
            self.node_id.simple()
        )
    }
}

/// An operator's API token: `pxop_<id>_<secret>`.
#[derive(Clone, PartialEq, Eq)]
pub struct OperatorToken {
    pub id: String,
    pub secret: SecretPart,
}

impl OperatorToken {
    pub fn generate() -> Result<Self, SecretFormatError> {
        Ok(Self {
            id: random_id()?,
            secret: SecretPart::generate()?,
        })
    }

    pub fn parse(text: &str) -> Result<Self, SecretFormatError> {
        let rest = text
            .trim()
            .strip_prefix("pxop_")
            .ok_or(SecretFormatError::Prefix("pxop"))?;
        let (id, secret) = rest.split_once('_').ok_or(SecretFormatError::Parts)?;
        check_id(id)?;
        Ok(Self {
            id: id.to_owned(),
            secret: SecretPart::parse(secret)?,
        })
    }

    pub fn expose(&self) -> String {
        format!("pxop_{}_{}", self.id, self.secret.expose())
    }
}

impl std::fmt::Debug for OperatorToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OperatorToken(pxop_{}_<redacted>)", self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_token_round_trips_and_shows_env_and_kind() {
        let t = BootstrapToken::generate("lab", TokenKind::Node).unwrap();
        let text = t.expose();
        assert!(text.starts_with("pxbt_lab_node_"), "{text}");
        assert_eq!(text.len(), "pxbt_lab_node_".len() + 16 + 1 + 43);
        let back = BootstrapToken::parse(&format!("{text}\n")).unwrap();
        assert_eq!(back, t);
        assert!(back.secret.matches(&t.secret.digest()));
        assert!(!format!("{back:?}").contains(t.secret.expose()));
    }

    #[test]
    fn bootstrap_token_refusals_name_the_part() {
        assert_eq!(
            BootstrapToken::parse("ghp_abc"),
            Err(SecretFormatError::Prefix("pxbt"))
        );
        assert_eq!(
            BootstrapToken::parse("pxbt_lab_node"),
            Err(SecretFormatError::Parts)
        );
        let secret = "A".repeat(43);
        assert_eq!(
            BootstrapToken::parse(&format!("pxbt_LAB_node_0123456789abcdef_{secret}")),
            Err(SecretFormatError::EnvPrefix)
        );
        assert_eq!(
            BootstrapToken::parse(&format!("pxbt_lab_user_0123456789abcdef_{secret}")),
            Err(SecretFormatError::Kind("user".into()))
        );
        assert_eq!(
            BootstrapToken::parse(&format!("pxbt_lab_node_0123456789ABCDEF_{secret}")),
            Err(SecretFormatError::Id)
        );
        assert_eq!(
            BootstrapToken::parse("pxbt_lab_node_0123456789abcdef_short"),
            Err(SecretFormatError::Secret)
        );
        // base64url may contain `_`: the secret is everything after the fourth separator.
        let underscored = format!("{}_{}", "B".repeat(20), "A".repeat(22));
        assert!(
            BootstrapToken::parse(&format!("pxbt_lab_node_0123456789abcdef_{underscored}")).is_ok()
        );
    }

    #[test]
    fn node_credential_and_operator_token_round_trip() {
        let id = Uuid::now_v7();
        let c = NodeCredential::generate(id).unwrap();
        assert_eq!(NodeCredential::parse(&c.expose()).unwrap(), c);
        assert_eq!(
            NodeCredential::parse("pxnk_zz_x"),
            Err(SecretFormatError::NodeId)
        );
        let o = OperatorToken::generate().unwrap();
        assert_eq!(OperatorToken::parse(&o.expose()).unwrap(), o);
        assert!(!c.secret.matches(&o.secret.digest()));
    }
}
