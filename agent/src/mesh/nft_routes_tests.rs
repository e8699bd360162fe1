//! The routed-traffic part of the nftables ruleset (issue 27), table-tested (pure;
//! nft_routes_root_tests.rs runs it through nft against real forwarded traffic).

use plexsphere_policy::filter::MAX_ROUTE_PREFIXES_PER_PEER;
use plexsphere_policy::view::{NodeView, RouteGrant};

use super::nft::{closed_ruleset, ruleset};
use super::nft_tests::{grant, peer, view};

fn route(prefix: &str, grant: u32) -> RouteGrant {
    RouteGrant {
        prefix: prefix.parse().unwrap(),
        grant,
    }
}

/// This node (10.64.0.2) routes 10.1.0.0/24 (grant 0: tcp 5432, icmp) with 10.1.0.0/28
/// inside it (grant 1: tcp 22) for client A, and is itself a client of router R for
/// 10.2.0.0/16 (grant 0) and fd10::/64 (grant 1).
pub(super) fn routed() -> NodeView {
    let mut a = peer(1, &["10.64.0.1", "fd00::1"], None, None);
    a.routes_in = vec![route("10.1.0.0/24", 0), route("10.1.0.0/28", 1)];
    let mut r = peer(5, &["10.64.0.5"], None, None);
    r.routes_out = vec![route("10.2.0.0/16", 0), route("fd10::/64", 1)];
    view(
        &["10.64.0.2", "fd00::2"],
        vec![
            grant(&[(5432, 5432)], &[], true, false),
            grant(&[(22, 22)], &[], false, false),
        ],
        vec![a, r],
    )
}

#[test]
fn a_router_forwards_a_clients_flows_by_the_grant_of_the_longest_prefix() {
    let r = ruleset("wg0", Some(&routed()));
    // The client's address selects its chain; the nested /28 wins over the /24 it is in.
    assert!(
        r.contains(
            "  map fwd4 {\n    type ipv4_addr : verdict\n    elements = { 10.64.0.1 : jump fwd_0 }"
        ),
        "{r}"
    );
    assert!(
        r.contains(
            "  map fwd6 {\n    type ipv6_addr : verdict\n    elements = { fd00::1 : jump fwd_0 }"
        ),
        "{r}"
    );
    assert!(r.contains("  chain fwd_0 {\n    ip daddr vmap { 10.1.0.0-10.1.0.15 : jump in_1, 10.1.0.16-10.1.0.255 : jump in_0 }\n  }"), "{r}");
    assert!(r.contains("  chain in_0 {\n    tcp dport { 5432 } accept\n    meta l4proto { icmp, icmpv6 } accept\n  }"), "{r}");
    assert!(
        r.contains("  chain in_1 {\n    tcp dport { 22 } accept\n  }"),
        "{r}"
    );
    // Every packet from the mesh is checked; the rest is logged and dropped.
    assert!(r.contains("  chain mesh_fwd {\n    ct direction reply accept\n    ct state related meta l4proto { icmp, icmpv6 } accept\n    ip saddr vmap @fwd4\n    ip6 saddr vmap @fwd6\n    limit rate 5/second burst 10 packets log prefix \"plexd-policy drop: \" level info\n    counter drop\n  }"), "{r}");
    assert!(r.contains("  chain forward {\n    type filter hook forward priority filter; policy accept;\n    iifname \"wg0\" jump mesh_fwd\n    oifname \"wg0\" jump mesh_fwd_out\n  }"), "{r}");
    assert!(!r.contains("established"), "{r}");
    // The router's own address inside a served prefix: the same grant, before the check
    // that input is for this node's mesh addresses.
    assert!(r.contains("  chain mesh_in {\n    ip saddr vmap @fwd4\n    ip6 saddr vmap @fwd6\n    ip daddr != { 10.64.0.2 } counter drop\n"), "{r}");
}

#[test]
fn a_router_lets_back_only_replies_its_grants_still_hold_and_nothing_a_lan_host_opens() {
    let r = ruleset("wg0", Some(&routed()));
    assert!(r.contains("  chain rep_0 {\n    ip saddr vmap { 10.1.0.0-10.1.0.15 : jump out_1, 10.1.0.16-10.1.0.255 : jump out_0 }\n  }"), "{r}");
    assert!(
        r.contains(
            "  map rep4 {\n    type ipv4_addr : verdict\n    elements = { 10.64.0.1 : jump rep_0 }"
        ),
        "{r}"
    );
    assert!(
        r.contains("  chain out_0 {\n    tcp sport { 5432 } accept\n"),
        "{r}"
    );
    // The served prefixes, merged.
    assert!(r.contains("  set served4 {\n    type ipv4_addr\n    flags interval\n    elements = { 10.1.0.0-10.1.0.255 }\n  }"), "{r}");
    assert!(r.contains("  chain mesh_fwd_out {\n    ct state related meta l4proto { icmp, icmpv6 } accept\n    ct direction reply ip daddr vmap @rep4\n    ct direction reply ip6 daddr vmap @rep6\n    ct direction reply counter drop\n    jump route_out\n  }"), "{r}");
    // A served host's own flow into the mesh: dropped after source NAT (so this host's
    // masqueraded flows, its containers', still pass).
    assert!(r.contains("  chain postrouting {\n    type filter hook postrouting priority srcnat + 10; policy accept;\n    oifname \"wg0\" ct direction original ip saddr @served4 counter drop\n    oifname \"wg0\" ct direction original ip6 saddr @served6 counter drop\n  }"), "{r}");
}

#[test]
fn a_client_opens_only_granted_flows_into_a_route_and_takes_only_their_replies() {
    let r = ruleset("wg0", Some(&routed()));
    assert!(r.contains("  map rdst4 {\n    type ipv4_addr : verdict\n    flags interval\n    elements = { 10.2.0.0-10.2.255.255 : jump rto_0 }\n  }"), "{r}");
    assert!(r.contains("  map rdst6 {\n    type ipv6_addr : verdict\n    flags interval\n    elements = { fd10::-fd10::ffff:ffff:ffff:ffff : jump rto_1 }\n  }"), "{r}");
    assert!(
        r.contains("  chain rto_0 {\n    jump in_0\n    limit rate 5/second"),
        "{r}"
    );
    assert!(r.contains("  map rsrc4 {\n    type ipv4_addr : verdict\n    flags interval\n    elements = { 10.2.0.0-10.2.255.255 : jump out_0 }\n  }"), "{r}");
    assert!(r.contains("    ct direction reply ip6 saddr vmap @out6\n    ct direction reply ip saddr vmap @rsrc4\n    ct direction reply ip6 saddr vmap @rsrc6\n"), "{r}");
    assert!(r.contains("  chain output {\n    type filter hook output priority filter; policy accept;\n    oifname \"wg0\" jump route_out\n  }"), "{r}");
    assert!(r.contains("  chain route_out {\n    ct state related meta l4proto { icmp, icmpv6 } accept\n    ip daddr vmap @rdst4\n    ip6 daddr vmap @rdst6\n  }"), "{r}");
    assert_eq!(r.matches("hook ").count(), 4, "{r}");
}

#[test]
fn a_view_without_routes_keeps_the_table_it_had() {
    let mut v = routed();
    for p in &mut v.peers {
        p.routes_in.clear();
        p.routes_out.clear();
    }
    let r = ruleset("wg0", Some(&v));
    assert!(
        r.contains("iifname \"wg0\" ct direction reply accept\n    iifname \"wg0\" counter drop\n"),
        "{r}"
    );
    for name in [
        "mesh_fwd",
        "rdst",
        "rsrc",
        "served",
        "hook output",
        "hook postrouting",
        "rto_",
    ] {
        assert!(!r.contains(name), "{name}: {r}");
    }
}

#[test]
fn too_many_route_prefixes_a_peer_give_the_closed_table() {
    let mut v = routed();
    v.peers[0].routes_in = (0..=MAX_ROUTE_PREFIXES_PER_PEER)
        .map(|i| route(&format!("10.{}.{}.0/24", 10 + i / 256, i % 256), 0))
        .collect();
    assert_eq!(ruleset("wg0", Some(&v)), closed_ruleset("wg0"));
}
