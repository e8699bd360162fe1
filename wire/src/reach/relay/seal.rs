//! Authenticated relay-to-node frames: the `sealed` frame and the proof that asks for them.
//!
//! A node that registers with [`sealed_proof`] (instead of [`super::proof`]) gets every
//! `registered`, `refused`, `peer gone` and `pong` of that registration inside a
//! [`super::Frame::Sealed`]: a counter, the inner frame and a 16-byte HMAC-SHA256 tag under
//! [`FrameKey`], which both ends derive from the X25519 shared secret of the node key and the
//! relay key (the secret the registration proof already uses, under another label). The relay's
//! counter only grows; the node keeps the highest it accepted and drops anything not above it.
//! This file holds the keys and tags; sealing and opening a [`super::Frame`] is in the parent
//! (so that this file needs nothing of it).

use crate::key::PublicKey;

/// Bytes of a sealed frame's tag (HMAC-SHA256, truncated).
pub const SEALED_TAG: usize = 16;

/// The HMAC a `register` carries under `label`: it shows the node holds the private key of
/// `node` (both ends compute `shared`), and the label says which answers it wants.
pub(super) fn labelled_proof(
    shared: &[u8; 32],
    cookie: &[u8; 32],
    node: &PublicKey,
    label: &[u8],
) -> [u8; 32] {
    let key = crate::reach::derive(shared, b"plexd relay v1", label);
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key);
    let mut msg = Vec::with_capacity(64);
    msg.extend_from_slice(cookie);
    msg.extend_from_slice(&node.0);
    let tag = ring::hmac::sign(&key, &msg);
    let mut out = [0u8; 32];
    out.copy_from_slice(tag.as_ref());
    out
}

/// Whether `a` and `b` are equal, comparing every byte whatever the first difference.
pub(super) fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The proof of a `register` that asks for sealed answers: like [`super::proof`], under its own
/// label, so a relay tells which kind of answers the node understands from the proof itself
/// (and a relay that predates sealing refuses it as a bad proof).
pub fn sealed_proof(shared: &[u8; 32], cookie: &[u8; 32], node: &PublicKey) -> [u8; 32] {
    labelled_proof(shared, cookie, node, b"register proof, sealed answers")
}

/// Whether `given` is the [`sealed_proof`], in constant time.
pub fn sealed_proof_matches(
    shared: &[u8; 32],
    cookie: &[u8; 32],
    node: &PublicKey,
    given: &[u8; 32],
) -> bool {
    same(&sealed_proof(shared, cookie, node), given)
}

/// The key that seals one node's frames at one relay.
#[derive(Clone)]
pub struct FrameKey(ring::hmac::Key);

impl std::fmt::Debug for FrameKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FrameKey(..)")
    }
}

impl FrameKey {
    /// From the X25519 shared secret of the node key and the relay key.
    pub fn new(shared: &[u8; 32]) -> Self {
        let key = crate::reach::derive(shared, b"plexd relay v1", b"relay to node frames");
        Self(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key))
    }

    pub(super) fn tag(&self, counter: u64, body: &[u8]) -> [u8; SEALED_TAG] {
        let mut ctx = ring::hmac::Context::with_key(&self.0);
        ctx.update(&[11]);
        ctx.update(&counter.to_be_bytes());
        ctx.update(body);
        let full = ctx.sign();
        let mut out = [0u8; SEALED_TAG];
        out.copy_from_slice(&full.as_ref()[..SEALED_TAG]);
        out
    }

    /// Whether `tag` is this key's tag of `counter` and `body`; every byte is compared,
    /// whatever the first difference.
    pub(super) fn checks(&self, counter: u64, body: &[u8], tag: &[u8; SEALED_TAG]) -> bool {
        same(&self.tag(counter, body), tag)
    }
}
