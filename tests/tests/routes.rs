//! Subnet routes and exit nodes end to end (root): the real control plane on the host, plexd
//! nodes in network namespaces with the embedded userspace data plane, and a LAN namespace
//! behind the routers holding a host `H` with no plexd (docs/routes.md).
//!
//! - A reaches H through router R (ping and TCP); a node the policy does not allow gets
//!   nothing through R;
//! - failover: R and R2 advertise the LAN with a probe of H while A pings H 10 times a second;
//!   killing R (SIGKILL) and, in a second case, cutting R's LAN link move the traffic to R2
//!   within the documented bound (lost pings counted); `plexctl route list` says who is
//!   primary, who is standby and why;
//! - exit: A sends traffic to an "internet" namespace through exit E, its tunnel to another
//!   peer and the control plane keep working, and turning the exit off gives back
//!   `ip rule` and `ip route show table all` byte for byte.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use plexsphere_e2e::lan::Lan;
use plexsphere_e2e::netns::{self, Lab};
use plexsphere_e2e::route_lab::{
    BOUND, Node, echo_server, last_seq, lost_pings, name_of, ping, plexctl, primary, reply_seq,
    routers, routes_yaml, tcp_echoes, wait_ping,
};
use plexsphere_e2e::{Proc, tail, wait_until};

/// Issue 27: a failed router is replaced within 10 s (docs/routes.md "Failover").
const FAILOVER: Duration = Duration::from_secs(10);
/// The ping's interval (10 a second): lost pings x this is the outage.
const PING_INTERVAL: Duration = Duration::from_millis(100);
/// How long a probe of something that must not answer is given.
const REFUSED_AFTER: Duration = Duration::from_secs(3);

#[test]
fn a_node_reaches_a_lan_host_through_a_router_and_a_denied_node_gets_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let mut lab = Lab::new().unwrap();
    let cp = netns::start_control_plane(&tmp.path().join("cp"), lab.host_addr(), &[]).unwrap();
    let mut a = Node::new(&mut lab, &cp, tmp.path(), "client");
    let mut b = Node::new(&mut lab, &cp, tmp.path(), "denied");
    let mut r = Node::new(&mut lab, &cp, tmp.path(), "router");
    let mut lan = Lan::new("a", [10, 200, 1]).unwrap();
    lan.attach(&r.ns, "lan0").unwrap();
    let cidr = lan.cidr();
    r.set_routes(&routes_yaml(&cidr, None));
    for n in [&mut a, &mut b, &mut r] {
        n.start();
    }
    r.wait_routes("the route is reported", |x| {
        x["advertise"][0]["approval"] == "pending"
    });
    assert!(!ping(&a.ns, lan.host()), "a pending route carries nothing");
    plexctl(&cp, &["route", "approve", &r.id(), &cidr]);
    r.wait_routes("the route is primary", |x| {
        x["advertise"][0]["role"] == "primary" && x["forwarding"] == true
    });
    a.via_mesh(&cidr);
    wait_ping(&a.ns, lan.host(), "client pings H through the router");
    echo_server(&lan.ns, lan.host(), 7000);
    assert!(
        tcp_echoes(&a.ns, lan.host(), 7000, BOUND),
        "client opens TCP to H through the router"
    );

    // A policy that lets only the client use the route.
    for n in [&a, &b, &r] {
        plexctl(&cp, &["node", "tag", &n.id(), &format!("tag:{}", n.name)]);
    }
    let doc = format!(
        "tags: [client, denied, router]\nrules:\n  - {{src: tag:client, dst: ['{cidr}'], proto: tcp, ports: 7000}}\n  - {{src: tag:client, dst: ['{cidr}'], proto: icmp}}\n"
    );
    let file = tmp.path().join("routes-policy.yaml");
    std::fs::write(&file, doc).unwrap();
    plexctl(&cp, &["policy", "set", file.to_str().unwrap(), "--yes"]);
    b.wait_routes("the denied node has no route via the mesh", |x| {
        x["via_mesh"].as_array().is_some_and(Vec::is_empty)
    });
    assert!(!ping(&b.ns, lan.host()), "the denied node cannot ping H");
    assert!(
        !tcp_echoes(&b.ns, lan.host(), 7000, REFUSED_AFTER),
        "the denied node cannot open TCP to H"
    );
    assert!(
        tcp_echoes(&a.ns, lan.host(), 7000, BOUND),
        "the client still can"
    );
    // A port the rule does not grant is refused at the router.
    echo_server(&lan.ns, lan.host(), 7001);
    assert!(
        !tcp_echoes(&a.ns, lan.host(), 7001, REFUSED_AFTER),
        "the client cannot open a port its grant does not hold"
    );
}

/// How a router fails in a failover case.
#[derive(Clone, Copy, Debug)]
enum Failure {
    Killed,
    LanCut,
}

fn failover(how: Failure) {
    let tmp = tempfile::tempdir().unwrap();
    let mut lab = Lab::new().unwrap();
    let cp = netns::start_control_plane(&tmp.path().join("cp"), lab.host_addr(), &[]).unwrap();
    let mut a = Node::new(&mut lab, &cp, tmp.path(), "client");
    let mut r1 = Node::new(&mut lab, &cp, tmp.path(), "rone");
    let mut r2 = Node::new(&mut lab, &cp, tmp.path(), "rtwo");
    let mut lan = Lan::new("f", [10, 200, 2]).unwrap();
    lan.attach(&r1.ns, "lan0").unwrap();
    lan.attach(&r2.ns, "lan0").unwrap();
    let cidr = lan.cidr();
    for r in [&r1, &r2] {
        r.set_routes(&routes_yaml(&cidr, Some(lan.host())));
    }
    let reported = |x: &serde_json::Value| x["advertise"][0]["approval"] == "pending";
    a.start();
    r1.start();
    r1.wait_routes("rone reports its route", reported);
    plexctl(&cp, &["route", "approve", &r1.id(), &cidr]);
    r1.wait_routes("rone is primary", |x| {
        x["advertise"][0]["role"] == "primary"
    });
    r2.start();
    r2.wait_routes("rtwo reports its route", reported);
    plexctl(&cp, &["route", "approve", &r2.id(), &cidr]);
    r2.wait_routes("rtwo is standby", |x| {
        x["advertise"][0]["role"] == "standby"
    });
    let list = plexctl(&cp, &["route", "list"]);
    assert!(
        list.contains("primary") && list.contains("standby"),
        "route list shows both roles:\n{list}"
    );
    let (n1, n2) = (name_of(&cp, &r1), name_of(&cp, &r2));
    eprintln!(
        "mesh IPs: client {}, rone {}, rtwo {}",
        a.ip(),
        r1.ip(),
        r2.ip()
    );
    assert_eq!(primary(&cp, &cidr).as_deref(), Some(n1.as_str()));
    a.via_mesh(&cidr);
    wait_ping(&a.ns, lan.host(), "client pings H through rone");

    // 10 pings a second, each waiting up to 1 s, for up to 60 s (ended early below).
    let mut cmd = std::process::Command::new("ping");
    cmd.args(["-n", "-O", "-W", "1", "-i"])
        .arg(format!("{}", PING_INTERVAL.as_secs_f64()))
        .args(["-c", "600"])
        .arg(lan.host().to_string());
    let pinger = Proc::spawn(netns::in_netns(&a.ns, &cmd)).unwrap();
    pinger
        .wait_for_line(BOUND, |l| l.contains("icmp_seq=20 "))
        .unwrap();
    let failed_at = std::time::Instant::now();
    match how {
        Failure::Killed => {
            r1.proc.as_ref().unwrap().signal("KILL").unwrap();
        }
        Failure::LanCut => {
            netns::ip(&["-n", &r1.ns, "link", "set", "lan0", "down"]).unwrap();
        }
    }
    wait_until(BOUND, "the control plane makes rtwo primary", || {
        Ok((primary(&cp, &cidr).as_deref() == Some(n2.as_str())).then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e}\n{:?}\n--- rone:\n{}", routers(&cp, &cidr), r1.output()));
    let switched = failed_at.elapsed();
    // Traffic flows again: 20 replies in a row after the failure.
    let seq_now = last_seq(&pinger.output());
    pinger
        .wait_for_line(BOUND, |l| reply_seq(l).is_some_and(|s| s >= seq_now + 20))
        .unwrap_or_else(|e| panic!("{e}\n--- ping:\n{}", pinger.output()));
    pinger.signal("INT").unwrap();
    let out = pinger.output();
    let lost = lost_pings(&out);
    let outage = PING_INTERVAL * u32::try_from(lost).unwrap();
    eprintln!(
        "failover ({how:?}): the control plane switched after {switched:?}; {lost} pings lost (about {outage:?} without traffic)"
    );
    let reasons = routers(&cp, &cidr);
    eprintln!("route list after the failover: {reasons:?}");
    assert!(
        reasons
            .iter()
            .any(|(n, role, why)| *n == n1 && role != "primary" && !why.is_empty()),
        "rone is no longer primary and the list says why: {reasons:?}"
    );
    assert!(
        outage <= FAILOVER,
        "{lost} pings lost ({outage:?}) past the {FAILOVER:?} bound\n--- ping:\n{}\n--- client:\n{}\n--- rone:\n{}\n--- rtwo:\n{}",
        tail(&out, 30),
        tail(&a.output(), 60),
        tail(&r1.output(), 60),
        tail(&r2.output(), 60),
    );
}

#[test]
fn killing_the_primary_router_moves_traffic_to_the_standby_within_the_bound() {
    failover(Failure::Killed);
}

#[test]
fn cutting_the_primary_routers_lan_link_moves_traffic_to_the_standby_within_the_bound() {
    failover(Failure::LanCut);
}

/// `ip rule` and every routing table of `ns`, both families.
fn routing(ns: &str) -> String {
    let mut s = String::new();
    for args in [
        &["rule", "show"][..],
        &["-6", "rule", "show"],
        &["route", "show", "table", "all"],
        &["-6", "route", "show", "table", "all"],
    ] {
        let out = netns::exec(ns, "ip", args).unwrap();
        s.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    s
}

#[test]
fn a_node_uses_an_exit_and_turning_it_off_restores_its_routing_byte_for_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let mut lab = Lab::new().unwrap();
    let cp = netns::start_control_plane(&tmp.path().join("cp"), lab.host_addr(), &[]).unwrap();
    let mut a = Node::new(&mut lab, &cp, tmp.path(), "client");
    let mut other = Node::new(&mut lab, &cp, tmp.path(), "other");
    let mut e = Node::new(&mut lab, &cp, tmp.path(), "exit");
    // The "internet": a namespace behind the exit only (198.51.100.0/24, TEST-NET-2).
    let mut internet = Lan::new("i", [198, 51, 100]).unwrap();
    internet.attach(&e.ns, "wan0").unwrap();
    e.set_routes("routes:\n  exit: true\n");
    for n in [&mut a, &mut other, &mut e] {
        n.start();
    }
    plexctl(&cp, &["route", "approve", &e.id(), "0.0.0.0/0"]);
    e.wait_routes("the exit serves", |x| x["forwarding"] == true);
    wait_ping(&a.ns, other.ip(), "client reaches the other peer");
    assert!(
        !ping(&a.ns, internet.host()),
        "no way to the internet without the exit"
    );
    // The kernel adds IPv6 link-local routes once duplicate address detection is done: the
    // snapshot waits for that, so it holds only what plexd could change.
    wait_until(BOUND, "no tentative IPv6 address on the client", || {
        let out = netns::exec(&a.ns, "ip", &["-6", "addr", "show", "tentative"]).unwrap();
        Ok(out.stdout.is_empty().then_some(()))
    })
    .unwrap();
    let before = routing(&a.ns);

    a.set_routes(&format!("routes:\n  use_exit: {}\n", e.id()));
    a.wait_routes("the exit is in use", |x| !x["exit_in_use"].is_null());
    wait_ping(
        &a.ns,
        internet.host(),
        "client reaches the internet through the exit",
    );
    assert!(
        ping(&a.ns, other.ip()),
        "the tunnel to the other peer still works"
    );
    assert!(ping(&a.ns, e.ip()), "and to the exit itself");
    let rules =
        String::from_utf8_lossy(&netns::exec(&a.ns, "ip", &["rule", "show"]).unwrap().stdout)
            .into_owned();
    assert!(
        rules.contains("suppress_prefixlength 0") && rules.contains("lookup 28780"),
        "{rules}"
    );
    // The control plane stays reachable: a heartbeat answered after the exit came up.
    let hb_before = a.status()["last_heartbeat_age_secs"].as_u64();
    wait_until(BOUND, "the control plane answers a heartbeat", || {
        let s = a.status();
        Ok((s["api"]["reachable"] == true
            && s["last_heartbeat_age_secs"].as_u64() < Some(2)
            && hb_before.is_some())
        .then_some(()))
    })
    .unwrap();

    a.set_routes("");
    a.wait_routes("the exit is no longer used", |x| x["exit_in_use"].is_null());
    wait_until(BOUND, "the routing is as it was", || {
        Ok((routing(&a.ns) == before).then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e}\n--- before:\n{before}\n--- now:\n{}", routing(&a.ns)));
    assert!(
        !ping(&a.ns, internet.host()),
        "no internet after the exit is off"
    );
    assert!(ping(&a.ns, other.ip()), "the mesh still works");
}
