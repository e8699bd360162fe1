//! The registration cookie: `HMAC-SHA256(secret, address | node key | epoch)`, with a
//! 30-second epoch; the current and the previous epoch are accepted, so a cookie lives 30 to
//! 60 seconds. The relay keeps no state for a `hello`: the cookie in `register` proves the
//! sender got the `challenge` at that address, so a spoofed source cannot register.

use std::net::{IpAddr, SocketAddr};

use plexsphere_wire::key::PublicKey;
use ring::hmac;

/// Seconds in one cookie epoch.
pub const COOKIE_EPOCH_SECS: u64 = 30;

pub struct CookieKey {
    key: hmac::Key,
}

impl CookieKey {
    pub fn new(secret: &[u8; 32]) -> Self {
        Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
        }
    }

    fn message(from: SocketAddr, node: &PublicKey, epoch: u64) -> Vec<u8> {
        let mut msg = Vec::with_capacity(19 + 32 + 8);
        match from.ip() {
            IpAddr::V4(v4) => {
                msg.push(4);
                msg.extend_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                msg.push(6);
                msg.extend_from_slice(&v6.octets());
            }
        }
        msg.extend_from_slice(&from.port().to_be_bytes());
        msg.extend_from_slice(&node.0);
        msg.extend_from_slice(&epoch.to_be_bytes());
        msg
    }

    fn at_epoch(&self, from: SocketAddr, node: &PublicKey, epoch: u64) -> [u8; 32] {
        let tag = hmac::sign(&self.key, &Self::message(from, node, epoch));
        let mut out = [0u8; 32];
        out.copy_from_slice(tag.as_ref());
        out
    }

    /// The cookie for a `hello` from `from` at Unix time `now_unix`.
    pub fn make(&self, from: SocketAddr, node: &PublicKey, now_unix: u64) -> [u8; 32] {
        self.at_epoch(from, node, now_unix / COOKIE_EPOCH_SECS)
    }

    /// Whether `cookie` was made for this address and key in this epoch or the one before.
    pub fn check(
        &self,
        from: SocketAddr,
        node: &PublicKey,
        cookie: &[u8; 32],
        now_unix: u64,
    ) -> bool {
        let epoch = now_unix / COOKIE_EPOCH_SECS;
        // hmac::verify compares in constant time.
        [epoch, epoch.saturating_sub(1)]
            .iter()
            .any(|e| hmac::verify(&self.key, &Self::message(from, node, *e), cookie).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_for_two_epochs_then_stale() {
        let k = CookieKey::new(&[5; 32]);
        let a: SocketAddr = "192.0.2.1:51820".parse().unwrap();
        let node = PublicKey([1u8; 32]);
        let t = 1_000_000u64;
        let c = k.make(a, &node, t);
        assert!(k.check(a, &node, &c, t));
        assert!(k.check(a, &node, &c, t + COOKIE_EPOCH_SECS));
        assert!(!k.check(a, &node, &c, t + 2 * COOKIE_EPOCH_SECS));
    }

    #[test]
    fn bound_to_address_key_and_secret() {
        let k = CookieKey::new(&[5; 32]);
        let a: SocketAddr = "192.0.2.1:51820".parse().unwrap();
        let b: SocketAddr = "192.0.2.1:51821".parse().unwrap();
        let c = k.make(a, &PublicKey([1; 32]), 60);
        assert!(!k.check(b, &PublicKey([1; 32]), &c, 60));
        assert!(!k.check(a, &PublicKey([2; 32]), &c, 60));
        assert!(!CookieKey::new(&[6; 32]).check(a, &PublicKey([1; 32]), &c, 60));
    }
}
