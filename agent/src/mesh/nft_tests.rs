//! The nftables ruleset generated from a view, table-tested (pure; nft_root_tests.rs runs it
//! through nft against real traffic).

use std::net::IpAddr;

use plexsphere_policy::compile::Grant;
use plexsphere_policy::ports::{Access, PortRange, PortSet};
use plexsphere_policy::view::{NodeView, PeerView};
use uuid::Uuid;

use super::nft::{closed_ruleset, ruleset, table_name};

fn ports(ranges: &[(u16, u16)]) -> PortSet {
    PortSet::from_ranges(
        ranges
            .iter()
            .map(|&(first, last)| PortRange { first, last }),
    )
}

pub(crate) fn grant(tcp: &[(u16, u16)], udp: &[(u16, u16)], icmp: bool, other: bool) -> Grant {
    Grant {
        access: Access {
            tcp: ports(tcp),
            udp: ports(udp),
            icmp,
            other,
        },
        lines: vec![1],
    }
}

pub(crate) fn peer(
    n: u128,
    addrs: &[&str],
    inbound: Option<u32>,
    outbound: Option<u32>,
) -> PeerView {
    PeerView {
        id: Uuid::from_u128(n),
        name: format!("peer-{n}"),
        addrs: addrs.iter().map(|a| a.parse::<IpAddr>().unwrap()).collect(),
        inbound,
        outbound,
        routes_out: Vec::new(),
        routes_in: Vec::new(),
    }
}

pub(crate) fn view(own: &[&str], grants: Vec<Grant>, peers: Vec<PeerView>) -> NodeView {
    NodeView {
        node: Uuid::from_u128(1000),
        addrs: own.iter().map(|a| a.parse::<IpAddr>().unwrap()).collect(),
        grants,
        peers,
    }
}

/// web may open tcp 5432 and 8000-8100 here; this node may open anything tcp on ci; mon may
/// ping in both directions; grant 3 is unused.
pub(super) fn sample() -> NodeView {
    view(
        &["10.64.0.2", "fd00::2"],
        vec![
            grant(&[(5432, 5432), (8000, 8100)], &[], false, false),
            grant(&[(0, u16::MAX)], &[], false, false),
            grant(&[], &[(53, 53)], true, false),
            grant(&[(22, 22)], &[], false, true),
        ],
        vec![
            peer(1, &["10.64.0.1", "fd00::1"], Some(0), None),
            peer(2, &["10.64.0.3"], None, Some(1)),
            peer(3, &["10.64.0.4"], Some(2), Some(2)),
        ],
    )
}

#[test]
fn table_is_per_interface() {
    assert_eq!(table_name("wg0"), "plexd_wg0");
    assert_eq!(table_name("plexd-mesh.1"), "plexd_plexd-mesh.1");
    // A name nft would misread never reaches it unchanged (install refuses it first).
    assert_eq!(table_name("a\"b c"), "plexd_a_b_c");
}

#[test]
fn no_policy_removes_the_table_and_nothing_else() {
    let r = ruleset("wg0", None);
    assert_eq!(r, "table inet plexd_wg0\ndelete table inet plexd_wg0\n");
}

#[test]
fn every_ruleset_replaces_the_table_in_one_transaction() {
    for r in [ruleset("wg0", Some(&sample())), closed_ruleset("wg0")] {
        assert!(
            r.starts_with(
                "table inet plexd_wg0\ndelete table inet plexd_wg0\ntable inet plexd_wg0 {\n"
            ),
            "{r}"
        );
        assert_eq!(r.matches("delete table").count(), 1);
    }
}

#[test]
fn inbound_grants_check_the_destination_port_of_every_packet_the_peer_sends() {
    let r = ruleset("wg0", Some(&sample()));
    // Peer addresses select their grant's chain, per family.
    assert!(r.contains("map in4 {\n    type ipv4_addr : verdict\n    elements = { 10.64.0.1 : jump in_0, 10.64.0.4 : jump in_2 }"), "{r}");
    assert!(
        r.contains(
            "map in6 {\n    type ipv6_addr : verdict\n    elements = { fd00::1 : jump in_0 }"
        ),
        "{r}"
    );
    assert!(
        r.contains("  chain in_0 {\n    tcp dport { 5432, 8000-8100 } accept\n  }"),
        "{r}"
    );
    assert!(r.contains("  chain in_2 {\n    udp dport { 53 } accept\n    meta l4proto { icmp, icmpv6 } accept\n  }"), "{r}");
    // Established flows are not waved through: the vmap lines carry no `ct state`.
    assert!(r.contains("    ct direction original ip saddr vmap @in4\n"));
    assert!(r.contains("    ct direction original ip6 saddr vmap @in6\n"));
    assert!(!r.contains("established"), "{r}");
}

#[test]
fn replies_pass_only_from_what_this_node_may_open() {
    let r = ruleset("wg0", Some(&sample()));
    assert!(
        r.contains("elements = { 10.64.0.3 : jump out_1, 10.64.0.4 : jump out_2 }"),
        "{r}"
    );
    assert!(
        r.contains("  chain out_1 {\n    meta l4proto tcp accept\n  }"),
        "{r}"
    );
    assert!(
        r.contains("  chain out_2 {\n    udp sport { 53 } accept\n"),
        "{r}"
    );
    assert!(r.contains("    ct direction reply ip saddr vmap @out4\n"));
    // A grant no peer uses in a direction has no chain there.
    assert!(!r.contains("chain in_1 "), "{r}");
    assert!(!r.contains("chain out_0 "), "{r}");
    assert!(!r.contains("_3 "), "{r}");
    // No map elements for the empty direction of a family.
    assert!(
        r.contains("  map out6 {\n    type ipv6_addr : verdict\n  }"),
        "{r}"
    );
}

#[test]
fn other_protocols_only_where_a_grant_says_any() {
    let v = view(
        &["10.64.0.2"],
        vec![grant(&[(22, 22)], &[], false, true)],
        vec![peer(1, &["10.64.0.1"], Some(0), None)],
    );
    let r = ruleset("wg0", Some(&v));
    assert!(
        r.contains("    meta l4proto != { tcp, udp, icmp, icmpv6 } accept\n"),
        "{r}"
    );
    assert!(!ruleset("wg0", Some(&sample())).contains("l4proto !="));
}

#[test]
fn only_this_nodes_addresses_and_only_the_mesh_interface() {
    let r = ruleset("wg0", Some(&sample()));
    assert!(
        r.contains("    ip daddr != { 10.64.0.2 } counter drop\n"),
        "{r}"
    );
    assert!(
        r.contains("    ip6 daddr != { fd00::2 } counter drop\n"),
        "{r}"
    );
    // Every hook rule names the interface: other interfaces fall through the accept policy.
    assert!(r.contains("type filter hook input priority filter; policy accept;\n    iifname \"wg0\" jump mesh_in\n  }"), "{r}");
    assert!(
        r.contains("iifname \"wg0\" ct direction reply accept\n    iifname \"wg0\" counter drop\n"),
        "{r}"
    );
    assert_eq!(r.matches("hook ").count(), 2);
    assert!(!r.contains("hook output"));
    // The last word of the mesh chain is a logged, counted drop.
    assert!(
        r.contains(
            "log prefix \"plexd-policy drop: \" level info\n    counter drop\n  }\n  chain input"
        ),
        "{r}"
    );
    // No IPv6 address: every IPv6 packet from the mesh is dropped.
    let v4only = view(&["10.64.0.2"], vec![], vec![]);
    let r = ruleset("wg0", Some(&v4only));
    assert!(r.contains("    meta nfproto ipv6 counter drop\n"), "{r}");
}

#[test]
fn a_view_that_cannot_become_a_filter_gives_the_closed_table() {
    // Grant 7 does not exist.
    let corrupt = view(
        &["10.64.0.2"],
        vec![],
        vec![peer(1, &["10.64.0.1"], Some(7), None)],
    );
    let r = ruleset("wg0", Some(&corrupt));
    assert_eq!(r, closed_ruleset("wg0"));
    assert!(r.contains("  chain input {\n    type filter hook input priority filter; policy accept;\n    iifname \"wg0\" counter drop\n  }"), "{r}");
    assert!(
        r.contains(
            "hook forward priority filter; policy accept;\n    iifname \"wg0\" counter drop"
        ),
        "{r}"
    );
    assert!(!r.contains("accept\n"), "{r}");
}

#[test]
fn size_grows_with_peers_not_peers_times_ranges() {
    let many: Vec<(u16, u16)> = (0..100)
        .map(|i| (1000 + i * 10, 1000 + i * 10 + 5))
        .collect();
    let peers: Vec<PeerView> = (0..1000u128)
        .map(|i| {
            let a = format!("10.64.{}.{}", i / 250, i % 250 + 1);
            peer(i + 1, &[a.as_str()], Some(0), None)
        })
        .collect();
    let v = view(&["10.65.0.1"], vec![grant(&many, &[], false, false)], peers);
    let r = ruleset("wg0", Some(&v));
    assert_eq!(r.matches("1000-1005").count(), 1);
    assert_eq!(r.matches(" : jump in_0").count(), 1000);
    assert!(r.len() < 40_000, "{} bytes", r.len());
}

/// `wireguard.backend: auto` asks whether nft is on the PATH before it picks the kernel
/// backend: an executable file named nft in any PATH directory counts; a directory, a file
/// without an execute bit, or no such file does not.
#[test]
fn nft_is_found_only_as_an_executable_file_on_the_path() {
    use std::os::unix::fs::PermissionsExt as _;
    let empty = tempfile::tempdir().unwrap();
    let not_exec = tempfile::tempdir().unwrap();
    let a_dir = tempfile::tempdir().unwrap();
    let good = tempfile::tempdir().unwrap();
    std::fs::write(not_exec.path().join("nft"), "").unwrap();
    std::fs::create_dir(a_dir.path().join("nft")).unwrap();
    let nft = good.path().join("nft");
    std::fs::write(&nft, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&nft, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = |dirs: &[&std::path::Path]| std::env::join_paths(dirs).unwrap();

    let without = path(&[empty.path(), not_exec.path(), a_dir.path()]);
    assert_eq!(super::nft::find_nft(Some(&without)), None);
    let with = path(&[empty.path(), not_exec.path(), a_dir.path(), good.path()]);
    assert_eq!(super::nft::find_nft(Some(&with)), Some(nft));
    assert_eq!(super::nft::find_nft(None), None, "no PATH at all");
}
