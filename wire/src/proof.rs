//! Proof of possession of a node's WireGuard private key, at registration and at credential
//! rotation (key rotation has its own transcript in [`crate::rotation`]).
//!
//! | call | challenge | proof over |
//! |---|---|---|
//! | registration | `POST /v1/register/challenge` ([`RegisterChallengeRequest`] -> [`Challenge`]), nonce bound to the token id | token id, public key, nonce |
//! | credential rotation | `GET /v1/nodes/{id}/key` (-> [`Challenge`]), nonce bound to the node | node id, public key, nonce |
//!
//! A proof is `SHA-256(label || X25519(wg_secret, server) || transcript)`, base64, where
//! `server` is the challenge's X25519 public key (the Domain's proof key, the same key rotation
//! uses) and each call has its own label, so a proof for one call proves nothing for another.
//! The node's WireGuard public key is public (every peer holds it); only its private key makes
//! a proof, so a fleet neighbour that holds a reusable bootstrap token and a node's public key
//! can neither register that key nor rotate that node's credential.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::key::PublicKey;
use crate::secret::{constant_time_eq, sha256};

/// The HTTP path of the registration challenge.
pub const REGISTER_CHALLENGE_PATH: &str = "/v1/register/challenge";
/// The label of a registration proof.
pub const REGISTER_LABEL: &[u8] = b"plexsphere registration v1";
/// The label of a credential rotation proof.
pub const CREDENTIAL_LABEL: &[u8] = b"plexsphere credential rotation v1";
/// How many leading bytes of a WireGuard public key name a node in relay frames (the relay's
/// `KeyPrefix`); a live node's prefix is unique in its Domain.
pub const KEY_PREFIX_LEN: usize = 8;

/// What a proof is made with (the answer of both challenges; the shape of
/// [`crate::rotation::KeyChallenge`]).
pub type Challenge = crate::rotation::KeyChallenge;

/// `POST /v1/register/challenge`: the bootstrap token the registration will use.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterChallengeRequest {
    pub bootstrap_token: String,
}

impl std::fmt::Debug for RegisterChallengeRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RegisterChallengeRequest(<redacted>)")
    }
}

/// `POST /v1/nodes/{id}/credential`: the proof that the caller holds the node's WireGuard
/// private key. Every field is optional on the wire so that an older plexd's empty body is
/// answered with `proof_required` (upgrade) rather than a JSON error.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialRotation {
    /// The node's current WireGuard public key, standard base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
    /// The nonce of `GET /v1/nodes/{id}/key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
    /// [`prove_credential`] with the node's private key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof: Option<String>,
}

fn digest(label: &[u8], shared: &[u8; 32], parts: &[&[u8]]) -> [u8; 32] {
    let mut buf = Vec::with_capacity(label.len() + 32 + 128);
    buf.extend_from_slice(label);
    buf.extend_from_slice(shared);
    for p in parts {
        // Length-prefixed: no two transcripts share bytes.
        buf.extend_from_slice(&u32::try_from(p.len()).unwrap_or(u32::MAX).to_be_bytes());
        buf.extend_from_slice(p);
    }
    sha256(&buf)
}

fn prove(label: &[u8], secret: &[u8; 32], server: &PublicKey, parts: &[&[u8]]) -> String {
    let shared = crate::reach::shared_secret(secret, server);
    STANDARD.encode(digest(label, &shared, parts))
}

fn verify(
    label: &[u8],
    server_secret: &[u8; 32],
    claimed: &PublicKey,
    parts: &[&[u8]],
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
    constant_time_eq(&digest(label, &shared, parts), &given)
}

/// The node's registration proof: its WireGuard private key `secret`, the challenge's
/// `server` key, the bootstrap token's id (`pxbt_<env>_<id>_...`'s id part) and the nonce.
pub fn prove_register(
    secret: &[u8; 32],
    server: &PublicKey,
    token_id: &str,
    nonce: &str,
) -> String {
    let public = crate::reach::public_key(secret);
    prove(
        REGISTER_LABEL,
        secret,
        server,
        &[token_id.as_bytes(), &public.0, nonce.as_bytes()],
    )
}

/// The server's check of a registration proof for the key `claimed`.
pub fn verify_register(
    server_secret: &[u8; 32],
    claimed: &PublicKey,
    token_id: &str,
    nonce: &str,
    proof: &str,
) -> bool {
    verify(
        REGISTER_LABEL,
        server_secret,
        claimed,
        &[token_id.as_bytes(), &claimed.0, nonce.as_bytes()],
        proof,
    )
}

/// The node's credential rotation proof.
pub fn prove_credential(
    secret: &[u8; 32],
    server: &PublicKey,
    node_id: Uuid,
    nonce: &str,
) -> String {
    let public = crate::reach::public_key(secret);
    prove(
        CREDENTIAL_LABEL,
        secret,
        server,
        &[node_id.as_bytes(), &public.0, nonce.as_bytes()],
    )
}

/// The server's check of a credential rotation proof for the node's key `claimed`.
pub fn verify_credential(
    server_secret: &[u8; 32],
    claimed: &PublicKey,
    node_id: Uuid,
    nonce: &str,
    proof: &str,
) -> bool {
    verify(
        CREDENTIAL_LABEL,
        server_secret,
        claimed,
        &[node_id.as_bytes(), &claimed.0, nonce.as_bytes()],
        proof,
    )
}

/// The key's first [`KEY_PREFIX_LEN`] bytes as the control plane stores them (standard base64
/// without padding: 11 characters, which are the first 10 characters of the key's base64 and
/// the 11th with its two low bits cleared, so SQL can compute it from the stored key too).
pub fn key_prefix(key: &PublicKey) -> String {
    STANDARD_NO_PAD.encode(&key.0[..KEY_PREFIX_LEN])
}

/// [`key_prefix`] of a key in standard base64 (as `wg pubkey` prints it); `None` for a text
/// that is no key.
pub fn key_prefix_of(key: &str) -> Option<String> {
    PublicKey::from_base64(key).ok().map(|k| key_prefix(&k))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reach::public_key;

    #[test]
    fn a_registration_proof_verifies_only_for_its_key_token_and_nonce() {
        let (server, node_s, other_s) = ([7u8; 32], [1u8; 32], [2u8; 32]);
        let (sp, node, other) = (
            public_key(&server),
            public_key(&node_s),
            public_key(&other_s),
        );
        let p = prove_register(&node_s, &sp, "tok1", "n1");
        assert!(verify_register(&server, &node, "tok1", "n1", &p));
        assert!(
            !verify_register(&server, &other, "tok1", "n1", &p),
            "other key"
        );
        assert!(
            !verify_register(&server, &node, "tok2", "n1", &p),
            "other token"
        );
        assert!(
            !verify_register(&server, &node, "tok1", "n2", &p),
            "other nonce"
        );
        assert!(
            !verify_register(&server, &PublicKey([0; 32]), "tok1", "n1", &p),
            "low order"
        );
        assert!(!verify_register(&server, &node, "tok1", "n1", "%%"));
        // A proof made without the private key (with another key, for this public key) fails.
        let forged = prove_register(&other_s, &sp, "tok1", "n1");
        assert!(!verify_register(&server, &node, "tok1", "n1", &forged));
    }

    #[test]
    fn a_credential_proof_is_not_a_registration_proof() {
        let (server, node_s) = ([7u8; 32], [1u8; 32]);
        let (sp, node) = (public_key(&server), public_key(&node_s));
        let id = Uuid::from_u128(3);
        let c = prove_credential(&node_s, &sp, id, "n");
        assert!(verify_credential(&server, &node, id, "n", &c));
        assert!(!verify_credential(
            &server,
            &node,
            Uuid::from_u128(4),
            "n",
            &c
        ));
        let r = prove_register(&node_s, &sp, &id.to_string(), "n");
        assert!(!verify_credential(&server, &node, id, "n", &r));
    }

    #[test]
    fn the_prefix_is_the_keys_base64_head() {
        let mut k = [0u8; 32];
        k[..8].copy_from_slice(&[0xff, 0xee, 0xdd, 0xcc, 0xbb, 0xaa, 0x99, 0x8f]);
        let full = STANDARD.encode(k);
        let p = key_prefix(&PublicKey(k));
        assert_eq!(p.len(), 11);
        assert_eq!(&p[..10], &full[..10]);
        // The 11th character: the key's with its two low bits (the 9th byte's) cleared.
        k[8] = 0xff;
        assert_eq!(key_prefix(&PublicKey(k)), p);
        assert_ne!(&STANDARD.encode(k)[10..11], &p[10..11]);
    }

    #[test]
    fn json_shapes_are_pinned() {
        let c: CredentialRotation = serde_json::from_str("{}").unwrap();
        assert_eq!(c, CredentialRotation::default());
        let c: CredentialRotation =
            serde_json::from_str(r#"{"public_key":"k","nonce":"n","proof":"p"}"#).unwrap();
        assert_eq!(c.proof.as_deref(), Some("p"));
        assert!(serde_json::from_str::<CredentialRotation>(r#"{"x":1}"#).is_err());
        let r: RegisterChallengeRequest =
            serde_json::from_str(r#"{"bootstrap_token":"pxbt_x"}"#).unwrap();
        assert!(!format!("{r:?}").contains("pxbt"));
    }
}
