//! The primitives of WireGuard's protocol (whitepaper section 5.4): BLAKE2s as HASH, MAC and
//! HMAC, the HKDF-style KDF over it, ChaCha20-Poly1305 (ring) for the handshake's and the
//! transport's AEAD, XChaCha20-Poly1305 for cookies, X25519 and TAI64N. Pure functions: the
//! randomness and the wall time come from the caller.

use std::time::{SystemTime, UNIX_EPOCH};

use blake2::digest::{FixedOutput, KeyInit, Mac, Update};
use blake2::{Blake2s256, Blake2sMac, Digest};
use boringtun::x25519::{PublicKey, StaticSecret};
use chacha20poly1305::aead::AeadInPlace;
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use hmac::SimpleHmac;
use rand_core::CryptoRngCore;
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};

/// The AEAD tag's length.
pub(crate) const TAG: usize = 16;

/// HASH(a || b ...): BLAKE2s-256 of the concatenation.
pub(crate) fn hash(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Blake2s256::new();
    for p in parts {
        Digest::update(&mut h, p);
    }
    h.finalize().into()
}

/// MAC(key, input): keyed BLAKE2s with a 16-byte output.
pub(crate) fn mac(key: &[u8; 32], input: &[u8]) -> [u8; 16] {
    mac_keyed(key, input)
}

/// MAC keyed with a 16-byte cookie (MAC2).
pub(crate) fn mac_cookie(cookie: &[u8; 16], input: &[u8]) -> [u8; 16] {
    mac_keyed(cookie, input)
}

fn mac_keyed(key: &[u8], input: &[u8]) -> [u8; 16] {
    type Mac16 = Blake2sMac<blake2::digest::consts::U16>;
    // Both key lengths (16, 32) are within BLAKE2s's 1..=32.
    let mut m = <Mac16 as KeyInit>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    Update::update(&mut m, input);
    m.finalize_fixed().into()
}

/// HMAC-BLAKE2s(key, input).
fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC takes keys of any length.
    let mut m =
        <SimpleHmac<Blake2s256> as KeyInit>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    for p in parts {
        Mac::update(&mut m, p);
    }
    m.finalize().into_bytes().into()
}

/// KDF_n(key, input) for n = 1, 2, 3: the first `N` of HKDF's outputs.
pub(crate) fn kdf<const N: usize>(key: &[u8; 32], input: &[u8]) -> [[u8; 32]; N] {
    let prk = hmac(key, &[input]);
    let mut out = [[0u8; 32]; N];
    let mut prev: Option<[u8; 32]> = None;
    for (i, o) in out.iter_mut().enumerate() {
        let counter = [i as u8 + 1];
        let t = match prev {
            None => hmac(&prk, &[&counter]),
            Some(p) => hmac(&prk, &[&p, &counter]),
        };
        *o = t;
        prev = Some(t);
    }
    out
}

/// A ChaCha20-Poly1305 key, used with WireGuard's nonce: 32 zero bits and a little-endian
/// 64-bit counter.
pub struct AeadKey(LessSafeKey);

impl AeadKey {
    pub fn new(key: &[u8; 32]) -> Self {
        // A 32-byte key is what CHACHA20_POLY1305 takes.
        Self(LessSafeKey::new(
            UnboundKey::new(&CHACHA20_POLY1305, key).unwrap_or_else(|_| unreachable!()),
        ))
    }

    fn nonce(counter: u64) -> Nonce {
        let mut n = [0u8; 12];
        n[4..].copy_from_slice(&counter.to_le_bytes());
        Nonce::assume_unique_for_key(n)
    }

    /// Encrypts `buf[..len]` in place and writes the tag after it; answers `len + TAG`.
    /// `buf` must hold `len + TAG` bytes.
    pub fn seal(&self, counter: u64, aad: &[u8], buf: &mut [u8], len: usize) -> usize {
        let (data, rest) = buf.split_at_mut(len);
        // ring refuses only inputs over 256 GiB.
        let tag = self
            .0
            .seal_in_place_separate_tag(Self::nonce(counter), Aad::from(aad), data)
            .unwrap_or_else(|_| unreachable!());
        rest[..TAG].copy_from_slice(tag.as_ref());
        len + TAG
    }

    /// Decrypts `buf` (ciphertext and tag) in place; answers the plaintext's length.
    pub fn open(&self, counter: u64, aad: &[u8], buf: &mut [u8]) -> Option<usize> {
        self.0
            .open_in_place(Self::nonce(counter), Aad::from(aad), buf)
            .ok()
            .map(|p| p.len())
    }
}

/// AEAD(key, 0, plaintext, aad) of the handshake: `plaintext.len() + TAG` bytes into `out`.
pub(crate) fn seal_once(key: &[u8; 32], aad: &[u8], plaintext: &[u8], out: &mut [u8]) {
    out[..plaintext.len()].copy_from_slice(plaintext);
    AeadKey::new(key).seal(0, aad, out, plaintext.len());
}

/// The inverse of `seal_once`: the plaintext of `sealed`, if it authenticates.
pub(crate) fn open_once<const N: usize>(
    key: &[u8; 32],
    aad: &[u8],
    sealed: &[u8],
) -> Option<[u8; N]> {
    if sealed.len() != N + TAG {
        return None;
    }
    let mut buf = [0u8; 64];
    buf[..sealed.len()].copy_from_slice(sealed);
    let n = AeadKey::new(key).open(0, aad, &mut buf[..sealed.len()])?;
    let mut out = [0u8; N];
    out.copy_from_slice(&buf[..n]);
    Some(out)
}

/// XAEAD(key, nonce, cookie, aad) of a cookie reply.
#[cfg(test)]
pub(crate) fn xseal_cookie(
    key: &[u8; 32],
    nonce: &[u8; 24],
    cookie: &[u8; 16],
    aad: &[u8],
) -> [u8; 32] {
    let mut buf = [0u8; 32];
    buf[..16].copy_from_slice(cookie);
    let cipher = XChaCha20Poly1305::new(key.into());
    let (data, tag_out) = buf.split_at_mut(16);
    // Encrypting 16 bytes cannot fail.
    let tag = cipher
        .encrypt_in_place_detached(XNonce::from_slice(nonce), aad, data)
        .unwrap_or_else(|_| unreachable!());
    tag_out.copy_from_slice(&tag);
    buf
}

/// The cookie of a cookie reply, if it authenticates.
pub(crate) fn xopen_cookie(
    key: &[u8; 32],
    nonce: &[u8; 24],
    sealed: &[u8],
    aad: &[u8],
) -> Option<[u8; 16]> {
    if sealed.len() != 32 {
        return None;
    }
    let mut data = [0u8; 16];
    data.copy_from_slice(&sealed[..16]);
    let cipher = XChaCha20Poly1305::new(key.into());
    cipher
        .decrypt_in_place_detached(
            XNonce::from_slice(nonce),
            aad,
            &mut data,
            sealed[16..].into(),
        )
        .ok()?;
    Some(data)
}

/// DH(private, public), refusing the all-zero result of a low-order point.
pub(crate) fn dh(private: &StaticSecret, public: &[u8; 32]) -> Option<[u8; 32]> {
    let shared = private.diffie_hellman(&PublicKey::from(*public));
    shared.was_contributory().then(|| shared.to_bytes())
}

/// A fresh ephemeral key pair from `rng`; None when the random source fails (no handshake
/// rather than a weak key).
pub(crate) fn ephemeral(rng: &mut dyn CryptoRngCore) -> Option<(StaticSecret, [u8; 32])> {
    let bytes = random::<32>(rng)?;
    let secret = StaticSecret::from(bytes);
    let public = PublicKey::from(&secret).to_bytes();
    Some((secret, public))
}

/// `N` random bytes from `rng`; None when it fails.
pub(crate) fn random<const N: usize>(rng: &mut dyn CryptoRngCore) -> Option<[u8; N]> {
    let mut bytes = [0u8; N];
    rng.try_fill_bytes(&mut bytes).ok()?;
    Some(bytes)
}

/// Whether `a` and `b` are equal, in time that does not depend on where they differ.
pub(crate) fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// The TAI64N label of the wall time `now`: seconds since 1970 plus 2^62 (big-endian), then
/// nanoseconds (big-endian). Nanoseconds are rounded down to a multiple of 2^24 ns (about
/// 16.8 ms), as the kernel does, so an initiation does not tell its sender's clock precisely.
pub(crate) fn tai64n(now: SystemTime) -> [u8; 12] {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let mut out = [0u8; 12];
    out[..8].copy_from_slice(&(since.as_secs() + (1u64 << 62)).to_be_bytes());
    let nanos = since.subsec_nanos() & !((1u32 << 24) - 1);
    out[8..].copy_from_slice(&nanos.to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7693 appendix A: BLAKE2s-256("abc").
    #[test]
    fn blake2s_matches_the_rfc_vector() {
        assert_eq!(
            hex::encode(hash(&[b"a", b"bc"])),
            "508c5e8c327c14e2e1a72ba34eeb452f37458b209ed63a294d999b4c86675982"
        );
    }

    /// HKDF's chaining: KDF2's first output is KDF1's, and the outputs differ.
    #[test]
    fn kdf_outputs_chain() {
        let key = [7u8; 32];
        let [a] = kdf::<1>(&key, b"input");
        let [b, c] = kdf::<2>(&key, b"input");
        let [d, e, f] = kdf::<3>(&key, b"input");
        assert_eq!(a, b);
        assert_eq!((b, c), (d, e));
        assert_ne!(e, f);
        assert_ne!(a, kdf::<1>(&key, b"other")[0]);
    }

    #[test]
    fn aead_round_trips_and_refuses_a_changed_byte() {
        let key = AeadKey::new(&[1; 32]);
        let mut buf = [0u8; 64];
        buf[..5].copy_from_slice(b"hello");
        let n = key.seal(9, b"", &mut buf, 5);
        assert_eq!(n, 5 + TAG);
        let mut copy = buf;
        assert_eq!(key.open(9, b"", &mut copy[..n]), Some(5));
        assert_eq!(&copy[..5], b"hello");
        let mut wrong_counter = buf;
        assert_eq!(key.open(10, b"", &mut wrong_counter[..n]), None);
        buf[2] ^= 1;
        assert_eq!(key.open(9, b"", &mut buf[..n]), None);
    }

    #[test]
    fn a_cookie_opens_only_with_its_key_nonce_and_mac() {
        let sealed = xseal_cookie(&[2; 32], &[3; 24], &[4; 16], b"mac1");
        assert_eq!(
            xopen_cookie(&[2; 32], &[3; 24], &sealed, b"mac1"),
            Some([4; 16])
        );
        assert_eq!(xopen_cookie(&[2; 32], &[3; 24], &sealed, b"mac2"), None);
        assert_eq!(xopen_cookie(&[2; 32], &[9; 24], &sealed, b"mac1"), None);
    }

    #[test]
    fn a_low_order_point_gives_no_shared_secret() {
        let mut rng = plexsphere_test_support::seeded::SeededRng::new(1);
        let (secret, public) = ephemeral(&mut rng).expect("random");
        assert!(dh(&secret, &[0; 32]).is_none());
        let (other, _) = ephemeral(&mut rng).expect("random");
        assert_eq!(
            dh(&secret, &PublicKey::from(&other).to_bytes()),
            dh(&other, &public)
        );
    }

    /// A random source that fails, as the OS's may: no key at all, never a weak one.
    #[test]
    fn a_failing_random_source_gives_no_ephemeral_key() {
        let mut rng = plexsphere_test_support::seeded::Failing;
        assert!(ephemeral(&mut rng).is_none());
        assert!(random::<2>(&mut rng).is_none());
    }

    #[test]
    fn tai64n_grows_with_the_clock_and_hides_the_low_nanoseconds() {
        let t = UNIX_EPOCH + std::time::Duration::new(1_000, 123_456_789);
        let a = tai64n(t);
        assert_eq!(&a[..8], &(1_000u64 + (1 << 62)).to_be_bytes());
        assert_eq!(
            u32::from_be_bytes([a[8], a[9], a[10], a[11]]) % (1 << 24),
            0
        );
        assert!(tai64n(t + std::time::Duration::from_secs(1)) > a);
    }
}
