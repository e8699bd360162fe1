//! `plexd-wg [-f|--foreground] <iface>`: plexd's userspace WireGuard as a drop-in for
//! `wireguard-go`. It creates the TUN interface `<iface>` and serves the UAPI socket
//! /var/run/wireguard/<iface>.sock, so `wg`, `wg-quick` and `wireguard-control` configure it
//! (`WG_USERSPACE_IMPLEMENTATION=plexd-wg`). Without `-f` (or `WG_PROCESS_FOREGROUND=1`) it
//! starts itself in the background and exits once the socket is up, as wireguard-go does.
//! SIGTERM/SIGINT stop it cleanly (SIGHUP is ignored); the interface and the socket go away
//! with it.
//!
//! Each performance technique has a switch, so it can be measured on its own:
//! `PLEXD_WG_MMSG=0` sends and receives one datagram per system call instead of a batch;
//! `PLEXD_WG_OFFLOAD=0` reads and writes the TUN one MTU-sized packet at a time (no TSO/GRO);
//! `PLEXD_WG_USO=0` keeps the TCP offloads but does not ask the TUN for UDP segmentation
//! offload, so the kernel cuts a `UDP_SEGMENT` sender's super-datagram before we read it;
//! `PLEXD_WG_GSO=0` / `PLEXD_WG_GRO=0` turn off UDP segmentation / receive coalescing;
//! `PLEXD_WG_QUEUE=0` processes each read batch whole (with a crypto pool, as one job), with no
//! queue in front of the cipher (so no priority, no AQM, no byte bound); `PLEXD_WG_AQM=0` keeps the queue without CoDel;
//! `PLEXD_WG_PRIORITY=0` keeps it without small packets first (see the data plane's `lane.rs`);
//! `PLEXD_WG_NICE=0` leaves the packet threads at the process's priority instead of -20.
//! `PLEXD_WG_QUANTUM=<bytes>` sets the bytes encrypted or decrypted between two looks at the
//! devices (1500 to 4194304; 64 KiB by default).
//! `PLEXD_WG_CRYPTO_WORKERS=<n>` (0 to 64, default 0) starts the ordered crypto pool: n threads
//! seal and open one peer's packets in parallel beside the two packet threads, released in
//! the order read (`plexd_dataplane::pool`); it runs on plexd's own protocol implementation.
//! `PLEXD_WG_PROTOCOL=boringtun|plexd` picks the WireGuard state machine without a pool
//! (default boringtun; a pool implies plexd).
//!
//! Exit codes: 0 clean stop, 1 runtime failure, 64 bad usage.

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{SigSet, Signal};
use plexd_dataplane::linux::sched::PACKET_THREAD_NICE;
use plexd_dataplane::linux::{LinuxTun, LinuxUdpBinder};
use plexd_dataplane::pool::MAX_WORKERS;
use plexd_dataplane::runner::{QueueConfig, RunConfig, Shutdown, run};
use plexd_dataplane::uapi_server::{TAKEOVER_WAIT, served_by, socket_path};
use plexd_dataplane::{Device, Protocol};

const USAGE: &str = "usage: plexd-wg [-f|--foreground] <interface>";
const DEFAULT_MTU: u32 = 1420;
const FOREGROUND_ENV: &str = "WG_PROCESS_FOREGROUND";
/// How long the background start waits for the new instance's socket (beyond the time that
/// instance may wait for an exiting one: `TAKEOVER_WAIT`).
const STARTUP_WAIT: Duration = Duration::from_secs(10);
/// The bounds of `PLEXD_WG_QUANTUM`: one MTU-sized packet, and a lane's worth.
const QUANTUM_MIN: usize = 1500;
const QUANTUM_MAX: usize = 4 << 20;

fn main() -> ExitCode {
    let mut foreground = std::env::var(FOREGROUND_ENV).is_ok_and(|v| v == "1");
    let mut iface = None;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "-f" | "--foreground" => foreground = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            _ if iface.is_none() && !arg.starts_with('-') => iface = Some(arg),
            _ => {
                eprintln!("plexd-wg: unexpected argument `{arg}`\n{USAGE}");
                return ExitCode::from(64);
            }
        }
    }
    let Some(iface) = iface else {
        eprintln!("plexd-wg: missing the interface name\n{USAGE}");
        return ExitCode::from(64);
    };
    let result = if foreground {
        run_foreground(&iface)
    } else {
        start_background(&iface)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plexd-wg: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Starts this program again in the foreground, detached, and waits for its UAPI socket.
fn start_background(iface: &str) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find this program's path to restart it")?;
    let mut child = Command::new(exe)
        .arg(iface)
        .env(FOREGROUND_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .context("cannot start plexd-wg in the background")?;
    let path = socket_path(iface);
    // The child may first wait for an exiting instance to let go of the path.
    let bound = STARTUP_WAIT + TAKEOVER_WAIT;
    let deadline = Instant::now() + bound;
    while Instant::now() < deadline {
        if let Some(status) = child
            .try_wait()
            .context("cannot watch the background plexd-wg")?
        {
            bail!(
                "the background plexd-wg exited ({status}) before serving {}; run `plexd-wg -f {iface}` to see why",
                path.display()
            );
        }
        // Its own socket: an instance of the same interface that is exiting may still
        // answer at the path for a moment (netns.sh deletes an interface and starts it again).
        if served_by(&path, child.id()) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!(
        "the background plexd-wg did not serve {} within {} s; run `plexd-wg -f {iface}` to see why",
        path.display(),
        bound.as_secs()
    )
}

fn run_foreground(iface: &str) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LOG_LEVEL")
                .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();

    // Block the stop signals before any thread starts, so they all inherit the mask and only
    // the waiter below receives them.
    let mut signals = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        signals.add(s);
    }
    signals
        .thread_block()
        .context("cannot block SIGTERM/SIGINT for a clean shutdown")?;

    // The switches first: a bad value is refused before anything is created.
    let quantum = match std::env::var("PLEXD_WG_QUANTUM") {
        Err(_) => QueueConfig::default().quantum,
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if (QUANTUM_MIN..=QUANTUM_MAX).contains(&n) => n,
            _ => bail!(
                "PLEXD_WG_QUANTUM={v:?}: give the bytes per quantum, {QUANTUM_MIN} to {QUANTUM_MAX}"
            ),
        },
    };
    let crypto_workers = match std::env::var("PLEXD_WG_CRYPTO_WORKERS") {
        Err(_) => 0,
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if n <= MAX_WORKERS => n,
            _ => bail!(
                "PLEXD_WG_CRYPTO_WORKERS={v:?}: give the number of crypto threads, 0 (no pool) to {MAX_WORKERS}"
            ),
        },
    };
    let protocol = match std::env::var("PLEXD_WG_PROTOCOL") {
        Err(_) => Protocol::default(),
        Ok(v) => v
            .parse::<Protocol>()
            .map_err(|e| anyhow::anyhow!("PLEXD_WG_PROTOCOL: {e}"))?,
    };
    let tun = LinuxTun::create_with(
        iface,
        DEFAULT_MTU,
        switch("PLEXD_WG_OFFLOAD"),
        switch("PLEXD_WG_USO"),
    )?;
    tracing::info!(
        interface = iface,
        mtu = DEFAULT_MTU,
        offloads = tun.offloads(),
        uso = tun.uso(),
        "TUN interface created"
    );
    let shutdown = Shutdown::new();
    {
        let shutdown = shutdown.clone();
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                // SIGHUP stays blocked and is ignored (a closed terminal must not stop us).
                loop {
                    match signals.wait() {
                        Ok(Signal::SIGHUP) => continue,
                        Ok(sig) => tracing::info!(signal = %sig, "stopping"),
                        Err(e) => {
                            tracing::warn!(error = %e, "waiting for signals failed; stopping")
                        }
                    }
                    break;
                }
                shutdown.trigger();
            })
            .context("cannot start the signal thread")?;
    }
    let config = RunConfig {
        uapi_socket: Some(socket_path(iface)),
        crypto_workers,
        queue: QueueConfig {
            enabled: switch("PLEXD_WG_QUEUE"),
            aqm: switch("PLEXD_WG_AQM"),
            priority: switch("PLEXD_WG_PRIORITY"),
            quantum,
        },
        nice: switch("PLEXD_WG_NICE").then_some(PACKET_THREAD_NICE),
        ..RunConfig::default()
    };
    let device = std::sync::Arc::new(Device::with_protocol(
        protocol,
        plexsphere_wire::clock::Now::system(),
    ));
    // A benchmark's access policy (wg-bench): the compiled view in DIR/<iface>.json, as a
    // signed state would carry it; no variable, no filter (plexd-wg filters nothing).
    if let Ok(dir) = std::env::var("PLEXD_WG_POLICY_VIEWS") {
        let path = Path::new(&dir).join(format!("{iface}.json"));
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read the policy view {}", path.display()))?;
        let view: plexsphere_policy::view::NodeView = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a policy view", path.display()))?;
        let (filter, error) = plexd_dataplane::PolicyFilter::from_view(1, &view);
        if let Some(e) = error {
            anyhow::bail!("the policy view {} gives no filter: {e}", path.display());
        }
        device.set_policy(Some(filter));
        tracing::info!(interface = iface, view = %path.display(), peers = view.peers.len(), "policy filter installed");
    }
    run(
        device,
        tun,
        LinuxUdpBinder {
            mmsg: switch("PLEXD_WG_MMSG"),
            gso: switch("PLEXD_WG_GSO"),
            gro: switch("PLEXD_WG_GRO"),
        },
        config,
        shutdown,
    )
    .with_context(|| format!("the data plane of {iface} stopped"))?;
    tracing::info!(
        interface = iface,
        socket = %Path::new(&socket_path(iface)).display(),
        "stopped; socket removed"
    );
    Ok(())
}

/// A performance technique's switch: on unless the variable is `0`.
fn switch(name: &str) -> bool {
    std::env::var(name).map_or(true, |v| v != "0")
}
