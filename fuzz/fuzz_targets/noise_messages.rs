//! plexd's own WireGuard state machine (`plexd_dataplane::noise`) with a session up, fed any
//! sequence of datagrams and clock steps: never a panic, and nothing that was not sealed with
//! the session's key is ever delivered to the host. Each input is cut into messages by a
//! length byte; a message's first byte picks the message type, so every parser is reached.
#![no_main]

use std::sync::Arc;
use std::time::{Duration, Instant};

use boringtun::noise::rate_limiter::RateLimiter;
use boringtun::x25519::{PublicKey, StaticSecret};
use libfuzzer_sys::fuzz_target;
use plexd_dataplane::noise::{Output, Tunnel};
use plexsphere_wire::clock::Now;

fn tunnel(own: u8, peer: u8, limit: u64) -> Tunnel {
    let sk = StaticSecret::from([own; 32]);
    let pk = PublicKey::from(&sk);
    let peer_pk = PublicKey::from(&StaticSecret::from([peer; 32])).to_bytes();
    Tunnel::new(
        sk,
        peer_pk,
        None,
        u32::from(own),
        Arc::new(RateLimiter::new(&pk, limit)),
        Box::new(rand_core::OsRng),
        Now::system(),
    )
}

fuzz_target!(|data: &[u8]| {
    let t0 = Instant::now();
    let (mut a, mut b) = (tunnel(1, 2, 100), tunnel(2, 1, 100));
    let mut buf = vec![0u8; 2048];
    let Ok(Output::Network(n)) = a.encapsulate(t0, &[], &mut buf) else {
        return;
    };
    let init = buf[..n].to_vec();
    let Ok(Output::Network(n)) = b.decapsulate(t0, None, &init, &mut buf) else {
        return;
    };
    let resp = buf[..n].to_vec();
    let Ok(Output::Network(n)) = a.decapsulate(t0, None, &resp, &mut buf) else {
        return;
    };
    let keepalive = buf[..n].to_vec();
    assert!(matches!(
        b.decapsulate(t0, None, &keepalive, &mut buf),
        Ok(Output::Done)
    ));
    let mut now = t0;
    let mut rest = data;
    while let Some((&len, tail)) = rest.split_first() {
        let take = usize::from(len).min(tail.len());
        let (msg, tail) = tail.split_at(take);
        rest = tail;
        let mut m = msg.to_vec();
        if let Some(t) = m.first_mut() {
            // Types 1 to 4 mostly, anything else sometimes.
            *t = match *t % 8 {
                k @ 1..=4 => k,
                _ => *t,
            };
            if m.len() >= 8 && m[0] > 1 {
                // Aim at b's indices (top 24 bits: b's peer index 2).
                let index = (2u32 << 8) | u32::from(m[4] % 4);
                m[4..8].copy_from_slice(&index.to_le_bytes());
            }
        }
        now += Duration::from_millis(u64::from(len) * 7);
        for (who, t) in [("b", &mut b), ("a", &mut a)] {
            match t.decapsulate(now, None, &m, &mut buf) {
                Ok(Output::Tunnel(..)) => panic!("{who} delivered a packet nobody sealed"),
                Ok(Output::Network(n)) => assert!(n <= buf.len()),
                _ => {}
            }
            let _ = t.update_timers(now, &mut buf);
        }
    }
});
