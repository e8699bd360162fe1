//! The GSO path probe's schedule (embedded data plane only): a thread that runs the data
//! plane's segmentation probe ([`plexd_dataplane::probe`]) on a few peers with a recent
//! handshake while the socket sends with UDP GSO: once the first handshakes are in after the
//! start, then every [`GSO_PROBE_EVERY`]. A path that loses segmented datagrams is
//! - logged as a warning that says what to do (`plexctl node set NODE --udp-offload off`),
//! - kept for `plexd status` (which peer, the reply counts, when),
//! - reported to the control plane as an `error` observation (`plexctl node observations`).
//!
//! plexd does not switch GSO off by itself: the switch follows the signed state, which the
//! operator owns, and a probe cannot test segmentation while GSO is off, so an automatic
//! switch could never learn that the path recovered. The kernel backend does not probe.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use plexd_dataplane::{ProbeReport, Prober, Verdict};
use uuid::Uuid;

use super::core::io;
use super::input::Input;
use super::status::{GsoProbePeer, GsoProbeStatus};

/// How often the thread looks for the first handshakes after the start.
pub const GSO_PROBE_FIRST_POLL: Duration = Duration::from_secs(2);
/// Time between two rounds once the first one ran.
pub const GSO_PROBE_EVERY: Duration = Duration::from_secs(30 * 60);
/// A peer is probed only with a handshake this recent (its session is current: WireGuard
/// rejects a session after 180 s without a new handshake).
pub const GSO_PROBE_RECENT_HANDSHAKE: Duration = Duration::from_secs(180);
/// Peers probed per round (most recent handshake first); each takes up to about 2.2 s.
pub const GSO_PROBE_MAX_PEERS: usize = 3;
/// Probe results kept for `plexd status` (the oldest go first).
pub const GSO_PROBE_KEEP: usize = 16;

#[derive(Debug, Default)]
struct Board {
    rounds: u64,
    last_round: Option<Instant>,
    results: BTreeMap<String, (Instant, ProbeReport)>,
}

/// The running probe thread's results; the thread ends when this is dropped.
pub struct GsoProbe {
    board: Arc<Mutex<Board>>,
    /// Asks the thread for a round now; it answers on the oneshot when the round is done.
    wake: mpsc::Sender<tokio::sync::oneshot::Sender<()>>,
}

/// What the thread needs to know about this node.
pub struct ProbeSetup {
    pub node_id: Uuid,
    pub mesh_ip: IpAddr,
    /// The interface MTU: the size of each probe request.
    pub mtu: usize,
}

impl GsoProbe {
    /// Starts the thread; its findings go to the core through `tx`.
    pub fn start(
        prober: Prober,
        setup: ProbeSetup,
        tx: tokio::sync::mpsc::Sender<Input>,
    ) -> std::io::Result<Self> {
        let board = Arc::new(Mutex::new(Board::default()));
        let (wake, woken) = mpsc::channel();
        let b = board.clone();
        thread::Builder::new()
            .name("gso-probe".into())
            .spawn(move || run(&prober, &setup, &b, &woken, &tx))?;
        Ok(Self { board, wake })
    }

    /// Runs a round now (`plexd status --probe-gso`); the receiver fires when it is done (or
    /// the thread is gone).
    pub fn run_now(&self) -> tokio::sync::oneshot::Receiver<()> {
        let (done, rx) = tokio::sync::oneshot::channel();
        let _ = self.wake.send(done);
        rx
    }

    pub fn status(&self, now: Instant) -> GsoProbeStatus {
        let b = self.board.lock().unwrap_or_else(PoisonError::into_inner);
        let age = |at: Instant| now.saturating_duration_since(at).as_secs();
        GsoProbeStatus {
            rounds: b.rounds,
            last_round_age_secs: b.last_round.map(age),
            peers: b
                .results
                .iter()
                .map(|(key, (at, r))| GsoProbePeer {
                    public_key: key.clone(),
                    mesh_ip: r.dst,
                    verdict: r.verdict.as_str().to_owned(),
                    sent: r.sent,
                    segmented_replies: r.segmented_replies,
                    single_replies: r.single_replies,
                    size: r.size,
                    age_secs: age(*at),
                })
                .collect(),
        }
    }
}

/// Why the thread woke.
enum Wake {
    Timeout,
    /// `plexd status --probe-gso`: a round now, then this fires.
    Now(tokio::sync::oneshot::Sender<()>),
    /// The owner is gone (plexd stops).
    Stop,
}

fn pause(woken: &WakeRx, d: Duration) -> Wake {
    match woken.recv_timeout(d) {
        Ok(done) => Wake::Now(done),
        Err(mpsc::RecvTimeoutError::Timeout) => Wake::Timeout,
        Err(mpsc::RecvTimeoutError::Disconnected) => Wake::Stop,
    }
}

type WakeRx = mpsc::Receiver<tokio::sync::oneshot::Sender<()>>;

fn run(
    prober: &Prober,
    setup: &ProbeSetup,
    board: &Mutex<Board>,
    woken: &WakeRx,
    tx: &tokio::sync::mpsc::Sender<Input>,
) {
    // The first round waits for the first handshakes (or an operator's request).
    let mut asked = loop {
        match pause(woken, GSO_PROBE_FIRST_POLL) {
            Wake::Stop => return,
            Wake::Now(done) => break Some(done),
            Wake::Timeout => {}
        }
        if prober.gso_in_use()
            && !prober
                .candidates(setup.mesh_ip, GSO_PROBE_RECENT_HANDSHAKE)
                .is_empty()
        {
            break None;
        }
    };
    loop {
        if prober.gso_in_use() {
            if !round(prober, setup, board, tx) {
                return;
            }
        } else {
            tracing::debug!(
                "the WireGuard socket does not send with UDP GSO now; no GSO probe this round"
            );
        }
        if let Some(done) = asked.take() {
            let _ = done.send(());
        }
        asked = match pause(woken, GSO_PROBE_EVERY) {
            Wake::Stop => return,
            Wake::Now(done) => Some(done),
            Wake::Timeout => None,
        };
    }
}

/// One round; false when the daemon's loop is gone.
fn round(
    prober: &Prober,
    setup: &ProbeSetup,
    board: &Mutex<Board>,
    tx: &tokio::sync::mpsc::Sender<Input>,
) -> bool {
    let peers = prober.candidates(setup.mesh_ip, GSO_PROBE_RECENT_HANDSHAKE);
    for (key, ip) in peers.into_iter().take(GSO_PROBE_MAX_PEERS) {
        let report = match prober.probe(&key, setup.mesh_ip, ip, setup.mtu) {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(peer = %key, "no GSO probe of this peer: {e}");
                continue;
            }
        };
        let b64 = key.to_base64();
        tracing::debug!(peer = %b64, verdict = report.verdict.as_str(), segmented = report.segmented_replies, single = report.single_replies, "GSO probe");
        if report.verdict == Verdict::SegmentedLost {
            let message = lost_message(setup.node_id, &b64, &report);
            tracing::warn!(peer = %b64, mesh_ip = %ip, "{message}");
            if tx
                .blocking_send(Input::Core(io::Input::Observe(message)))
                .is_err()
            {
                return false;
            }
        }
        let mut b = board.lock().unwrap_or_else(PoisonError::into_inner);
        b.results.insert(b64, (Instant::now(), report));
        while b.results.len() > GSO_PROBE_KEEP {
            let oldest = b
                .results
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => b.results.remove(&k),
                None => break,
            };
        }
    }
    let mut b = board.lock().unwrap_or_else(PoisonError::into_inner);
    b.rounds += 1;
    b.last_round = Some(Instant::now());
    true
}

/// The warning and the observation of a lost path: what was seen and what to do.
pub fn lost_message(node_id: Uuid, peer: &str, r: &ProbeReport) -> String {
    format!(
        "GSO probe: the path to peer {peer} ({}) loses segmented UDP datagrams: {}/{} replies to one UDP GSO send of {} echo requests of {} bytes, {}/{} to the same sent one by one; bulk traffic on it stalls while handshakes and pings pass; switch UDP offload off for this node: plexctl node set {node_id} --udp-offload off",
        r.dst, r.segmented_replies, r.sent, r.sent, r.size, r.single_replies, r.sent
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use plexd_dataplane::PublicKey;

    #[test]
    fn a_lost_path_says_which_peer_what_was_seen_and_what_to_do() {
        let r = ProbeReport {
            peer: PublicKey([1; 32]),
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
            size: 1420,
            sent: 8,
            segmented_replies: 0,
            single_replies: 8,
            verdict: Verdict::SegmentedLost,
        };
        let id = Uuid::nil();
        let m = lost_message(id, "KEY", &r);
        assert!(m.contains("peer KEY (10.0.0.2)"), "{m}");
        assert!(m.contains("0/8 replies to one UDP GSO send"), "{m}");
        assert!(m.contains("8/8 to the same sent one by one"), "{m}");
        assert!(
            m.ends_with(&format!("plexctl node set {id} --udp-offload off")),
            "{m}"
        );
        let s = GsoProbeStatus {
            rounds: 1,
            last_round_age_secs: Some(3),
            peers: vec![GsoProbePeer {
                public_key: "KEY".into(),
                mesh_ip: r.dst,
                verdict: "segmented_lost".into(),
                sent: 8,
                segmented_replies: 0,
                single_replies: 8,
                size: 1420,
                age_secs: 3,
            }],
        };
        assert_eq!(
            super::super::status::gso_probe_lines(&s),
            vec![
                "peer KEY (10.0.0.2): segmented_lost, 0/8 segmented and 8/8 single replies, 3 s ago"
            ]
        );
    }
}
