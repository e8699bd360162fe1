//! The simulated world's network: the NAT kinds a host can sit behind (every row of
//! docs/reach.md's table, and the cones around them), the path each pair of kinds is expected
//! to end on, and the address plan.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use crate::reach::engine::sim_nat::{Filtering, Mapping, Router};
use crate::reach::io::{Path, Transport};

/// The WireGuard port of every host.
pub const PORT: u16 = 51820;

/// What a host sits behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NatKind {
    /// No NAT, no filter: a public address.
    Routed,
    /// Endpoint-independent mapping and filtering.
    FullCone,
    /// Endpoint-independent mapping, address filtering.
    Restricted,
    /// Linux `masquerade`: endpoint-independent mapping, address-and-port filtering, the
    /// unsolicited dropped.
    Eim,
    /// `masquerade` whose input keeps an entry for the unsolicited (it holds the tuple).
    EimInputAccept,
    /// `masquerade random`: a port per destination, address-and-port filtering.
    Edm,
    /// No UDP leaves the LAN (TCP does).
    DropUdp,
}

impl NatKind {
    pub const ALL: [NatKind; 7] = [
        NatKind::Routed,
        NatKind::FullCone,
        NatKind::Restricted,
        NatKind::Eim,
        NatKind::EimInputAccept,
        NatKind::Edm,
        NatKind::DropUdp,
    ];

    /// The router of this kind with public address `wan` (for [`NatKind::Routed`], the host's
    /// own address).
    pub fn router(self, wan: IpAddr) -> Router {
        match self {
            NatKind::Routed => Router::routed(wan),
            NatKind::FullCone => {
                Router::with(wan, Mapping::Independent, Filtering::Endpoint, false)
            }
            NatKind::Restricted => {
                Router::with(wan, Mapping::Independent, Filtering::Address, false)
            }
            NatKind::Eim => Router::new(wan, false),
            NatKind::EimInputAccept => Router::new(wan, true),
            NatKind::Edm => Router::with(wan, Mapping::Dependent, Filtering::AddressPort, false),
            NatKind::DropUdp => Router::dropping_udp(wan),
        }
    }
}

/// The path a node is expected to end on towards a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    Direct,
    Relay(Transport),
    /// Either a direct path or a relay over UDP: a pair whose punch can lose the race at an
    /// input-accepting router, then waits for the quiet (docs/reach.md, the last row).
    DirectOrRelay,
}

impl Want {
    pub fn holds(self, path: &Path) -> bool {
        match (self, path) {
            (Want::Direct | Want::DirectOrRelay, Path::Direct { .. }) => true,
            (Want::Relay(t), Path::Relay { transport, .. }) => *transport == t,
            (Want::DirectOrRelay, Path::Relay { transport, .. }) => *transport == Transport::Udp,
            _ => false,
        }
    }
}

/// The path a node behind `own` ends on towards a peer behind `peer`: docs/reach.md's table
/// ("What each NAT topology gives"), extended to the cones. A UDP-dropping side relays over
/// TCP (its peer over UDP); an endpoint-dependent mapping meets only a filter that lets in
/// what its new port sends (a cone, or a routed host, which learns the port from the ping:
/// peer-reflexive); everything else punches a direct path. `strict`: the input-accepting pairs
/// of the table's last row go direct (the two-node simulations, and the thousand nodes within
/// a quiet's bound); else they may stay relayed, as a pair whose timed punch lost its race does
/// until the quiet after it ends (docs/reach.md "The simulator").
pub fn expected(own: NatKind, peer: NatKind, strict: bool) -> Want {
    use NatKind::*;
    if own == DropUdp {
        return Want::Relay(Transport::Tcp);
    }
    if peer == DropUdp {
        return Want::Relay(Transport::Udp);
    }
    let pair = |a: NatKind, b: NatKind| (own == a && peer == b) || (own == b && peer == a);
    if pair(Edm, Edm) || pair(Edm, Eim) || pair(Edm, EimInputAccept) {
        return Want::Relay(Transport::Udp);
    }
    let racing = pair(EimInputAccept, EimInputAccept) || pair(EimInputAccept, Eim);
    if racing && !strict {
        return Want::DirectOrRelay;
    }
    Want::Direct
}

/// The public address of router `n` (one /24 each: the relays' per-prefix answer budgets are
/// per network, as on the Internet).
pub fn wan(n: usize) -> IpAddr {
    let [_, _, hi, lo] = (n as u32).to_be_bytes();
    IpAddr::V4(Ipv4Addr::new(20, hi, lo, 1))
}

/// A host's address on its LAN: every LAN is 192.168.1.0/24, as home networks are, so a
/// peer's local candidate names a host only on the same LAN. `n` moves a roaming host.
pub fn inside(n: u8) -> SocketAddr {
    SocketAddr::from(([192, 168, 1, n], PORT))
}

/// STUN server `n` (two, so a node can tell endpoint-independent mapping from dependent).
pub fn stun(n: u8) -> SocketAddr {
    SocketAddr::from(([30, 0, 0, n], 3478))
}

/// Relay `n`'s UDP address.
pub fn relay_udp(n: u8) -> SocketAddr {
    SocketAddr::from(([40, 0, 0, n], 3478))
}
