//! The console benchmark (`benches/console-bench.sh` runs it): a real `plexsphere dev` whose
//! database is seeded with [`NODES`] nodes (default 10,000) in the lab Domain and, when the
//! control plane stores paths, [`PAIRS`] pairs with a reported path; Debian's chromium loads
//! the nodes page and the map [`LOADS`] times each, signed in with the dev admin token.
//! - time to first render: the `performance` marks the console sets when the node list
//!   (`plexsphere:nodes-rendered`) and the map (`plexsphere:map-rendered`) are drawn, in ms
//!   from the start of the navigation: median and p99;
//! - the server's CPU per page view: utime + stime of the plexsphere process from
//!   /proc/<pid>/stat before and after the loads of a page, divided by the loads.
//!
//! It asserts nothing about speed: it prints Markdown for docs/benchmarks.md.
//! Env: CONSOLE_BENCH_NODES, CONSOLE_BENCH_PAIRS, CONSOLE_BENCH_LOADS.

#![allow(clippy::unwrap_used)] // benchmark code: a failed unwrap is a failed run

use std::process::Command;

use plexsphere_e2e::ControlPlane;
use plexsphere_e2e::browser::{Browser, PAGE_BOUND};

const DOMAIN_SLUG: &str = "lab";
const LAB_NODES: &str = "019a0816-0000-7000-8000-000000000002";
const OPENSTACK: &str = "019a0816-0000-7000-8000-000000000001";

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// SQL that inserts `n` online nodes (every tenth in the OpenStack Project), with unique mesh
/// IPs (10.64.2.0 onwards), keys, key prefixes and names.
fn seed_nodes_sql(n: usize, domain: &str, now: i64) -> String {
    format!(
        "WITH RECURSIVE i(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM i WHERE x < {last})
INSERT INTO nodes (id, domain_id, project_id, hostname, arch, plexd_version, mesh_ip,
  wireguard_public_key, credential_sha256, registered_at, last_seen_at, last_heartbeat_at,
  key_prefix, dns_name, tags)
SELECT printf('0b3a0000-0000-4000-8000-%012x', x), '{domain}',
  CASE WHEN x % 10 = 9 THEN '{OPENSTACK}' ELSE '{LAB_NODES}' END,
  printf('bench-%05d', x), 'amd64', '0.1.0',
  printf('10.64.%d.%d', 2 + x / 250, 1 + x % 250),
  printf('%s=', substr(hex(randomblob(32)) || hex(randomblob(32)), 1, 43)),
  hex(randomblob(32)), {now}, {now}, {now},
  printf('bench%06x', x), printf('bench-%05d', x), 'tag:bench'
FROM i;",
        last = n.saturating_sub(1),
    )
}

fn sqlite(db: &std::path::Path, sql: &str) -> String {
    let out = Command::new("sqlite3")
        .args(["-cmd", ".timeout 30000"])
        .arg(db)
        .arg(sql)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "sqlite3: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// utime + stime of `pid` in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn ticks_per_sec() -> f64 {
    let out = Command::new("getconf").arg("CLK_TCK").output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(100.0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

struct Measured {
    median: f64,
    p99: f64,
    cpu_ms_per_view: f64,
}

async fn measure(b: &Browser, url: &str, mark: &str, loads: usize, pid: u32) -> Measured {
    let script = format!(
        "const m = performance.getEntriesByName('{mark}'); return m.length ? m[0].startTime : null;"
    );
    // One warm-up load (the browser's cache of the files, the server's first queries).
    b.goto(url).await.unwrap();
    b.wait_js(mark, &script, PAGE_BOUND * 4).await.unwrap();
    let before = cpu_ticks(pid);
    let mut times = Vec::with_capacity(loads);
    for _ in 0..loads {
        b.goto(url).await.unwrap();
        let v = b.wait_js(mark, &script, PAGE_BOUND * 4).await.unwrap();
        times.push(v.as_f64().unwrap());
    }
    let after = cpu_ticks(pid);
    times.sort_by(f64::total_cmp);
    Measured {
        median: percentile(&times, 50.0),
        p99: percentile(&times, 99.0),
        cpu_ms_per_view: (after - before) as f64 * 1000.0 / ticks_per_sec() / loads as f64,
    }
}

fn main() {
    let nodes = env("CONSOLE_BENCH_NODES", 10_000);
    let pairs = env("CONSOLE_BENCH_PAIRS", 3_000);
    let loads = env("CONSOLE_BENCH_LOADS", 20);
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_dev(&tmp.path().join("cp")).unwrap();
    let db = cp.data_dir.join("plexsphere.db");
    let domain = sqlite(
        &db,
        &format!("SELECT id FROM domains WHERE slug = '{DOMAIN_SLUG}';"),
    );
    let domain = domain.trim().to_owned();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    sqlite(&db, &seed_nodes_sql(nodes, &domain, now));
    let seeded_pairs = seed_paths(&db, &domain, nodes, pairs, now);
    let cfg = std::fs::read_to_string(cp.plexctl_config()).unwrap();
    let token_file = cfg
        .lines()
        .find_map(|l| l.strip_prefix("token_file: "))
        .unwrap()
        .trim()
        .to_owned();
    let token = std::fs::read_to_string(token_file)
        .unwrap()
        .trim()
        .to_owned();
    let base = cp.url.trim_end_matches('/').to_owned();
    let pid = cp.proc.pid();

    let rt = tokio::runtime::Runtime::new().unwrap();
    let (list, map) = rt.block_on(async {
        let b = Browser::start(&cp.ca_file()).await.unwrap();
        b.goto(&format!("{base}/sign-in")).await.unwrap();
        b.js(
            "sessionStorage.setItem('plexsphere-operator-token', arguments[0]); return true;",
            vec![serde_json::json!(token)],
        )
        .await
        .unwrap();
        let list = measure(
            &b,
            &format!("{base}/nodes"),
            "plexsphere:nodes-rendered",
            loads,
            pid,
        )
        .await;
        let map = measure(
            &b,
            &format!("{base}/map"),
            "plexsphere:map-rendered",
            loads,
            pid,
        )
        .await;
        b.close().await.unwrap();
        (list, map)
    });
    println!(
        "Console at {nodes} nodes and {seeded_pairs} pairs with a path, {loads} loads each (chromium headless, same machine):\n"
    );
    println!("| page | first render, median | first render, p99 | plexsphere CPU per view |");
    println!("| --- | --- | --- | --- |");
    for (name, m) in [("nodes (`/nodes`)", list), ("map (`/map`)", map)] {
        println!(
            "| {name} | {:.0} ms | {:.0} ms | {:.1} ms |",
            m.median, m.p99, m.cpu_ms_per_view
        );
    }
}

/// Inserts reported paths between `pairs` pairs of the seeded nodes (node k and node k+1, a
/// third each direct, relayed over UDP, relayed over TCP), as if the first of each pair had
/// reported them; answers how many pairs it seeded.
fn seed_paths(db: &std::path::Path, domain: &str, nodes: usize, pairs: usize, now: i64) -> usize {
    let pairs = pairs.min(nodes.saturating_sub(1));
    if pairs == 0 {
        return 0;
    }
    sqlite(
        db,
        &format!(
            "WITH RECURSIVE i(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM i WHERE x < {last})
INSERT INTO node_paths (node_id, peer_node_id, domain_id, kind, relay, transport, endpoint,
  rtt_ms, last_handshake_at, updated_at, seq)
SELECT printf('0b3a0000-0000-4000-8000-%012x', x), printf('0b3a0000-0000-4000-8000-%012x', x + 1),
  '{domain}', CASE WHEN x % 3 = 0 THEN 'direct' ELSE 'relay' END,
  CASE WHEN x % 3 = 0 THEN NULL ELSE 'relay1' END,
  CASE x % 3 WHEN 1 THEN 'udp' WHEN 2 THEN 'tcp' ELSE NULL END,
  CASE WHEN x % 3 = 0 THEN '192.0.2.1:51820' ELSE NULL END,
  1.0 + (x % 50), {now}, {now}, 1
FROM i;
INSERT INTO path_heads (domain_id, seq, removed_seq) VALUES ('{domain}', 1, 0)
  ON CONFLICT (domain_id) DO UPDATE SET seq = excluded.seq;",
            last = pairs - 1
        ),
    );
    pairs
}
