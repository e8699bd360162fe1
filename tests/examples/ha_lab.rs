//! The local highly available lab that `scripts/ha-lab` runs (root): a Postgres cluster of its
//! own, a NATS JetStream cluster, several `plexsphere serve` replicas on that database and
//! HAProxy in front, the same pieces as the HA tests (tests/src/ha.rs). It prints the one
//! `api_url`, the CA, an admin operator token and a plexctl config, then stays in the
//! foreground until Ctrl-C (SIGINT) or SIGTERM, and removes everything it made.
//!
//! `ha_lab [--replicas N] [--nats N] [--pg-port PORT] [--bench-registrations N] [--bench-budgets]`:
//! `--bench-registrations` registers N nodes through HAProxy with 8 clients at once, prints
//! the rate (docs/benchmarks.md, "Several replicas") and exits instead of waiting.
//! `--bench-budgets` starts the lab for a benchmark that runs against it (the event fan-out
//! across the replicas, docs/benchmarks.md "Event fan-out"): a registration budget for a whole
//! fleet from one address, the operator token also in a file, the replicas' pids printed.

use std::os::unix::fs::PermissionsExt as _;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use plexsphere_e2e::LAB_NODES_PROJECT;
use plexsphere_e2e::ha::{Lab, LabOptions, Postgres, free_port};
use plexsphere_e2e::ha_client::{self, Operator};

/// Clients registering at once in the registration benchmark.
const BENCH_CLIENTS: usize = 8;

struct Args {
    replicas: usize,
    nats: usize,
    pg_port: Option<u16>,
    bench: Option<usize>,
    budgets: bool,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        replicas: 3,
        nats: 3,
        pg_port: None,
        bench: None,
        budgets: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |what: &str| -> Result<usize> {
            let v = it.next().with_context(|| format!("{flag} needs {what}"))?;
            v.parse()
                .with_context(|| format!("{flag} takes {what}, not {v:?}"))
        };
        match flag.as_str() {
            "--replicas" => args.replicas = value("a number of replicas (1-9)")?,
            "--nats" => args.nats = value("a number of NATS servers (0-5)")?,
            "--pg-port" => {
                let port = value("a TCP port")?;
                args.pg_port = Some(u16::try_from(port).context("--pg-port is a TCP port")?);
            }
            "--bench-registrations" => args.bench = Some(value("a number of registrations")?),
            "--bench-budgets" => args.budgets = true,
            other => bail!(
                "unknown argument {other:?} (expected --replicas N, --nats N, --pg-port PORT, --bench-registrations N or --bench-budgets)"
            ),
        }
    }
    if !(1..=9).contains(&args.replicas) {
        bail!("--replicas must be 1 to 9, not {}", args.replicas);
    }
    if args.nats > 5 {
        bail!("--nats must be 0 to 5, not {}", args.nats);
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = parse_args()?;
    if !nix::unistd::Uid::effective().is_root() {
        bail!(
            "run it as root (sudo scripts/ha-lab): the lab starts its own Postgres as the postgres user"
        );
    }
    let root = tempfile::Builder::new()
        .prefix("ha1-lab-")
        .tempdir_in("/var/tmp")
        .context("making the lab's directory in /var/tmp")?;
    // The postgres user must reach its cluster directory inside.
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o711))?;
    let pg_port = match args.pg_port {
        Some(p) => p,
        None => free_port()?,
    };
    let pg = Postgres::own_cluster(&root.path().join("postgres"), pg_port)?;
    let opts = LabOptions {
        replicas: args.replicas,
        nats_nodes: args.nats,
        // The benchmarks' clients all come from one address.
        extra_args: if args.bench.is_some() || args.budgets {
            vec!["--register-burst".into(), "1000000".into()]
        } else {
            Vec::new()
        },
        ..LabOptions::default()
    };
    let lab = Lab::start(root.path(), pg, opts)?;
    lab.wait_bus_consuming(1)?;
    if let Some(n) = args.bench {
        return bench(&lab, n).await;
    }
    println!(
        "plexsphere HA lab: {} replicas, {} NATS servers, HAProxy, Postgres",
        args.replicas, args.nats
    );
    println!("api url: {}", lab.api_url);
    println!("ca file: {}", lab.certs.ca_file.display());
    println!("operator token: {}", lab.operator_token);
    if args.budgets {
        let file = root.path().join("operator-token");
        std::fs::write(&file, &lab.operator_token)?;
        println!("operator token file: {}", file.display());
    }
    println!("export PLEXCTL_CONFIG={}", lab.plexctl_config.display());
    for (i, r) in lab.replicas.iter().flatten().enumerate() {
        println!(
            "replica {}: {} (pid {}, data dir {})",
            i + 1,
            r.url(),
            r.proc.pid(),
            r.data_dir.display()
        );
    }
    if let Some(n) = &lab.nats {
        println!("nats: {}", n.urls());
    }
    println!("database: {}", lab.pg.url);
    println!("haproxy config: {}", lab.root.join("haproxy.cfg").display());
    println!("Ctrl-C stops the lab and removes {}", root.path().display());
    wait_for_stop().await?;
    println!("stopping the lab");
    drop(lab);
    Ok(())
}

async fn wait_for_stop() -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

/// Registers `n` nodes through HAProxy, [`BENCH_CLIENTS`] at once (tokens issued beforehand,
/// not timed), and prints the rate.
async fn bench(lab: &Lab, n: usize) -> Result<()> {
    let http = ha_client::client(&lab.certs.ca_file)?;
    let op = Operator {
        http: http.clone(),
        base: lab.api_url.clone(),
        token: lab.operator_token.clone(),
    };
    let mut tokens = Vec::with_capacity(n);
    for _ in 0..n {
        tokens.push(op.issue_token(LAB_NODES_PROJECT).await?);
    }
    let started = Instant::now();
    let chunks: Vec<Vec<String>> = tokens
        .chunks(n.div_ceil(BENCH_CLIENTS).max(1))
        .map(<[String]>::to_vec)
        .collect();
    let mut tasks = Vec::new();
    for (c, chunk) in chunks.into_iter().enumerate() {
        let (http, base) = (http.clone(), lab.api_url.clone());
        tasks.push(tokio::spawn(async move {
            for (i, token) in chunk.iter().enumerate() {
                ha_client::register(&http, &base, token, &format!("bench-{c}-{i}")).await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let took = started.elapsed();
    let replicas = lab.replicas.iter().flatten().count();
    println!(
        "{n} registrations through HAProxy on {replicas} replica(s), {BENCH_CLIENTS} clients: {:.2} s, {:.0} registrations/s",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64().max(f64::EPSILON)
    );
    Ok(())
}
