//! Every bound of the policy crate, with its reason. docs/policy.md "Limits" lists the same.

use std::time::Duration;

/// Largest document accepted, in bytes: a policy is text an operator reads; 1 MiB holds
/// about 10,000 rules in the block style.
pub const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;
/// Rules per document (the per-packet check does not depend on it; compile time does).
pub const MAX_RULES: usize = 10_000;
/// Named groups per document.
pub const MAX_GROUPS: usize = 1_000;
/// How deep groups may name groups (`group:a` naming `group:b` naming ... ), counting the
/// group a rule names as 1.
pub const MAX_GROUP_DEPTH: usize = 8;
/// Tests per document.
pub const MAX_TESTS: usize = 1_000;
/// Tags a document may declare under `tags:`.
pub const MAX_DECLARED_TAGS: usize = 10_000;
/// Length of one selector string (`tag:prod - tag:db`), in bytes.
pub const MAX_SELECTOR_LEN: usize = 256;
/// Entries in one list: a rule's `src`, `dst`, `ports` or `proto`, a group's members.
pub const MAX_LIST_LEN: usize = 256;
/// Length of a tag, group, node or project name.
pub const MAX_NAME_LEN: usize = 64;
/// Errors one validation reports before it stops (the first ones are the useful ones).
pub const MAX_REPORTED_ERRORS: usize = 20;
/// Distinct port sets a compiled policy may yield. A node's filter keeps one 8 KiB bitmap
/// per distinct set it uses, so this bounds the bitmaps of one filter at 32 MiB (a real
/// policy has a handful).
pub const MAX_PORT_SETS: usize = 4_096;

/// Flows a [`crate::flow::FlowTable`] holds by default (about 100 bytes each: ~7 MiB full).
pub const DEFAULT_FLOW_CAPACITY: usize = 65_536;
/// Idle time after which a TCP flow this node opened is forgotten (RFC 5382 REQ-5: at
/// least 2 h 4 min for an established connection).
pub const TCP_FLOW_IDLE: Duration = Duration::from_secs(2 * 3600 + 4 * 60);
/// Idle time for a UDP flow (RFC 4787 REQ-5: at least 2 minutes).
pub const UDP_FLOW_IDLE: Duration = Duration::from_secs(120);
/// Idle time for an ICMP echo flow (RFC 5508 REQ-1: at least 60 s).
pub const ICMP_FLOW_IDLE: Duration = Duration::from_secs(60);
/// Idle time for a flow of any other IP protocol (GRE, SCTP, ...).
pub const OTHER_FLOW_IDLE: Duration = Duration::from_secs(120);
/// Expired flows one packet removes at most per protocol list, so no single packet pays for
/// a large expiry (the rest goes with the next packets; a found expired flow is dropped on
/// the spot).
pub const FLOW_EXPIRY_BATCH: usize = 8;

/// IPv6 extension headers the packet parser walks before it gives up (drops the packet).
pub const MAX_IPV6_EXT_HEADERS: usize = 8;
/// The most routes (subnet routes and exits in service) a compile considers: a node's view
/// costs O(routes x rules with prefix destinations) on top of its peers.
pub const MAX_ROUTES: usize = 1_024;
