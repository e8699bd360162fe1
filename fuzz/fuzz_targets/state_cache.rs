//! plexd's on-disk cache (`<state_dir>/state.json`: a signed state plus the signed events
//! applied on top). Raw bytes are never accepted (nothing in them is signed by the Domain key);
//! a cache built from made-up payloads behind valid signatures either loads with its events in
//! order and its position not below the state's version, or is refused.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plexd::daemon::cache::decode;
use plexsphere_fuzz::{acceptor, envelope};
use plexsphere_wire::signed::SignContext;

fuzz_target!(|data: &[u8]| {
    let acceptor = acceptor();
    assert!(
        decode(data, &acceptor).is_err(),
        "accepted an unsigned cache"
    );

    // Parts split at 0xff: the state's payload, then each event's payload; the first byte of
    // an event part is its frame id.
    let mut parts = data.split(|&b| b == 0xff);
    let state = envelope(SignContext::NodeState, parts.next().unwrap_or_default());
    let events: Vec<serde_json::Value> = parts
        .take(16)
        .map(|p| {
            let (id, payload) = p.split_first().map_or((0, &[][..]), |(i, r)| (*i, r));
            let env = envelope(SignContext::Event, payload);
            serde_json::json!({
                "id": id,
                "data": serde_json::to_string(&env).unwrap_or_default(),
            })
        })
        .collect();
    let file = serde_json::json!({
        "version": 1,
        "state": state,
        "events": events,
        "last_seq": data.len() as u64,
    });
    let Ok(bytes) = serde_json::to_vec(&file) else {
        return;
    };
    if let Ok(cached) = decode(&bytes, &acceptor) {
        assert!(cached.last_seq >= cached.state.version);
        let mut last = cached.state.version;
        for (ev, frame) in &cached.events {
            assert!(ev.seq > last, "events out of order");
            assert_eq!(ev.seq, frame.id);
            last = ev.seq;
        }
    }
});
