//! The signed state document (`GET /state` bodies and the on-disk cache). Two ways in: the raw
//! body, which must be refused unless it carries a valid signature; and a payload the fuzzer
//! makes up, signed with the Domain key, so the decoder and checks behind the signature run on
//! arbitrary JSON. Nothing panics, and whatever is accepted is addressed to this node and not
//! older than the applied version.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plexsphere_fuzz::{NODE, acceptor, envelope, split_at_marker};
use plexsphere_wire::signed::SignContext;

fuzz_target!(|data: &[u8]| {
    let acceptor = acceptor();
    let (head, payload) = split_at_marker(data);
    let applied = head
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()));

    // Raw: an unsigned or badly signed body is never accepted.
    if let Ok((state, _, _)) = acceptor.state_json(data, None) {
        panic!("accepted an unsigned state: version {}", state.version);
    }

    // Signed: the fuzzer's payload behind a valid signature.
    let env = envelope(SignContext::NodeState, payload);
    if let Ok(state) = acceptor.state(&env, applied) {
        assert_eq!(state.node_id, NODE);
        if let Some(applied) = applied {
            assert!(state.version >= applied);
        }
    }
    // The same payload signed for another context is refused.
    let env = envelope(SignContext::Event, payload);
    assert!(acceptor.state(&env, None).is_err());
});
