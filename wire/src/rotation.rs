//! Key and credential rotation: what a node sends to replace its WireGuard key or its node
//! credential, and the proof of possession both sides compute.
//!
//! | call | path |
//! |---|---|
//! | key challenge | `GET /v1/nodes/{id}/key` (-> [`KeyChallenge`]) |
//! | key rotation | `POST /v1/nodes/{id}/key` ([`KeyRotation`] -> [`KeyRotated`]) |
//! | credential rotation | `POST /v1/nodes/{id}/credential` (-> [`CredentialRotated`]) |
//! | operator: ask a node to rotate | `POST /v1/nodes/{id}/rotate-key`, `/rotate-credential` (-> 202) |
//!
//! The proof: the node's credential says who asks; the proof says the asker holds both the
//! current and the new WireGuard private key. For each of the two keys the node computes
//! `SHA-256(PROOF_LABEL || X25519(key, server) || node_id || old || new || nonce)`, where
//! `server` is the challenge's X25519 public key (the control plane's, kept in memory) and
//! `nonce` the challenge's (bound to the node, expiring, checked by the server). The server
//! computes the same with its own secret and the two public keys. A request is good for one
//! change only: the server changes the key only when its current key is `old` (a replay after
//! the change finds another current key), and answers a repeat of the change it already made
//! as done (so a node that lost the answer retries safely).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::key::PublicKey;
use crate::secret::{constant_time_eq, sha256};
use crate::signed::SignedEnvelope;

/// The domain-separation label of the proof of possession.
pub const PROOF_LABEL: &[u8] = b"plexsphere key rotation v1";
/// How long a key challenge is good for, in seconds.
pub const CHALLENGE_TTL_SECS: i64 = 300;

/// At most one key change (and one credential change) per node in this many seconds; a
/// faster one is refused with 429 and `Retry-After`. A rotation touches every peer (one event
/// each), so a node must not be able to churn them.
pub const MIN_ROTATION_GAP_SECS: i64 = 30;

/// `GET /v1/nodes/{id}/key`: what the proof of a rotation is made with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyChallenge {
    /// The control plane's X25519 public key for proofs, standard base64.
    pub server_public_key: String,
    /// Opaque; sent back in [`KeyRotation::nonce`].
    pub nonce: String,
    /// Unix seconds after which the nonce is refused.
    pub expires_at: i64,
}

/// `POST /v1/nodes/{id}/key`: replace the node's WireGuard public key `old` with `new`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyRotation {
    pub old_public_key: String,
    pub new_public_key: String,
    pub nonce: String,
    /// The proof made with the old private key.
    pub old_proof: String,
    /// The proof made with the new private key.
    pub new_proof: String,
}

/// The answer to a key rotation: the key the control plane now holds for the node, the state
/// version its peers were told at, and a relay token for the new key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRotated {
    pub public_key: String,
    pub state_version: u64,
    /// `true` when the control plane had this key already (a repeat after a lost answer).
    #[serde(default)]
    pub already: bool,
    #[serde(default)]
    pub relay_token: Option<SignedEnvelope>,
}

/// The answer to `POST /v1/nodes/{id}/credential`: the new credential. The old one keeps
/// working until the new one is first used, and a short grace after that.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CredentialRotated {
    pub node_credential: String,
}

impl std::fmt::Debug for CredentialRotated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CredentialRotated(<redacted>)")
    }
}

/// The bytes a proof hashes, after the shared secret.
fn transcript(node_id: Uuid, old: &PublicKey, new: &PublicKey, nonce: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + 64 + nonce.len());
    out.extend_from_slice(node_id.as_bytes());
    out.extend_from_slice(&old.0);
    out.extend_from_slice(&new.0);
    out.extend_from_slice(nonce.as_bytes());
    out
}

fn digest(shared: &[u8; 32], transcript: &[u8]) -> [u8; 32] {
    let mut buf = Vec::with_capacity(PROOF_LABEL.len() + 32 + transcript.len());
    buf.extend_from_slice(PROOF_LABEL);
    buf.extend_from_slice(shared);
    buf.extend_from_slice(transcript);
    sha256(&buf)
}

/// The node's proof with one of its private keys (`secret`), base64.
pub fn prove(
    secret: &[u8; 32],
    server_public: &PublicKey,
    node_id: Uuid,
    old: &PublicKey,
    new: &PublicKey,
    nonce: &str,
) -> String {
    let shared = crate::reach::shared_secret(secret, server_public);
    STANDARD.encode(digest(&shared, &transcript(node_id, old, new, nonce)))
}

/// The server's check of a proof for the key `claimed` (one of `old`, `new`).
pub fn verify(
    server_secret: &[u8; 32],
    claimed: &PublicKey,
    node_id: Uuid,
    old: &PublicKey,
    new: &PublicKey,
    nonce: &str,
    proof: &str,
) -> bool {
    let Ok(given) = STANDARD.decode(proof.trim()) else {
        return false;
    };
    let shared = crate::reach::shared_secret(server_secret, claimed);
    // An all-zero shared secret means a low-order public key: nothing proves anything.
    if shared == [0; 32] {
        return false;
    }
    constant_time_eq(
        &digest(&shared, &transcript(node_id, old, new, nonce)),
        &given,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reach::public_key;

    #[test]
    fn a_proof_verifies_only_for_its_key_node_keys_and_nonce() {
        let (server, old_s, new_s) = ([7u8; 32], [1u8; 32], [2u8; 32]);
        let (sp, old, new) = (public_key(&server), public_key(&old_s), public_key(&new_s));
        let id = Uuid::from_u128(5);
        let p = prove(&new_s, &sp, id, &old, &new, "n1");
        assert!(verify(&server, &new, id, &old, &new, "n1", &p));
        assert!(
            !verify(&server, &old, id, &old, &new, "n1", &p),
            "other key"
        );
        assert!(
            !verify(&server, &new, id, &old, &new, "n2", &p),
            "other nonce"
        );
        let other = Uuid::from_u128(6);
        assert!(
            !verify(&server, &new, other, &old, &new, "n1", &p),
            "other node"
        );
        assert!(!verify(&server, &new, id, &new, &old, "n1", &p), "swapped");
        assert!(
            !verify(&server, &PublicKey([0; 32]), id, &old, &new, "n1", &p),
            "low order"
        );
        assert!(!verify(&server, &new, id, &old, &new, "n1", "%%"));
    }

    #[test]
    fn json_shapes_are_pinned() {
        let r: KeyRotation = serde_json::from_str(
            r#"{"old_public_key":"a","new_public_key":"b","nonce":"n","old_proof":"p","new_proof":"q"}"#,
        )
        .unwrap();
        assert_eq!(r.new_public_key, "b");
        assert!(serde_json::from_str::<KeyRotation>(r#"{"old_public_key":"a","x":1}"#).is_err());
        let a: KeyRotated =
            serde_json::from_str(r#"{"public_key":"b","state_version":4}"#).unwrap();
        assert!(!a.already && a.relay_token.is_none());
        let c = CredentialRotated {
            node_credential: "pxnk_x".into(),
        };
        assert_eq!(
            serde_json::to_string(&c).unwrap(),
            r#"{"node_credential":"pxnk_x"}"#
        );
        assert!(!format!("{c:?}").contains("pxnk"));
    }
}
