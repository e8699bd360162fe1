//! What the fuzz targets share: a Domain key pair that signs whatever bytes a target makes up, so
//! that the decoders behind the signature check get fuzzed too, and not only the check.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use plexd::daemon::core::accept::{Acceptor, DomainKeys};
use plexsphere_wire::signed::{DomainSigner, SignContext, SignedEnvelope};
use uuid::Uuid;

/// The node the documents are addressed to (a fixed id, so inputs can name it).
pub const NODE: Uuid = Uuid::from_u128(0x019a0816_0000_7000_8000_0000000000aa);
/// The node's Domain (Domain events must name it).
pub const DOMAIN: Uuid = Uuid::from_u128(0x019a0816_0000_7000_8000_000000000001);
const SEED: [u8; 32] = [42; 32];

pub fn signer() -> DomainSigner {
    DomainSigner::from_seed(&SEED).expect("a fixed 32-byte seed is a valid key")
}

pub fn acceptor() -> Acceptor {
    let keys = DomainKeys {
        pinned: signer().public_key_b64(),
        generation: None,
        next: None,
    };
    Acceptor::with_keys(keys, NODE)
        .expect("the signer's own public key parses")
        .in_domain(DOMAIN)
}

/// `payload` signed for `ctx`, as the control plane would send it.
pub fn envelope(ctx: SignContext, payload: &[u8]) -> SignedEnvelope {
    SignedEnvelope {
        payload: STANDARD.encode(payload),
        signature: STANDARD.encode(signer().sign_bytes(ctx, payload)),
    }
}

/// Splits fuzz input at the first `0xff` byte: a selector/prefix and the rest.
pub fn split_at_marker(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == 0xff) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}
