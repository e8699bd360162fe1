//! The acceptor's tests ([`super::accept`]): what is applied and what is refused (and why),
//! for states, the node's own events and its Domain's events, through a key rotation
//! (announced, promoted, adopted), and that no flipped byte of a signed document is accepted.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use plexsphere_wire::domain_event::{DomainEvent, EventData};
use plexsphere_wire::node::{Event, EventKind};
use plexsphere_wire::signed::{DomainSigner, SignContext, SignedEnvelope, VerifyError};
use plexsphere_wire::signing_keys::SigningKey;
use uuid::Uuid;

use super::accept::*;
use super::accept_fixtures::*;

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
