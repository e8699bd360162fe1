//! Disco: the authenticated path probes two nodes send each other on their WireGuard sockets,
//! directly or through a relay.
//!
//! ```text
//! "pxd\x02" | sender public key (32) | nonce (12) | ChaCha20-Poly1305(message) with tag (16)
//! message = type (1) | stamp (8) | fields
//!   1 ping          tx id (12)
//!   2 pong          tx id (12) | the address the ping came from (family, address, port)
//!   3 call-me-maybe count (1) | addresses (family, address, port) x count
//! ```
//!
//! The key is the HKDF of the X25519 shared secret of the two nodes' WireGuard keys, under a
//! label of its own (per version), so it is never a WireGuard key. Only a holder of one of the
//! two private keys can seal or open a message; the sender key in clear text only says which
//! pair key to try. A pong answers a ping only when it carries the tx id the pinger chose at
//! random, so a replayed pong proves nothing.
//!
//! The **stamp** (big endian) is the sender's clock in microseconds since the Unix epoch, made
//! strictly increasing by its sender ([`next_stamp`]): every message a node seals has a stamp
//! greater than the one before, across restarts too (as long as its clock does not step back
//! past the last stamp; WireGuard's handshake timestamps have the same rule). A receiver
//! accepts each stamp of a sender key once, within a small window (the agent's
//! `reach::engine::guard`), so a captured ping replayed costs nothing but its opening.
//!
//! Version 1 (`pxd\x01`, no stamp) is refused with [`DecodeError::Version`]: its pings could
//! be replayed without limit. A version-1 node classifies version-2 datagrams as unknown and
//! drops them; the pair keeps its relay path until both run version 2.

use std::net::SocketAddr;

use rand_core::{CryptoRng, RngCore};
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

use super::{DISCO_MAGIC, DISCO_VERSION, DecodeError, MAX_DATAGRAM, Reader, put_addr};
use crate::key::PublicKey;

/// The most addresses a call-me-maybe carries (more are cut off when sealing).
pub const MAX_CALL_ME_MAYBE: usize = 16;
/// Bytes before the sealed message: magic, sender key, nonce.
pub const HEADER: usize = 4 + 32 + NONCE;
const TAG: usize = 16;
/// Bytes of a disco nonce (ChaCha20-Poly1305's), after the sender key in the header.
pub const NONCE: usize = 12;
/// Bytes of the sealed message before its fields: type, stamp.
const MESSAGE_HEAD: usize = 1 + 8;

pub type TxId = [u8; 12];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// "Are you there on this path?"
    Ping { tx: TxId },
    /// "Yes, and your ping came from `observed`."
    Pong { tx: TxId, observed: SocketAddr },
    /// "Probe me now at these addresses" (sent through a relay, so both sides punch at once).
    CallMeMaybe { addrs: Vec<SocketAddr> },
}

/// An opened message with the stamp its sender gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    pub stamp: u64,
    pub message: Message,
}

/// The stamp of the next message a sender seals: its clock in microseconds since the Unix
/// epoch (`wall_micros`), or one more than the `last` stamp when the clock did not move on.
pub fn next_stamp(last: u64, wall_micros: u64) -> u64 {
    wall_micros.max(last.saturating_add(1))
}

/// The key one pair of nodes seals its disco messages with.
pub struct PairKey {
    key: LessSafeKey,
}

impl PairKey {
    /// From the X25519 shared secret of the pair ([`super::shared_secret`]).
    pub fn new(shared: &[u8; 32]) -> Self {
        let bytes = super::derive(shared, b"plexd disco v2", b"pair key");
        // A 32-byte key is always a valid ChaCha20-Poly1305 key.
        let unbound = match UnboundKey::new(&CHACHA20_POLY1305, &bytes) {
            Ok(k) => k,
            Err(_) => unreachable!("a 32-byte key is a ChaCha20-Poly1305 key"),
        };
        Self {
            key: LessSafeKey::new(unbound),
        }
    }

    /// Seals `message` from `sender` (our public key) with `stamp` ([`next_stamp`]) into a
    /// datagram, under a nonce from the system's random source.
    pub fn seal(&self, sender: &PublicKey, stamp: u64, message: &Message) -> Vec<u8> {
        let mut nonce = [0u8; NONCE];
        // The system's random source does not fail on Linux; a zero nonce would still be
        // unique per message only by chance, so a failure is treated as fatal for this one.
        if SystemRandom::new().fill(&mut nonce).is_err() {
            return Vec::new();
        }
        self.seal_with_nonce(sender, stamp, message, nonce)
    }

    /// [`Self::seal`] under a nonce the caller drew ([`new_nonce_from`]). Both nodes of a pair
    /// seal under the same pair key, so a nonce must never repeat under it: draw it from a
    /// cryptographically secure generator, never from a counter or a fixed seed outside tests.
    pub fn seal_with_nonce(
        &self,
        sender: &PublicKey,
        stamp: u64,
        message: &Message,
        nonce: [u8; NONCE],
    ) -> Vec<u8> {
        let mut plain = Vec::with_capacity(64);
        let kind = match message {
            Message::Ping { .. } => 1,
            Message::Pong { .. } => 2,
            Message::CallMeMaybe { .. } => 3,
        };
        plain.push(kind);
        plain.extend_from_slice(&stamp.to_be_bytes());
        match message {
            Message::Ping { tx } => plain.extend_from_slice(tx),
            Message::Pong { tx, observed } => {
                plain.extend_from_slice(tx);
                put_addr(&mut plain, *observed);
            }
            Message::CallMeMaybe { addrs } => {
                let addrs = &addrs[..addrs.len().min(MAX_CALL_ME_MAYBE)];
                plain.push(addrs.len() as u8);
                for a in addrs {
                    put_addr(&mut plain, *a);
                }
            }
        }
        let mut out = Vec::with_capacity(HEADER + plain.len() + TAG);
        out.extend_from_slice(&DISCO_MAGIC);
        out.extend_from_slice(&sender.0);
        out.extend_from_slice(&nonce);
        let nonce = Nonce::assume_unique_for_key(nonce);
        if self
            .key
            .seal_in_place_append_tag(nonce, Aad::from(&out[..HEADER]), &mut plain)
            .is_err()
        {
            return Vec::new();
        }
        out.extend_from_slice(&plain);
        out
    }

    /// Opens a datagram sealed with this pair key ([`sender`] tells which key to use).
    pub fn open(&self, datagram: &[u8]) -> Result<Opened, DecodeError> {
        if datagram.len() > MAX_DATAGRAM {
            return Err(DecodeError::Long(datagram.len()));
        }
        check_magic(datagram)?;
        if datagram.len() < HEADER + TAG + MESSAGE_HEAD {
            return Err(DecodeError::Short(datagram.len()));
        }
        let (header, sealed) = datagram.split_at(HEADER);
        let mut nonce = [0u8; 12];
        nonce.copy_from_slice(&header[36..48]);
        let mut buf = sealed.to_vec();
        let plain = self
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(header),
                &mut buf,
            )
            .map_err(|_| DecodeError::Unauthentic)?;
        decode(plain)
    }
}

/// The sender's public key of a disco datagram, read before anything is authenticated: it only
/// selects the pair key to try. Another version of disco is [`DecodeError::Version`].
pub fn sender(datagram: &[u8]) -> Result<PublicKey, DecodeError> {
    check_magic(datagram)?;
    let mut r = Reader::new(&datagram[4..]);
    r.array::<32>().map(PublicKey)
}

/// `pxd` and our version; `pxd` with another version byte is refused as that version.
fn check_magic(datagram: &[u8]) -> Result<(), DecodeError> {
    let Some(magic) = datagram.get(..4) else {
        return Err(DecodeError::Short(datagram.len()));
    };
    if magic[..3] != DISCO_MAGIC[..3] {
        return Err(DecodeError::Magic);
    }
    if magic[3] != DISCO_VERSION {
        return Err(DecodeError::Version(magic[3]));
    }
    Ok(())
}

fn decode(plain: &[u8]) -> Result<Opened, DecodeError> {
    let mut r = Reader::new(plain);
    let kind = r.u8()?;
    let stamp = u64::from_be_bytes(r.array()?);
    let message = match kind {
        1 => Message::Ping { tx: r.array()? },
        2 => Message::Pong {
            tx: r.array()?,
            observed: r.addr()?,
        },
        3 => {
            let n = usize::from(r.u8()?);
            if n > MAX_CALL_ME_MAYBE {
                return Err(DecodeError::Field("call-me-maybe address count"));
            }
            let mut addrs = Vec::with_capacity(n);
            for _ in 0..n {
                addrs.push(r.addr()?);
            }
            Message::CallMeMaybe { addrs }
        }
        t => return Err(DecodeError::Type(t)),
    };
    if !r.is_empty() {
        return Err(DecodeError::Field("trailing bytes"));
    }
    Ok(Opened { stamp, message })
}

/// A fresh random tx id.
pub fn new_tx() -> TxId {
    let mut tx = [0u8; 12];
    let _ = SystemRandom::new().fill(&mut tx);
    tx
}

/// A fresh tx id from `rng` (a sans-IO caller's random source).
pub fn new_tx_from<R: RngCore + CryptoRng + ?Sized>(rng: &mut R) -> TxId {
    let mut tx = [0u8; 12];
    rng.fill_bytes(&mut tx);
    tx
}

/// A fresh nonce for [`PairKey::seal_with_nonce`] from `rng`.
pub fn new_nonce_from<R: RngCore + CryptoRng + ?Sized>(rng: &mut R) -> [u8; NONCE] {
    let mut nonce = [0u8; NONCE];
    rng.fill_bytes(&mut nonce);
    nonce
}
