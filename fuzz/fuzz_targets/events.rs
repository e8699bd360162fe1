//! Events from the SSE stream: the frame's `id:` and its `data:` (a signed envelope of a
//! per-node event, or of a Domain event). As for the state: raw frames are refused unless
//! signed; signed made-up payloads go through the decoder (as either kind); an accepted event
//! is ours and its seq equals the frame id.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plexsphere_fuzz::{NODE, acceptor, envelope, split_at_marker};
use plexsphere_wire::domain_event::{DomainEnvelope, EventData};
use plexsphere_wire::signed::SignContext;

fuzz_target!(|data: &[u8]| {
    let acceptor = acceptor();
    let (id, payload) = split_at_marker(data);
    let id = String::from_utf8_lossy(id);
    let frame_id = (!id.is_empty()).then_some(id.as_ref());

    let raw = String::from_utf8_lossy(payload);
    if let Ok((event, _)) = acceptor.event(frame_id, &raw) {
        panic!("accepted an unsigned event: seq {}", event.seq);
    }

    let node = EventData::Node(envelope(SignContext::Event, payload));
    let domain = EventData::Domain(DomainEnvelope {
        domain_event: envelope(SignContext::DomainEvent, payload),
    });
    for signed in [node, domain] {
        let Ok(data) = serde_json::to_string(&signed) else {
            return;
        };
        if let Ok((event, _)) = acceptor.event(frame_id, &data) {
            assert_eq!(event.node_id, NODE);
            assert_eq!(
                frame_id.map(|s| s.trim().parse::<u64>().ok()),
                Some(Some(event.seq))
            );
        }
    }
});
