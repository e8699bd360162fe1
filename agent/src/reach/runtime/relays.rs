//! The loop's relays: the TCP links with TLS the node asks for (the relay set, a sans-IO
//! machine in `reach::node::relays`, decides the connections, the home relay, the move to TCP
//! and idle closes), and how the peers relayed through each relay are carried (their
//! forwarders' routes, the data plane's relay endpoints).

use std::net::SocketAddr;

use super::event_loop::Loop;
use super::shared::tcp_sink;
use crate::reach::forward::Route;
use crate::reach::io::Now;
use crate::reach::relay_client::tcp::{TcpEvent, TcpLink};
use plexsphere_wire::key::PublicKey;

impl Loop {
    /// Opens the TCP link with TLS the relay set asked for; one that cannot start is reported
    /// back as ended.
    pub(super) fn open_link(
        &mut self,
        relay: String,
        addr: SocketAddr,
        server_name: String,
        now: Now,
    ) {
        if self.links.contains_key(&relay) {
            return;
        }
        let Some(tls) = self.setup.tls.clone() else {
            self.node
                .handle_tcp_closed(&relay, "this node has no TLS trust for relays", now);
            return;
        };
        let sink = tcp_sink(self.shared.clone(), relay.clone());
        match TcpLink::open(addr, server_name, tls, sink) {
            Ok(link) => {
                self.links.insert(relay, link);
            }
            Err(e) => {
                tracing::warn!(relay, "cannot start a TCP connection to relay {relay}: {e}");
                self.node
                    .handle_tcp_closed(&relay, &format!("it could not start: {e}"), now);
            }
        }
    }

    /// How a forwarder reaches `dst` through relay `name` now.
    pub(super) fn relay_route(&self, name: &str, dst: PublicKey) -> Route {
        if let Some(link) = self.links.get(name) {
            return Route::RelayTcp {
                link: link.sender(),
                dst,
            };
        }
        match self.node.relay_udp(name) {
            Some(relay) => Route::Relay { relay, dst },
            None => Route::Hold,
        }
    }

    /// Carries the peers relayed through relay `name` over its current transport.
    pub(super) fn reroute(&mut self, name: &str) {
        let peers: Vec<PublicKey> = self
            .relayed
            .iter()
            .filter(|(_, relay)| relay.as_str() == name)
            .map(|(peer, _)| *peer)
            .collect();
        for peer in peers {
            self.carry_relayed(peer, name);
        }
    }

    /// Carries `peer` through relay `name`: over UDP, as the data plane's own relay endpoint
    /// when it has one (userspace; no forwarder); otherwise (TCP, the kernel, a data plane
    /// that cannot take one more relay) through the peer's forwarder.
    pub(super) fn carry_relayed(&mut self, peer: PublicKey, name: &str) {
        if !self.links.contains_key(name)
            && let Some(udp) = self.node.relay_udp(name)
        {
            match self.setup.control.relay_endpoint(udp, peer) {
                Ok(Some(endpoint)) => {
                    self.fwds.remove(&peer);
                    self.set_endpoint(peer, endpoint);
                    return;
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(peer_key = %peer, relay = name, "the data plane cannot carry the peer through relay {name} itself ({e}); using a loopback forwarder");
                }
            }
        }
        if let Some(f) = self.forwarder(peer) {
            f.set_route(self.relay_route(name, peer));
        }
    }

    pub(super) fn tcp(&mut self, relay: String, event: TcpEvent, now: Now) {
        match event {
            TcpEvent::Frame(frame) => self.node.handle_tcp_frame(&relay, frame, now),
            TcpEvent::Closed(why) => {
                self.links.remove(&relay);
                self.node.handle_tcp_closed(&relay, &why, now);
            }
        }
        self.drain(now);
    }
}
