//! A Domain's signing keys as nodes learn them, and the statements that carry a node from one
//! key to the next (Domain key rotation).
//!
//! A rotation adds the next generation with `active_from` at the end of an overlap. While the
//! overlap lasts the current key still signs and every state document announces the next key
//! ([`crate::node::NodeState::next_signing_key`]), so a node that is online accepts documents
//! signed by either and moves to the new key when the first document signed by it arrives.
//!
//! A node that was offline for the whole overlap never saw the announcement. For it each key
//! after the first has a [`KeyTransition`]: the new key's generation, public key and start,
//! signed by the key before it (context [`SignContext::KeyTransition`]). Following the chain
//! from the key it has pinned ([`follow`]) brings the node to the current key without trusting
//! anything its pinned key did not vouch for, link by link.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::signed::{DomainSigner, DomainVerifier, SignContext, VerifyError};

/// The HTTP path (below `/v1/nodes/{id}`) of a node's key chain: `GET` answers a
/// [`SigningKeyChain`].
pub const SIGNING_KEYS_PATH: &str = "signing-keys";

/// At most this many transitions are served and followed (a documented limit: a Domain
/// rotated more often than this keeps only its newest links, and a node pinned to a key older
/// than all of them must be enrolled again).
pub const MAX_KEY_CHAIN: usize = 64;

/// One signing key of a Domain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SigningKey {
    /// 1 for the Domain's first key, one more per rotation.
    pub generation: u64,
    /// The Ed25519 public key, standard base64 (32 bytes).
    pub public_key: String,
    /// Unix seconds from which this key signs (the end of the overlap that announced it).
    pub active_from: i64,
}

/// What a transition statement signs: the Domain and the new key.
#[derive(Serialize)]
struct Statement<'a> {
    domain_id: Uuid,
    generation: u64,
    public_key: &'a str,
    active_from: i64,
}

/// The previous key's statement that `key` follows it in `domain_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyTransition {
    pub domain_id: Uuid,
    pub key: SigningKey,
    /// Ed25519 signature (standard base64, 64 bytes) by the key of generation
    /// `key.generation - 1` over the statement, context [`SignContext::KeyTransition`].
    pub signature: String,
}

fn statement_bytes(domain_id: Uuid, key: &SigningKey) -> Vec<u8> {
    // A struct of plain fields: serialization cannot fail, and its bytes are fixed by the
    // field order above.
    serde_json::to_vec(&Statement {
        domain_id,
        generation: key.generation,
        public_key: &key.public_key,
        active_from: key.active_from,
    })
    .unwrap_or_default()
}

impl KeyTransition {
    /// The statement that `key` follows `previous` (the key of the generation before it).
    pub fn sign(previous: &DomainSigner, domain_id: Uuid, key: SigningKey) -> Self {
        let sig = previous.sign_bytes(
            SignContext::KeyTransition,
            &statement_bytes(domain_id, &key),
        );
        Self {
            domain_id,
            key,
            signature: STANDARD.encode(sig),
        }
    }

    /// Whether `previous` signed this statement.
    pub fn verify(&self, previous: &DomainVerifier) -> Result<(), VerifyError> {
        let sig = STANDARD
            .decode(&self.signature)
            .map_err(|_| VerifyError::Encoding)?;
        previous.verify_bytes(
            SignContext::KeyTransition,
            &statement_bytes(self.domain_id, &self.key),
            &sig,
        )
    }
}

/// The answer of `GET /v1/nodes/{id}/signing-keys`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SigningKeyChain {
    /// The transitions of the node's Domain, oldest first, at most [`MAX_KEY_CHAIN`] (the
    /// newest ones); generation 1 has none.
    pub transitions: Vec<KeyTransition>,
}

/// Why a chain does not lead anywhere from the pinned key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChainError {
    #[error(
        "the key chain has {0} transitions, more than the {MAX_KEY_CHAIN} a node follows; enrol the node again"
    )]
    TooLong(usize),
    #[error(
        "no transition in the key chain is signed by the pinned Domain key: the Domain's keys changed in a way this node cannot verify; enrol the node again"
    )]
    NotFromPinned,
    #[error("a transition of the key chain is for another Domain ({0})")]
    OtherDomain(Uuid),
    #[error(
        "the transition to generation {generation} is not signed by generation {previous}: the chain is broken or forged"
    )]
    Broken { generation: u64, previous: u64 },
    #[error("the public key of generation {0} in the key chain is not 32 bytes of base64")]
    BadKey(u64),
}

/// Follows `chain` from the key `pinned` of `domain_id`: the first transition must be signed
/// by `pinned`, each later one by the key before it. Returns the keys reached, in order (empty
/// when the chain holds nothing after the pinned key, i.e. the pinned key is the newest).
///
/// Transitions older than the pinned key are skipped (they are signed by keys the node never
/// had); a transition that neither follows the pinned key nor the last key reached is an error,
/// so a forged link is never skipped over.
pub fn follow(
    domain_id: Uuid,
    pinned: &str,
    chain: &SigningKeyChain,
) -> Result<Vec<SigningKey>, ChainError> {
    if chain.transitions.len() > MAX_KEY_CHAIN {
        return Err(ChainError::TooLong(chain.transitions.len()));
    }
    let verifier = |key: &SigningKey| {
        DomainVerifier::from_b64(&key.public_key).map_err(|_| ChainError::BadKey(key.generation))
    };
    let pinned_verifier = DomainVerifier::from_b64(pinned).map_err(|_| ChainError::BadKey(0))?;
    let mut reached: Vec<SigningKey> = Vec::new();
    for t in &chain.transitions {
        if t.domain_id != domain_id {
            return Err(ChainError::OtherDomain(t.domain_id));
        }
        match reached.last() {
            None => {
                if t.key.public_key == pinned {
                    // The pinned key's own transition (signed by an older key): nothing to do.
                    continue;
                }
                if t.verify(&pinned_verifier).is_ok() {
                    verifier(&t.key)?;
                    reached.push(t.key.clone());
                }
            }
            Some(last) => {
                let previous = verifier(last)?;
                if t.key.generation != last.generation + 1 || t.verify(&previous).is_err() {
                    return Err(ChainError::Broken {
                        generation: t.key.generation,
                        previous: last.generation,
                    });
                }
                verifier(&t.key)?;
                reached.push(t.key.clone());
            }
        }
    }
    if reached.is_empty() {
        let pinned_is_newest = chain
            .transitions
            .last()
            .is_none_or(|t| t.key.public_key == pinned);
        if !pinned_is_newest {
            return Err(ChainError::NotFromPinned);
        }
    }
    Ok(reached)
}

#[cfg(test)]
#[path = "signing_keys_tests.rs"]
mod tests;
