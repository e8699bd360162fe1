//! WireGuard keys: public keys are the wire crate's [`PublicKey`] (one type for the agent, the
//! data plane and the codecs); private and preshared keys are secrets that never show up in
//! `Debug` output or logs.

use boringtun::x25519;
use ring::rand::{SecureRandom, SystemRandom};

pub use plexsphere_wire::key::{KeyError, PublicKey};
use plexsphere_wire::key::{decode_base64, decode_hex};

/// The X25519 form boringtun's handshake takes.
pub(crate) fn x25519(key: &PublicKey) -> x25519::PublicKey {
    x25519::PublicKey::from(key.0)
}

/// A private or preshared key. `Debug` prints `<redacted>`; the bytes are wiped on drop.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretKey([u8; 32]);

impl SecretKey {
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    pub fn generate() -> Result<Self, KeyError> {
        let mut bytes = [0u8; 32];
        SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| KeyError::Random)?;
        Ok(Self(bytes))
    }

    pub(crate) fn from_hex(s: &str) -> Result<Self, KeyError> {
        decode_hex(s).map(Self)
    }

    pub fn from_base64(s: &str) -> Result<Self, KeyError> {
        decode_base64(s).map(Self)
    }

    /// The UAPI text form. Only the UAPI `get` answer prints it.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|b| *b == 0)
    }

    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The public key of this private key.
    pub fn public_key(&self) -> PublicKey {
        PublicKey(x25519::PublicKey::from(&self.static_secret()).to_bytes())
    }

    pub(crate) fn static_secret(&self) -> x25519::StaticSecret {
        x25519::StaticSecret::from(self.0)
    }
}

impl Drop for SecretKey {
    fn drop(&mut self) {
        self.0 = [0; 32];
        // Keeps the wipe from being optimised away as a dead store.
        std::hint::black_box(&self.0);
    }
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretKey(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_key_matches_wg_pubkey() {
        // `echo yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk= | wg pubkey` (wireguard.com example)
        let private =
            SecretKey::from_base64("yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=").expect("key");
        assert_eq!(
            private.public_key().to_base64(),
            "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw="
        );
        let hex = private.to_hex();
        assert_eq!(SecretKey::from_hex(&hex).expect("hex"), private);
    }

    #[test]
    fn bad_text_is_refused_and_secrets_do_not_print() {
        assert_eq!(PublicKey::from_hex("zz"), Err(KeyError::Hex));
        assert_eq!(PublicKey::from_base64("AAAA"), Err(KeyError::Base64));
        let s = SecretKey::generate().expect("random");
        assert!(!format!("{s:?}").contains(&s.to_hex()));
        assert!(!s.is_zero());
    }
}
