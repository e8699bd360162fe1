//! The access policy's filter on the packet path (issue 25, docs/policy.md "On the node").
//!
//! The device holds at most one [`PolicyFilter`] in its state, next to the peer tables, so
//! the lanes read it under the read lock they already take per batch; installing one takes
//! the write lock, like a peer change, and is atomic for every lane. Each WireGuard peer
//! keeps its slot in the filter (`PeerRef`), resolved once when the filter or the peers
//! change: a device peer is the filter's peer whose mesh address its allowed IPs route.
//!
//! Per packet: [`plexsphere_policy::decide::inbound_bytes`] after decryption (the security
//! boundary: the sender may be the attacker) and `outbound_bytes` before encryption. O(1):
//! a parse of the headers, a slot index, a bit test, and a flow-table lookup for replies.
//!
//! The flow table is one per WireGuard peer, in the peer's state: every flow is with one
//! peer (an inbound packet's source must be the peer's, an outbound packet's destination
//! routes to it), and both lanes (threads) already take that peer's lock for every packet,
//! so a reply finds the flow its request opened whichever lane it arrives on, with no lock
//! of its own and no contention between peers. A device-wide table under a mutex measured
//! 0.90x on wg-bench's one TCP stream (both lanes of the stream's peer meeting on it).
//! Capacity per peer: [`PEER_FLOW_CAPACITY`] (the oldest idle flow goes first when full).
//!
//! Routed traffic (issue 27): cryptokey routing already sends a packet for a route prefix
//! to the peer whose allowed IPs hold it (the route's primary router) and accepts from a
//! peer the sources its allowed IPs hold (a reply from a host behind the router; on the
//! router, the client's mesh address); the filter's decisions then keep what the grants of
//! the peer's `routes_out`/`routes_in` allow (docs/policy.md "Routed traffic"). A route
//! flow is kept in the flow table of the peer it goes through, like a direct one.
//!
//! No filter (`None`): every packet passes, as before policies. A closed filter
//! ([`PolicyFilter::closed`]) lets nothing from or to a peer through.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use plexsphere_policy::decide::Drop as Why;
use plexsphere_policy::view::NodeView;
use plexsphere_policy::{FlowTable, NodeFilter, PeerRef, ViewError};

/// A peer's drops of one reason are logged at most once per this long (the count of the
/// drops in between goes into the next line).
pub(crate) const POLICY_LOG_EVERY: Duration = Duration::from_secs(10);

/// Flows this node may have open with one peer (about 100 bytes each: ~800 KiB full);
/// past it the flow idle longest is forgotten (its replies are then dropped). This node's
/// own traffic opens flows, and, on a subnet router, the flows the peer opens through it
/// (so a client can fill only its own table: it evicts its own flows, never another
/// peer's).
pub(crate) const PEER_FLOW_CAPACITY: usize = 8192;

/// The reasons a packet is dropped by the policy, in counter order.
pub(crate) const REASONS: [&str; REASON_COUNT] = [
    "unknown_peer",
    "not_for_this_node",
    "not_from_this_node",
    "spoofed_source",
    "no_rule",
    "malformed",
    "route_denied",
];
pub(crate) const REASON_COUNT: usize = 7;

/// The index of a drop reason in [`REASONS`].
pub(crate) fn reason_index(why: &Why) -> usize {
    match why {
        Why::UnknownPeer => 0,
        Why::NotForThisNode => 1,
        Why::NotFromThisNode => 2,
        Why::SpoofedSource => 3,
        Why::NoRule { .. } => 4,
        Why::Malformed(_) => 5,
        Why::RouteDenied { .. } => 6,
    }
}

/// Packets the policy dropped since the device started, per direction and reason.
#[derive(Debug, Default)]
pub struct PolicyDrops {
    /// Decrypted packets from a peer (the peer tried to reach this node).
    pub inbound: [AtomicU64; REASON_COUNT],
    /// Packets from the host to a peer.
    pub outbound: [AtomicU64; REASON_COUNT],
}

impl PolicyDrops {
    /// `(reason, inbound, outbound)` for every reason.
    pub fn read(&self) -> Vec<(&'static str, u64, u64)> {
        REASONS
            .iter()
            .enumerate()
            .map(|(i, r)| {
                (
                    *r,
                    self.inbound[i].load(Ordering::Relaxed),
                    self.outbound[i].load(Ordering::Relaxed),
                )
            })
            .collect()
    }

    pub(crate) fn count(&self, inbound: bool, why: &Why) {
        let side = if inbound {
            &self.inbound
        } else {
            &self.outbound
        };
        side[reason_index(why)].fetch_add(1, Ordering::Relaxed);
    }
}

/// What the device enforces: a view's filter, or a closed one.
#[derive(Debug)]
pub struct PolicyFilter {
    pub(crate) filter: NodeFilter,
    /// The policy version (None: closed before any policy was known).
    version: Option<u64>,
    /// Why the filter is closed (None: the view's filter is installed).
    closed: Option<String>,
    /// Per filter peer, its mesh addresses (to find the WireGuard peer that routes them).
    pub(crate) peers: Vec<(PeerRef, Vec<IpAddr>)>,
}

impl PolicyFilter {
    /// The view's filter; a view that cannot become one gives the closed filter and the
    /// reason (fail closed: never allow-all on error).
    pub fn from_view(version: u64, view: &NodeView) -> (PolicyFilter, Option<ViewError>) {
        match NodeFilter::new(view) {
            Ok(filter) => {
                let peers = view
                    .peers
                    .iter()
                    .filter_map(|p| filter.peer(&p.id).map(|r| (r, p.addrs.clone())))
                    .collect();
                (
                    PolicyFilter {
                        filter,
                        version: Some(version),
                        closed: None,
                        peers,
                    },
                    None,
                )
            }
            Err(e) => {
                let why = format!("the view of policy version {version} is unusable: {e}");
                let mut f = PolicyFilter::closed(&why);
                f.version = Some(version);
                (f, Some(e))
            }
        }
    }

    /// A filter that lets nothing through, for `why`.
    pub fn closed(why: &str) -> PolicyFilter {
        PolicyFilter {
            filter: NodeFilter::closed(uuid_nil(), Vec::new()),
            version: None,
            closed: Some(why.to_owned()),
            peers: Vec::new(),
        }
    }

    pub fn version(&self) -> Option<u64> {
        self.version
    }

    /// Why nothing passes (None: the view's filter is installed).
    pub fn closed_reason(&self) -> Option<&str> {
        self.closed.as_deref()
    }

    pub fn filter(&self) -> &NodeFilter {
        &self.filter
    }
}

fn uuid_nil() -> uuid::Uuid {
    uuid::Uuid::nil()
}

/// The daemon's read-only handle on the filter's counters (for `plexd status` and metrics).
#[derive(Clone)]
pub struct PolicyReader(std::sync::Arc<crate::Device>);

impl PolicyReader {
    pub fn new(device: std::sync::Arc<crate::Device>) -> Self {
        Self(device)
    }

    /// `(reason, inbound, outbound)` drop counts.
    pub fn drops(&self) -> Vec<(&'static str, u64, u64)> {
        self.0.counters().policy.read()
    }

    /// Flows in the flow table.
    pub fn flows(&self) -> usize {
        self.0.policy_flows()
    }
}

/// A peer's policy state: its slot, the flows this node opened with it, and when each
/// reason was last logged.
#[derive(Debug)]
pub(crate) struct PeerPolicy {
    pub slot: Option<PeerRef>,
    pub flows: FlowTable,
    logged: [Option<Instant>; REASON_COUNT],
    /// Drops since the last line, per reason (u32: a peer's state stays under 512 bytes,
    /// `peer.rs`; saturates, far beyond what 10 s can bring).
    quiet: [u32; REASON_COUNT],
}

impl Default for PeerPolicy {
    fn default() -> Self {
        Self {
            slot: None,
            flows: Self::flow_table(),
            logged: [None; REASON_COUNT],
            quiet: [0; REASON_COUNT],
        }
    }
}

impl PeerPolicy {
    /// An empty flow table of [`PEER_FLOW_CAPACITY`] (it allocates as flows come).
    pub(crate) fn flow_table() -> FlowTable {
        FlowTable::new(PEER_FLOW_CAPACITY)
    }

    /// Logs a drop unless this peer's drops of that reason were logged less than
    /// [`POLICY_LOG_EVERY`] ago (then counted into the next line). Answers whether it
    /// logged.
    /// The peer's name is only made for a line that is written.
    pub(crate) fn log(
        &mut self,
        peer: impl FnOnce() -> String,
        inbound: bool,
        why: &Why,
        now: Instant,
    ) -> bool {
        let i = reason_index(why);
        if self.logged[i].is_some_and(|t| now.saturating_duration_since(t) < POLICY_LOG_EVERY) {
            self.quiet[i] = self.quiet[i].saturating_add(1);
            return false;
        }
        let more = u64::from(std::mem::take(&mut self.quiet[i]));
        self.logged[i] = Some(now);
        let dir = if inbound { "from" } else { "to" };
        let peer = peer();
        tracing::warn!(
            peer,
            reason = REASONS[i],
            suppressed = more,
            "policy: a packet {dir} peer {peer} {}; ({more} more like it since the last line, one line per peer and reason every {} s)",
            plexsphere_policy::Decision::Drop(*why),
            POLICY_LOG_EVERY.as_secs()
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plexsphere_policy::Proto;

    #[test]
    fn drops_are_logged_once_per_peer_and_reason_per_interval() {
        let mut p = PeerPolicy::default();
        let t0 = Instant::now();
        let no_rule = Why::NoRule {
            proto: Proto::Tcp,
            port: 22,
        };
        assert!(p.log(|| "web".into(), true, &no_rule, t0));
        // A flood within the interval: no line, counted for the next one.
        for i in 0..1000 {
            assert!(!p.log(
                || "web".into(),
                true,
                &no_rule,
                t0 + Duration::from_millis(i)
            ));
        }
        assert!(
            p.log(|| "web".into(), true, &Why::SpoofedSource, t0),
            "another reason has its own pace"
        );
        assert!(p.log(|| "web".into(), true, &no_rule, t0 + POLICY_LOG_EVERY));
        assert_eq!(
            p.quiet[reason_index(&no_rule)],
            0,
            "the line carried the count"
        );
    }
}
