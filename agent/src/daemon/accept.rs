//! Whether a state document or an event may be applied: signed by the Domain key pinned at
//! registration, addressed to this node, not older than what is applied, and (for events)
//! carrying the same `seq` as the SSE frame's `id:`. Pure; a refusal says why, for the log.

use plexsphere_wire::node::{Event, NodeState};
use plexsphere_wire::signed::{DomainVerifier, SignContext, SignedEnvelope, VerifyError};
use uuid::Uuid;

/// Why a document was refused. The daemon logs it at warn and keeps the last good state.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("it is not a signed envelope: {0}")]
    NotAnEnvelope(String),
    #[error("{0}")]
    Signature(#[from] VerifyError),
    #[error("it is addressed to node {got}, not to this node {own}")]
    OtherNode { got: Uuid, own: Uuid },
    #[error("its version {got} is older than the applied version {applied}")]
    Older { got: u64, applied: u64 },
    #[error("its signed seq {signed} differs from the frame id `{frame_id}`")]
    SeqMismatch { signed: u64, frame_id: String },
    #[error("the frame has no usable `id:` (`{0}`)")]
    BadFrameId(String),
    #[error(
        "it was issued {age_secs} s ago, more than the {max_secs} s a fresh answer may be old (a replay, or this host's clock is wrong)"
    )]
    Stale { age_secs: u64, max_secs: u64 },
}

/// What a document is checked against.
#[derive(Clone)]
pub struct Acceptor {
    verifier: DomainVerifier,
    node_id: Uuid,
}

impl Acceptor {
    pub fn new(verifier: DomainVerifier, node_id: Uuid) -> Self {
        Self { verifier, node_id }
    }

    /// A state document (the body of `GET /state`, or the cache): signed, ours, and not
    /// older than `applied` (the same version again is fine).
    pub fn state(&self, env: &SignedEnvelope, applied: Option<u64>) -> Result<NodeState, Refusal> {
        let state: NodeState = self.verifier.open(SignContext::NodeState, env)?;
        if state.node_id != self.node_id {
            return Err(Refusal::OtherNode {
                got: state.node_id,
                own: self.node_id,
            });
        }
        if let Some(applied) = applied
            && state.version < applied
        {
            return Err(Refusal::Older {
                got: state.version,
                applied,
            });
        }
        Ok(state)
    }

    /// Whether a state from the API is fresh: issued at most `max_age` before `wall`.
    pub fn fresh(
        &self,
        state: &NodeState,
        wall: std::time::SystemTime,
        max_age: std::time::Duration,
    ) -> Result<(), Refusal> {
        let now = wall
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let issued = u64::try_from(state.issued_at).unwrap_or(0);
        let age = now.saturating_sub(issued);
        if age > max_age.as_secs() {
            return Err(Refusal::Stale {
                age_secs: age,
                max_secs: max_age.as_secs(),
            });
        }
        Ok(())
    }

    /// A state body as JSON text.
    pub fn state_json(
        &self,
        body: &[u8],
        applied: Option<u64>,
    ) -> Result<(NodeState, SignedEnvelope), Refusal> {
        let env: SignedEnvelope =
            serde_json::from_slice(body).map_err(|e| Refusal::NotAnEnvelope(e.to_string()))?;
        let state = self.state(&env, applied)?;
        Ok((state, env))
    }

    /// An SSE frame: `data:` is a signed envelope of an [`Event`] whose `seq` equals `id:`.
    pub fn event(&self, frame_id: Option<&str>, data: &str) -> Result<Event, Refusal> {
        let env: SignedEnvelope =
            serde_json::from_str(data).map_err(|e| Refusal::NotAnEnvelope(e.to_string()))?;
        let event: Event = self.verifier.open(SignContext::Event, &env)?;
        if event.node_id != self.node_id {
            return Err(Refusal::OtherNode {
                got: event.node_id,
                own: self.node_id,
            });
        }
        let id = frame_id.unwrap_or("");
        let parsed: u64 = id
            .trim()
            .parse()
            .map_err(|_| Refusal::BadFrameId(id.chars().take(40).collect()))?;
        if parsed != event.seq {
            return Err(Refusal::SeqMismatch {
                signed: event.seq,
                frame_id: id.chars().take(40).collect(),
            });
        }
        Ok(event)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::net::IpAddr;

    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use plexsphere_wire::node::{EventKind, PeerSpec};
    use plexsphere_wire::signed::DomainSigner;

    use super::*;

    pub const SEED: [u8; 32] = [42u8; 32];
    pub fn own() -> Uuid {
        Uuid::parse_str("019a0816-0000-7000-8000-0000000000aa").unwrap()
    }
    pub fn peer_id(n: u8) -> Uuid {
        Uuid::parse_str(&format!("019a0816-0000-7000-8000-0000000000{n:02x}")).unwrap()
    }
    pub fn signer() -> DomainSigner {
        DomainSigner::from_seed(&SEED).unwrap()
    }
    pub fn acceptor() -> Acceptor {
        let v = DomainVerifier::from_b64(&signer().public_key_b64()).unwrap();
        Acceptor::new(v, own())
    }
    pub fn peer(n: u8) -> PeerSpec {
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
        }
    }
    pub fn state(version: u64, peers: Vec<PeerSpec>) -> NodeState {
        NodeState {
            version,
            node_id: own(),
            domain_id: Uuid::parse_str("019a0816-0000-7000-8000-000000000001").unwrap(),
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
        }
    }
    pub fn event_data(seq: u64, node: Uuid, kind: EventKind) -> String {
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

    #[test]
    fn a_good_state_is_accepted_and_same_version_again_too() {
        let env = signer()
            .sign(SignContext::NodeState, &state(5, vec![peer(3)]))
            .unwrap();
        let a = acceptor();
        assert_eq!(a.state(&env, None).unwrap().peers.len(), 1);
        assert_eq!(a.state(&env, Some(5)).unwrap().version, 5);
        let body = serde_json::to_vec(&env).unwrap();
        assert_eq!(a.state_json(&body, Some(4)).unwrap().0.version, 5);
    }

    #[test]
    fn a_flipped_byte_is_refused() {
        let env = signer()
            .sign(SignContext::NodeState, &state(5, vec![peer(3)]))
            .unwrap();
        let mut raw = STANDARD.decode(&env.payload).unwrap();
        raw[10] ^= 0x01;
        let bad = SignedEnvelope {
            payload: STANDARD.encode(raw),
            signature: env.signature.clone(),
        };
        let e = acceptor().state(&bad, None).unwrap_err();
        assert!(
            matches!(e, Refusal::Signature(VerifyError::BadSignature)),
            "{e}"
        );
        assert!(e.to_string().contains("pinned at registration"), "{e}");
    }

    #[test]
    fn unsigned_and_garbage_are_refused() {
        let a = acceptor();
        let e = a
            .state_json(br#"{"version":9,"peers":[]}"#, None)
            .unwrap_err();
        assert!(matches!(e, Refusal::NotAnEnvelope(_)), "{e}");
        let unsigned = SignedEnvelope {
            payload: STANDARD.encode(serde_json::to_vec(&state(9, vec![])).unwrap()),
            signature: String::new(),
        };
        assert!(matches!(
            a.state(&unsigned, None),
            Err(Refusal::Signature(_))
        ));
        // signed as an event, presented as a state
        let ev = signer()
            .sign(SignContext::Event, &state(9, vec![]))
            .unwrap();
        assert!(matches!(
            a.state(&ev, None),
            Err(Refusal::Signature(VerifyError::BadSignature))
        ));
    }

    #[test]
    fn another_nodes_state_and_an_older_version_are_refused() {
        let mut s = state(5, vec![]);
        s.node_id = peer_id(9);
        let env = signer().sign(SignContext::NodeState, &s).unwrap();
        let e = acceptor().state(&env, None).unwrap_err();
        assert!(matches!(e, Refusal::OtherNode { .. }), "{e}");
        let env = signer()
            .sign(SignContext::NodeState, &state(4, vec![]))
            .unwrap();
        let e = acceptor().state(&env, Some(5)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "its version 4 is older than the applied version 5"
        );
    }

    #[test]
    fn events_are_checked_against_the_frame_id() {
        let a = acceptor();
        let data = event_data(12, own(), EventKind::NodeRevoked);
        assert_eq!(a.event(Some("12"), &data).unwrap().seq, 12);
        let e = a.event(Some("13"), &data).unwrap_err();
        assert!(matches!(e, Refusal::SeqMismatch { signed: 12, .. }), "{e}");
        assert!(matches!(a.event(None, &data), Err(Refusal::BadFrameId(_))));
        assert!(matches!(
            a.event(Some("x"), &data),
            Err(Refusal::BadFrameId(_))
        ));
        let other = event_data(12, peer_id(4), EventKind::NodeRevoked);
        assert!(matches!(
            a.event(Some("12"), &other),
            Err(Refusal::OtherNode { .. })
        ));
        // a state signature is not an event signature
        let env = signer()
            .sign(
                SignContext::NodeState,
                &Event {
                    seq: 12,
                    node_id: own(),
                    kind: EventKind::NodeRevoked,
                },
            )
            .unwrap();
        let data = serde_json::to_string(&env).unwrap();
        assert!(matches!(
            a.event(Some("12"), &data),
            Err(Refusal::Signature(_))
        ));
        assert!(matches!(
            a.event(Some("12"), "not json"),
            Err(Refusal::NotAnEnvelope(_))
        ));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// The state decoder never panics, and nothing unsigned gets through.
        #[test]
        fn state_decoder_never_panics(body in proptest::collection::vec(proptest::num::u8::ANY, 0..400)) {
            proptest::prop_assert!(acceptor().state_json(&body, None).is_err());
        }

        /// The event decoder never panics on arbitrary frames.
        #[test]
        fn event_decoder_never_panics(id in "\\PC{0,24}", data in "\\PC{0,300}") {
            proptest::prop_assert!(acceptor().event(Some(&id), &data).is_err());
        }

        /// A valid envelope with one flipped byte anywhere in its payload is refused.
        #[test]
        fn any_flipped_payload_byte_is_refused(pos in 0usize..400, bit in 0u8..8) {
            let env = signer().sign(SignContext::NodeState, &state(5, vec![peer(3)])).unwrap();
            let mut raw = STANDARD.decode(&env.payload).unwrap();
            let i = pos % raw.len();
            raw[i] ^= 1 << bit;
            let bad = SignedEnvelope { payload: STANDARD.encode(raw), signature: env.signature };
            proptest::prop_assert!(acceptor().state(&bad, None).is_err());
        }
    }
}
