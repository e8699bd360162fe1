use super::*;

fn mesh() -> IpNet {
    "10.64.0.0/16".parse().unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn relay(name: &str) -> RelaySpec {
    RelaySpec {
        name: name.to_owned(),
        public_key: "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=".to_owned(),
        udp: Some(sa("203.0.113.5:3479")),
        tls: None,
        tls_server_name: None,
    }
}

fn report(addresses: &[&str], reflexive: &[&str]) -> EndpointReport {
    EndpointReport {
        listen_port: 51820,
        addresses: addresses.iter().map(|a| ip(a)).collect(),
        reflexive: reflexive.iter().map(|a| sa(a)).collect(),
        ..Default::default()
    }
}

/// Every row of the refusal table, IPv4, IPv6 and IPv4-mapped IPv6.
#[test]
fn the_refusal_table() {
    use Unusable::*;
    let table: &[(&str, Option<Unusable>)] = &[
        ("0.0.0.0", Some(Unspecified)),
        ("::", Some(Unspecified)),
        ("::ffff:0.0.0.0", Some(Unspecified)),
        ("127.0.0.1", Some(Loopback)),
        ("127.200.0.9", Some(Loopback)),
        ("::1", Some(Loopback)),
        ("::ffff:127.0.0.1", Some(Loopback)),
        ("169.254.169.254", Some(LinkLocal)),
        ("169.254.0.1", Some(LinkLocal)),
        ("fe80::1", Some(LinkLocal)),
        ("febf:ffff::1", Some(LinkLocal)),
        ("::ffff:169.254.169.254", Some(LinkLocal)),
        ("224.0.0.1", Some(Multicast)),
        ("239.255.255.250", Some(Multicast)),
        ("ff02::1", Some(Multicast)),
        ("::ffff:224.0.0.251", Some(Multicast)),
        ("255.255.255.255", Some(Broadcast)),
        ("::ffff:255.255.255.255", Some(Broadcast)),
        ("10.64.0.1", Some(MeshRange)),
        ("10.64.255.254", Some(MeshRange)),
        ("::ffff:10.64.3.4", Some(MeshRange)),
        // Usable: private, documentation, public, ULA, global v6, mapped public; just
        // outside the link-local and mesh ranges.
        ("10.65.0.1", None),
        ("10.63.255.255", None),
        ("192.168.1.20", None),
        ("172.16.0.5", None),
        ("192.0.2.10", None),
        ("203.0.113.5", None),
        ("169.255.0.1", None),
        ("fec0::1", None),
        ("fd00::4", None),
        ("2001:db8::10", None),
        ("::ffff:198.51.100.7", None),
        // Not mapped (IPv4-compatible, deprecated): judged as IPv6.
        ("::127.0.0.1", None),
    ];
    for (addr, want) in table {
        assert_eq!(unusable(ip(addr), mesh()), *want, "{addr}");
    }
    // An IPv6 mesh range refuses its own addresses.
    let v6_mesh: IpNet = "fd64::/48".parse().unwrap();
    assert_eq!(unusable(ip("fd64::5"), v6_mesh), Some(MeshRange));
    assert_eq!(unusable(ip("fd65::5"), v6_mesh), None);
}

#[test]
fn each_refused_address_is_named_with_its_field_and_why() {
    let from = ip("198.51.100.1");
    for (r, field, address, why) in [
        (
            report(&["192.0.2.1", "127.0.0.1"], &[]),
            "addresses[1]",
            "127.0.0.1",
            Unusable::Loopback,
        ),
        (
            report(&["169.254.169.254"], &[]),
            "addresses[0]",
            "169.254.169.254",
            Unusable::LinkLocal,
        ),
        (
            report(&[], &["198.51.100.1:4000", "[::ffff:127.0.0.1]:80"]),
            "reflexive[1]",
            "[::ffff:127.0.0.1]:80",
            Unusable::Loopback,
        ),
        (
            report(&[], &["[ff02::1]:51820"]),
            "reflexive[0]",
            "[ff02::1]:51820",
            Unusable::Multicast,
        ),
        (
            report(&["10.64.0.9"], &[]),
            "addresses[0]",
            "10.64.0.9",
            Unusable::MeshRange,
        ),
    ] {
        let err = accept(&r, from, mesh(), &[]).unwrap_err();
        assert_eq!(
            err,
            Refusal::Unusable {
                field: field.into(),
                address: address.into(),
                why
            }
        );
        let msg = err.to_string();
        assert!(msg.starts_with(&format!("{field} {address} is ")), "{msg}");
    }
}

#[test]
fn ports_zero_too_many_and_unknown_relays_are_refused() {
    let from = ip("198.51.100.1");
    let mut zero = report(&["192.0.2.1"], &[]);
    zero.listen_port = 0;
    assert_eq!(
        accept(&zero, from, mesh(), &[]),
        Err(Refusal::ListenPortZero)
    );
    let r = report(&[], &["203.0.113.9:0"]);
    assert_eq!(
        accept(&r, from, mesh(), &[]),
        Err(Refusal::PortZero {
            field: "reflexive[0]".into(),
            address: sa("203.0.113.9:0")
        })
    );

    // Local plus reflexive count together, duplicates included.
    let locals: Vec<String> = (1..=10).map(|i| format!("192.0.2.{i}")).collect();
    let refl: Vec<String> = (1..=7).map(|i| format!("203.0.113.{i}:4000")).collect();
    let locals: Vec<&str> = locals.iter().map(String::as_str).collect();
    let refl: Vec<&str> = refl.iter().map(String::as_str).collect();
    let r = report(&locals, &refl);
    assert_eq!(
        accept(&r, from, mesh(), &[]),
        Err(Refusal::TooMany(MAX_CANDIDATES + 1))
    );
    let r = report(&locals, &refl[..6]);
    assert_eq!(
        accept(&r, from, mesh(), &[]).unwrap().advertised().len(),
        17
    );

    let mut r = report(&["192.0.2.1"], &[]);
    r.home_relay = Some("r9".into());
    let err = accept(&r, from, mesh(), &[relay("r1"), relay("r2")]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "home_relay \"r9\" is not a relay of this control plane (it has: r1, r2); name one from the state's relays or none"
    );
    assert!(matches!(
        accept(&r, from, mesh(), &[]),
        Err(Refusal::UnknownRelay { .. })
    ));
    r.home_relay = Some("r2".into());
    assert!(accept(&r, from, mesh(), &[relay("r1"), relay("r2")]).is_ok());
}

#[test]
fn advertised_is_local_then_reflexive_then_observed_without_duplicates() {
    let r = report(
        &["192.0.2.7", "203.0.113.5", "192.0.2.7"],
        &[
            "198.51.100.1:40001",
            "198.51.100.1:40001",
            "[2001:db8::1]:51820",
        ],
    );
    let c = accept(&r, ip("198.51.100.1"), mesh(), &[]).unwrap();
    assert_eq!(
        c.local,
        vec![sa("192.0.2.7:51820"), sa("203.0.113.5:51820")]
    );
    assert_eq!(
        c.reflexive,
        vec![sa("198.51.100.1:40001"), sa("[2001:db8::1]:51820")]
    );
    assert_eq!(c.observed, Some(sa("198.51.100.1:51820")));
    let shown: Vec<String> = c.advertised().iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        vec![
            "192.0.2.7:51820",
            "203.0.113.5:51820",
            "198.51.100.1:40001",
            "[2001:db8::1]:51820",
            "198.51.100.1:51820"
        ]
    );
    // The observed address equal to a local one collapses into it.
    let c = accept(&r, ip("203.0.113.5"), mesh(), &[]).unwrap();
    assert_eq!(c.advertised().len(), 4);
}

#[test]
fn an_observed_address_of_a_refused_kind_is_not_kept() {
    let r = report(&["192.0.2.7"], &[]);
    for from in [
        "127.0.0.1",
        "::1",
        "::ffff:127.0.0.1",
        "10.64.0.3",
        "fe80::9",
    ] {
        let c = accept(&r, ip(from), mesh(), &[]).unwrap();
        assert_eq!(c.observed, None, "{from}");
        assert_eq!(c.advertised(), vec![sa("192.0.2.7:51820")], "{from}");
    }
}
