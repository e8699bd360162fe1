//! Disco: the authenticated path probes two nodes send each other on their WireGuard sockets,
//! directly or through a relay.
//!
//! ```text
//! "pxd\x01" | sender public key (32) | nonce (12) | ChaCha20-Poly1305(message) with tag (16)
//! message = type (1) | fields
//!   1 ping          tx id (12)
//!   2 pong          tx id (12) | the address the ping came from (family, address, port)
//!   3 call-me-maybe count (1) | addresses (family, address, port) x count
//! ```
//!
//! The key is the HKDF of the X25519 shared secret of the two nodes' WireGuard keys, under a
//! label of its own, so it is never a WireGuard key. Only a holder of one of the two private
//! keys can seal or open a message; the sender key in clear text only says which pair key to
//! try. A pong answers a ping only when it carries the tx id the pinger chose at random, so a
//! replayed pong proves nothing; a replayed ping costs one pong to where it came from.

use std::net::SocketAddr;

use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

use super::{DISCO_MAGIC, DecodeError, MAX_DATAGRAM, Reader, put_addr};

/// The most addresses a call-me-maybe carries (more are cut off when sealing).
pub const MAX_CALL_ME_MAYBE: usize = 16;
/// Bytes before the sealed message: magic, sender key, nonce.
pub const HEADER: usize = 4 + 32 + 12;
const TAG: usize = 16;

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

/// The key one pair of nodes seals its disco messages with.
pub struct PairKey {
    key: LessSafeKey,
}

impl PairKey {
    /// From the X25519 shared secret of the pair ([`super::shared_secret`]).
    pub fn new(shared: &[u8; 32]) -> Self {
        let bytes = super::derive(shared, b"plexd disco v1", b"pair key");
        // A 32-byte key is always a valid ChaCha20-Poly1305 key.
        let unbound = match UnboundKey::new(&CHACHA20_POLY1305, &bytes) {
            Ok(k) => k,
            Err(_) => unreachable!("a 32-byte key is a ChaCha20-Poly1305 key"),
        };
        Self {
            key: LessSafeKey::new(unbound),
        }
    }

    /// Seals `message` from `sender` (our public key) into a datagram.
    pub fn seal(&self, sender: &[u8; 32], message: &Message) -> Vec<u8> {
        let mut plain = Vec::with_capacity(64);
        match message {
            Message::Ping { tx } => {
                plain.push(1);
                plain.extend_from_slice(tx);
            }
            Message::Pong { tx, observed } => {
                plain.push(2);
                plain.extend_from_slice(tx);
                put_addr(&mut plain, *observed);
            }
            Message::CallMeMaybe { addrs } => {
                plain.push(3);
                let addrs = &addrs[..addrs.len().min(MAX_CALL_ME_MAYBE)];
                plain.push(addrs.len() as u8);
                for a in addrs {
                    put_addr(&mut plain, *a);
                }
            }
        }
        let mut nonce = [0u8; 12];
        // The system's random source does not fail on Linux; a zero nonce would still be
        // unique per message only by chance, so a failure is treated as fatal for this one.
        if SystemRandom::new().fill(&mut nonce).is_err() {
            return Vec::new();
        }
        let mut out = Vec::with_capacity(HEADER + plain.len() + TAG);
        out.extend_from_slice(&DISCO_MAGIC);
        out.extend_from_slice(sender);
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
    pub fn open(&self, datagram: &[u8]) -> Result<Message, DecodeError> {
        if datagram.len() > MAX_DATAGRAM {
            return Err(DecodeError::Long(datagram.len()));
        }
        if datagram.len() < HEADER + TAG + 1 {
            return Err(DecodeError::Short(datagram.len()));
        }
        if datagram[..4] != DISCO_MAGIC {
            return Err(DecodeError::Magic);
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
/// selects the pair key to try.
pub fn sender(datagram: &[u8]) -> Result<[u8; 32], DecodeError> {
    let mut r = Reader::new(datagram);
    if r.take(4)? != DISCO_MAGIC {
        return Err(DecodeError::Magic);
    }
    r.array::<32>()
}

fn decode(plain: &[u8]) -> Result<Message, DecodeError> {
    let mut r = Reader::new(plain);
    let message = match r.u8()? {
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
    Ok(message)
}

/// A fresh random tx id.
pub fn new_tx() -> TxId {
    let mut tx = [0u8; 12];
    let _ = SystemRandom::new().fill(&mut tx);
    tx
}
