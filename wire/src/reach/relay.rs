//! The relay protocol: a node registers its WireGuard public key with a `plexsphere relay`, then
//! sends WireGuard datagrams (and disco messages) to other registered keys through it.
//!
//! Over UDP every frame starts with [`RELAY_MAGIC`](super::RELAY_MAGIC); over TCP (with TLS) each
//! frame is preceded by its length as a big-endian u16 and has no magic. The frames:
//!
//! ```text
//! type (1) | fields
//!   1 hello       node key (32)                                  node -> relay
//!   2 challenge   cookie (32)                                    relay -> node
//!   3 register    node key (32) | cookie (32) | proof (32) | token (rest, JSON)
//!   4 registered  lease seconds (u16)                            relay -> node
//!   5 send        destination key prefix (8) | datagram (rest)  node -> relay
//!   6 recv        source key prefix (8) | datagram (rest)       relay -> node
//!   7 refused     code (1) | reason (rest, UTF-8)                relay -> node
//!   8 peer gone   destination key prefix (8)                    relay -> node
//!   9 ping        nonce (8)                                      either way
//!  10 pong        nonce (8)                                      either way
//!  11 sealed      counter (u64) | frame (4, 7, 8 or 10) | tag (16) relay -> node
//! ```
//!
//! `sealed` ([`FrameKey`]) is how a relay answers a node that registered with the sealed proof
//! ([`sealed_proof`]): `registered`, `refused`, `peer gone` and `pong` go inside it,
//! authenticated with a MAC under a key derived from the registration's X25519 shared secret,
//! with a counter that only grows for the relay's life (and across restarts: it starts at the
//! relay's Unix time in microseconds). A node acts on these four only when sealed and newer
//! than the last it accepted; an unsealed `refused` is a hint to say `hello` again, nothing
//! more. A spoofer who can send from the relay's address cannot forge them, and a replayed one
//! carries an old counter. `challenge` cannot be sealed (it comes before the proof) and needs
//! not be: a forged cookie only makes the relay refuse the `register`. `recv` is not sealed: its
//! datagram is WireGuard or disco, each authenticated end to end (WireGuard keeps its own
//! replay window), and 24 more bytes on every data frame would push a 1452-byte WireGuard
//! datagram past a 1500-byte underlay; a forged `recv` is dropped by the peer's WireGuard.
//!
//! Data frames name a node by the first 8 bytes of its key ([`KeyPrefix`]), so that a relayed
//! WireGuard datagram of a 1420-byte tunnel MTU (1452 bytes) plus the 13-byte UDP frame head
//! fits a 1500-byte IPv4 underlay (1493 bytes) without fragmentation. A relay refuses nothing
//! for a prefix collision: finding a key with another key's 64-bit prefix takes about 2^64
//! tries, and the key must also carry a Domain-signed token.
//!
//! Registration is three messages so that the relay keeps no state for a stranger: the cookie
//! is a MAC (under the relay's secret) of the sender's address, key and a 30-second epoch. The
//! proof shows the node holds the private key of the key it registers ([`proof`], from the
//! X25519 shared secret of the node key and the relay key), and the token (a [`RelayToken`]
//! signed by the Domain) shows the Domain admitted that key until a time. The relay needs no
//! database: the Domain's public key, its own key pair and a clock.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{DecodeError, MAX_DATAGRAM, RELAY_MAGIC, Reader};
use crate::key::PublicKey;

mod seal;
pub use seal::{FrameKey, SEALED_TAG, sealed_proof, sealed_proof_matches};

impl FrameKey {
    /// `frame` sealed with `counter`.
    pub fn seal(&self, counter: u64, frame: &Frame) -> Frame {
        let body = frame.encode();
        let tag = self.tag(counter, &body);
        Frame::Sealed { counter, body, tag }
    }

    /// The counter and the inner frame of a sealed frame whose tag checks out. Only
    /// `registered`, `refused`, `peer gone` and `pong` may be inside.
    pub fn open(
        &self,
        counter: u64,
        body: &[u8],
        tag: &[u8; SEALED_TAG],
    ) -> Result<Frame, DecodeError> {
        if !self.checks(counter, body, tag) {
            return Err(DecodeError::Unauthentic);
        }
        match Frame::decode(body)? {
            f @ (Frame::Registered { .. }
            | Frame::Refused { .. }
            | Frame::PeerGone { .. }
            | Frame::Pong { .. }) => Ok(f),
            _ => Err(DecodeError::Field(
                "a sealed frame holds registered, refused, peer gone or pong",
            )),
        }
    }
}

/// The largest WireGuard datagram a `send` or `recv` carries.
pub const MAX_PAYLOAD: usize = MAX_DATAGRAM - 64;
/// The largest token a `register` carries, in bytes.
pub const MAX_TOKEN: usize = 4096;
/// The largest reason a `refused` carries, in bytes.
pub const MAX_REASON: usize = 512;

/// What data frames name a node by: the first 8 bytes of its key.
pub type KeyPrefix = [u8; 8];
/// The bytes before the datagram in a UDP `send` or `recv`: magic, type, key prefix.
pub const UDP_DATA_HEAD: usize = 4 + 1 + 8;

/// The type byte of a `send` frame.
pub const SEND: u8 = 5;
/// The type byte of a `recv` frame.
pub const RECV: u8 = 6;

/// Writes the head of a UDP `send` to `dst` (magic, type, key prefix) into `out`: the
/// allocation-free form of [`Frame::Send`]'s [`Frame::to_datagram`] for a caller that leaves
/// [`UDP_DATA_HEAD`] bytes free in front of the datagram it relays.
pub fn write_send_head(out: &mut [u8; UDP_DATA_HEAD], dst: &KeyPrefix) {
    out[..4].copy_from_slice(&RELAY_MAGIC);
    out[4] = SEND;
    out[5..].copy_from_slice(dst);
}

/// The source prefix and the datagram of a UDP `recv`, borrowed from `datagram` (the
/// allocation-free form of [`Frame::from_datagram`] for a `recv`); None for anything else, and
/// for a payload longer than [`MAX_PAYLOAD`] (which [`Frame::decode`] refuses too).
pub fn parse_recv(datagram: &[u8]) -> Option<(KeyPrefix, &[u8])> {
    if datagram.len() < UDP_DATA_HEAD
        || datagram[..4] != RELAY_MAGIC
        || datagram[4] != RECV
        || datagram.len() - UDP_DATA_HEAD > MAX_PAYLOAD
    {
        return None;
    }
    let mut src = [0u8; 8];
    src.copy_from_slice(&datagram[5..UDP_DATA_HEAD]);
    Some((src, &datagram[UDP_DATA_HEAD..]))
}

/// The bytes a TCP stream `send` or `recv` puts before the datagram: length (big-endian u16),
/// type, key prefix (a stream frame carries no magic).
pub const STREAM_DATA_HEAD: usize = 2 + 1 + 8;

/// The longest frame (after its length prefix) a relay takes on a TCP stream; a longer one
/// closes the connection.
pub const MAX_STREAM_FRAME: usize = 8192;
/// The longest datagram a stream `send` carries: [`MAX_STREAM_FRAME`] less type and prefix.
pub const MAX_STREAM_PAYLOAD: usize = MAX_STREAM_FRAME - (STREAM_DATA_HEAD - 2);

/// Appends a stream `send` of `payload` to `dst` (length, type, prefix, payload) to `out`: the
/// allocation-free form of [`Frame::Send`]'s [`Frame::to_stream`]. False (nothing appended)
/// for a payload longer than [`MAX_STREAM_PAYLOAD`], which would close the relay connection.
pub fn write_stream_send(out: &mut Vec<u8>, dst: &KeyPrefix, payload: &[u8]) -> bool {
    if payload.len() > MAX_STREAM_PAYLOAD {
        return false;
    }
    // 1 + 8 + MAX_STREAM_PAYLOAD is below u16::MAX.
    let len = (1 + dst.len() + payload.len()) as u16;
    out.extend_from_slice(&len.to_be_bytes());
    out.push(SEND);
    out.extend_from_slice(dst);
    out.extend_from_slice(payload);
    true
}

/// The source prefix and the datagram of a stream `recv` (`body`: the frame after its length
/// prefix), borrowed; None for any other frame and for a payload longer than [`MAX_PAYLOAD`]
/// (which [`Frame::decode`] refuses too).
pub fn parse_stream_recv(body: &[u8]) -> Option<(KeyPrefix, &[u8])> {
    const HEAD: usize = STREAM_DATA_HEAD - 2;
    if body.len() < HEAD || body[0] != RECV || body.len() - HEAD > MAX_PAYLOAD {
        return None;
    }
    let mut src = [0u8; 8];
    src.copy_from_slice(&body[1..HEAD]);
    Some((src, &body[HEAD..]))
}

/// A key's [`KeyPrefix`].
pub fn prefix(key: &PublicKey) -> KeyPrefix {
    let mut p = [0u8; 8];
    p.copy_from_slice(&key.0[..8]);
    p
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Hello {
        node: PublicKey,
    },
    Challenge {
        cookie: [u8; 32],
    },
    Register {
        node: PublicKey,
        cookie: [u8; 32],
        proof: [u8; 32],
        token: Vec<u8>,
    },
    Registered {
        lease_secs: u16,
    },
    Send {
        dst: KeyPrefix,
        payload: Vec<u8>,
    },
    Recv {
        src: KeyPrefix,
        payload: Vec<u8>,
    },
    Refused {
        code: RefuseCode,
        reason: String,
    },
    PeerGone {
        dst: KeyPrefix,
    },
    Ping {
        nonce: [u8; 8],
    },
    Pong {
        nonce: [u8; 8],
    },
    /// One of `registered`, `refused`, `peer gone`, `pong`, authenticated ([`FrameKey`]).
    Sealed {
        counter: u64,
        /// The inner frame's bytes.
        body: Vec<u8>,
        tag: [u8; SEALED_TAG],
    },
}

/// Why a relay refused a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefuseCode {
    /// The token's signature, Domain or key does not check out.
    BadToken,
    /// The token has expired: pull a fresh state.
    Expired,
    /// The proof or the cookie is wrong (or the cookie is older than a minute).
    BadProof,
    /// A `send` from an address or connection that is not registered.
    NotRegistered,
    /// The relay is at its limit of registered nodes or of frames per second for this node.
    Busy,
    Other(u8),
}

impl RefuseCode {
    fn to_u8(self) -> u8 {
        match self {
            RefuseCode::BadToken => 1,
            RefuseCode::Expired => 2,
            RefuseCode::BadProof => 3,
            RefuseCode::NotRegistered => 4,
            RefuseCode::Busy => 5,
            RefuseCode::Other(c) => c,
        }
    }

    fn from_u8(c: u8) -> Self {
        match c {
            1 => RefuseCode::BadToken,
            2 => RefuseCode::Expired,
            3 => RefuseCode::BadProof,
            4 => RefuseCode::NotRegistered,
            5 => RefuseCode::Busy,
            c => RefuseCode::Other(c),
        }
    }
}

impl Frame {
    /// The frame's bytes without magic or length prefix.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        self.encode_into(&mut out);
        out
    }

    /// Appends the frame's bytes to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        match self {
            Frame::Hello { node } => {
                out.push(1);
                out.extend_from_slice(&node.0);
            }
            Frame::Challenge { cookie } => {
                out.push(2);
                out.extend_from_slice(cookie);
            }
            Frame::Register {
                node,
                cookie,
                proof,
                token,
            } => {
                out.push(3);
                out.extend_from_slice(&node.0);
                out.extend_from_slice(cookie);
                out.extend_from_slice(proof);
                out.extend_from_slice(&token[..token.len().min(MAX_TOKEN)]);
            }
            Frame::Registered { lease_secs } => {
                out.push(4);
                out.extend_from_slice(&lease_secs.to_be_bytes());
            }
            Frame::Send { dst, payload } => {
                out.push(SEND);
                out.extend_from_slice(dst);
                out.extend_from_slice(payload);
            }
            Frame::Recv { src, payload } => {
                out.push(RECV);
                out.extend_from_slice(src);
                out.extend_from_slice(payload);
            }
            Frame::Refused { code, reason } => {
                out.push(7);
                out.push(code.to_u8());
                let mut end = reason.len().min(MAX_REASON);
                while !reason.is_char_boundary(end) {
                    end -= 1;
                }
                out.extend_from_slice(&reason.as_bytes()[..end]);
            }
            Frame::PeerGone { dst } => {
                out.push(8);
                out.extend_from_slice(dst);
            }
            Frame::Ping { nonce } => {
                out.push(9);
                out.extend_from_slice(nonce);
            }
            Frame::Pong { nonce } => {
                out.push(10);
                out.extend_from_slice(nonce);
            }
            Frame::Sealed { counter, body, tag } => {
                out.push(11);
                out.extend_from_slice(&counter.to_be_bytes());
                out.extend_from_slice(body);
                out.extend_from_slice(tag);
            }
        }
    }

    /// Reads one frame (without magic or length prefix).
    pub fn decode(bytes: &[u8]) -> Result<Frame, DecodeError> {
        if bytes.len() > MAX_DATAGRAM {
            return Err(DecodeError::Long(bytes.len()));
        }
        let mut r = Reader::new(bytes);
        let frame = match r.u8()? {
            1 => Frame::Hello {
                node: PublicKey(r.array()?),
            },
            2 => Frame::Challenge { cookie: r.array()? },
            3 => {
                let (node, cookie, proof) = (r.array()?, r.array()?, r.array()?);
                let token = r.rest();
                if token.len() > MAX_TOKEN {
                    return Err(DecodeError::Field("token longer than 4096 bytes"));
                }
                Frame::Register {
                    node: PublicKey(node),
                    cookie,
                    proof,
                    token: token.to_vec(),
                }
            }
            4 => Frame::Registered {
                lease_secs: r.u16()?,
            },
            SEND => Frame::Send {
                dst: r.array()?,
                payload: payload(r.rest())?,
            },
            RECV => Frame::Recv {
                src: r.array()?,
                payload: payload(r.rest())?,
            },
            7 => {
                let code = RefuseCode::from_u8(r.u8()?);
                let rest = r.rest();
                let rest = &rest[..rest.len().min(MAX_REASON)];
                Frame::Refused {
                    code,
                    reason: bounded_reason(rest),
                }
            }
            8 => Frame::PeerGone { dst: r.array()? },
            9 => Frame::Ping { nonce: r.array()? },
            10 => Frame::Pong { nonce: r.array()? },
            11 => {
                let counter = u64::from_be_bytes(r.array()?);
                let rest = r.rest();
                // The inner frame and the tag; a sealed frame is small (a `refused` at most).
                if rest.len() <= SEALED_TAG || rest.len() > SEALED_TAG + 2 + MAX_REASON {
                    return Err(DecodeError::Field("sealed frame length"));
                }
                let (body, tag) = rest.split_at(rest.len() - SEALED_TAG);
                let mut t = [0u8; SEALED_TAG];
                t.copy_from_slice(tag);
                Frame::Sealed {
                    counter,
                    body: body.to_vec(),
                    tag: t,
                }
            }
            t => return Err(DecodeError::Type(t)),
        };
        if !r.is_empty() {
            return Err(DecodeError::Field("trailing bytes"));
        }
        Ok(frame)
    }

    /// The frame as one UDP datagram: magic, then the frame.
    pub fn to_datagram(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(&RELAY_MAGIC);
        self.encode_into(&mut out);
        out
    }

    /// A UDP datagram's frame (checks the magic).
    pub fn from_datagram(datagram: &[u8]) -> Result<Frame, DecodeError> {
        match datagram.get(..4) {
            Some(m) if m == RELAY_MAGIC => Frame::decode(&datagram[4..]),
            Some(_) => Err(DecodeError::Magic),
            None => Err(DecodeError::Short(datagram.len())),
        }
    }

    /// The frame for a TCP stream: its length (big-endian u16), then the frame.
    pub fn to_stream(&self) -> Vec<u8> {
        let mut out = vec![0, 0];
        self.encode_into(&mut out);
        let len = (out.len() - 2).min(usize::from(u16::MAX)) as u16;
        out[..2].copy_from_slice(&len.to_be_bytes());
        out
    }
}

fn payload(bytes: &[u8]) -> Result<Vec<u8>, DecodeError> {
    if bytes.len() > MAX_PAYLOAD {
        return Err(DecodeError::Long(bytes.len()));
    }
    Ok(bytes.to_vec())
}

/// A refusal's reason as text of at most [`MAX_REASON`] bytes. Invalid UTF-8 becomes U+FFFD,
/// three bytes for one, so the text is cut again after the conversion (at a character
/// boundary): a decoded reason then encodes to the same bytes and decodes to itself.
fn bounded_reason(bytes: &[u8]) -> String {
    let mut text = String::from_utf8_lossy(bytes).into_owned();
    let mut end = text.len().min(MAX_REASON);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text
}

/// The proof a node sends in `register`: shows it holds the private key of `node`. Both the
/// node (with its private key and the relay's public key) and the relay (with its private key
/// and the node's public key) compute the same shared secret; see [`super::shared_secret`].
pub fn proof(shared: &[u8; 32], cookie: &[u8; 32], node: &PublicKey) -> [u8; 32] {
    seal::labelled_proof(shared, cookie, node, b"register proof")
}

/// Whether `proof` is right, in constant time.
pub fn proof_matches(
    shared: &[u8; 32],
    cookie: &[u8; 32],
    node: &PublicKey,
    given: &[u8; 32],
) -> bool {
    seal::same(&proof(shared, cookie, node), given)
}

/// What a relay accepts from a node: signed by the Domain (context `RelayToken`), carried in
/// the node's signed state as an envelope, sent as JSON in `register`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayToken {
    pub domain_id: Uuid,
    pub node_id: Uuid,
    /// The node's WireGuard public key, standard base64.
    pub public_key: String,
    /// Unix seconds after which relays refuse it.
    pub expires_at: i64,
    /// Which of the node's keys it is for: the Unix second the control plane recorded
    /// `public_key` for the node (its registration, or its last key rotation; rotations are at
    /// least 30 s apart, so a later key has a higher one). A relay that saw a token of a higher
    /// generation for the node refuses lower ones while that token lives. Absent in tokens of
    /// older control planes: 0.
    #[serde(default)]
    pub key_generation: i64,
}

/// How long a token the control plane issues lasts, in seconds: 10 minutes. Every heartbeat
/// answer (30 s by default) and every state carries a fresh one, and the node registers again
/// with it, so a live node never runs out; a revoked node gets none, so relays drop it at most
/// this long after its revocation (its registration ends when its token expires).
pub const TOKEN_TTL_SECS: i64 = 10 * 60;
/// How far a relay's clock may run behind the control plane's: a token that expires more than
/// [`TOKEN_TTL_SECS`] + this from the relay's now is refused (it was not issued by a control
/// plane that keeps the bound above, e.g. a 24-hour token of an older version).
pub const TOKEN_CLOCK_SKEW_SECS: i64 = 60;
/// How long a relay keeps a registration without a new `register`, in seconds.
pub const LEASE_SECS: u16 = 60;
/// A node registers again this often, in seconds (also keeps NAT bindings alive).
pub const REREGISTER_SECS: u64 = 20;
