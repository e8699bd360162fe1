//! The probes of `routes.advertise[].probe`: one thread per target sends an ICMP echo every
//! [`PROBE_INTERVAL`] and waits up to [`PROBE_TIMEOUT`] for the reply (a ping socket, else a
//! raw one: plexd runs as root), and posts each result. The verdict with its hysteresis is
//! the reporter's ([`super::report::Health`]).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use tokio::sync::mpsc;

use crate::echo::EchoSocket;

/// How often each probe target is pinged.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// How long one echo waits for its reply.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// One probe's result: the route, whether the target answered.
pub(crate) type ProbeResult = (IpNet, bool);

/// The running probes, one thread each.
#[derive(Debug)]
pub struct Probes {
    tx: mpsc::Sender<ProbeResult>,
    running: BTreeMap<(IpNet, IpAddr), Arc<AtomicBool>>,
}

impl Probes {
    pub fn new(tx: mpsc::Sender<ProbeResult>) -> Self {
        Self {
            tx,
            running: BTreeMap::new(),
        }
    }

    /// Runs exactly these probes (stops the others, starts the new ones).
    pub fn sync(&mut self, want: &[(IpNet, IpAddr)]) {
        self.running.retain(|key, stop| {
            let keep = want.contains(key);
            if !keep {
                stop.store(true, Ordering::Relaxed);
            }
            keep
        });
        for &(cidr, target) in want {
            if self.running.contains_key(&(cidr, target)) {
                continue;
            }
            let stop = Arc::new(AtomicBool::new(false));
            let (flag, tx) = (stop.clone(), self.tx.clone());
            let spawned = std::thread::Builder::new()
                .name("plexd-route-probe".into())
                .spawn(move || run(cidr, target, &flag, &tx));
            match spawned {
                Ok(_) => {
                    self.running.insert((cidr, target), stop);
                }
                Err(e) => tracing::warn!(%cidr, "cannot start the probe of {target}: {e}"),
            }
        }
    }

    /// Stops every probe (each thread ends within one interval).
    pub fn stop(&mut self) {
        self.sync(&[]);
    }
}

impl Drop for Probes {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(cidr: IpNet, target: IpAddr, stop: &AtomicBool, tx: &mpsc::Sender<ProbeResult>) {
    let mut socket: Option<EchoSocket> = None;
    let mut last_error = None;
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        if socket.is_none() {
            match EchoSocket::open(target) {
                Ok(s) => socket = Some(s),
                Err(e) => {
                    if last_error.as_ref() != Some(&e) {
                        tracing::warn!(%cidr, "the probe of {target} cannot send: {e}");
                    }
                    last_error = Some(e);
                }
            }
        }
        let answered = match &socket {
            Some(s) => match s.run(1, PROBE_INTERVAL, PROBE_TIMEOUT) {
                Ok(replies) => replies.first().is_some_and(|r| r.rtt_ms.is_some()),
                Err(e) => {
                    tracing::debug!(%cidr, "the probe of {target} failed: {e}");
                    // A socket whose route went away is opened again.
                    socket = None;
                    false
                }
            },
            None => false,
        };
        if stop.load(Ordering::Relaxed) || tx.blocking_send((cidr, answered)).is_err() {
            return;
        }
        std::thread::sleep(PROBE_INTERVAL.saturating_sub(started.elapsed()));
    }
}
