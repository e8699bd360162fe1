//! Reach: what shares plexd's WireGuard UDP socket besides WireGuard, and the relay's frames.
//!
//! One socket carries four kinds of datagram, told apart by their first bytes ([`classify`]):
//!
//! | kind | first bytes |
//! |---|---|
//! | WireGuard | type 1..=4, then three zero bytes |
//! | STUN (RFC 8489) | two zero top bits, and the magic cookie `0x2112A442` at bytes 4..8 |
//! | disco ([`disco`]) | `pxd` and a version byte (`\x02` now; other versions are refused) |
//! | relay ([`relay`]) | `pxr\x01` (over UDP; over TCP the frames are length-prefixed) |
//!
//! Disco messages are the authenticated path probes between two nodes (sealed with a key both
//! derive from their WireGuard keys); relay frames are what a node and a `plexsphere relay`
//! exchange. Neither carries anything but ciphertext and addresses. Everything here is
//! sans-IO: the codecs take and give bytes, so the agent, the relay and fuzzers share them.

pub mod disco;
pub mod relay;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::key::PublicKey;

/// The magic cookie of every STUN message (RFC 8489 §5).
pub const STUN_COOKIE: [u8; 4] = [0x21, 0x12, 0xA4, 0x42];
/// The disco version this node speaks ([`disco`] says what changed).
pub const DISCO_VERSION: u8 = 2;
/// The first bytes of a disco message: `pxd` and the version.
pub const DISCO_MAGIC: [u8; 4] = *b"pxd\x02";
/// The first bytes of a relay frame sent over UDP.
pub const RELAY_MAGIC: [u8; 4] = *b"pxr\x01";

/// The largest datagram any reach codec accepts or produces, in bytes: a WireGuard message for
/// a 1420-byte tunnel MTU is 1452 bytes; 65535 bounds what a UDP datagram can be at all.
pub const MAX_DATAGRAM: usize = 65535;

/// What a datagram on the WireGuard socket is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    WireGuard,
    Stun,
    Disco,
    Relay,
    /// Anything else: dropped and counted.
    Unknown,
}

/// Tells the kinds apart by their first bytes; never looks further than byte 8.
pub fn classify(datagram: &[u8]) -> Kind {
    if datagram.len() >= 4 && (1..=4).contains(&datagram[0]) && datagram[1..4] == [0, 0, 0] {
        return Kind::WireGuard;
    }
    // Every version of disco is disco, so an old peer's message is refused by name
    // (`DecodeError::Version`) rather than dropped as unknown.
    if datagram.len() >= 4 && datagram[..3] == DISCO_MAGIC[..3] && datagram[3] != 0 {
        return Kind::Disco;
    }
    if datagram.len() >= 4 && datagram[..4] == RELAY_MAGIC {
        return Kind::Relay;
    }
    if datagram.len() >= 20 && datagram[0] & 0xC0 == 0 && datagram[4..8] == STUN_COOKIE {
        return Kind::Stun;
    }
    Kind::Unknown
}

/// Why a reach message could not be read. Every variant is a dropped datagram (or, on TCP, a
/// closed connection), never a panic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("the message is too short ({0} bytes)")]
    Short(usize),
    #[error("the message is too long ({0} bytes; at most {MAX_DATAGRAM})")]
    Long(usize),
    #[error("the message does not start with the expected magic bytes")]
    Magic,
    #[error("unknown message type {0}")]
    Type(u8),
    #[error("a field is malformed: {0}")]
    Field(&'static str),
    #[error("the message does not authenticate (wrong key, or altered on the way)")]
    Unauthentic,
    #[error(
        "disco version {0} is not spoken here (this node speaks version {DISCO_VERSION}); upgrade the sender's plexd"
    )]
    Version(u8),
}

/// Reads fields front to back; every read is bounds-checked.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() < n {
            return Err(DecodeError::Short(self.buf.len()));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub(crate) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// An address as [`put_addr`] writes it: family 4 or 6, the address, the port.
    pub(crate) fn addr(&mut self) -> Result<SocketAddr, DecodeError> {
        let ip = match self.u8()? {
            4 => IpAddr::V4(Ipv4Addr::from(self.array::<4>()?)),
            6 => IpAddr::V6(Ipv6Addr::from(self.array::<16>()?)),
            _ => return Err(DecodeError::Field("address family")),
        };
        Ok(SocketAddr::new(ip, self.u16()?))
    }
}

pub(crate) fn put_addr(out: &mut Vec<u8>, addr: SocketAddr) {
    match addr.ip() {
        IpAddr::V4(v4) => {
            out.push(4);
            out.extend_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            out.push(6);
            out.extend_from_slice(&v6.octets());
        }
    }
    out.extend_from_slice(&addr.port().to_be_bytes());
}

/// The X25519 shared secret of two WireGuard-style keys (32 bytes each). Both sides of a pair
/// compute the same value; it is only ever used through a key derivation ([`disco::PairKey`],
/// [`relay::proof`]), never directly.
pub fn shared_secret(own_secret: &[u8; 32], peer_public: &PublicKey) -> [u8; 32] {
    let own = x25519_dalek::StaticSecret::from(*own_secret);
    let peer = x25519_dalek::PublicKey::from(peer_public.0);
    own.diffie_hellman(&peer).to_bytes()
}

/// The X25519 public key of a secret key.
pub fn public_key(secret: &[u8; 32]) -> PublicKey {
    PublicKey(x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from(*secret)).to_bytes())
}

/// HKDF-SHA256 of `secret` with a label: the one key derivation of the reach protocols.
pub(crate) fn derive(secret: &[u8; 32], label: &[u8], context: &[u8]) -> [u8; 32] {
    use ring::hkdf;
    struct Len32;
    impl hkdf::KeyType for Len32 {
        fn len(&self) -> usize {
            32
        }
    }
    let salt = hkdf::Salt::new(hkdf::HKDF_SHA256, label);
    let prk = salt.extract(secret);
    let info = [context];
    let mut out = [0u8; 32];
    // Both calls fail only for an output longer than 255 x 32 bytes; 32 is never that.
    if let Ok(okm) = prk.expand(&info, Len32) {
        let _ = okm.fill(&mut out);
    }
    out
}

#[cfg(test)]
mod tests;
