//! A control plane's node API, faked in the test server: registration, a signed state, the
//! heartbeat/endpoint/ingest answers, and an event stream body chosen by the test.
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use plexsphere_wire::node::{Event, EventKind, NodeState, PeerSpec};
use plexsphere_wire::signed::{DomainSigner, SignContext, SignedEnvelope};
use uuid::Uuid;

use super::{Answer, Handler, Req};

pub const NODE: &str = "019a0816-0000-7000-8000-0000000000aa";
pub const SEED: [u8; 32] = [42u8; 32];

pub fn signer() -> DomainSigner {
    DomainSigner::from_seed(&SEED).unwrap()
}

/// The registration answer, with the test Domain's real signing key.
pub fn registered() -> String {
    let mut v: serde_json::Value = serde_json::from_str(super::REGISTERED).unwrap();
    v["domain_signing_public_key"] = serde_json::json!(signer().public_key_b64());
    v.to_string()
}

pub fn peer(n: u8) -> PeerSpec {
    PeerSpec {
        node_id: Uuid::parse_str(&format!("019a0816-0000-7000-8000-0000000000{n:02x}")).unwrap(),
        hostname: format!("node-{n}"),
        public_key: STANDARD.encode([n; 32]),
        mesh_ip: format!("10.64.1.{n}").parse().unwrap(),
        allowed_ips: vec![format!("10.64.1.{n}/32").parse().unwrap()],
        endpoints: vec![format!("192.0.2.{n}:51820").parse().unwrap()],
        persistent_keepalive_secs: None,
        home_relay: None,
        dns_name: None,
    }
}

pub fn state(version: u64, peers: Vec<PeerSpec>) -> SignedEnvelope {
    state_signed_by(&signer(), version, peers)
}

/// A state document signed by `by` (another Domain key than the test Domain's, say).
pub fn state_signed_by(by: &DomainSigner, version: u64, peers: Vec<PeerSpec>) -> SignedEnvelope {
    let s = NodeState {
        version,
        node_id: Uuid::parse_str(NODE).unwrap(),
        domain_id: Uuid::parse_str("019a0816-0000-7000-8000-000000000001").unwrap(),
        mesh_ip: "10.64.1.2".parse().unwrap(),
        mesh_cidr: "10.64.0.0/16".parse().unwrap(),
        listen_port: 51820,
        peers,
        // Now: plexd refuses a state issued long ago as a replay (MAX_STATE_AGE).
        issued_at: i64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs(),
        )
        .unwrap(),
        relays: vec![],
        relay_token: None,
        stun: vec![],
        udp_offload: None,
        next_signing_key: None,
        policy: None,
        dns: None,
        served_routes: Vec::new(),
    };
    by.sign(SignContext::NodeState, &s).unwrap()
}

/// One SSE frame carrying a signed event.
pub fn frame(seq: u64, kind: EventKind) -> String {
    let name = kind.name();
    let ev = Event {
        seq,
        node_id: Uuid::parse_str(NODE).unwrap(),
        kind,
    };
    let env = signer().sign(SignContext::Event, &ev).unwrap();
    format!(
        "id: {seq}\nevent: {name}\ndata: {}\n\n",
        serde_json::to_string(&env).unwrap()
    )
}

/// The fake: `events` is the body of every event-stream answer.
pub fn control_plane(state: SignedEnvelope, events: String) -> Handler {
    let state_json = serde_json::to_string(&state).unwrap();
    Arc::new(move |req: &Req| {
        let p = req.path.as_str();
        if p == plexsphere_wire::proof::REGISTER_CHALLENGE_PATH {
            Answer::json(200, &super::challenge())
        } else if p == "/v1/register" {
            Answer::json(201, &registered())
        } else if p.ends_with("/heartbeat") {
            Answer::json(
                200,
                r#"{"state_version":1,"intervals":{"heartbeat_secs":30,"endpoint_report_secs":60,"state_poll_secs":300,"ingest_secs":60}}"#,
            )
        } else if p.ends_with("/endpoints") {
            Answer::json(
                200,
                r#"{"observed":"127.0.0.1:51820","endpoints":["127.0.0.1:51820"]}"#,
            )
        } else if p.ends_with("/state") {
            Answer::json(200, &state_json)
        } else if p.ends_with("/ingest") {
            Answer::json(202, "")
        } else if p.ends_with("/events") {
            Answer {
                status: 200,
                headers: vec![("content-type".into(), "text/event-stream".into())],
                body: events.clone(),
            }
        } else {
            Answer::json(404, r#"{"code":"not_found","message":"no"}"#)
        }
    })
}
