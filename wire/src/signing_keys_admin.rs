//! What operators send and see of a Domain's signing keys: `GET /v1/domains/{domain}/signing-keys`
//! and `POST` to it (a rotation). The keys as nodes learn them are in [`crate::signing_keys`].

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// The overlap a rotation gets when the request names none: one day, so every node that polls
/// (every 5 minutes) or is briefly offline sees the announcement before the new key signs.
pub const DEFAULT_OVERLAP_SECS: u64 = 86_400;
/// The longest overlap a rotation may ask for (30 days): an old key that may be compromised
/// should not keep signing for longer.
pub const MAX_OVERLAP_SECS: u64 = 30 * 86_400;

/// `POST /v1/domains/{domain}/signing-keys`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RotateSigningKeyRequest {
    /// Seconds from now until the new key signs, 0 to [`MAX_OVERLAP_SECS`]; default
    /// [`DEFAULT_OVERLAP_SECS`]. Until then the current key signs and the new one is announced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap_secs: Option<u64>,
}

/// Where a key stands in its Domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SigningKeyStatus {
    /// An older generation: it signs nothing any more.
    Retired,
    /// The key that signs now.
    Current,
    /// Announced by a rotation: it signs from `active_from`.
    Next,
}

impl SigningKeyStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            SigningKeyStatus::Retired => "retired",
            SigningKeyStatus::Current => "current",
            SigningKeyStatus::Next => "next",
        }
    }
}

/// One generation of a Domain's signing key as operators see it (never its private half).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SigningKeyView {
    pub generation: u64,
    /// The Ed25519 public key, standard base64 (what `plexsphere relay --domain-key` takes).
    pub public_key: String,
    #[serde(with = "time::serde::rfc3339")]
    pub active_from: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    pub status: SigningKeyStatus,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_is_strict_and_its_overlap_optional() {
        let r: RotateSigningKeyRequest = serde_json::from_str("{}").unwrap();
        assert_eq!(r.overlap_secs, None);
        let r: RotateSigningKeyRequest = serde_json::from_str(r#"{"overlap_secs":60}"#).unwrap();
        assert_eq!(r.overlap_secs, Some(60));
        assert!(serde_json::from_str::<RotateSigningKeyRequest>(r#"{"overlap":60}"#).is_err());
    }

    #[test]
    fn statuses_are_snake_case() {
        let s = serde_json::to_string(&SigningKeyStatus::Next).unwrap();
        assert_eq!(s, r#""next""#);
        assert_eq!(SigningKeyStatus::Retired.as_str(), "retired");
    }
}
