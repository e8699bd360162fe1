//! The routes benchmark (root; `benches/routes-bench.sh` runs it): the real control plane,
//! plexd nodes with the userspace data plane in namespaces (tests/src/route_lab.rs), a LAN
//! namespace behind two routers. In one run:
//! - one iperf3 TCP stream from the client to a router's mesh IP (the direct mesh path), and
//!   one from the client to the LAN host through that router (the subnet route: the router
//!   decrypts, its kernel forwards and masquerades, the LAN host answers);
//! - failover: the client pings the LAN host every [`PING_INTERVAL`]; the primary router is
//!   killed (SIGKILL) [`ROUNDS`] times (then started again, as standby), and each time the
//!   longest gap between two answered pings around the kill is the time without traffic
//!   (the error is one interval).
//!
//! It asserts nothing about speed: it prints Markdown for docs/benchmarks.md.

#![allow(clippy::unwrap_used)] // benchmark code: a failed unwrap is a failed run

use std::process::Command;
use std::time::Duration;

use plexsphere_e2e::lan::Lan;
use plexsphere_e2e::netns::{self, Lab};
use plexsphere_e2e::route_lab::{BOUND, Node, name_of, plexctl, primary, routes_yaml, wait_ping};
use plexsphere_e2e::{Proc, wait_until};

/// Failovers measured.
const ROUNDS: usize = 10;
/// The failover ping's interval.
const PING_INTERVAL: Duration = Duration::from_millis(20);

fn secs() -> u32 {
    std::env::var("ROUTES_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5)
}

/// One iperf3 TCP stream from `client_ns` to `server` (an iperf3 server runs at `server` in
/// `server_ns`); Gbit/s received.
fn iperf(server_ns: &str, server: std::net::Ipv4Addr, client_ns: &str) -> f64 {
    let mut srv = Command::new("iperf3");
    srv.args(["-s", "-1", "--forceflush", "-B", &server.to_string()]);
    let srv = Proc::spawn(netns::in_netns(server_ns, &srv)).unwrap();
    srv.wait_for_line(BOUND, |l| l.contains("Server listening"))
        .unwrap();
    let out = netns::exec(
        client_ns,
        "iperf3",
        &["-c", &server.to_string(), "-t", &secs().to_string(), "-J"],
    )
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap()
        / 1e9
}

/// `ping -D` lines with replies: (unix time, seq).
fn replies(out: &str) -> Vec<(f64, u64)> {
    out.lines()
        .filter(|l| l.contains("bytes from"))
        .filter_map(|l| {
            let t = l.strip_prefix('[')?.split(']').next()?.parse().ok()?;
            let seq = plexsphere_e2e::route_lab::reply_seq(l)?;
            Some((t, seq))
        })
        .collect()
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn main() {
    let tmp = tempfile::tempdir().unwrap();
    let mut lab = Lab::new().unwrap();
    let cp = netns::start_control_plane(&tmp.path().join("cp"), lab.host_addr(), &[]).unwrap();
    let mut a = Node::new(&mut lab, &cp, tmp.path(), "client");
    let mut routers = [
        Node::new(&mut lab, &cp, tmp.path(), "rone"),
        Node::new(&mut lab, &cp, tmp.path(), "rtwo"),
    ];
    let mut lan = Lan::new("b", [10, 200, 9]).unwrap();
    let cidr = lan.cidr();
    for r in &mut routers {
        lan.attach(&r.ns, "lan0").unwrap();
        r.set_routes(&routes_yaml(&cidr, Some(lan.host())));
    }
    a.start();
    for r in &mut routers {
        r.start();
        plexctl(&cp, &["route", "approve", &r.id(), &cidr]);
    }
    a.via_mesh(&cidr);
    wait_ping(&a.ns, lan.host(), "client pings H");
    let names: Vec<String> = routers.iter().map(|r| name_of(&cp, r)).collect();
    let first = primary(&cp, &cidr).unwrap();
    let p = names.iter().position(|n| *n == first).unwrap();

    // Throughput: the direct mesh path to the primary, then through it to H.
    let direct = iperf(&routers[p].ns, routers[p].ip(), &a.ns);
    let routed = iperf(&lan.ns, lan.host(), &a.ns);

    // Failover.
    let mut cmd = Command::new("ping");
    cmd.args(["-n", "-D", "-W", "1", "-i"])
        .arg(format!("{}", PING_INTERVAL.as_secs_f64()))
        .arg(lan.host().to_string());
    let pinger = Proc::spawn(netns::in_netns(&a.ns, &cmd)).unwrap();
    pinger
        .wait_for_line(BOUND, |l| l.contains("icmp_seq=50 "))
        .unwrap();
    let mut gaps = Vec::new();
    for round in 0..ROUNDS {
        let p = names
            .iter()
            .position(|n| Some(n.as_str()) == primary(&cp, &cidr).as_deref())
            .unwrap();
        let killed_at = unix_now();
        routers[p].proc.as_ref().unwrap().signal("KILL").unwrap();
        routers[p].proc = None;
        let other = names[1 - p].clone();
        wait_until(BOUND, "the other router becomes primary", || {
            Ok((primary(&cp, &cidr).as_deref() == Some(other.as_str())).then_some(()))
        })
        .unwrap();
        // Traffic flows again: 50 replies after the switch. The outage is the longest gap
        // between two replies around the kill (one interval when nothing was lost).
        let switched = unix_now();
        wait_until(BOUND, "pings answered after the switch", || {
            let after = replies(&pinger.output())
                .into_iter()
                .filter(|(t, _)| *t > switched)
                .count();
            Ok((after >= 50).then_some(()))
        })
        .unwrap();
        let times: Vec<f64> = replies(&pinger.output())
            .into_iter()
            .map(|(t, _)| t)
            .filter(|t| *t > killed_at - 1.0)
            .collect();
        let gap = times
            .windows(2)
            .map(|w| w[1] - w[0])
            .fold(0.0_f64, f64::max);
        eprintln!("round {round}: no traffic for {gap:.2} s around the kill");
        gaps.push(gap);
        // The killed router comes back as standby (no pre-emption).
        routers[p].start();
        routers[p].wait_routes("the restarted router is standby", |x| {
            x["advertise"][0]["role"] == "standby"
        });
    }
    pinger.signal("INT").unwrap();
    gaps.sort_by(f64::total_cmp);
    let median = (gaps[ROUNDS / 2 - 1] + gaps[ROUNDS / 2]) / 2.0;
    let max = gaps[ROUNDS - 1];
    println!("| path | TCP Gbit/s (one iperf3 stream, {} s) |", secs());
    println!("|---|---|");
    println!("| client -> router's mesh IP (direct mesh path) | {direct:.2} |");
    println!("| client -> LAN host through the router (subnet route, masquerade) | {routed:.2} |");
    println!();
    println!(
        "| failover (SIGKILL of the primary, {ROUNDS} rounds, ping every {} ms) | seconds |",
        PING_INTERVAL.as_millis()
    );
    println!("|---|---|");
    println!("| median | {median:.2} |");
    println!("| max | {max:.2} |");
    println!(
        "| all | {} |",
        gaps.iter()
            .map(|g| format!("{g:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
}
