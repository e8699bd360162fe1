//! A NAT router for the simulated network ([`super::sim`]), with Linux conntrack's
//! rules for UDP as `masquerade` applies them: a host's flow towards a remote address keeps
//! the host's port when that tuple is free (endpoint-independent mapping), else takes another;
//! only a datagram from the exact remote address and port of a flow gets in
//! (address-and-port-dependent filtering); entries live [`CONNTRACK_UDP`] past their last
//! datagram. A router whose input accepts ([`Router::accept_input`]) keeps an entry of its own
//! for a datagram that matched no flow, and that entry holds the tuple too (tests/src/nat
//! builds the same routers with nftables for the reach tests).

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// Linux's `nf_conntrack_udp_timeout`: an unreplied UDP entry lives this long.
pub const CONNTRACK_UDP: Duration = Duration::from_secs(30);
/// Where the router's other ports start when the host's own is taken.
const FIRST_OTHER_PORT: u16 = 20_000;

#[derive(Debug, Clone)]
struct Flow {
    inside: SocketAddr,
    remote: SocketAddr,
    port: u16,
    until: Instant,
}

/// One NAT router in front of one simulated node.
#[derive(Debug, Clone)]
pub struct Router {
    pub wan: IpAddr,
    /// The router's own input accepts unsolicited datagrams ("EIM, input accept"): each keeps
    /// an entry that holds its tuple. Else they are dropped and leave nothing.
    pub accept_input: bool,
    flows: Vec<Flow>,
    /// The router's own entries: (remote, public port), until.
    own: Vec<(SocketAddr, u16, Instant)>,
    next_port: u16,
}

impl Router {
    pub fn new(wan: IpAddr, accept_input: bool) -> Self {
        Self {
            wan,
            accept_input,
            flows: Vec::new(),
            own: Vec::new(),
            next_port: FIRST_OTHER_PORT,
        }
    }

    fn expire(&mut self, now: Instant) {
        self.flows.retain(|f| f.until > now);
        self.own.retain(|(_, _, until)| *until > now);
    }

    /// Whether the public tuple (`port`, `remote`) is held by a flow or an entry of its own.
    fn taken(&self, port: u16, remote: SocketAddr) -> bool {
        self.flows
            .iter()
            .any(|f| f.port == port && f.remote == remote)
            || self.own.iter().any(|(r, p, _)| *p == port && *r == remote)
    }

    /// A datagram from the host at `inside` to `remote`: the public source it leaves with.
    pub fn outbound(&mut self, inside: SocketAddr, remote: SocketAddr, now: Instant) -> SocketAddr {
        self.expire(now);
        if let Some(f) = self
            .flows
            .iter_mut()
            .find(|f| f.inside == inside && f.remote == remote)
        {
            f.until = now + CONNTRACK_UDP;
            return SocketAddr::new(self.wan, f.port);
        }
        let mut port = inside.port();
        while self.taken(port, remote) {
            port = self.next_port;
            self.next_port = self.next_port.wrapping_add(1).max(FIRST_OTHER_PORT);
        }
        self.flows.push(Flow {
            inside,
            remote,
            port,
            until: now + CONNTRACK_UDP,
        });
        SocketAddr::new(self.wan, port)
    }

    /// A datagram from `src` to `dst` reaches the router: the inside host it is for, if a
    /// flow lets it in. Else it ends at the router (and, with an accepting input, holds its
    /// tuple from now on).
    pub fn inbound(
        &mut self,
        src: SocketAddr,
        dst: SocketAddr,
        now: Instant,
    ) -> Option<SocketAddr> {
        self.expire(now);
        if dst.ip() != self.wan {
            return None;
        }
        if let Some(f) = self
            .flows
            .iter_mut()
            .find(|f| f.remote == src && f.port == dst.port())
        {
            f.until = now + CONNTRACK_UDP;
            return Some(f.inside);
        }
        if self.accept_input {
            match self
                .own
                .iter_mut()
                .find(|(r, p, _)| *r == src && *p == dst.port())
            {
                Some(entry) => entry.2 = now + CONNTRACK_UDP,
                None => self.own.push((src, dst.port(), now + CONNTRACK_UDP)),
            }
        }
        None
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
            let out = r.outbound(inside, peer, now);
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
}
