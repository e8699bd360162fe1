//! The detached Domain signature of `checksums.sha256` and the public key that checks it.
//!
//! The signature is plain Ed25519 over the file's exact bytes (64 raw bytes), so
//! `openssl pkeyutl -verify -pubin -inkey signing-key.pem -rawin -in checksums.sha256
//! -sigfile checksums.sha256.sig` checks it; `wire::signed::SignContext::Checksums` has an empty
//! tag for that reason.

use std::fmt;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use plexsphere_wire::signed::{DomainSigner, SignContext};
use ring::signature::{ED25519, UnparsedPublicKey};

type SignFn = dyn Fn(&[u8]) -> [u8; 64] + Send + Sync;

/// Signs checksum files with a Domain key. Holds only a closure and the public key: the
/// private key stays wherever the caller keeps it, and `Debug` shows the public key alone.
#[derive(Clone)]
pub struct ChecksumSigner {
    sign: Arc<SignFn>,
    public_key: [u8; 32],
}

#[derive(Debug, thiserror::Error)]
pub enum SigningError {
    #[error("the Domain public key is not 32 bytes of base64")]
    BadPublicKey,
    #[error(
        "the signing function's signature does not verify with the given Domain public key; pass the public key of the same Domain key"
    )]
    KeyMismatch,
}

impl ChecksumSigner {
    /// A signer from a closure that signs bytes (plain Ed25519, no context) and the matching
    /// raw public key. A probe signature is checked, so a wrong pair fails here, at start.
    pub fn new(
        public_key: [u8; 32],
        sign: impl Fn(&[u8]) -> [u8; 64] + Send + Sync + 'static,
    ) -> Result<Self, SigningError> {
        let signer = Self {
            sign: Arc::new(sign),
            public_key,
        };
        let probe = b"plexsphere-downloads: key check";
        if !signer.verify(probe, &signer.sign(probe)) {
            return Err(SigningError::KeyMismatch);
        }
        Ok(signer)
    }

    /// A signer backed by the Domain's [`DomainSigner`] with [`SignContext::Checksums`].
    pub fn from_domain(domain: Arc<DomainSigner>) -> Result<Self, SigningError> {
        let key = STANDARD
            .decode(domain.public_key_b64())
            .map_err(|_| SigningError::BadPublicKey)?;
        let key: [u8; 32] = key.try_into().map_err(|_| SigningError::BadPublicKey)?;
        Self::new(key, move |bytes| {
            domain.sign_bytes(SignContext::Checksums, bytes)
        })
    }

    pub fn sign(&self, bytes: &[u8]) -> [u8; 64] {
        (self.sign)(bytes)
    }

    pub fn verify(&self, bytes: &[u8], signature: &[u8]) -> bool {
        UnparsedPublicKey::new(&ED25519, &self.public_key)
            .verify(bytes, signature)
            .is_ok()
    }

    pub fn public_key(&self) -> &[u8; 32] {
        &self.public_key
    }

    /// `signing-key.pem`: the SubjectPublicKeyInfo PEM `openssl pkeyutl -pubin` reads.
    pub fn public_key_pem(&self) -> String {
        ed25519_spki_pem(&self.public_key)
    }
}

impl fmt::Debug for ChecksumSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChecksumSigner")
            .field("public_key", &STANDARD.encode(self.public_key))
            .finish_non_exhaustive()
    }
}

pub use plexsphere_wire::signed::ed25519_spki_pem;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domain_signer_signs_plain_ed25519() {
        let domain = Arc::new(DomainSigner::from_seed(&[3u8; 32]).unwrap());
        let signer = ChecksumSigner::from_domain(domain.clone()).unwrap();
        let sig = signer.sign(b"abc  plexd-linux-amd64\n");
        assert!(signer.verify(b"abc  plexd-linux-amd64\n", &sig));
        assert!(!signer.verify(b"abd  plexd-linux-amd64\n", &sig));
        // The same bytes the Domain signs with the Checksums context: no prefix.
        assert_eq!(
            sig,
            domain.sign_bytes(SignContext::Checksums, b"abc  plexd-linux-amd64\n")
        );
        assert!(!format!("{signer:?}").contains("sign:"));
    }

    #[test]
    fn a_mismatched_key_is_refused_at_construction() {
        let domain = Arc::new(DomainSigner::from_seed(&[3u8; 32]).unwrap());
        let other =
            ChecksumSigner::from_domain(Arc::new(DomainSigner::from_seed(&[4u8; 32]).unwrap()))
                .unwrap();
        let wrong = ChecksumSigner::new(*other.public_key(), move |b| {
            domain.sign_bytes(SignContext::Checksums, b)
        });
        assert!(matches!(wrong, Err(SigningError::KeyMismatch)));
    }

    #[test]
    fn spki_pem_shape() {
        let pem = ed25519_spki_pem(&[0u8; 32]);
        assert_eq!(
            pem,
            "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n-----END PUBLIC KEY-----\n"
        );
    }
}
