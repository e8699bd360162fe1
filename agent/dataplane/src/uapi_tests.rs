use std::time::{Duration, Instant, SystemTime};

use proptest::prelude::*;

use super::*;
use crate::device::Device;

const PRIV: &str = "e84b5a6d2717c1003a13b431570353dbaca9146cf150c5f8575680feba52027a";
const PEER: &str = "b85996fecc9c7f1fc6d2572a76eda11d59bcd20be8e543b15ce4bd85a8e75a33";
const PSK: &str = "188515093e952f5f22e865cef3012e72f8b5f0b598ac0309d5dacce3b70fcf52";

fn set(device: &Device, text: &str) -> Result<(), UapiError> {
    match parse_request(text.lines())? {
        Request::Set(update) => device.apply(update).map_err(|e| UapiError::Invalid {
            line: 0,
            what: e.to_string(),
        }),
        Request::Get => panic!("expected a set request"),
    }
}

#[test]
fn set_then_get_round_trips() {
    let device = Device::new(plexsphere_wire::clock::Now::system());
    let text = format!(
        "set=1\nprivate_key={PRIV}\nlisten_port=51820\nreplace_peers=true\n\
         public_key={PEER}\npreshared_key={PSK}\nendpoint=[2001:db8::1]:51820\n\
         persistent_keepalive_interval=25\nreplace_allowed_ips=true\n\
         allowed_ip=10.64.0.2/32\nallowed_ip=fd00::1/64\nallowed_ip=10.64.0.9/24\n"
    );
    set(&device, &text).expect("valid set");
    let now = Instant::now();
    let answer = format_get(&device.snapshot(now, SystemTime::now()));
    let expected = format!(
        "private_key={PRIV}\nlisten_port=51820\n\
         public_key={PEER}\npreshared_key={PSK}\nprotocol_version=1\n\
         endpoint=[2001:db8::1]:51820\nlast_handshake_time_sec=0\nlast_handshake_time_nsec=0\n\
         tx_bytes=0\nrx_bytes=0\npersistent_keepalive_interval=25\n\
         allowed_ip=10.64.0.0/24\nallowed_ip=10.64.0.2/32\nallowed_ip=fd00::/64\nerrno=0\n\n"
    );
    assert_eq!(answer, expected);

    // The answer parses back into the same configuration on a fresh device.
    let replay: String = std::iter::once("set=1")
        .chain(answer.lines().filter(|l| {
            !l.is_empty()
                && !l.starts_with("errno")
                && !l.starts_with("last_handshake")
                && !l.ends_with("_bytes=0")
        }))
        .map(|l| format!("{l}\n"))
        .collect();
    let copy = Device::new(plexsphere_wire::clock::Now::system());
    set(&copy, &replay).expect("get output is valid set input");
    assert_eq!(format_get(&copy.snapshot(now, SystemTime::now())), expected);
}

#[test]
fn remove_update_only_and_replace_allowed_ips() {
    let device = Device::new(plexsphere_wire::clock::Now::system());
    set(
        &device,
        &format!("set=1\npublic_key={PEER}\nallowed_ip=10.0.0.1/32\n"),
    )
    .expect("add");
    set(
        &device,
        &format!(
            "set=1\npublic_key={PEER}\nallowed_ip=10.0.0.2/32\nreplace_allowed_ips=true\nallowed_ip=10.0.0.3/32\n\
             public_key={PSK}\nupdate_only=true\nendpoint=192.0.2.1:1\n"
        ),
    )
    .expect("update");
    let snap = device.snapshot(Instant::now(), SystemTime::now());
    assert_eq!(snap.peers.len(), 1, "update_only did not create a peer");
    assert_eq!(
        snap.peers[0].allowed_ips,
        vec!["10.0.0.3/32".parse::<IpNet>().expect("net")]
    );
    set(&device, &format!("set=1\npublic_key={PEER}\nremove=true\n")).expect("remove");
    assert!(
        device
            .snapshot(Instant::now(), SystemTime::now())
            .peers
            .is_empty()
    );
}

#[test]
fn last_handshake_is_reported_in_wall_clock_time() {
    let device = Device::new(plexsphere_wire::clock::Now::system());
    set(&device, &format!("set=1\npublic_key={PEER}\n")).expect("add");
    let key = PublicKey::from_hex(PEER).expect("key");
    let t0 = Instant::now();
    device.peer(&key).expect("peer").lock().last_handshake = Some(t0);
    let wall = UNIX_EPOCH + Duration::from_secs(1_700_000_100);
    let snap = device.snapshot(t0 + Duration::from_millis(100_250), wall);
    let answer = format_get(&snap);
    assert!(
        answer.contains("last_handshake_time_sec=1699999999\n"),
        "{answer}"
    );
    assert!(
        answer.contains("last_handshake_time_nsec=750000000\n"),
        "{answer}"
    );
}

#[test]
fn malformed_requests_answer_the_errno_wireguard_go_answers() {
    let cases: &[(&str, i32)] = &[
        ("set=1\nbogus=1", -EINVAL),
        ("set=1\nlisten_port=abc", -EINVAL),
        ("set=1\nlisten_port=65536", -EINVAL),
        ("set=1\nprivate_key=zz", -EINVAL),
        ("set=1\nendpoint=1.2.3.4:5", -EINVAL),
        ("set=1\nnoequals", -EPROTO),
        ("set=1\nprotocol_version=2", -EINVAL),
        (
            &format!("set=1\npublic_key={PEER}\nprotocol_version=2"),
            -EINVAL,
        ),
        (
            &format!("set=1\npublic_key={PEER}\nallowed_ip=10.0.0.1"),
            -EINVAL,
        ),
        (
            &format!("set=1\npublic_key={PEER}\nendpoint=host:1"),
            -EINVAL,
        ),
        (&format!("set=1\npublic_key={PEER}\nlisten_port=1"), -EINVAL),
        ("set=1\npublic_key=abcd", -EINVAL),
        ("set=1\nreplace_peers=yes", -EINVAL),
        ("foo=1", -EINVAL),
    ];
    for (text, errno) in cases {
        let err = parse_request(text.lines()).expect_err(text);
        assert_eq!(err.errno(), *errno, "{text}: {err}");
    }
    assert_eq!(
        parse_request("foo=1".lines()),
        Err(UapiError::UnknownOperation)
    );
    assert_eq!(errno_answer(-22), "errno=-22\n\n");
}

#[test]
fn errors_name_the_line_but_never_echo_a_key() {
    let err = parse_request(format!("set=1\nlisten_port=1\nprivate_key={}x", &PRIV[..63]).lines())
        .expect_err("bad key");
    let text = err.to_string();
    assert!(text.contains("line 3"), "{text}");
    assert!(!text.contains(&PRIV[..63]), "{text}");
}

proptest! {
    #[test]
    fn arbitrary_input_never_panics(lines in proptest::collection::vec(
        prop_oneof![
            "[a-z_]{0,30}=[ -~]{0,80}",
            "(public_key|private_key|preshared_key)=[0-9a-f]{60,66}",
            "(endpoint|allowed_ip|listen_port|persistent_keepalive_interval)=[0-9a-f:.\\[\\]/]{0,40}",
            "[ -~]{0,40}",
        ],
        0..20,
    )) {
        let device = Device::new(plexsphere_wire::clock::Now::system());
        let text: Vec<&str> = std::iter::once("set=1").chain(lines.iter().map(String::as_str)).collect();
        if let Ok(Request::Set(update)) = parse_request(text.into_iter()) {
            prop_assert!(device.apply(update).is_ok());
            let answer = format_get(&device.snapshot(Instant::now(), SystemTime::now()));
            prop_assert!(answer.ends_with("errno=0\n\n"));
        }
    }
}
