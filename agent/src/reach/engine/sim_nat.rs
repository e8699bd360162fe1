//! A NAT router for the simulators (the engine's, [`super::sim`], and the node's,
//! `crate::reach::node::sim`), in every kind docs/reach.md's table has and the cones around
//! them:
//!
//! - **mapping**, as Linux `masquerade` does it: a host's flow towards a remote address keeps
//!   the host's port when that public tuple is free, else takes another (endpoint-independent,
//!   [`Mapping::Independent`]); or every new flow takes a port of its own (`masquerade random`,
//!   endpoint-dependent, [`Mapping::Dependent`]);
//! - **filtering**: a datagram gets in when a flow on its public port was sent to its exact
//!   source address and port ([`Filtering::AddressPort`], Linux conntrack), to its source
//!   address ([`Filtering::Address`], a restricted cone), or anywhere
//!   ([`Filtering::Endpoint`], a full cone);
//! - **input accept** ([`Router::accept_input`]): a datagram that matched no flow keeps an entry
//!   of the router's own, and that entry holds its tuple too, so the host's later flow to the
//!   same remote takes another port ("EIM, input accept"); else it is dropped and leaves nothing;
//! - **UDP dropped** ([`Router::drop_udp`]): no UDP leaves or enters (TCP passes);
//! - **routed** ([`Router::routed`]): no NAT and no filter, the host's address is public.
//!
//! Entries live [`CONNTRACK_UDP`] past their last datagram either way (expiry is checked on
//! lookup). Lookups go through hash maps that are never iterated, so a router holds hundreds of
//! flows at no cost to the order of anything (tests/src/nat builds the same routers with
//! nftables for the reach tests).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// Linux's `nf_conntrack_udp_timeout`: an unreplied UDP entry lives this long.
pub const CONNTRACK_UDP: Duration = Duration::from_secs(30);
/// Where the router's other ports start when the host's own is taken (and where
/// endpoint-dependent mappings start).
const FIRST_OTHER_PORT: u16 = 20_000;

/// How a router picks the public port of a new flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mapping {
    /// The host's own port when the public tuple is free (`masquerade`).
    Independent,
    /// A port of its own for every flow (`masquerade random`).
    Dependent,
}

/// Which datagrams a router lets in to a flow's public port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filtering {
    /// From anywhere (a full cone).
    Endpoint,
    /// From any port of an address the flow's host sent to (a restricted cone).
    Address,
    /// Only from the exact address and port the host sent to (Linux conntrack).
    AddressPort,
}

/// One NAT router in front of one simulated node (or several).
#[derive(Debug, Clone)]
pub struct Router {
    pub wan: IpAddr,
    pub mapping: Mapping,
    pub filtering: Filtering,
    /// The router's own input accepts unsolicited datagrams ("EIM, input accept"): each keeps
    /// an entry that holds its tuple. Else they are dropped and leave nothing.
    pub accept_input: bool,
    /// No UDP passes either way.
    pub drop_udp: bool,
    /// No NAT and no filter: the host's address is `wan` itself.
    pub routed: bool,
    /// (inside, remote) -> (public port, until).
    flows: HashMap<(SocketAddr, SocketAddr), (u16, Instant)>,
    /// (public port, remote) -> (the inside host, or `None` for an entry of the router's own;
    /// until).
    tuples: HashMap<(u16, SocketAddr), (Option<SocketAddr>, Instant)>,
    /// (public port, remote address) -> (inside, until): restricted-cone filtering.
    by_address: HashMap<(u16, IpAddr), (SocketAddr, Instant)>,
    /// Public port -> (inside, until): full-cone filtering.
    by_port: HashMap<u16, (SocketAddr, Instant)>,
    next_port: u16,
}

impl Router {
    /// Linux `masquerade` (endpoint-independent mapping, address-and-port filtering), with or
    /// without an input that accepts the unsolicited.
    pub fn new(wan: IpAddr, accept_input: bool) -> Self {
        Self::with(
            wan,
            Mapping::Independent,
            Filtering::AddressPort,
            accept_input,
        )
    }

    pub fn with(wan: IpAddr, mapping: Mapping, filtering: Filtering, accept_input: bool) -> Self {
        Self {
            wan,
            mapping,
            filtering,
            accept_input,
            drop_udp: false,
            routed: false,
            flows: HashMap::new(),
            tuples: HashMap::new(),
            by_address: HashMap::new(),
            by_port: HashMap::new(),
            next_port: FIRST_OTHER_PORT,
        }
    }

    /// No NAT, no filter: the host at `addr` is reached as it is.
    pub fn routed(addr: IpAddr) -> Self {
        let mut r = Self::new(addr, false);
        r.routed = true;
        r
    }

    /// A router that drops every UDP datagram (TCP passes).
    pub fn dropping_udp(wan: IpAddr) -> Self {
        let mut r = Self::new(wan, false);
        r.drop_udp = true;
        r
    }

    /// Whether the public tuple (`port`, `remote`) is held by a live flow or entry.
    fn taken(&self, port: u16, remote: SocketAddr, now: Instant) -> bool {
        self.tuples
            .get(&(port, remote))
            .is_some_and(|(_, until)| *until > now)
    }

    fn other_port(&mut self) -> u16 {
        let port = self.next_port;
        self.next_port = self.next_port.wrapping_add(1).max(FIRST_OTHER_PORT);
        port
    }

    /// A datagram from the host at `inside` to `remote`: the public source it leaves with, or
    /// `None` when the router drops it.
    pub fn outbound(
        &mut self,
        inside: SocketAddr,
        remote: SocketAddr,
        now: Instant,
    ) -> Option<SocketAddr> {
        if self.drop_udp {
            return None;
        }
        if self.routed {
            return Some(inside);
        }
        let until = now + CONNTRACK_UDP;
        let port = match self.flows.get(&(inside, remote)) {
            Some((port, live)) if *live > now => *port,
            _ => {
                let mut port = match self.mapping {
                    Mapping::Independent => inside.port(),
                    Mapping::Dependent => self.other_port(),
                };
                while self.taken(port, remote, now) {
                    port = self.other_port();
                }
                port
            }
        };
        self.flows.insert((inside, remote), (port, until));
        self.tuples.insert((port, remote), (Some(inside), until));
        self.by_address.insert((port, remote.ip()), (inside, until));
        self.by_port.insert(port, (inside, until));
        Some(SocketAddr::new(self.wan, port))
    }

    /// A datagram from `src` to `dst` reaches the router: the inside host it is for, if the
    /// router lets it in. Else it ends at the router (and, with an accepting input, holds its
    /// tuple from now on).
    pub fn inbound(
        &mut self,
        src: SocketAddr,
        dst: SocketAddr,
        now: Instant,
    ) -> Option<SocketAddr> {
        if self.drop_udp || dst.ip() != self.wan {
            return None;
        }
        if self.routed {
            return Some(dst);
        }
        let until = now + CONNTRACK_UDP;
        let port = dst.port();
        if let Some((Some(inside), live)) = self.tuples.get(&(port, src)).copied()
            && live > now
        {
            self.refresh(inside, src, port, until);
            return Some(inside);
        }
        let loose = match self.filtering {
            Filtering::AddressPort => None,
            Filtering::Address => self.by_address.get(&(port, src.ip())).copied(),
            Filtering::Endpoint => self.by_port.get(&port).copied(),
        };
        if let Some((inside, live)) = loose
            && live > now
        {
            return Some(inside);
        }
        if self.accept_input {
            match self.tuples.get_mut(&(port, src)) {
                Some(entry) if entry.1 > now => entry.1 = until,
                _ => {
                    self.tuples.insert((port, src), (None, until));
                }
            }
        }
        None
    }

    /// A datagram of the flow from `inside` to `remote` on public `port` came back: the flow
    /// lives on.
    fn refresh(&mut self, inside: SocketAddr, remote: SocketAddr, port: u16, until: Instant) {
        self.flows.insert((inside, remote), (port, until));
        self.tuples.insert((port, remote), (Some(inside), until));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> SocketAddr {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn an_early_datagram_moves_the_mapping_only_where_the_input_accepts() {
        let now = Instant::now();
        let (inside, peer) = (at("10.0.0.2:51820"), at("198.51.100.2:51820"));
        let public = at("192.0.2.1:51820");
        for accept in [false, true] {
            let mut r = Router::new(public.ip(), accept);
            assert_eq!(r.inbound(peer, public, now), None, "nothing let it in");
            let out = r
                .outbound(inside, peer, now)
                .expect("masquerade passes UDP");
            if accept {
                assert_ne!(out, public, "the router's own entry holds the tuple");
                assert_eq!(r.inbound(peer, public, now), None);
                assert_eq!(r.inbound(peer, out, now), Some(inside));
            } else {
                assert_eq!(out, public, "the port is kept");
                assert_eq!(r.inbound(peer, public, now), Some(inside));
            }
            let later = now + CONNTRACK_UDP;
            assert_eq!(r.inbound(peer, out, later), None, "expired");
        }
    }

    #[test]
    fn each_kind_maps_and_filters_as_its_name_says() {
        let now = Instant::now();
        let inside = at("10.0.0.2:51820");
        let (a, a_other_port, b) = (
            at("198.51.100.2:3478"),
            at("198.51.100.2:9"),
            at("203.0.113.7:3478"),
        );
        let wan = at("192.0.2.1:0").ip();

        let mut eim = Router::new(wan, false);
        let to_a = eim.outbound(inside, a, now).expect("passes");
        let to_b = eim.outbound(inside, b, now).expect("passes");
        assert_eq!(to_a, to_b, "endpoint-independent: one mapping");
        assert_eq!(eim.inbound(a_other_port, to_a, now), None, "port filtered");

        let mut edm = Router::with(wan, Mapping::Dependent, Filtering::AddressPort, false);
        let to_a = edm.outbound(inside, a, now).expect("passes");
        let to_b = edm.outbound(inside, b, now).expect("passes");
        assert_ne!(to_a, to_b, "endpoint-dependent: a port per remote");
        assert_eq!(
            edm.outbound(inside, a, now),
            Some(to_a),
            "a flow keeps its port"
        );

        let mut restricted = Router::with(wan, Mapping::Independent, Filtering::Address, false);
        let out = restricted.outbound(inside, a, now).expect("passes");
        assert_eq!(restricted.inbound(a_other_port, out, now), Some(inside));
        assert_eq!(restricted.inbound(b, out, now), None, "address filtered");

        let mut full = Router::with(wan, Mapping::Independent, Filtering::Endpoint, false);
        let out = full.outbound(inside, a, now).expect("passes");
        assert_eq!(full.inbound(b, out, now), Some(inside), "anyone gets in");

        let mut dropping = Router::dropping_udp(wan);
        assert_eq!(dropping.outbound(inside, a, now), None);
        assert_eq!(dropping.inbound(a, at("192.0.2.1:51820"), now), None);

        let public = at("192.0.2.9:51820");
        let mut routed = Router::routed(public.ip());
        assert_eq!(routed.outbound(public, a, now), Some(public));
        assert_eq!(routed.inbound(b, public, now), Some(public), "no filter");
    }
}
