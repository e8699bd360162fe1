//! The relay's limits: every one a named default, a field of [`Limits`] and a flag of
//! `plexsphere relay`. When one is hit the relay drops (or refuses) and counts it, and logs one
//! line naming the limit and its flag at most every [`LIMIT_LOG_EVERY`].

use std::time::Duration;

/// Nodes registered at once (`--max-nodes`); past it `register` is refused with `Busy`.
pub const DEFAULT_MAX_NODES: usize = 10_000;
/// TCP connections open at once (`--max-tcp-connections`); past it a new one is closed.
pub const DEFAULT_MAX_TCP_CONNECTIONS: usize = 10_000;
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
pub const MAX_STREAM_FRAME: usize = 8192;
/// Frames waiting for one TCP connection's writer; past it frames are dropped and counted, so a
/// slow reader costs at most this many x [`MAX_STREAM_FRAME`] bytes.
pub const TCP_QUEUE_FRAMES: usize = 256;
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
    pub node_frames_per_sec: u64,
    pub node_bytes_per_sec: u64,
    pub node_answers_per_sec: u64,
    pub refusals_per_sec: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_nodes: DEFAULT_MAX_NODES,
            max_tcp_connections: DEFAULT_MAX_TCP_CONNECTIONS,
            node_frames_per_sec: DEFAULT_NODE_FRAMES_PER_SEC,
            node_bytes_per_sec: DEFAULT_NODE_BYTES_PER_SEC,
            node_answers_per_sec: DEFAULT_NODE_ANSWERS_PER_SEC,
            refusals_per_sec: DEFAULT_REFUSALS_PER_SEC,
        }
    }
}

impl Limits {
    /// Says which knob is out of range.
    pub fn check(&self) -> Result<(), String> {
        if self.max_nodes == 0 {
            return Err("--max-nodes must be at least 1".into());
        }
        if self.max_tcp_connections == 0 {
            return Err("--max-tcp-connections must be at least 1".into());
        }
        if self.node_answers_per_sec == 0 || self.refusals_per_sec == 0 {
            return Err("--node-answers-per-sec and --refusals-per-sec must be at least 1".into());
        }
        Ok(())
    }
}
