//! NAT topologies for the reach tests (root): a "public" segment, routers that translate with
//! nftables, and node namespaces behind them. Everything lives in namespaces this module
//! creates, so nothing touches the host's own interfaces or routes, and concurrent tests (even
//! in one process) never collide: every name carries the pid and a counter, and the addresses
//! repeat only inside each topology's own namespaces. Drop removes it all, after a failed
//! assertion too.
//!
//! ```text
//!   public ns (br0: 203.0.113.1/24 + server aliases .10, .11, ...; forwarding on)
//!      |  r0                     |  r1
//!   router 0 (wan 203.0.113.100) router 1 (wan 203.0.113.101)     nft NAT per NatMode
//!      |  lan 10.200.0.1/24      |  lan 10.200.1.1/24
//!   node 0.0 (eth0 10.200.0.10)  node 1.0 (eth0 10.200.1.10)
//! ```
//!
//! Every router's firewall drops new connections addressed to the router itself on its WAN
//! side, as a home router's does. That also keeps a datagram from a peer that arrives before
//! the inside host has sent anything from creating a conntrack entry for the router itself
//! (which would make the host's later mapping pick another port). [`NatMode::EimInputAccept`]
//! is the router without that rule, whose mappings an early datagram moves.
//!
//! Needs `ip` (iproute2), `nft` (nftables) and `conntrack` (conntrack).

pub mod flags;
mod mesh;
mod observe;
mod probe;
mod rules;
mod spoof;
mod topology;
mod wg;

pub use mesh::{LabNode, NodeSpec, ReachLab, RelayInfo, node_config};
pub use observe::{LongStream, PeerPath, peer_entry};
pub use probe::{UdpEcho, udp_mapped_from};
pub use rules::{NatMode, ruleset};
pub use spoof::{nat_mapped_port, send_spoofed};
pub use topology::{
    MAX_NODES_PER_ROUTER, MAX_ROUTERS, MAX_SERVERS, PUBLIC_GATEWAY, PUBLIC_PREFIX, Topology,
};
pub use wg::{WgPeer, wg_keypair};
