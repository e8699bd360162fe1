//! The Domain key's rotation as the core follows it: the announcement, the promotion, the
//! key chain of a node that missed the overlap, and what is never accepted.

use plexsphere_wire::node::Event;
use plexsphere_wire::signed::DomainSigner;
use plexsphere_wire::signing_keys::{KeyTransition, SigningKey, SigningKeyChain};
use uuid::Uuid;

use super::*;
use crate::daemon::core::accept::DomainKeys;
use crate::daemon::core::accept_fixtures::{key_of, peer, signer2};
use crate::daemon::core::domain_keys::KEY_CHAIN_INTERVAL;

fn domain() -> Uuid {
    Uuid::parse_str("019a0816-0000-7000-8000-000000000001").unwrap()
}

fn body(by: &DomainSigner, s: &NodeState) -> CallResult {
    let env = by.sign(SignContext::NodeState, s).unwrap();
    CallResult::State(Ok(StateAnswer::Body(serde_json::to_vec(&env).unwrap())))
}

fn frame_by(by: &DomainSigner, seq: u64, kind: EventKind) -> StreamMsg {
    let ev = Event {
        seq,
        node_id: own(),
        kind,
    };
    StreamMsg::Frame {
        id: Some(seq.to_string()),
        event: "e".into(),
        data: serde_json::to_string(&by.sign(SignContext::Event, &ev).unwrap()).unwrap(),
    }
}

fn saved_keys(effects: &[Effect]) -> Vec<&DomainKeys> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::SaveDomainKeys(k) => Some(k),
            _ => None,
        })
        .collect()
}

fn chain_fetches(effects: &[Effect]) -> usize {
    calls(effects)
        .iter()
        .filter(|c| matches!(c, Call::SigningKeys))
        .count()
}

fn announcing(version: u64, next: Option<SigningKey>) -> NodeState {
    let mut s = one_state(version, 1);
    s.next_signing_key = next;
    s
}

fn chain(links: Vec<(&DomainSigner, SigningKey)>) -> CallResult {
    CallResult::SigningKeys(Ok(SigningKeyChain {
        transitions: links
            .into_iter()
            .map(|(by, key)| KeyTransition::sign(by, domain(), key))
            .collect(),
    }))
}

#[test]
fn an_announced_key_is_saved_and_its_first_state_promotes_it() {
    let mut h = harness();
    let next = key_of(&signer2(), 2);
    let e = h.up(&announcing(4, Some(next.clone())));
    assert_eq!(
        saved_keys(&e),
        vec![&DomainKeys {
            pinned: signer().public_key_b64(),
            generation: Some(1),
            next: Some(next.clone()),
        }]
    );
    // The same announcement again changes nothing.
    let e = h.call(body(&signer(), &announcing(5, Some(next.clone()))));
    assert!(saved_keys(&e).is_empty(), "{e:?}");
    assert_eq!(h.core.report(&[], h.now).domain_key.next, Some(next));

    // The first state signed by the next key: applied, and the key promoted.
    let e = h.call(body(&signer2(), &one_state(6, 2)));
    assert_eq!(applies(&e), vec![2], "{e:?}");
    assert_eq!(
        saved_keys(&e),
        vec![&DomainKeys {
            pinned: signer2().public_key_b64(),
            generation: Some(2),
            next: None,
        }]
    );
    let status = h.core.report(&[], h.now).domain_key;
    assert_eq!(status.generation, Some(2));
    assert_eq!(status.public_key, signer2().public_key_b64());
    assert_eq!(status.next, None);

    // From now on the old key is refused: the last good state stays.
    let e = h.call(body(&signer(), &one_state(7, 3)));
    assert!(applies(&e).is_empty(), "{e:?}");
    assert!(saved_keys(&e).is_empty());
    assert_eq!(h.core.state_version, Some(6));
    assert_eq!(
        chain_fetches(&e),
        1,
        "a document by an unknown key asks for the chain"
    );
}

#[test]
fn a_next_key_announced_by_another_key_is_not_taken() {
    let mut h = harness();
    h.up(&one_state(4, 1));
    // A state signed by an unannounced key, announcing itself: refused whole.
    let e = h.call(body(
        &signer2(),
        &announcing(5, Some(key_of(&signer2(), 2))),
    ));
    assert!(saved_keys(&e).is_empty() && applies(&e).is_empty(), "{e:?}");
    assert_eq!(h.core.report(&[], h.now).domain_key.next, None);
    // Its events neither.
    let e = h.stream(
        1,
        frame_by(&signer2(), 6, EventKind::PeerAdded { peer: peer(9) }),
    );
    assert!(applies(&e).is_empty(), "{e:?}");
    assert_eq!(h.core.last_seq, 4);
}

#[test]
fn an_event_by_the_next_key_promotes_it_and_pulls_the_whole_state() {
    let mut h = harness();
    h.up(&announcing(4, Some(key_of(&signer2(), 2))));
    let e = h.stream(
        1,
        frame_by(&signer2(), 5, EventKind::PeerAdded { peer: peer(9) }),
    );
    assert_eq!(applies(&e), vec![2], "{e:?}");
    assert_eq!(saved_keys(&e).len(), 1);
    assert_eq!(saved_keys(&e)[0].generation, Some(2));
    // The cache's state is still signed by the old key: a full pull replaces it.
    let e = h.after(Duration::from_secs(3));
    assert!(calls(&e).contains(&&Call::State { applied: None }), "{e:?}");
    // The old key's events are refused now.
    let e = h.frame(1, 6, EventKind::PeerAdded { peer: peer(10) });
    assert!(applies(&e).is_empty(), "{e:?}");
}

#[test]
fn a_missed_rotation_is_followed_through_the_chain_at_most_once_a_minute() {
    let mut h = harness();
    h.up(&one_state(4, 1));
    let signer3 = DomainSigner::from_seed(&[44u8; 32]).unwrap();
    let e = h.call(body(&signer2(), &one_state(5, 2)));
    assert_eq!(chain_fetches(&e), 1, "{e:?}");
    // While it runs, and then within the interval, no second fetch.
    let e = h.call(body(&signer2(), &one_state(5, 2)));
    assert_eq!(chain_fetches(&e), 0);
    h.call(CallResult::SigningKeys(Err(unreachable())));
    h.now = h.now.plus(KEY_CHAIN_INTERVAL - Duration::from_secs(1));
    let e = h.call(body(&signer2(), &one_state(5, 2)));
    assert_eq!(chain_fetches(&e), 0, "rate limited");
    h.now = h.now.plus(Duration::from_secs(1));
    let e = h.call(body(&signer2(), &one_state(5, 2)));
    assert_eq!(chain_fetches(&e), 1, "after the interval");

    // The chain: 1 -> 2 (active) -> 3 (from the future: it becomes the next key).
    let mut k3 = key_of(&signer3, 3);
    k3.active_from = h.now.unix() + 3600;
    let (one, two) = (signer(), signer2());
    let e = h.call(chain(vec![(&one, key_of(&two, 2)), (&two, k3.clone())]));
    assert_eq!(
        saved_keys(&e),
        vec![&DomainKeys {
            pinned: signer2().public_key_b64(),
            generation: Some(2),
            next: Some(k3),
        }]
    );
    // ...and the state is pulled again, whole, and now accepted.
    let e = h.after(Duration::from_secs(3));
    assert!(calls(&e).contains(&&Call::State { applied: None }), "{e:?}");
    let e = h.call(body(&signer2(), &one_state(5, 2)));
    assert_eq!(applies(&e), vec![2], "{e:?}");
    assert_eq!(h.core.report(&[], h.now).domain_key.generation, Some(2));
}

#[test]
fn a_forged_or_broken_chain_never_changes_the_pinned_key() {
    let third = DomainSigner::from_seed(&[44u8; 32]).unwrap();
    let (one, two) = (signer(), signer2());
    let forged: Vec<Vec<(&DomainSigner, SigningKey)>> = vec![
        // signed by the key it introduces, not by the pinned key
        vec![(&two, key_of(&two, 2))],
        // a first good link, then one not signed by the key before it
        vec![(&one, key_of(&two, 2)), (&third, key_of(&third, 3))],
    ];
    for (i, links) in forged.into_iter().enumerate() {
        let mut h = harness();
        h.up(&one_state(4, 1));
        let e = h.call(body(&third, &one_state(5, 2)));
        assert_eq!(chain_fetches(&e), 1, "case {i}");
        let e = h.call(chain(links));
        assert!(saved_keys(&e).is_empty(), "case {i}: {e:?}");
        assert_eq!(
            h.core.report(&[], h.now).domain_key.public_key,
            signer().public_key_b64(),
            "case {i}"
        );
        // The node keeps working with its pinned key.
        let e = h.call(body(&signer(), &one_state(6, 3)));
        assert_eq!(applies(&e), vec![3], "case {i}: {e:?}");
    }
    // A chain for another Domain.
    let mut h = harness();
    h.up(&one_state(4, 1));
    h.call(body(&third, &one_state(5, 2)));
    let other = Uuid::parse_str("019a0816-0000-7000-8000-0000000000ff").unwrap();
    let e = h.call(CallResult::SigningKeys(Ok(SigningKeyChain {
        transitions: vec![KeyTransition::sign(&signer(), other, key_of(&third, 2))],
    })));
    assert!(saved_keys(&e).is_empty(), "{e:?}");
    // A chain that ends at the pinned key: nothing to adopt.
    let e = h.call(CallResult::SigningKeys(Ok(SigningKeyChain {
        transitions: vec![],
    })));
    assert!(saved_keys(&e).is_empty(), "{e:?}");
}
