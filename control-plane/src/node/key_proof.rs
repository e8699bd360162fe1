//! Proof of possession of a WireGuard key (`plexsphere_wire::proof` has the protocol), and a live node key's uniqueness in its Domain.
//!
//! `POST /v1/register/challenge` takes the bootstrap token, checks it is a known node token of
//! a live project, and answers the Domain's X25519 proof key (the one key rotation uses) and a
//! stateless nonce: `<expires>.<random>.<tag>`, the tag a MAC under the Domain's registration
//! nonce key over the token id, the expiry and the random part. Nothing is stored: any replica
//! checks it. `POST /v1/register` then needs the nonce and the proof made with the WireGuard
//! private key of the key it registers; without them it is refused (`proof_required`, an older
//! plexd: upgrade), with a wrong one or an expired nonce too (`proof_invalid`).
//!
//! So a bootstrap token alone (a reusable one sits in every machine's user data) and a node's
//! public key (every peer has it) no longer register that key, nor replay that node's
//! registration.

use plexsphere_wire::RegisterRequest;
use plexsphere_wire::proof::{Challenge, verify_register};
use plexsphere_wire::rotation::CHALLENGE_TTL_SECS;
use plexsphere_wire::secret::{SecretPart, constant_time_eq, sha256};
use plexsphere_wire::signed::{DomainSigner, SignContext};

use std::sync::Arc;
use uuid::Uuid;

use crate::error::Error;
use crate::keys::KeySet;
use crate::store::nodes;

/// The label the registration nonce key is derived with (distinct from key rotation's).
const NONCE_LABEL: &[u8] = b"plexsphere registration nonce v1";

/// What `POST /v1/register` tells a plexd that sent no proof.
pub(crate) const UPGRADE: &str = "this control plane requires a proof of the node's WireGuard private key at registration (nonce and proof from POST /v1/register/challenge), and this plexd sent none: it is too old; upgrade plexd to this control plane's version and run plexd join again";

/// The label the Domain's X25519 proof secret is derived with: one secret for registration and
/// for key and credential rotation (its public half is what nodes prove their keys to).
const PROOF_SECRET_LABEL: &[u8] = b"plexsphere key-rotation secret v1";

/// The Domain's X25519 proof secret.
pub(crate) fn proof_secret(signer: &DomainSigner) -> [u8; 32] {
    sha256(&signer.sign_bytes(SignContext::KeyDerivation, PROOF_SECRET_LABEL))
}

struct Secrets {
    x25519: [u8; 32],
    nonce_key: [u8; 32],
}

fn secrets(signer: &DomainSigner) -> Secrets {
    Secrets {
        x25519: proof_secret(signer),
        nonce_key: sha256(&signer.sign_bytes(SignContext::KeyDerivation, NONCE_LABEL)),
    }
}

/// A stateless nonce of `subject` (what it is bound to) expiring at `expires`:
/// `<expires>.<random>.<tag>`, the tag the first 16 bytes of SHA-256 over the nonce key, the
/// subject, the expiry and the random part. Registration binds its nonces to the token id,
/// key and credential rotation theirs to the node id; each under its own nonce key.
pub(crate) fn nonce(nonce_key: &[u8; 32], subject: &[u8], expires: i64, random: &str) -> String {
    let tag = nonce_tag(nonce_key, subject, expires, random);
    format!("{expires}.{random}.{tag}")
}

fn nonce_tag(nonce_key: &[u8; 32], subject: &[u8], expires: i64, random: &str) -> String {
    let mut buf = Vec::new();
    buf.extend_from_slice(nonce_key);
    buf.extend_from_slice(subject);
    buf.extend_from_slice(&expires.to_be_bytes());
    buf.extend_from_slice(random.as_bytes());
    hex::encode(&sha256(&buf)[..16])
}

/// Whether `text` is a [`nonce`] of `subject` under `nonce_key` that has not expired at `now`
/// (and whose expiry is no further than [`CHALLENGE_TTL_SECS`] ahead).
pub(crate) fn nonce_ok(nonce_key: &[u8; 32], subject: &[u8], text: &str, now: i64) -> bool {
    let mut parts = text.splitn(3, '.');
    let (Some(exp), Some(random), Some(given)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let Ok(expires) = exp.parse::<i64>() else {
        return false;
    };
    now <= expires
        && expires <= now.saturating_add(CHALLENGE_TTL_SECS)
        && constant_time_eq(
            nonce_tag(nonce_key, subject, expires, random).as_bytes(),
            given.as_bytes(),
        )
}

/// What a registration nonce is bound to: the token id, length first.
fn token_subject(token_id: &str) -> Vec<u8> {
    let mut subject = u32::try_from(token_id.len())
        .unwrap_or(u32::MAX)
        .to_be_bytes()
        .to_vec();
    subject.extend_from_slice(token_id.as_bytes());
    subject
}

/// The signers a registration's proof at `now` may be made under: the Domain's current one
/// (the challenge's) and, for a challenge answered just before a signing-key generation became
/// current, the one that was current [`CHALLENGE_TTL_SECS`] ago.
pub(crate) fn proof_signers(keys: &KeySet, now: i64) -> Vec<Arc<DomainSigner>> {
    let current = keys.current(now);
    let before = keys.current(now.saturating_sub(CHALLENGE_TTL_SECS));
    let mut out = vec![current.signer.clone()];
    if before.generation != current.generation {
        out.push(before.signer.clone());
    }
    out
}

/// Checks a registration's proof for its key against the token `token_id` at `now`, under any
/// of `signers` ([`proof_signers`]).
pub(crate) fn check(
    signers: &[Arc<DomainSigner>],
    req: &RegisterRequest,
    token_id: &str,
    now: i64,
) -> Result<(), Error> {
    let (Some(nonce), Some(proof)) = (req.nonce.as_deref(), req.proof.as_deref()) else {
        return Err(Error::ProofRequired(UPGRADE.into()));
    };
    let key =
        plexsphere_wire::key::PublicKey::from_base64(&req.wireguard_public_key).map_err(|_| {
            Error::Invalid("wireguard_public_key must be the standard base64 of 32 bytes".into())
        })?;
    // The nonce says which signer made it: its tag checks under that one only.
    let subject = token_subject(token_id);
    let Some(s) = signers
        .iter()
        .map(|signer| secrets(signer))
        .find(|s| nonce_ok(&s.nonce_key, &subject, nonce, now))
    else {
        tracing::warn!(token_id, "registration refused: unknown or expired nonce");
        return Err(Error::ProofInvalid(
            "the registration's nonce is unknown, expired or for another token; ask for a fresh one (POST /v1/register/challenge) and register again".into(),
        ));
    };
    if !verify_register(&s.x25519, &key, token_id, nonce, proof) {
        tracing::warn!(token_id, key = %req.wireguard_public_key, "registration refused: the proof of possession does not match the key");
        return Err(Error::ProofInvalid(
            "the proof of possession does not match wireguard_public_key: the request was not made by the holder of its private key".into(),
        ));
    }
    Ok(())
}

/// A challenge for a registration with the token `token_id`, under the Domain key `signer`.
pub(crate) fn challenge(
    signer: &DomainSigner,
    token_id: &str,
    now: i64,
) -> Result<Challenge, Error> {
    let s = secrets(signer);
    let random =
        SecretPart::generate().map_err(|e| Error::Internal(format!("cannot draw a nonce: {e}")))?;
    let expires_at = now.saturating_add(CHALLENGE_TTL_SECS);
    Ok(Challenge {
        server_public_key: plexsphere_wire::reach::public_key(&s.x25519).to_base64(),
        nonce: nonce(
            &s.nonce_key,
            &token_subject(token_id),
            expires_at,
            random.expose(),
        ),
        expires_at,
    })
}

/// Refuses a key that another live node of `domain` (not `except`) has, or whose first 8
/// bytes another live node's key has (409, naming that node). The unique index on
/// `(domain_id, key_prefix)` among live nodes backs this up when two writers race.
pub(crate) async fn key_unique(
    conn: &mut sqlx::AnyConnection,
    domain: Uuid,
    key: &str,
    except: Option<Uuid>,
) -> Result<(), Error> {
    let Some((other, other_key)) = nodes::key_clash(conn, domain, key, except).await? else {
        return Ok(());
    };
    tracing::warn!(domain_id = %domain, key, other_node = %other, "refused a WireGuard key that clashes with another live node's");
    Err(if other_key == key {
        Error::KeyInUse(format!(
            "node {other} of this Domain already has this WireGuard public key; a key names one node: generate a fresh key pair (remove the state dir's wireguard.key) and try again"
        ))
    } else {
        Error::KeyPrefixInUse(format!(
            "node {other} of this Domain has a WireGuard public key with the same first 8 bytes (relay frames name nodes by them); generate a fresh key pair (remove the state dir's wireguard.key) and try again"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok_nonce(s: &Secrets, token_id: &str, expires: i64, random: &str) -> String {
        nonce(&s.nonce_key, &token_subject(token_id), expires, random)
    }

    fn tok_ok(s: &Secrets, token_id: &str, text: &str, now: i64) -> bool {
        nonce_ok(&s.nonce_key, &token_subject(token_id), text, now)
    }

    #[test]
    fn nonces_are_bound_to_token_and_time() {
        let s = Secrets {
            x25519: [1; 32],
            nonce_key: [2; 32],
        };
        let n = tok_nonce(&s, "tok", 1300, "r");
        assert!(tok_ok(&s, "tok", &n, 1000));
        assert!(tok_ok(&s, "tok", &n, 1300));
        assert!(!tok_ok(&s, "tok", &n, 1301), "expired");
        assert!(!tok_ok(&s, "tok2", &n, 1000), "other token");
        assert!(!tok_ok(&s, "tok", &n, 900), "expiry further than the TTL");
        assert!(!tok_ok(&s, "tok", &n.replace(".r.", ".x."), 1000));
        assert!(!tok_ok(&s, "tok", "1300.r", 1000));
        let other = Secrets {
            x25519: [1; 32],
            nonce_key: [3; 32],
        };
        assert!(!tok_ok(&other, "tok", &n, 1000), "another Domain's nonce");
    }
}
