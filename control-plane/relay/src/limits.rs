//! The relay's limits: every one a named default, a field of [`Limits`] and a flag of
//! `plexsphere relay`. When one is hit the relay drops (or refuses) and counts it, and logs one
//! line naming the limit and its flag at most every [`LIMIT_LOG_EVERY`].

use std::time::Duration;

use crate::prefix::PrefixLimits;

/// Nodes registered at once (`--max-nodes`); past it `register` is refused with `Busy`.
pub const DEFAULT_MAX_NODES: usize = 10_000;
/// TCP connections open at once (`--max-tcp-connections`); past it a new one is closed.
pub const DEFAULT_MAX_TCP_CONNECTIONS: usize = 10_000;
/// TCP connections open at once from one source address, or one IPv6 /64
/// (`--max-tcp-per-source`); past it a new one is closed at accept, before any TLS work. It is
/// held below `--max-tcp-connections` ([`Limits::tcp_per_source`]), so one source never holds
/// them all.
pub const DEFAULT_MAX_TCP_PER_SOURCE: usize = 256;
/// A TCP connection that has not registered this long after its accept is closed
/// (`--tcp-register-within-secs`): the TLS handshake, `hello`, `challenge` and `register`
/// must be done by then; pings and other frames do not extend it.
pub const DEFAULT_TCP_REGISTER_WITHIN: Duration = Duration::from_secs(10);
/// Answers a second to one source /24 (IPv4) or /48 (IPv6) that is not registered: STUN
/// answers, `challenge`, `refused` (`--prefix-answers-per-sec`). A forged source names its
/// victim, so this bounds what the relay reflects to any one network.
pub const DEFAULT_PREFIX_ANSWERS_PER_SEC: u64 = 100;
/// Answers one such prefix may get at once (`--prefix-answers-burst`).
pub const DEFAULT_PREFIX_ANSWERS_BURST: u64 = 200;
/// Source prefixes with a bucket of their own (`--max-answer-prefixes`); past it (after the
/// idle ones are pruned) new prefixes share one bucket of the same rate. About 100 bytes each.
pub const DEFAULT_MAX_ANSWER_PREFIXES: usize = 65_536;
/// The per-prefix answer limits with their defaults (the relay's and the control plane's STUN
/// responder's).
pub const DEFAULT_PREFIX_ANSWERS: PrefixLimits = PrefixLimits {
    per_sec: DEFAULT_PREFIX_ANSWERS_PER_SEC,
    burst: DEFAULT_PREFIX_ANSWERS_BURST,
    max_prefixes: DEFAULT_MAX_ANSWER_PREFIXES,
};
/// Frames a second one registered node may send (`--node-frames-per-sec`); 0: no limit.
pub const DEFAULT_NODE_FRAMES_PER_SEC: u64 = 100_000;
/// Bytes a second one registered node may send (`--node-bytes-per-sec`): 1 Gbit/s; 0: no limit.
pub const DEFAULT_NODE_BYTES_PER_SEC: u64 = 125_000_000;
/// `peer gone` answers a second to one node (`--node-answers-per-sec`).
pub const DEFAULT_NODE_ANSWERS_PER_SEC: u64 = 10;
/// `refused` answers a second to everyone together (`--refusals-per-sec`): the relay answers
/// strangers, so this bounds what it sends to forged source addresses.
pub const DEFAULT_REFUSALS_PER_SEC: u64 = 100;
/// The longest length-prefixed frame a TCP connection may send or be sent, in bytes: a
/// `register` with the largest token, or a `send` of a 1452-byte WireGuard datagram, fit with
/// room to spare. A longer frame from a node closes its connection; a longer `recv` for a
/// TCP node is dropped and counted.
pub const MAX_STREAM_FRAME: usize = plexsphere_wire::reach::relay::MAX_STREAM_FRAME;
/// Frames waiting for one TCP connection's writer; past it frames are dropped and counted, so a
/// slow reader costs at most this many x [`MAX_STREAM_FRAME`] bytes.
pub const TCP_QUEUE_FRAMES: usize = 256;
/// The relay's UDP threads at most (`--udp-threads`): by default it runs one a core
/// (`std::thread::available_parallelism`), up to this many, each with its own socket on the one
/// UDP address (`SO_REUSEPORT`). Every thread takes the core's one lock once a batch, so past
/// about this many the lock, not the cores, would set the pace; a relay on a bigger machine
/// runs this many.
pub const MAX_UDP_THREADS: usize = 16;
/// Bytes the writer of one TCP connection puts in one write at most (plus the one frame that
/// crosses it): it drains its queue into one buffer up to here, so a busy connection sends full
/// TLS records (16 KiB) with few system calls instead of one record and one call a frame. Per
/// busy connection the buffer costs this much memory and one frame more.
pub const TCP_WRITE_BATCH: usize = 64 * 1024;
/// A TLS handshake that takes longer closes the connection.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A TCP connection that sends no frame for this long is closed: two leases.
pub const TCP_IDLE_TIMEOUT: Duration =
    Duration::from_secs(2 * plexsphere_wire::reach::relay::LEASE_SECS as u64);
/// A limit that is hit again is logged at most this often (the count says how often it was).
pub const LIMIT_LOG_EVERY: Duration = Duration::from_secs(10);

/// The knobs; `Limits::default()` are the defaults above.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub max_nodes: usize,
    pub max_tcp_connections: usize,
    pub max_tcp_per_source: usize,
    pub tcp_register_within: Duration,
    /// Answers to unregistered sources, per /24 or /48.
    pub prefix_answers: PrefixLimits,
    pub node_frames_per_sec: u64,
    pub node_bytes_per_sec: u64,
    pub node_answers_per_sec: u64,
    pub refusals_per_sec: u64,
    /// UDP threads (`--udp-threads`); 0: one a core, at most [`MAX_UDP_THREADS`].
    pub udp_threads: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_nodes: DEFAULT_MAX_NODES,
            max_tcp_connections: DEFAULT_MAX_TCP_CONNECTIONS,
            max_tcp_per_source: DEFAULT_MAX_TCP_PER_SOURCE,
            tcp_register_within: DEFAULT_TCP_REGISTER_WITHIN,
            prefix_answers: DEFAULT_PREFIX_ANSWERS,
            node_frames_per_sec: DEFAULT_NODE_FRAMES_PER_SEC,
            node_bytes_per_sec: DEFAULT_NODE_BYTES_PER_SEC,
            node_answers_per_sec: DEFAULT_NODE_ANSWERS_PER_SEC,
            refusals_per_sec: DEFAULT_REFUSALS_PER_SEC,
            udp_threads: 0,
        }
    }
}

impl Limits {
    /// The per-source cap in force: `max_tcp_per_source`, but at most one below
    /// `max_tcp_connections` (when that is above 1), so one source always leaves a slot.
    pub fn tcp_per_source(&self) -> usize {
        self.max_tcp_per_source
            .min(self.max_tcp_connections.saturating_sub(1))
            .max(1)
    }

    /// Says which knob is out of range.
    pub fn check(&self) -> Result<(), String> {
        if self.max_nodes == 0 {
            return Err("--max-nodes must be at least 1".into());
        }
        if self.max_tcp_connections == 0 {
            return Err("--max-tcp-connections must be at least 1".into());
        }
        if self.max_tcp_per_source == 0 {
            return Err("--max-tcp-per-source must be at least 1".into());
        }
        if self.tcp_register_within.is_zero() {
            return Err("--tcp-register-within-secs must be at least 1".into());
        }
        self.prefix_answers.check([
            "--prefix-answers-per-sec",
            "--prefix-answers-burst",
            "--max-answer-prefixes",
        ])?;
        if self.node_answers_per_sec == 0 || self.refusals_per_sec == 0 {
            return Err("--node-answers-per-sec and --refusals-per-sec must be at least 1".into());
        }
        if self.udp_threads > MAX_UDP_THREADS {
            return Err(format!(
                "--udp-threads {} is over {MAX_UDP_THREADS}; give 0 (one a core) or at most {MAX_UDP_THREADS}",
                self.udp_threads
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_threads_past_the_cap_are_refused_naming_the_flag_and_the_range() {
        let ok = Limits {
            udp_threads: MAX_UDP_THREADS,
            ..Limits::default()
        };
        assert_eq!(ok.check(), Ok(()));
        let over = Limits {
            udp_threads: MAX_UDP_THREADS + 1,
            ..Limits::default()
        };
        let e = over.check().unwrap_err();
        assert!(
            e.contains("--udp-threads 17") && e.contains("at most 16"),
            "{e}"
        );
        assert_eq!(crate::udp::threads(3), 3);
        assert_eq!(
            crate::udp::threads(0),
            crate::udp::threads(0).clamp(1, MAX_UDP_THREADS)
        );
        assert!(crate::udp::threads(0) >= 1);
    }
}
