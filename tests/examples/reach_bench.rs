//! The reach benchmark (root; `benches/reach-bench.sh` runs it, it is ignored otherwise): per
//! NAT topology, two plexd nodes behind their routers, the control plane and two relays on the
//! public segment (tests/src/nat.rs). It measures, in one run:
//! - the time from both daemons up (event streams connected) to the first ping over the mesh,
//!   and to a direct path (`plexd status`), when there is one;
//! - one iperf3 TCP stream over whatever path the topology gives (direct, relay over UDP,
//!   relay over TCP), with the relays' and both plexd's CPU-seconds per GB carried
//!   (/proc/<pid>/stat utime+stime).
//!
//! It asserts nothing about speed: it prints a Markdown table for docs/benchmarks.md. A
//! topology that cannot run (a missing piece: no `plexsphere relay` yet) gets a row saying
//! why, and the benchmark fails at the end, after measuring everything else.

#![allow(clippy::unwrap_used)] // benchmark code: a failed unwrap is a failed run

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use plexsphere_e2e::nat::{NatMode, NodeSpec, ReachLab, flags};
use plexsphere_e2e::netns::{exec, in_netns};
use plexsphere_e2e::{Proc, bin, wait_until};

/// How long each measured wait may take before the row says "none".
const WAIT_BOUND: Duration = Duration::from_secs(45);

struct Row {
    topology: &'static str,
    path: String,
    first_packet: String,
    direct: String,
    gbits: String,
    relay_cpu: String,
    plexd_cpu: String,
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// Whether this build has the relay (`plexsphere relay --help` answers).
fn relay_available() -> bool {
    bin("plexsphere").is_ok_and(|b| {
        Command::new(b)
            .args(["relay", "--help"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// utime + stime of `pid`, in seconds.
fn cpu_secs(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit(')').next().context("malformed stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state): utime is field 14, stime 15.
    let ticks: f64 =
        f.get(11).context("utime")?.parse::<f64>()? + f.get(12).context("stime")?.parse::<f64>()?;
    let out = Command::new("getconf").arg("CLK_TCK").output()?;
    let hz: f64 = String::from_utf8_lossy(&out.stdout).trim().parse()?;
    Ok(ticks / hz)
}

fn measure(topology: &'static str, modes: &[NatMode], relays: usize, secs_run: u32) -> Result<Row> {
    let mut lab = ReachLab::start(modes, relays)?;
    for r in 0..modes.len() {
        lab.add_node(&NodeSpec {
            router: r,
            backend: "userspace",
        })?;
    }
    lab.start_node(0)?;
    lab.start_node(1)?;
    let up = Instant::now();
    let peer_ip = lab.mesh_ip(1)?.to_string();
    // One ping every 0.2 s until the first answer.
    let out = exec(
        &lab.nodes[0].ns,
        "ping",
        &["-c", "1", "-i", "0.2", "-w", "45", &peer_ip],
    )?;
    if !out.status.success() {
        bail!("no ping over the mesh within 45 s\n{}", lab.dump());
    }
    let first_packet = secs(up.elapsed());
    let has_paths = lab.path(0, 1)?.is_some();
    let direct = if !has_paths {
        "n/a (plexd status shows no path)".to_owned()
    } else {
        match wait_until(WAIT_BOUND, "a direct path", || {
            Ok(lab
                .path(0, 1)?
                .filter(|p| p.is_direct())
                .map(|_| up.elapsed()))
        }) {
            Ok(d) => secs(d),
            Err(_) => "none".to_owned(),
        }
    };
    let path = match lab.path(0, 1)? {
        Some(p) if p.is_direct() => "direct".to_owned(),
        Some(p) => format!("{} {}", p.kind, p.transport.unwrap_or_default()),
        None => "(not reported)".to_owned(),
    };

    // One iperf3 TCP stream, node 0 -> node 1, with the CPU the relays and daemons spend.
    // The relay dev embeds runs in the control plane's process.
    let via_dev = lab.path(0, 1)?.and_then(|p| p.relay).as_deref() == Some(flags::DEV_RELAY_NAME);
    let pids: Vec<u32> = if via_dev {
        vec![lab.cp.proc.pid()]
    } else {
        lab.relays
            .iter()
            .filter_map(|r| r.proc.as_ref().map(Proc::pid))
            .collect()
    };
    let daemons: Vec<u32> = lab
        .nodes
        .iter()
        .filter_map(|n| n.proc.as_ref().map(Proc::pid))
        .collect();
    let server = Proc::spawn(in_netns(
        &lab.nodes[1].ns,
        Command::new("iperf3").args(["-s", "-1", "--forceflush", "-B", &peer_ip]),
    ))?;
    server.wait_for_line(Duration::from_secs(10), |l| l.contains("Server listening"))?;
    let cpu = |ps: &[u32]| ps.iter().map(|p| cpu_secs(*p).unwrap_or(0.0)).sum::<f64>();
    let (relay0, plexd0) = (cpu(&pids), cpu(&daemons));
    let client = exec(
        &lab.nodes[0].ns,
        "iperf3",
        &["-c", &peer_ip, "-t", &secs_run.to_string(), "-J"],
    )?;
    let (relay1, plexd1) = (cpu(&pids), cpu(&daemons));
    let v: serde_json::Value =
        serde_json::from_slice(&client.stdout).context("iperf3 -J output")?;
    let bytes = v["end"]["sum_received"]["bytes"]
        .as_f64()
        .context("iperf3 bytes")?;
    let bps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .context("iperf3 rate")?;
    let gb = bytes / 1e9;
    let per_gb = |c: f64| {
        if gb > 0.0 {
            format!("{:.2}", c / gb)
        } else {
            "-".into()
        }
    };
    Ok(Row {
        topology,
        path,
        first_packet,
        direct,
        gbits: format!("{:.2}", bps / 1e9),
        relay_cpu: if pids.is_empty() {
            "-".into()
        } else {
            per_gb(relay1 - relay0)
        },
        plexd_cpu: per_gb(plexd1 - plexd0),
    })
}

/// A benchmark, not a test: benches/reach-bench.sh runs it (`cargo run --example reach_bench`).
fn main() {
    let secs_run: u32 = std::env::var("REACH_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let relays = if relay_available() { 2 } else { 0 };
    let topologies: [(&'static str, &[NatMode], bool); 6] = [
        (
            "routing only (no NAT)",
            &[NatMode::None, NatMode::None],
            false,
        ),
        ("both EIM", &[NatMode::Eim, NatMode::Eim], true),
        ("both EDM", &[NatMode::Edm, NatMode::Edm], true),
        (
            "one drops UDP, one EIM",
            &[NatMode::DropUdp, NatMode::Eim],
            true,
        ),
        (
            "one EIM input accept, one routed",
            &[NatMode::EimInputAccept, NatMode::None],
            true,
        ),
        (
            "both EIM input accept",
            &[NatMode::EimInputAccept, NatMode::EimInputAccept],
            true,
        ),
    ];
    // REACH_BENCH_ONLY (benches/reach-bench.sh --only): the topologies whose names contain
    // one of its comma-separated words; empty or unset: all.
    let only: Vec<String> = std::env::var("REACH_BENCH_ONLY")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect();
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    for (name, modes, needs_relays) in topologies {
        if !only.is_empty() && !only.iter().any(|w| name.contains(w.as_str())) {
            continue;
        }
        eprintln!("reach-bench: {name}");
        if needs_relays && relays == 0 {
            failed.push(format!(
                "{name}: `plexsphere relay` is missing in this build (the relay is not merged)"
            ));
            continue;
        }
        match measure(name, modes, relays, secs_run) {
            Ok(r) => rows.push(r),
            Err(e) => failed.push(format!(
                "{name}: {}",
                format!("{e:#}").lines().next().unwrap_or("")
            )),
        }
    }
    println!(
        "| topology | path | first packet | direct path | TCP Gbit/s | relay CPU-s/GB | plexd CPU-s/GB (both) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.topology, r.path, r.first_packet, r.direct, r.gbits, r.relay_cpu, r.plexd_cpu
        );
    }
    for f in &failed {
        println!("| {f} | | | | | | |");
    }
    assert!(
        failed.is_empty(),
        "topologies that could not run:\n{}",
        failed.join("\n")
    );
}
