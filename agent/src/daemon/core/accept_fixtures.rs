//! Signed documents and keys for the core's tests: a Domain signer (and the rotation's
//! second), an acceptor for a fixed node in a fixed Domain, peers numbered `n` with
//! predictable ids, keys and addresses, states and event frames signed the way the control
//! plane signs them. Every test of `core/` (and the shell's cache tests) builds on these, so
//! a change here shows in all of them.

use std::net::IpAddr;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use plexsphere_wire::domain_event::{DomainEvent, EventData};
use plexsphere_wire::node::{Event, EventKind, NodeState, PeerSpec};
use plexsphere_wire::signed::{DomainSigner, SignContext};
use plexsphere_wire::signing_keys::SigningKey;
use uuid::Uuid;

use super::accept::{Acceptor, DomainKeys};

pub(crate) const SEED: [u8; 32] = [42u8; 32];
pub(crate) fn own() -> Uuid {
    Uuid::parse_str("019a0816-0000-7000-8000-0000000000aa").unwrap()
}
pub(crate) fn peer_id(n: u8) -> Uuid {
    Uuid::parse_str(&format!("019a0816-0000-7000-8000-0000000000{n:02x}")).unwrap()
}
pub(crate) fn signer() -> DomainSigner {
    DomainSigner::from_seed(&SEED).unwrap()
}
pub(crate) fn acceptor() -> Acceptor {
    Acceptor::with_keys(keys(&signer(), None), own())
        .unwrap()
        .in_domain(domain())
}
/// The Domain of [`state`].
pub(crate) fn domain() -> Uuid {
    Uuid::parse_str("019a0816-0000-7000-8000-000000000001").unwrap()
}
pub(crate) fn keys(pinned: &DomainSigner, next: Option<SigningKey>) -> DomainKeys {
    DomainKeys {
        pinned: pinned.public_key_b64(),
        generation: Some(1),
        next,
    }
}
/// The rotation's second key.
pub(crate) fn signer2() -> DomainSigner {
    DomainSigner::from_seed(&[43u8; 32]).unwrap()
}
pub(crate) fn key_of(signer: &DomainSigner, generation: u64) -> SigningKey {
    SigningKey {
        generation,
        public_key: signer.public_key_b64(),
        active_from: 1_700_000_000,
    }
}
pub(crate) fn peer(n: u8) -> PeerSpec {
    let ip: IpAddr = format!("10.64.1.{n}").parse().unwrap();
    PeerSpec {
        node_id: peer_id(n),
        hostname: format!("node-{n}"),
        public_key: STANDARD.encode([n; 32]),
        mesh_ip: ip,
        allowed_ips: vec![format!("10.64.1.{n}/32").parse().unwrap()],
        endpoints: vec![format!("192.0.2.{n}:51820").parse().unwrap()],
        persistent_keepalive_secs: None,
        home_relay: None,
        dns_name: None,
    }
}
pub(crate) fn state(version: u64, peers: Vec<PeerSpec>) -> NodeState {
    NodeState {
        version,
        node_id: own(),
        domain_id: domain(),
        mesh_ip: "10.64.1.2".parse().unwrap(),
        mesh_cidr: "10.64.0.0/16".parse().unwrap(),
        listen_port: 51820,
        peers,
        issued_at: 1_700_000_000,
        relays: vec![],
        relay_token: None,
        stun: vec![],
        udp_offload: None,
        next_signing_key: None,
        policy: None,
        dns: None,
        served_routes: Vec::new(),
    }
}
pub(crate) fn event_data(seq: u64, node: Uuid, kind: EventKind) -> String {
    let env = signer()
        .sign(
            SignContext::Event,
            &Event {
                seq,
                node_id: node,
                kind,
            },
        )
        .unwrap();
    serde_json::to_string(&env).unwrap()
}
/// The frame `data:` of a Domain event signed by `by`.
pub(crate) fn domain_event_data(by: &DomainSigner, ev: &DomainEvent) -> String {
    let env = by.sign(SignContext::DomainEvent, ev).unwrap();
    serde_json::to_string(&EventData::Domain(
        plexsphere_wire::domain_event::DomainEnvelope { domain_event: env },
    ))
    .unwrap()
}
