//! The DNS benchmark (docs/benchmarks.md, "DNS"):
//!
//! - `dns-bench query SERVER NAME SECS INFLIGHT`: INFLIGHT closed-loop UDP clients ask SERVER
//!   (`address:port`) for NAME's A record for SECS seconds; prints queries per second and the
//!   answer latency's median, p99 and max (a query without an answer within 1 s is lost).
//! - `dns-bench names N`: builds plexd's name table for a state of N peers (the code plexd runs,
//!   `plexd::dns::zone`) and prints what it adds to the process's resident memory.

use std::net::{SocketAddr, UdpSocket};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["query", server, name, secs, inflight] => query(server, name, secs, inflight),
        ["names", n] => names(n),
        _ => Err("usage: dns-bench query SERVER NAME SECS INFLIGHT | dns-bench names N".into()),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dns-bench: {e}");
            ExitCode::from(1)
        }
    }
}

fn query(server: &str, name: &str, secs: &str, inflight: &str) -> Result<(), String> {
    let server: SocketAddr = server.parse().map_err(|e| format!("SERVER: {e}"))?;
    let secs: u64 = secs.parse().map_err(|e| format!("SECS: {e}"))?;
    let inflight: usize = inflight.parse().map_err(|e| format!("INFLIGHT: {e}"))?;
    let name = Name::from_ascii(name).map_err(|e| format!("NAME: {e}"))?;
    let until = Instant::now() + Duration::from_secs(secs);
    let threads: Vec<_> = (0..inflight)
        .map(|t| {
            let name = name.clone();
            std::thread::spawn(move || client(server, name, until, t as u16))
        })
        .collect();
    let mut lat = Vec::new();
    let (mut lost, mut errors) = (0u64, 0u64);
    for t in threads {
        let (l, lo, er) = t
            .join()
            .map_err(|_| "a client thread panicked".to_string())??;
        lat.extend(l);
        lost += lo;
        errors += er;
    }
    lat.sort_unstable();
    let pct = |p: f64| -> f64 {
        lat.get(((lat.len() as f64 - 1.0) * p) as usize)
            .map_or(f64::NAN, |d: &Duration| d.as_secs_f64() * 1e6)
    };
    println!(
        "server {server} name {name} inflight {inflight}: {:.0} answers/s over {secs} s; latency us p50 {:.0} p99 {:.0} max {:.0}; lost {lost}; not NOERROR {errors}",
        lat.len() as f64 / secs as f64,
        pct(0.5),
        pct(0.99),
        pct(1.0)
    );
    Ok(())
}

type ClientResult = Result<(Vec<Duration>, u64, u64), String>;

fn client(server: SocketAddr, name: Name, until: Instant, seed: u16) -> ClientResult {
    let bind = if server.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let socket = UdpSocket::bind(bind).map_err(|e| e.to_string())?;
    socket.connect(server).map_err(|e| e.to_string())?;
    socket
        .set_read_timeout(Some(Duration::from_secs(1)))
        .map_err(|e| e.to_string())?;
    let (mut lat, mut lost, mut errors) = (Vec::new(), 0u64, 0u64);
    let mut id = seed.wrapping_mul(7919);
    let mut buf = [0u8; 1500];
    while Instant::now() < until {
        id = id.wrapping_add(1);
        let mut q = Message::new(id, MessageType::Query, OpCode::Query);
        q.metadata.recursion_desired = true;
        q.add_query(Query::query(name.clone(), RecordType::A));
        let bytes = q.to_vec().map_err(|e| e.to_string())?;
        let start = Instant::now();
        socket.send(&bytes).map_err(|e| e.to_string())?;
        loop {
            match socket.recv(&mut buf) {
                Ok(n) => {
                    let Ok(m) = Message::from_vec(&buf[..n]) else {
                        continue;
                    };
                    if m.metadata.id != id {
                        continue;
                    }
                    lat.push(start.elapsed());
                    if m.metadata.response_code != ResponseCode::NoError || m.answers.is_empty() {
                        errors += 1;
                    }
                    break;
                }
                Err(_) => {
                    lost += 1;
                    break;
                }
            }
        }
    }
    Ok((lat, lost, errors))
}

fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn names(n: &str) -> Result<(), String> {
    use plexd::dns::zone::{Zone, ZoneInput};
    use plexsphere_wire::node::PeerSpec;
    use plexsphere_wire::routes::DnsState;
    use std::net::{IpAddr, Ipv4Addr};

    let n: u32 = n.parse().map_err(|e| format!("N: {e}"))?;
    let peers: Vec<PeerSpec> = (0..n)
        .map(|i| {
            let [_, _, hi, lo] = (i + 2).to_be_bytes();
            PeerSpec {
                node_id: uuid::Uuid::from_u128(u128::from(i) + 2),
                hostname: format!("host-{i}"),
                public_key: String::new(),
                mesh_ip: IpAddr::V4(Ipv4Addr::new(10, 64, hi, lo)),
                allowed_ips: vec![],
                endpoints: vec![],
                persistent_keepalive_secs: None,
                home_relay: None,
                dns_name: Some(format!("node-{i}-of-the-benchmark")),
            }
        })
        .collect();
    let dns = DnsState {
        suffix: "mesh.internal".into(),
        name: "self".into(),
    };
    let own = [IpAddr::V4(Ipv4Addr::new(10, 64, 0, 1))];
    let before = rss_kib().ok_or("no VmRSS in /proc/self/status")?;
    let start = Instant::now();
    let zone = Zone::build(ZoneInput {
        dns: Some(&dns),
        own_addrs: &own,
        mesh: "10.64.0.0/16".parse().map_err(|e| format!("{e}"))?,
        peers: &peers,
        view: None,
    })
    .ok_or("no table")?;
    let took = start.elapsed();
    let after = rss_kib().ok_or("no VmRSS in /proc/self/status")?;
    println!(
        "{} names: the table adds {} KiB to the resident memory ({:.0} bytes a name), built in {:.1} ms",
        zone.len(),
        after.saturating_sub(before),
        after.saturating_sub(before) as f64 * 1024.0 / zone.len() as f64,
        took.as_secs_f64() * 1e3
    );
    Ok(())
}
