//! The access policy's part of `plexd status` and `plexd policy` as the core keeps it
//! (docs/policy.md "On the node"): the version the signed state carries, whether its filter is
//! installed or closed (and why), the drop counters and the view's lines. Reading the data
//! plane's counters and the human lines are the shell's (`daemon/policy_status.rs`).

use serde::{Deserialize, Serialize};

/// The filter's state on this node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FilterState {
    /// No state applied yet: the embedded data plane lets nothing through until one is.
    #[default]
    Pending,
    /// The signed state carries no policy (a control plane older than policies): nothing
    /// is filtered, every peer reaches every port, as before.
    None,
    /// The view's filter is installed.
    Installed,
    /// Nothing passes to or from any peer: the filter could not be installed (`why`).
    Closed,
}

/// One reason's drop counts (`REASONS` in agent/dataplane/src/policy.rs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropCount {
    pub reason: String,
    /// Packets from peers (decrypted, stopped before the host).
    pub inbound: u64,
    /// Packets from the host to peers (stopped before encryption).
    pub outbound: u64,
}

/// The policy part of `plexd status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyStatus {
    /// The policy version of the applied signed state (None: it carries no policy).
    pub version: Option<u64>,
    pub filter: FilterState,
    /// Why the filter is closed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// Peers in the view.
    pub peers: usize,
    /// Flows in the data plane's flow table (embedded data plane only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flows: Option<usize>,
    /// Drops per reason (embedded data plane only; empty otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drops: Vec<DropCount>,
}

/// What `plexd policy` shows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyReport {
    pub status: PolicyStatus,
    /// `NodeView::describe()`: one line per peer and direction.
    pub lines: Vec<String>,
    /// The view itself (what `plexd ping` checks a peer against).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub view: Option<plexsphere_policy::view::NodeView>,
}
