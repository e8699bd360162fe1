//! Access policy as code: who may reach whom over the mesh (issue 25).
//!
//! A Domain has one policy document, YAML (docs/policy.md has the whole syntax):
//!
//! ```yaml
//! tags: [web, db, ci]              # tags the document may name before nodes carry them
//! groups:
//!   frontends: [tag:web, tag:edge]
//!   prod-apps: tag:prod - tag:db   # set subtraction
//! rules:                           # only allow; what no rule allows is denied
//!   - src: group:frontends
//!     dst: tag:db
//!     proto: tcp
//!     ports: [5432, 8000-8100]
//!   - src: project:ops
//!     dst: '*'
//!     proto: icmp
//! tests:
//!   - {src: tag:web, dst: tag:db, port: 5432, proto: tcp, expect: accept}
//!   - {src: tag:ci, dst: tag:db, port: 5432, proto: tcp, expect: deny}
//! ```
//!
//! Everything here is pure: no I/O, no clock (`now` is passed in), no server dependency,
//! so the control plane and plexd both use it.
//!
//! | module | owns |
//! |---|---|
//! | [`document`] | the YAML shape, [`DEFAULT_DOCUMENT`] (allow-all), [`parse`] |
//! | [`selector`] | the selector grammar (`tag:`, `project:`, `node:`, `group:`, `*`, CIDR, `-`) |
//! | [`ports`] | protocols, port ranges and sets, [`Access`] (what one node may open on another) |
//! | [`model`] | the parsed document: [`Policy`], [`Rule`], [`Group`], [`PolicyTest`] |
//! | `groups`, `locate`, `fields` | group checks (unknown, cycles, depth); line and column lookup; field readers |
//! | [`check`] | names against the Domain (unknown project, node, tag) |
//! | [`doc_tests`] | running the document's tests; [`validate`] = parse + names + tests |
//! | [`inventory`] | the Domain's nodes and Projects as the compiler sees them |
//! | [`eval`] | the plain evaluator (scans rules): the reference for tests and explain |
//! | [`compile`] | (policy, inventory) -> [`Compiled`]: node sets, classes, prefix rules |
//! | [`view`] | one node's [`NodeView`]: its peer set and per-peer grants (signed-state data) |
//! | [`approvers`] | `auto_approvers`: whose routes and exits are approved without an operator |
//! | [`route_grants`] | subnet routes and exits: who may use which, with what (`routes_out`/`routes_in`) |
//! | [`filter`] | [`NodeFilter`]: the view as O(1) lookups (bitmaps per distinct port set) |
//! | [`packet`] | raw IPv4/IPv6 bytes -> [`Packet`] (addresses, TCP/UDP ports, ICMP echo id) |
//! | [`flow`] | [`FlowTable`]: flows this node opened, bounded, idle timeouts, O(1) |
//! | [`decide`] | the per-packet [`Decision`] (inbound and outbound) with its reason |
//! | [`mod@explain`] | why A may (not) reach B: the rule and line, or the rule that would |
//! | [`diff`] | [`reach_diff`]: which node pairs gain or lose which ports, as lines |
//! | [`error`] | [`PolicyError`] with [`Location`]; [`limits`]: every bound |

mod approve;
pub mod approvers;
mod bitset;
pub mod check;
pub mod compile;
pub mod decide;
pub mod diff;
pub mod doc_tests;
pub mod document;
pub mod error;
pub mod eval;
pub mod explain;
mod fields;
pub mod filter;
pub mod flow;
mod groups;
pub mod inventory;
pub mod limits;
mod locate;
pub mod model;
pub mod packet;
pub mod ports;
mod resolve;
pub mod route_grants;
mod route_use;
pub mod selector;
pub mod view;

pub use approve::{NodeApprovals, auto_approves};
pub use approvers::AutoApprovers;
pub use check::check_names;
pub use compile::{Compiled, Grant, RouteRule};
pub use decide::{Decision, inbound, inbound_bytes, outbound, outbound_bytes, prune_flows};
pub use diff::{DiffEntry, ReachDiff, reach_diff};
pub use doc_tests::{run_tests, validate};
pub use document::{DEFAULT_DOCUMENT, default_document, parse};
pub use error::{ErrorKind, Location, PolicyError, PolicyErrors};
pub use explain::{Explanation, explain, explain_address, parse_what};
pub use filter::{NodeFilter, PeerRef, ViewError};
pub use flow::{FlowKey, FlowTable};
pub use inventory::{Inventory, NodeInfo, ProjectInfo, RouteInfo, RouteInventory};
pub use model::{Expect, Group, Policy, PolicyTest, Rule};
pub use packet::{Packet, PacketError, parse_packet};
pub use ports::{Access, PortRange, PortSet, Proto, ProtoSet};
pub use view::{NodeView, PeerView};
