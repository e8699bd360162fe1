use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use super::*;

fn spec(n: u32) -> PeerSpec {
    let b = n.to_be_bytes();
    let mut key = [0u8; 32];
    key[..4].copy_from_slice(&b);
    key[31] = 1;
    PeerSpec {
        node_id: Uuid::from_u128(u128::from(n)),
        hostname: format!("node-{n}"),
        public_key: STANDARD.encode(key),
        mesh_ip: std::net::IpAddr::from([10, 64, b[2], b[3]]),
        allowed_ips: vec![format!("10.64.{}.{}/32", b[2], b[3]).parse().unwrap()],
        endpoints: vec![SocketAddr::from(([192, 0, b[2], b[3]], 51820))],
        persistent_keepalive_secs: None,
        home_relay: None,
        dns_name: None,
    }
}

/// The live peer that applying `s` produces, with a fresh handshake.
fn live_of(s: &PeerSpec, wall: SystemTime) -> LiveConfig {
    LiveConfig {
        key: PublicKey::from_base64(&s.public_key).unwrap(),
        endpoint: s.endpoints.first().copied(),
        allowed_ips: s.allowed_ips.clone(),
        keepalive: s.persistent_keepalive_secs.unwrap_or(0),
        last_handshake: Some(wall),
        rx_bytes: 1,
        tx_bytes: 1,
    }
}

fn key(s: &PeerSpec) -> PublicKey {
    PublicKey::from_base64(&s.public_key).unwrap()
}

fn clock() -> (Instant, SystemTime) {
    (
        Instant::now(),
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
    )
}

#[test]
fn no_change_is_an_empty_update() {
    let (now, wall) = clock();
    let desired = vec![spec(1), spec(2)];
    let live: Vec<_> = desired.iter().map(|s| live_of(s, wall)).collect();
    let d = diff(&desired, &live, &mut EndpointBook::new(), now, wall);
    assert!(d.update.is_empty(), "{d:?}");
    assert!(d.changes.is_empty());
    assert!(diff(&[], &[], &mut EndpointBook::new(), now, wall) == PeerDiff::default());
}

#[test]
fn adds_removes_and_updates_only_what_changed() {
    let (now, wall) = clock();
    let mut book = EndpointBook::new();
    let (a, b, c) = (spec(1), spec(2), spec(3));
    let mut b2 = b.clone();
    b2.allowed_ips.push("10.99.0.0/16".parse().unwrap());
    b2.persistent_keepalive_secs = Some(25);
    let live = vec![live_of(&a, wall), live_of(&b, wall)];
    let d = diff(&[b2.clone(), c.clone()], &live, &mut book, now, wall);
    assert_eq!(
        d.update.ops,
        vec![
            PeerOp::Remove(key(&a)),
            PeerOp::Set {
                key: key(&b),
                endpoint: None,
                allowed_ips: Some(normalize(&b2.allowed_ips)),
                keepalive: Some(25),
            },
            PeerOp::Set {
                key: key(&c),
                endpoint: c.endpoints.first().copied(),
                allowed_ips: Some(c.allowed_ips.clone()),
                keepalive: None,
            },
        ]
    );
    assert_eq!(
        d.changes,
        vec![
            MeshChange::Removed { key: key(&a) },
            MeshChange::AllowedIpsChanged {
                key: key(&b),
                from: b.allowed_ips.clone(),
                to: normalize(&b2.allowed_ips),
            },
            MeshChange::KeepaliveChanged {
                key: key(&b),
                from: 0,
                to: 25
            },
            MeshChange::Added {
                key: key(&c),
                node_id: c.node_id,
                endpoint: c.endpoints.first().copied(),
            },
        ]
    );
    // Keepalive back off: Some(0) turns it off on the interface.
    let mut live_b = live_of(&b2, wall);
    live_b.allowed_ips = normalize(&b2.allowed_ips);
    let d = diff(std::slice::from_ref(&b), &[live_b], &mut book, now, wall);
    assert!(d.update.ops.iter().any(|op| matches!(
        op,
        PeerOp::Set {
            keepalive: Some(0),
            ..
        }
    )));
}

#[test]
fn allowed_ips_compare_as_sets_with_host_bits_cleared() {
    let (now, wall) = clock();
    let mut s = spec(1);
    s.allowed_ips = vec![
        "10.70.0.0/16".parse().unwrap(),
        "10.64.0.1/32".parse().unwrap(),
    ];
    let mut l = live_of(&s, wall);
    l.allowed_ips = vec![
        "10.64.0.1/32".parse().unwrap(),
        "10.70.0.0/16".parse().unwrap(),
    ];
    assert!(
        diff(
            &[s.clone()],
            &[l.clone()],
            &mut EndpointBook::new(),
            now,
            wall
        )
        .update
        .is_empty()
    );
    s.allowed_ips.push("10.70.3.4/16".parse().unwrap());
    assert!(
        diff(&[s], &[l], &mut EndpointBook::new(), now, wall)
            .update
            .is_empty()
    );
}

#[test]
fn endpoints_follow_the_rotation_and_respect_roaming() {
    let (now, wall) = clock();
    let mut book = EndpointBook::new();
    let mut s = spec(1);
    s.endpoints.push("198.51.100.1:51820".parse().unwrap());
    // A live peer without a handshake on an old endpoint: the best candidate is written.
    let mut l = live_of(&s, wall);
    l.last_handshake = None;
    l.endpoint = Some("203.0.113.9:1".parse().unwrap());
    let d = diff(&[s.clone()], &[l.clone()], &mut book, now, wall);
    assert_eq!(
        d.changes,
        vec![MeshChange::EndpointChanged {
            key: key(&s),
            from: l.endpoint,
            to: s.endpoints[0],
        }]
    );
    // The same roamed endpoint with a fresh handshake: left alone.
    l.last_handshake = Some(wall);
    assert!(
        diff(&[s.clone()], &[l.clone()], &mut book, now, wall)
            .update
            .is_empty()
    );
    // No handshake 15 s after the first candidate was set: the second one.
    l.last_handshake = None;
    l.endpoint = Some(s.endpoints[0]);
    let later = now + super::super::endpoints::TRY_FOR;
    let d = diff(&[s.clone()], &[l], &mut book, later, wall);
    assert_eq!(
        d.update.ops,
        vec![PeerOp::Set {
            key: key(&s),
            endpoint: Some(s.endpoints[1]),
            allowed_ips: None,
            keepalive: None,
        }]
    );
    // A removed peer's rotation is forgotten.
    diff(&[], &[], &mut book, later, wall);
    assert!(book.is_empty());
}

#[test]
fn bad_and_duplicate_keys_are_skipped_with_a_reason() {
    let (now, wall) = clock();
    let mut bad = spec(1);
    bad.public_key = "not a key".into();
    let mut dup = spec(3);
    dup.public_key = spec(2).public_key;
    let d = diff(
        &[bad, spec(2), dup],
        &[],
        &mut EndpointBook::new(),
        now,
        wall,
    );
    assert_eq!(d.update.ops.len(), 1);
    let skipped: Vec<_> = d
        .changes
        .iter()
        .filter_map(|c| match c {
            MeshChange::Skipped { node_id, reason } => Some((*node_id, reason.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(skipped.len(), 2);
    assert_eq!(skipped[0].0, Uuid::from_u128(1));
    assert!(skipped[1].1.contains("another desired peer"), "{skipped:?}");
}

#[test]
fn ten_thousand_peers() {
    let (now, wall) = clock();
    let mut book = EndpointBook::new();
    let desired: Vec<PeerSpec> = (0..10_000).map(spec).collect();
    // From empty: 10k additions.
    let d = diff(&desired, &[], &mut book, now, wall);
    assert_eq!(d.update.ops.len(), 10_000);
    assert_eq!(book.len(), 10_000);
    // Applied: nothing to do.
    let mut live: Vec<LiveConfig> = desired.iter().map(|s| live_of(s, wall)).collect();
    assert!(
        diff(&desired, &live, &mut book, now, wall)
            .update
            .is_empty()
    );
    // One peer's endpoint report changes and one peer leaves: exactly two operations.
    let mut changed = desired.clone();
    changed[4242].endpoints = vec!["198.51.100.77:51820".parse().unwrap()];
    changed.remove(9000);
    live[4242].last_handshake = None;
    let d = diff(&changed, &live, &mut book, now, wall);
    assert_eq!(
        d.update.ops,
        vec![
            PeerOp::Remove(key(&desired[9000])),
            PeerOp::Set {
                key: key(&desired[4242]),
                endpoint: Some("198.51.100.77:51820".parse().unwrap()),
                allowed_ips: None,
                keepalive: None,
            },
        ]
    );
    assert_eq!(book.len(), 9_999);
}

#[test]
fn keys_round_trip_and_print_as_base64() {
    let k = PublicKey([9; 32]);
    assert_eq!(PublicKey::from_base64(&k.to_base64()), Ok(k));
    assert_eq!(format!("{k:?}"), format!("PublicKey({k})"));
    assert!(PublicKey::from_base64("AAAA").is_err());
}

/// Reach owns the peers in the map (with where it carries them now); the rest rotate.
struct ReachOwns(std::collections::HashMap<PublicKey, Option<SocketAddr>>);

impl EndpointOwners for ReachOwns {
    fn owner(&self, key: &PublicKey) -> Owner {
        match self.0.get(key) {
            Some(endpoint) => Owner::Reach {
                endpoint: *endpoint,
            },
            None => Owner::Rotation,
        }
    }
}

#[test]
fn endpoints_reach_owns_are_left_to_reach_except_when_a_peer_is_added() {
    let (now, wall) = clock();
    let mut book = EndpointBook::new();
    let (a, b, c) = (spec(1), spec(2), spec(3));
    let forwarder: SocketAddr = "127.0.0.1:40001".parse().unwrap();
    let owners = ReachOwns(
        [(key(&a), Some(forwarder)), (key(&b), None)]
            .into_iter()
            .collect(),
    );
    // Added: a where reach carries it, b (reach has not decided) at its first candidate, c
    // (not reach's) by the rotation.
    let d = diff_with(
        &[a.clone(), b.clone(), c.clone()],
        &[],
        &mut book,
        &owners,
        now,
        wall,
    );
    let endpoints: Vec<_> = d
        .update
        .ops
        .iter()
        .map(|op| match op {
            PeerOp::Set { endpoint, .. } => *endpoint,
            PeerOp::Remove(_) => None,
        })
        .collect();
    assert_eq!(
        endpoints,
        vec![
            Some(forwarder),
            b.endpoints.first().copied(),
            c.endpoints.first().copied()
        ]
    );
    assert_eq!(book.len(), 1, "only c rotates");
    // Live, idle (stale handshakes), at addresses no candidate names: the rotation would
    // write a candidate back for every one of them; reach's are left alone.
    let roamed: SocketAddr = "203.0.113.9:40000".parse().unwrap();
    let live: Vec<LiveConfig> = [&a, &b, &c]
        .iter()
        .map(|s| LiveConfig {
            endpoint: Some(roamed),
            last_handshake: None,
            ..live_of(s, wall)
        })
        .collect();
    let d = diff_with(
        &[a.clone(), b.clone(), c.clone()],
        &live,
        &mut book,
        &owners,
        now,
        wall,
    );
    assert_eq!(
        d.update.ops,
        vec![PeerOp::Set {
            key: key(&c),
            endpoint: c.endpoints.first().copied(),
            allowed_ips: None,
            keepalive: None,
        }]
    );
    // Without owners the same pass rewrites all three.
    let d = diff(&[a, b, c], &live, &mut EndpointBook::new(), now, wall);
    assert_eq!(d.update.ops.len(), 3);
}
