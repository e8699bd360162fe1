//! Whether a state document or an event may be applied: signed by the Domain key the node
//! pinned (at registration, or by following a rotation) or by the next key a document signed
//! with the pinned key announced, addressed to this node, not older than what is applied, and
//! (for events) carrying the same `seq` as the SSE frame's `id:`. An event comes either as the
//! node's own copy or as its Domain's one signed copy for every node
//! ([`plexsphere_wire::domain_event`]): then it must name this node's Domain and this node as a
//! recipient. Pure; a refusal says why, for
//! the log. What a verified document means for the keys (an announcement, a promotion) is the
//! core's to decide: each accepted document says which key signed it ([`SignedBy`]).

use plexsphere_wire::domain_event::{DomainEvent, EventData};
use plexsphere_wire::node::{Event, NodeState};
use plexsphere_wire::signed::{DomainVerifier, SignContext, SignedEnvelope, VerifyError};
use plexsphere_wire::signing_keys::SigningKey;
use serde::de::DeserializeOwned;
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
    #[error("it is an event of Domain {got}, not of this node's Domain {own}")]
    OtherDomain { got: Uuid, own: Uuid },
    #[error(
        "it is a Domain event this node does not receive (target {target:?}, about node {subject})"
    )]
    NotARecipient { target: Option<Uuid>, subject: Uuid },
    #[error("it is a Domain event, and this node's Domain is not known to check it against")]
    NoDomain,
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

/// Which of the node's Domain keys verified a document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignedBy {
    /// The pinned key.
    Pinned,
    /// The announced next key: the rotation's overlap is over, the node moves to it.
    Next,
}

/// The Domain keys a node trusts: the pinned one, and the next one while an overlap lasts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainKeys {
    /// The pinned public key, standard base64.
    pub pinned: String,
    /// Its generation, when known (a key pinned at registration has none).
    pub generation: Option<u64>,
    pub next: Option<SigningKey>,
}

/// What a document is checked against.
#[derive(Clone)]
pub struct Acceptor {
    verifier: DomainVerifier,
    keys: DomainKeys,
    /// The announced next key's verifier (`keys.next` decoded).
    next: Option<DomainVerifier>,
    node_id: Uuid,
    /// The node's Domain: Domain events must name it (none known: they are refused).
    domain_id: Option<Uuid>,
}

impl Acceptor {
    /// The keys as the identity file keeps them; an error names the bad one.
    pub fn with_keys(keys: DomainKeys, node_id: Uuid) -> Result<Self, String> {
        let verifier = DomainVerifier::from_b64(&keys.pinned)
            .map_err(|e| format!("domain_signing_public_key: {e}"))?;
        let next = match &keys.next {
            Some(k) => Some(
                DomainVerifier::from_b64(&k.public_key)
                    .map_err(|e| format!("next_signing_key: {e}"))?,
            ),
            None => None,
        };
        Ok(Self {
            verifier,
            keys,
            next,
            node_id,
            domain_id: None,
        })
    }

    /// Accepts Domain events of `domain_id` (the node's Domain).
    pub fn in_domain(mut self, domain_id: Uuid) -> Self {
        self.domain_id = Some(domain_id);
        self
    }

    /// The identity's keys (pinned and next).
    pub fn from_identity(id: &crate::identity::Identity) -> Result<Self, String> {
        Self::with_keys(
            DomainKeys {
                pinned: id.domain_signing_public_key.clone(),
                generation: id.domain_signing_key_generation,
                next: id.next_signing_key.clone(),
            },
            id.node_id,
        )
        .map(|a| a.in_domain(id.domain_id))
    }

    pub fn keys(&self) -> &DomainKeys {
        &self.keys
    }

    /// Trusts `next` beside the pinned key (a document signed by the pinned key announced
    /// it). `false` when nothing changed (the same key again, or the pinned key itself).
    pub fn announce(&mut self, next: &SigningKey) -> Result<bool, String> {
        if next.public_key == self.keys.pinned || self.keys.next.as_ref() == Some(next) {
            return Ok(false);
        }
        let v = DomainVerifier::from_b64(&next.public_key).map_err(|e| {
            format!(
                "the announced next signing key (generation {}): {e}",
                next.generation
            )
        })?;
        self.next = Some(v);
        self.keys.next = Some(next.clone());
        Ok(true)
    }

    /// The next key becomes the pinned one; the old key is refused from now on. Answers the
    /// key promoted (`None`: there was no next key).
    pub fn promote(&mut self) -> Option<SigningKey> {
        let key = self.keys.next.take()?;
        let v = self.next.take()?;
        self.verifier = v;
        self.keys.pinned = key.public_key.clone();
        self.keys.generation = Some(key.generation);
        Some(key)
    }

    /// Pins `key` (reached by following the key chain from the pinned key), with `next` (a
    /// later link of the same chain, still in its overlap) beside it.
    pub fn adopt(&mut self, key: &SigningKey, next: Option<&SigningKey>) -> Result<(), String> {
        let keys = DomainKeys {
            pinned: key.public_key.clone(),
            generation: Some(key.generation),
            next: next.cloned(),
        };
        *self = Self {
            domain_id: self.domain_id,
            ..Self::with_keys(keys, self.node_id)?
        };
        Ok(())
    }

    /// Which of my keys verifies this: the pinned key, else the announced next key, else the
    /// pinned key's refusal (never a key the node did not pin or was not announced).
    fn open<T: DeserializeOwned>(
        &self,
        ctx: SignContext,
        env: &SignedEnvelope,
    ) -> Result<(T, SignedBy), VerifyError> {
        match self.verifier.open(ctx, env) {
            Ok(doc) => Ok((doc, SignedBy::Pinned)),
            Err(VerifyError::BadSignature) if self.next.is_some() => match &self.next {
                Some(next) => next
                    .open(ctx, env)
                    .map(|doc| (doc, SignedBy::Next))
                    .map_err(|_| VerifyError::BadSignature),
                None => Err(VerifyError::BadSignature),
            },
            Err(e) => Err(e),
        }
    }

    /// A state document (the body of `GET /state`, or the cache): signed, ours, and not
    /// older than `applied` (the same version again is fine).
    pub fn state(&self, env: &SignedEnvelope, applied: Option<u64>) -> Result<NodeState, Refusal> {
        self.state_by(env, applied).map(|(s, _)| s)
    }

    /// [`Self::state`], and which key signed it.
    pub fn state_by(
        &self,
        env: &SignedEnvelope,
        applied: Option<u64>,
    ) -> Result<(NodeState, SignedBy), Refusal> {
        let (state, by): (NodeState, _) = self.open(SignContext::NodeState, env)?;
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
        Ok((state, by))
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
    ) -> Result<(NodeState, SignedEnvelope, SignedBy), Refusal> {
        let env: SignedEnvelope =
            serde_json::from_slice(body).map_err(|e| Refusal::NotAnEnvelope(e.to_string()))?;
        let (state, by) = self.state_by(&env, applied)?;
        Ok((state, env, by))
    }

    /// An SSE frame: `data:` is a signed envelope of an [`Event`] for this node, or of a
    /// [`DomainEvent`] of this node's Domain that this node receives, whose `seq` equals `id:`.
    /// Either is answered as the event addressed to this node.
    pub fn event(&self, frame_id: Option<&str>, data: &str) -> Result<(Event, SignedBy), Refusal> {
        let data: EventData =
            serde_json::from_str(data).map_err(|e| Refusal::NotAnEnvelope(e.to_string()))?;
        let (event, by) = match data {
            EventData::Node(env) => {
                let (event, by): (Event, _) = self.open(SignContext::Event, &env)?;
                if event.node_id != self.node_id {
                    return Err(Refusal::OtherNode {
                        got: event.node_id,
                        own: self.node_id,
                    });
                }
                (event, by)
            }
            EventData::Domain(d) => {
                let own = self.domain_id.ok_or(Refusal::NoDomain)?;
                let (event, by): (DomainEvent, _) =
                    self.open(SignContext::DomainEvent, &d.domain_event)?;
                if event.domain_id != own {
                    return Err(Refusal::OtherDomain {
                        got: event.domain_id,
                        own,
                    });
                }
                if !event.is_for(self.node_id) {
                    return Err(Refusal::NotARecipient {
                        target: event.target,
                        subject: event.subject,
                    });
                }
                (event.addressed_to(self.node_id), by)
            }
        };
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
        Ok((event, by))
    }
}

/// Whether a refusal is the signature matching none of the node's keys (what sends a node
/// to the key chain).
pub fn is_unknown_signer(r: &Refusal) -> bool {
    matches!(r, Refusal::Signature(VerifyError::BadSignature))
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
        Acceptor::with_keys(keys(&signer(), None), own())
            .unwrap()
            .in_domain(domain())
    }
    /// The Domain of [`state`].
    pub fn domain() -> Uuid {
        Uuid::parse_str("019a0816-0000-7000-8000-000000000001").unwrap()
    }
    pub fn keys(pinned: &DomainSigner, next: Option<SigningKey>) -> DomainKeys {
        DomainKeys {
            pinned: pinned.public_key_b64(),
            generation: Some(1),
            next,
        }
    }
    /// The rotation's second key.
    pub fn signer2() -> DomainSigner {
        DomainSigner::from_seed(&[43u8; 32]).unwrap()
    }
    pub fn key_of(signer: &DomainSigner, generation: u64) -> SigningKey {
        SigningKey {
            generation,
            public_key: signer.public_key_b64(),
            active_from: 1_700_000_000,
        }
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
            dns_name: None,
        }
    }
    pub fn state(version: u64, peers: Vec<PeerSpec>) -> NodeState {
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
    /// The frame `data:` of a Domain event signed by `by`.
    pub fn domain_event_data(by: &DomainSigner, ev: &DomainEvent) -> String {
        let env = by.sign(SignContext::DomainEvent, ev).unwrap();
        serde_json::to_string(&EventData::Domain(
            plexsphere_wire::domain_event::DomainEnvelope { domain_event: env },
        ))
        .unwrap()
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
        assert_eq!(a.event(Some("12"), &data).unwrap().0.seq, 12);
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

    #[test]
    fn a_domain_event_is_accepted_only_in_its_domain_by_its_recipients() {
        let a = acceptor();
        let ev = |target: Option<Uuid>, subject: Uuid| DomainEvent {
            seq: 30,
            domain_id: domain(),
            target,
            subject,
            kind: EventKind::PeerRemoved {
                peer_node_id: subject,
                public_key: "k".to_owned(),
            },
        };
        // For every node but its subject, and for its target.
        for good in [ev(None, peer_id(3)), ev(Some(own()), peer_id(3))] {
            let (event, by) = a
                .event(Some("30"), &domain_event_data(&signer(), &good))
                .unwrap();
            assert_eq!(
                (event.seq, event.node_id, by),
                (30, own(), SignedBy::Pinned)
            );
            assert_eq!(event.kind, good.kind);
        }
        // Not about this node itself, not for another target, not of another Domain.
        let e = a
            .event(Some("30"), &domain_event_data(&signer(), &ev(None, own())))
            .unwrap_err();
        assert!(matches!(e, Refusal::NotARecipient { .. }), "{e}");
        let e = a
            .event(
                Some("30"),
                &domain_event_data(&signer(), &ev(Some(peer_id(4)), peer_id(3))),
            )
            .unwrap_err();
        assert!(matches!(e, Refusal::NotARecipient { .. }), "{e}");
        let mut other = ev(None, peer_id(3));
        other.domain_id = peer_id(9);
        let e = a
            .event(Some("30"), &domain_event_data(&signer(), &other))
            .unwrap_err();
        assert!(matches!(e, Refusal::OtherDomain { .. }), "{e}");
        // The frame id still binds the seq.
        let data = domain_event_data(&signer(), &ev(None, peer_id(3)));
        assert!(matches!(
            a.event(Some("31"), &data),
            Err(Refusal::SeqMismatch { signed: 30, .. })
        ));
        // An acceptor that does not know its Domain accepts none.
        let blind = Acceptor::with_keys(keys(&signer(), None), own()).unwrap();
        assert!(matches!(
            blind.event(Some("30"), &data),
            Err(Refusal::NoDomain)
        ));
        // An unknown key's Domain event sends the node to the key chain, as any event.
        let e = a
            .event(
                Some("30"),
                &domain_event_data(&signer2(), &ev(None, peer_id(3))),
            )
            .unwrap_err();
        assert!(is_unknown_signer(&e), "{e}");
    }

    #[test]
    fn an_envelope_relabelled_between_node_and_domain_fails_to_verify() {
        let a = acceptor();
        // A per-node event's envelope presented as a Domain event, and the other way round:
        // the signature covers the context, so neither verifies.
        let node = signer()
            .sign(
                SignContext::Event,
                &Event {
                    seq: 5,
                    node_id: own(),
                    kind: EventKind::NodeRevoked,
                },
            )
            .unwrap();
        let relabelled = serde_json::to_string(&EventData::Domain(
            plexsphere_wire::domain_event::DomainEnvelope { domain_event: node },
        ))
        .unwrap();
        assert!(matches!(
            a.event(Some("5"), &relabelled),
            Err(Refusal::Signature(VerifyError::BadSignature))
        ));
        let dom = signer()
            .sign(
                SignContext::DomainEvent,
                &DomainEvent {
                    seq: 5,
                    domain_id: domain(),
                    target: Some(own()),
                    subject: own(),
                    kind: EventKind::NodeRevoked,
                },
            )
            .unwrap();
        let relabelled = serde_json::to_string(&dom).unwrap();
        assert!(matches!(
            a.event(Some("5"), &relabelled),
            Err(Refusal::Signature(VerifyError::BadSignature))
        ));
    }

    fn signed_state(by: &DomainSigner, version: u64, next: Option<SigningKey>) -> SignedEnvelope {
        let mut s = state(version, vec![]);
        s.next_signing_key = next;
        by.sign(SignContext::NodeState, &s).unwrap()
    }

    #[test]
    fn the_next_key_verifies_only_once_announced() {
        let mut a = acceptor();
        let by_next = signed_state(&signer2(), 6, None);
        let e = a.state(&by_next, None).unwrap_err();
        assert!(is_unknown_signer(&e), "an unannounced key is refused: {e}");

        assert!(a.announce(&key_of(&signer2(), 2)).unwrap());
        assert!(
            !a.announce(&key_of(&signer2(), 2)).unwrap(),
            "the same key twice changes nothing"
        );
        assert!(
            !a.announce(&key_of(&signer(), 1)).unwrap(),
            "nor the pinned key"
        );
        let (_, by) = a.state_by(&by_next, None).unwrap();
        assert_eq!(by, SignedBy::Next);
        let (_, by) = a.state_by(&signed_state(&signer(), 6, None), None).unwrap();
        assert_eq!(
            by,
            SignedBy::Pinned,
            "the pinned key still signs in the overlap"
        );
        let ev = serde_json::to_string(
            &signer2()
                .sign(
                    SignContext::Event,
                    &Event {
                        seq: 7,
                        node_id: own(),
                        kind: EventKind::NodeRevoked,
                    },
                )
                .unwrap(),
        )
        .unwrap();
        assert_eq!(a.event(Some("7"), &ev).unwrap().1, SignedBy::Next);

        // A third key is never accepted, announced or not.
        let third = DomainSigner::from_seed(&[44u8; 32]).unwrap();
        let e = a.state(&signed_state(&third, 6, None), None).unwrap_err();
        assert!(is_unknown_signer(&e), "{e}");
        // A bad announced key is refused with its name, and changes nothing.
        let bad = SigningKey {
            generation: 3,
            public_key: "not a key".into(),
            active_from: 0,
        };
        let e = a.announce(&bad).unwrap_err();
        assert!(e.contains("generation 3"), "{e}");
        assert_eq!(a.keys().next, Some(key_of(&signer2(), 2)));
    }

    #[test]
    fn after_the_promotion_the_old_key_is_refused() {
        let mut a = acceptor();
        assert_eq!(a.promote(), None, "nothing to promote");
        a.announce(&key_of(&signer2(), 2)).unwrap();
        assert_eq!(a.promote(), Some(key_of(&signer2(), 2)));
        assert_eq!(
            a.keys(),
            &DomainKeys {
                pinned: signer2().public_key_b64(),
                generation: Some(2),
                next: None,
            }
        );
        let e = a
            .state(&signed_state(&signer(), 8, None), None)
            .unwrap_err();
        assert!(is_unknown_signer(&e), "the old key is refused: {e}");
        let (_, by) = a
            .state_by(&signed_state(&signer2(), 8, None), None)
            .unwrap();
        assert_eq!(by, SignedBy::Pinned);
        let old_event = event_data(9, own(), EventKind::NodeRevoked);
        assert!(a.event(Some("9"), &old_event).is_err());
    }

    #[test]
    fn an_adopted_key_replaces_both() {
        let mut a = acceptor();
        a.adopt(&key_of(&signer2(), 2), None).unwrap();
        assert_eq!(a.keys().generation, Some(2));
        assert!(a.state(&signed_state(&signer(), 3, None), None).is_err());
        assert!(a.state(&signed_state(&signer2(), 3, None), None).is_ok());
        let bad = SigningKey {
            generation: 3,
            public_key: "AAAA".into(),
            active_from: 0,
        };
        assert!(a.adopt(&bad, None).is_err());
        assert_eq!(a.keys().pinned, signer2().public_key_b64(), "unchanged");
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
