//! Everything that arrives on plexd's WireGuard port besides WireGuard itself, and what relays
//! take: the classifier, relay frames (datagram and stream forms), disco probes, STUN answers
//! and relay tokens. Nothing panics; a relay frame that decodes encodes back to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plexd::reach::stun::parse_binding_response;
use plexsphere_wire::reach::classify;
use plexsphere_wire::reach::disco::{PairKey, sender};
use plexsphere_wire::reach::relay::{Frame, RelayToken};

fuzz_target!(|data: &[u8]| {
    let _ = classify(data);

    if let Ok(frame) = Frame::decode(data) {
        let again = Frame::decode(&frame.encode());
        assert_eq!(again.ok().as_ref(), Some(&frame), "decode(encode(f)) != f");
    }
    if let Ok(frame) = Frame::from_datagram(data) {
        assert_eq!(
            Frame::from_datagram(&frame.to_datagram()).ok().as_ref(),
            Some(&frame)
        );
    }

    if sender(data).is_ok() {
        let key = PairKey::new(&[7; 32]);
        let _ = key.open(data);
    }

    let _ = parse_binding_response(data);
    let _ = serde_json::from_slice::<RelayToken>(data);
});
