//! Documents signed with a Domain's Ed25519 key: the node state and the stream's events.
//!
//! The signature covers the exact payload bytes, prefixed with a context string, so a state
//! document can never be replayed as an event (or the other way round), and the verifier checks
//! the signature before it parses a single byte of the payload.
//!
//! ```json
//! {"payload":"<standard base64 of the JSON document>","signature":"<standard base64, 64 bytes>"}
//! ```

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// What a signed document is; part of what is signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignContext {
    NodeState,
    Event,
    /// A Domain-wide event ([`crate::domain_event::DomainEvent`]).
    DomainEvent,
    Checksums,
    /// A relay token ([`crate::reach::relay::RelayToken`]).
    RelayToken,
    /// A Domain key's statement that the next generation follows it
    /// ([`crate::signing_keys::KeyTransition`]).
    KeyTransition,
    /// Never sent: the control plane hashes its signature of a fixed label into a secret it
    /// derives from the Domain key (the key-rotation proof key and nonce key), the same on
    /// every replica and after every restart.
    KeyDerivation,
}

impl SignContext {
    fn tag(self) -> &'static [u8] {
        match self {
            SignContext::NodeState => b"plexsphere/v1/node-state\0",
            SignContext::Event => b"plexsphere/v1/event\0",
            SignContext::DomainEvent => b"plexsphere/v1/domain-event\0",
            SignContext::RelayToken => b"plexsphere/v1/relay-token\0",
            SignContext::KeyTransition => b"plexsphere/v1/key-transition\0",
            SignContext::KeyDerivation => b"plexsphere/v1/key-derivation\0",
            // Empty on purpose: the detached signature of checksums.sha256 is a plain Ed25519
            // signature of the file's bytes, so `openssl pkeyutl -verify -rawin` checks it.
            SignContext::Checksums => b"",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedEnvelope {
    pub payload: String,
    pub signature: String,
}

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("the envelope is not valid base64")]
    Encoding,
    #[error("the signature does not match the Domain key pinned at registration")]
    BadSignature,
    #[error("the signed payload is not a valid document: {0}")]
    Payload(#[from] serde_json::Error),
    #[error("the pinned Domain key is not 32 bytes of base64")]
    BadKey,
}

/// A Domain's signing key, from its 32-byte seed.
pub struct DomainSigner {
    pair: Ed25519KeyPair,
}

impl DomainSigner {
    pub fn from_seed(seed: &[u8; 32]) -> Result<Self, VerifyError> {
        let pair = Ed25519KeyPair::from_seed_unchecked(seed).map_err(|_| VerifyError::BadKey)?;
        Ok(Self { pair })
    }

    /// The raw 32-byte public key.
    pub fn public_key(&self) -> &[u8] {
        self.pair.public_key().as_ref()
    }

    /// The public key, standard base64, as registration hands it to nodes.
    pub fn public_key_b64(&self) -> String {
        STANDARD.encode(self.pair.public_key().as_ref())
    }

    /// Signs arbitrary bytes with a context (detached signature, 64 bytes).
    pub fn sign_bytes(&self, ctx: SignContext, bytes: &[u8]) -> [u8; 64] {
        let mut msg = Vec::with_capacity(ctx.tag().len() + bytes.len());
        msg.extend_from_slice(ctx.tag());
        msg.extend_from_slice(bytes);
        let sig = self.pair.sign(&msg);
        let mut out = [0u8; 64];
        out.copy_from_slice(sig.as_ref());
        out
    }

    pub fn sign<T: Serialize>(
        &self,
        ctx: SignContext,
        doc: &T,
    ) -> Result<SignedEnvelope, serde_json::Error> {
        let payload = serde_json::to_vec(doc)?;
        let sig = self.sign_bytes(ctx, &payload);
        Ok(SignedEnvelope {
            payload: STANDARD.encode(&payload),
            signature: STANDARD.encode(sig),
        })
    }
}

/// A pinned Domain public key that verifies envelopes.
#[derive(Clone)]
pub struct DomainVerifier {
    key: [u8; 32],
}

impl DomainVerifier {
    pub fn from_b64(public_key: &str) -> Result<Self, VerifyError> {
        let bytes = STANDARD
            .decode(public_key.trim())
            .map_err(|_| VerifyError::BadKey)?;
        let key: [u8; 32] = bytes.try_into().map_err(|_| VerifyError::BadKey)?;
        Ok(Self { key })
    }

    pub fn verify_bytes(
        &self,
        ctx: SignContext,
        bytes: &[u8],
        signature: &[u8],
    ) -> Result<(), VerifyError> {
        let mut msg = Vec::with_capacity(ctx.tag().len() + bytes.len());
        msg.extend_from_slice(ctx.tag());
        msg.extend_from_slice(bytes);
        UnparsedPublicKey::new(&ED25519, &self.key)
            .verify(&msg, signature)
            .map_err(|_| VerifyError::BadSignature)
    }

    /// Checks the signature, then parses the payload. Nothing is parsed before the check.
    pub fn open<T: DeserializeOwned>(
        &self,
        ctx: SignContext,
        env: &SignedEnvelope,
    ) -> Result<T, VerifyError> {
        let payload = STANDARD
            .decode(&env.payload)
            .map_err(|_| VerifyError::Encoding)?;
        let sig = STANDARD
            .decode(&env.signature)
            .map_err(|_| VerifyError::Encoding)?;
        self.verify_bytes(ctx, &payload, &sig)?;
        Ok(serde_json::from_slice(&payload)?)
    }
}

/// The SubjectPublicKeyInfo PEM of a raw Ed25519 public key (what `openssl pkeyutl -pubin`
/// reads): the fixed 12-byte DER prefix of id-Ed25519 (1.3.101.112), then the key, in
/// 64-column base64.
pub fn ed25519_spki_pem(key: &[u8; 32]) -> String {
    const PREFIX: [u8; 12] = [
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
    ];
    let mut der = PREFIX.to_vec();
    der.extend_from_slice(key);
    let b64 = STANDARD.encode(&der);
    let mut pem = String::from("-----BEGIN PUBLIC KEY-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        pem.push_str(&String::from_utf8_lossy(chunk));
        pem.push('\n');
    }
    pem.push_str("-----END PUBLIC KEY-----\n");
    pem
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Doc {
        version: u64,
    }

    #[test]
    fn sign_then_open_and_refuse_tampering() {
        let signer = DomainSigner::from_seed(&[7u8; 32]).unwrap();
        let verifier = DomainVerifier::from_b64(&signer.public_key_b64()).unwrap();
        let env = signer
            .sign(SignContext::NodeState, &Doc { version: 3 })
            .unwrap();
        let doc: Doc = verifier.open(SignContext::NodeState, &env).unwrap();
        assert_eq!(doc, Doc { version: 3 });

        // The same bytes under another context are refused.
        assert!(matches!(
            verifier.open::<Doc>(SignContext::Event, &env),
            Err(VerifyError::BadSignature)
        ));

        // One flipped payload bit is refused.
        let mut raw = STANDARD.decode(&env.payload).unwrap();
        raw[2] ^= 1;
        let tampered = SignedEnvelope {
            payload: STANDARD.encode(raw),
            signature: env.signature.clone(),
        };
        assert!(matches!(
            verifier.open::<Doc>(SignContext::NodeState, &tampered),
            Err(VerifyError::BadSignature)
        ));

        // Another Domain's key is refused.
        let other = DomainSigner::from_seed(&[8u8; 32]).unwrap();
        let other_verifier = DomainVerifier::from_b64(&other.public_key_b64()).unwrap();
        assert!(
            other_verifier
                .open::<Doc>(SignContext::NodeState, &env)
                .is_err()
        );
    }
}
