#![allow(clippy::unwrap_used)] // test code

use std::net::SocketAddr;

use super::disco::{Message, Opened, PairKey, new_tx, next_stamp, sender};
use super::relay::{Frame, MAX_REASON, RefuseCode, proof, proof_matches};
use super::*;

fn keypair(seed: u8) -> ([u8; 32], PublicKey) {
    let secret = [seed; 32];
    (secret, public_key(&secret))
}

#[test]
fn kinds_are_told_apart_by_their_first_bytes() {
    let mut wg = vec![1, 0, 0, 0];
    wg.resize(148, 7);
    assert_eq!(classify(&wg), Kind::WireGuard);
    assert_eq!(classify(&[4, 0, 0, 0, 9, 9]), Kind::WireGuard);
    let mut stun = vec![0x00, 0x01, 0x00, 0x00];
    stun.extend_from_slice(&STUN_COOKIE);
    stun.extend_from_slice(&[0; 12]);
    assert_eq!(classify(&stun), Kind::Stun);
    // A binding success response starts 0x01 0x01: not a WireGuard type-1 message.
    stun[0] = 0x01;
    stun[1] = 0x01;
    assert_eq!(classify(&stun), Kind::Stun);
    assert_eq!(classify(b"pxd\x02rest"), Kind::Disco);
    // An older (or newer) disco version is still disco, so it is refused by name.
    assert_eq!(classify(b"pxd\x01rest"), Kind::Disco);
    assert_eq!(classify(b"pxr\x01rest"), Kind::Relay);
    assert_eq!(classify(&[5, 0, 0, 0]), Kind::Unknown);
    assert_eq!(classify(&[1, 0, 0]), Kind::Unknown);
    assert_eq!(classify(&[]), Kind::Unknown);
}

#[test]
fn both_sides_of_a_pair_derive_one_disco_key() {
    let (a_sk, a_pk) = keypair(1);
    let (b_sk, b_pk) = keypair(2);
    assert_eq!(shared_secret(&a_sk, &b_pk), shared_secret(&b_sk, &a_pk));
    let a = PairKey::new(&shared_secret(&a_sk, &b_pk));
    let b = PairKey::new(&shared_secret(&b_sk, &a_pk));
    let observed: SocketAddr = "[2001:db8::1]:51820".parse().unwrap();
    for m in [
        Message::Ping { tx: new_tx() },
        Message::Pong {
            tx: new_tx(),
            observed,
        },
        Message::CallMeMaybe {
            addrs: vec!["198.51.100.7:51820".parse().unwrap(), observed],
        },
    ] {
        let stamp = 1_764_963_000_123_456;
        let sealed = a.seal(&a_pk, stamp, &m);
        assert_eq!(&sealed[..4], b"pxd\x02");
        assert_eq!(classify(&sealed), Kind::Disco);
        assert_eq!(sender(&sealed).unwrap(), a_pk);
        assert_eq!(b.open(&sealed).unwrap(), Opened { stamp, message: m });
    }
}

#[test]
fn a_message_sealed_with_a_given_nonce_opens_and_carries_that_nonce() {
    use super::disco::{HEADER, NONCE};
    let (a_sk, a_pk) = keypair(1);
    let (b_sk, b_pk) = keypair(2);
    let a = PairKey::new(&shared_secret(&a_sk, &b_pk));
    let b = PairKey::new(&shared_secret(&b_sk, &a_pk));
    let nonce = [0x5a; NONCE];
    let message = Message::Ping { tx: [7; 12] };
    let sealed = a.seal_with_nonce(&a_pk, 42, &message, nonce);
    assert_eq!(
        &sealed[HEADER - NONCE..HEADER],
        &nonce,
        "the nonce in the header"
    );
    assert_eq!(
        b.open(&sealed).unwrap(),
        Opened {
            stamp: 42,
            message: message.clone()
        }
    );
    // The same nonce and message seal to the same bytes; another nonce to others that open
    // all the same.
    assert_eq!(a.seal_with_nonce(&a_pk, 42, &message, nonce), sealed);
    let other = a.seal_with_nonce(&a_pk, 42, &message, [0xa5; NONCE]);
    assert_ne!(other, sealed);
    assert_eq!(b.open(&other).unwrap().message, message);
}

#[test]
fn stamps_grow_strictly_and_version_1_is_refused_by_name() {
    assert_eq!(next_stamp(0, 5), 5);
    assert_eq!(next_stamp(5, 5), 6, "the clock did not move: one more");
    assert_eq!(
        next_stamp(9, 3),
        10,
        "the clock stepped back: still one more"
    );
    let (a_sk, a_pk) = keypair(1);
    let (_, b_pk) = keypair(2);
    let a = PairKey::new(&shared_secret(&a_sk, &b_pk));
    let mut old = a.seal(&a_pk, 1, &Message::Ping { tx: new_tx() });
    old[3] = 1;
    assert_eq!(sender(&old), Err(DecodeError::Version(1)));
    assert_eq!(a.open(&old), Err(DecodeError::Version(1)));
    assert!(
        DecodeError::Version(1)
            .to_string()
            .contains("upgrade the sender's plexd")
    );
}

#[test]
fn a_disco_message_from_outside_the_pair_or_altered_is_refused() {
    let (a_sk, a_pk) = keypair(1);
    let (_, b_pk) = keypair(2);
    let (c_sk, _) = keypair(3);
    let a = PairKey::new(&shared_secret(&a_sk, &b_pk));
    let stranger = PairKey::new(&shared_secret(&c_sk, &b_pk));
    let sealed = stranger.seal(&a_pk, 7, &Message::Ping { tx: new_tx() });
    // The stranger claims to be A, but cannot know A's pair key with B.
    let b_view = PairKey::new(&shared_secret(&[2; 32], &a_pk));
    assert_eq!(b_view.open(&sealed), Err(DecodeError::Unauthentic));
    let mut good = a.seal(&a_pk, 7, &Message::Ping { tx: new_tx() });
    assert!(b_view.open(&good).is_ok());
    let last = good.len() - 1;
    good[last] ^= 1;
    assert_eq!(b_view.open(&good), Err(DecodeError::Unauthentic));
    // A changed sender key in the header is caught too (it is authenticated data).
    let mut relabeled = a.seal(&a_pk, 7, &Message::Ping { tx: new_tx() });
    relabeled[5] ^= 1;
    assert_eq!(b_view.open(&relabeled), Err(DecodeError::Unauthentic));
    assert!(matches!(
        b_view.open(&good[..20]),
        Err(DecodeError::Short(_))
    ));
}

#[test]
fn relay_frames_round_trip_over_udp_and_tcp() {
    let frames = [
        Frame::Hello {
            node: PublicKey([1; 32]),
        },
        Frame::Challenge { cookie: [2; 32] },
        Frame::Register {
            node: PublicKey([1; 32]),
            cookie: [2; 32],
            proof: [3; 32],
            token: b"{\"payload\":\"x\"}".to_vec(),
        },
        Frame::Registered { lease_secs: 60 },
        Frame::Send {
            dst: [4; 8],
            payload: vec![4, 0, 0, 0, 1, 2, 3],
        },
        Frame::Recv {
            src: [5; 8],
            payload: vec![],
        },
        Frame::Refused {
            code: RefuseCode::Expired,
            reason: "token expired".into(),
        },
        Frame::PeerGone { dst: [6; 8] },
        Frame::Ping { nonce: [7; 8] },
        Frame::Pong { nonce: [8; 8] },
        Frame::Sealed {
            counter: 9,
            body: vec![10, 1, 2, 3, 4, 5, 6, 7, 8],
            tag: [9; 16],
        },
    ];
    for f in frames {
        let d = f.to_datagram();
        assert_eq!(classify(&d), Kind::Relay);
        assert_eq!(Frame::from_datagram(&d).unwrap(), f);
        let s = f.to_stream();
        let len = usize::from(u16::from_be_bytes([s[0], s[1]]));
        assert_eq!(len, s.len() - 2);
        assert_eq!(Frame::decode(&s[2..]).unwrap(), f);
    }
}

#[test]
fn malformed_relay_frames_are_errors_not_panics() {
    assert!(Frame::decode(&[]).is_err());
    assert_eq!(Frame::decode(&[99]), Err(DecodeError::Type(99)));
    assert!(Frame::decode(&[1, 0, 0]).is_err());
    let mut hello = Frame::Hello {
        node: PublicKey([1; 32]),
    }
    .encode();
    hello.push(0);
    assert_eq!(
        Frame::decode(&hello),
        Err(DecodeError::Field("trailing bytes"))
    );
    let mut big = vec![3];
    big.extend_from_slice(&[0; 96]);
    big.extend_from_slice(&[b'x'; 5000]);
    assert!(Frame::decode(&big).is_err());
    assert_eq!(
        Frame::from_datagram(b"pxd\x01\x01"),
        Err(DecodeError::Magic)
    );
}

#[test]
fn a_registration_proof_needs_the_node_private_key() {
    let (node_sk, node_pk) = keypair(9);
    let (relay_sk, relay_pk) = keypair(10);
    let cookie = [42; 32];
    let p = proof(&shared_secret(&node_sk, &relay_pk), &cookie, &node_pk);
    let relay_side = shared_secret(&relay_sk, &node_pk);
    assert!(proof_matches(&relay_side, &cookie, &node_pk, &p));
    assert!(!proof_matches(&relay_side, &[43; 32], &node_pk, &p));
    let (other_sk, _) = keypair(11);
    let forged = proof(&shared_secret(&other_sk, &relay_pk), &cookie, &node_pk);
    assert!(!proof_matches(&relay_side, &cookie, &node_pk, &forged));
}

#[test]
fn a_relayed_datagram_of_a_1420_byte_tunnel_fits_a_1500_byte_ipv4_underlay() {
    // 1420 bytes of inner packet + 32 bytes of WireGuard data message = 1452.
    let wireguard = vec![4u8; 1452];
    let d = Frame::Send {
        dst: relay::prefix(&PublicKey([9; 32])),
        payload: wireguard.clone(),
    }
    .to_datagram();
    assert_eq!(d.len(), relay::UDP_DATA_HEAD + 1452);
    // 1500 - 20 (IPv4) - 8 (UDP) = 1472 bytes of UDP payload without fragmentation.
    assert!(d.len() <= 1472, "{} bytes", d.len());
    let back = Frame::Recv {
        src: relay::prefix(&PublicKey([8; 32])),
        payload: wireguard,
    }
    .to_datagram();
    assert_eq!(
        back.len(),
        d.len(),
        "the relay rewrites send into recv in place"
    );
}

/// Found by the `reach_frames` fuzz target: a refusal whose reason is invalid UTF-8 decoded to
/// a longer text (each bad byte becomes a three-byte U+FFFD), past MAX_REASON, so decoding what
/// it encodes gave another frame.
#[test]
fn a_refusal_with_invalid_utf8_decodes_within_the_bound_and_round_trips() {
    let mut bytes = vec![7, 208];
    bytes.extend(std::iter::repeat_n(0xff, MAX_REASON + 40));
    let Frame::Refused { reason, .. } = Frame::decode(&bytes).unwrap() else {
        panic!("not a refusal");
    };
    assert!(reason.len() <= MAX_REASON, "{} bytes", reason.len());
    let frame = Frame::decode(&bytes).unwrap();
    assert_eq!(Frame::decode(&frame.encode()).unwrap(), frame);
}

#[test]
fn sealed_frames_open_only_under_the_pairs_key_and_unaltered() {
    use super::relay::{FrameKey, sealed_proof, sealed_proof_matches};
    let (node_sk, node_pk) = keypair(1);
    let (relay_sk, relay_pk) = keypair(2);
    let node_side = FrameKey::new(&shared_secret(&node_sk, &relay_pk));
    let relay_side = FrameKey::new(&shared_secret(&relay_sk, &node_pk));
    let inner = Frame::Refused {
        code: RefuseCode::Busy,
        reason: "busy".into(),
    };
    let sealed = relay_side.seal(7, &inner);
    // Over UDP and TCP it decodes to itself, and opens to the inner frame.
    assert_eq!(Frame::from_datagram(&sealed.to_datagram()).unwrap(), sealed);
    let Frame::Sealed { counter, body, tag } = sealed.clone() else {
        panic!("{sealed:?}")
    };
    assert_eq!(node_side.open(counter, &body, &tag).unwrap(), inner);
    // Another counter, another body, another key: unauthentic.
    assert_eq!(
        node_side.open(counter + 1, &body, &tag),
        Err(DecodeError::Unauthentic)
    );
    let mut altered = body.clone();
    altered[1] = 1;
    assert_eq!(
        node_side.open(counter, &altered, &tag),
        Err(DecodeError::Unauthentic)
    );
    let (_, other_pk) = keypair(3);
    let stranger = FrameKey::new(&shared_secret(&relay_sk, &other_pk));
    assert_eq!(
        stranger.open(counter, &body, &tag),
        Err(DecodeError::Unauthentic)
    );
    // Only the four relay answers go inside.
    let Frame::Sealed { counter, body, tag } = relay_side.seal(8, &Frame::Hello { node: node_pk })
    else {
        panic!()
    };
    assert!(node_side.open(counter, &body, &tag).is_err());
    // The sealed proof is not the plain one, and needs the node's private key.
    let shared = shared_secret(&node_sk, &relay_pk);
    let p = sealed_proof(&shared, &[5; 32], &node_pk);
    assert_ne!(p, proof(&shared, &[5; 32], &node_pk));
    assert!(sealed_proof_matches(
        &shared_secret(&relay_sk, &node_pk),
        &[5; 32],
        &node_pk,
        &p
    ));
    assert!(!sealed_proof_matches(
        &shared_secret(&relay_sk, &other_pk),
        &[5; 32],
        &node_pk,
        &p
    ));
}

/// The allocation-free head and parse agree with the frame codec byte for byte.
#[test]
fn send_heads_and_recv_parses_match_the_frame_codec() {
    use super::relay::{UDP_DATA_HEAD, parse_recv, write_send_head};
    let payload = vec![4u8, 0, 0, 0, 9, 9, 9];
    let mut head = [0u8; UDP_DATA_HEAD];
    write_send_head(&mut head, &[7; 8]);
    let mut framed = head.to_vec();
    framed.extend_from_slice(&payload);
    let send = Frame::Send {
        dst: [7; 8],
        payload: payload.clone(),
    };
    assert_eq!(framed, send.to_datagram());

    let recv = Frame::Recv {
        src: [3; 8],
        payload: payload.clone(),
    }
    .to_datagram();
    assert_eq!(parse_recv(&recv), Some(([3; 8], &payload[..])));
    assert_eq!(
        parse_recv(&send.to_datagram()),
        None,
        "a send is not a recv"
    );
    assert_eq!(parse_recv(&recv[..UDP_DATA_HEAD - 1]), None, "too short");
    let mut other_magic = recv.clone();
    other_magic[3] ^= 1;
    assert_eq!(parse_recv(&other_magic), None);
    assert_eq!(
        parse_recv(&recv[..UDP_DATA_HEAD]),
        Some(([3; 8], &[][..])),
        "an empty recv parses as the codec decodes it"
    );
}

/// The stream forms agree with the frame codec byte for byte, and refuse what it refuses.
#[test]
fn stream_sends_and_recv_parses_match_the_frame_codec() {
    use super::relay::{MAX_PAYLOAD, MAX_STREAM_PAYLOAD, parse_stream_recv, write_stream_send};
    let payload = vec![4u8, 0, 0, 0, 9, 9, 9];
    let mut out = vec![0xAA];
    assert!(write_stream_send(&mut out, &[7; 8], &payload));
    let send = Frame::Send {
        dst: [7; 8],
        payload: payload.clone(),
    };
    assert_eq!(
        out[1..],
        send.to_stream()[..],
        "appended after what was there"
    );
    let mut untouched = Vec::new();
    let longest = vec![0u8; MAX_STREAM_PAYLOAD];
    assert!(write_stream_send(&mut untouched, &[7; 8], &longest));
    assert_eq!(untouched.len() - 2, super::relay::MAX_STREAM_FRAME);
    untouched.clear();
    assert!(!write_stream_send(
        &mut untouched,
        &[7; 8],
        &[0; MAX_STREAM_PAYLOAD + 1]
    ));
    assert!(
        untouched.is_empty(),
        "a relay would close the connection on it"
    );
    let long = vec![0u8; MAX_PAYLOAD + 1];

    let recv = Frame::Recv {
        src: [3; 8],
        payload: payload.clone(),
    }
    .to_stream();
    assert_eq!(parse_stream_recv(&recv[2..]), Some(([3; 8], &payload[..])));
    assert_eq!(
        parse_stream_recv(&send.to_stream()[2..]),
        None,
        "a send is not a recv"
    );
    assert_eq!(parse_stream_recv(&recv[2..9]), None, "too short");
    let mut too_long = vec![super::relay::RECV];
    too_long.extend_from_slice(&[3; 8]);
    too_long.extend_from_slice(&long);
    assert_eq!(parse_stream_recv(&too_long), None);
    assert!(
        Frame::decode(&too_long).is_err(),
        "the codec refuses it too"
    );
}
