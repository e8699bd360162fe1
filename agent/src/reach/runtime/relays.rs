//! The loop's relays: what the relay set ([`RelaySet`], the sans-IO machine in
//! `reach::node::relays` that decides the connections, the home relay, the move to TCP and
//! idle closes) asks for, carried out: frames over UDP or on a TCP link, the TCP links with
//! TLS themselves, the engine inputs it names, relayed datagrams to the peers' forwarders, and
//! how the peers relayed through each relay are carried (their forwarders' routes, the data
//! plane's relay endpoints).
//!
//! [`RelaySet`]: crate::reach::node::relays::RelaySet

use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use plexsphere_wire::node::RelaySpec;
use plexsphere_wire::reach::{Kind, classify};

use super::event_loop::Loop;
use super::shared::tcp_sink;
use crate::reach::forward::Route;
use crate::reach::io::{Input, Now};
use crate::reach::node::relays::RelayOut;
use crate::reach::relay_client::tcp::{TcpEvent, TcpLink};
use plexsphere_wire::key::PublicKey;

impl Loop {
    pub(super) fn set_relays(&mut self, specs: Vec<RelaySpec>, stun: Vec<SocketAddr>, now: Now) {
        self.node.handle_relays(specs, stun, now.at);
        self.carry_relay_outs(now);
    }

    /// Carries out what the relay set asks for, until it asks nothing.
    pub(super) fn carry_relay_outs(&mut self, now: Now) {
        while let Some(out) = self.node.relays.poll_out() {
            self.carry_relay_out(out, now);
        }
    }

    fn carry_relay_out(&mut self, out: RelayOut, now: Now) {
        match out {
            RelayOut::Udp { to, frame } => {
                if let Err(e) = self.setup.underlay.send(&frame.to_datagram(), to) {
                    tracing::trace!(%to, "relay send failed: {e}");
                }
            }
            RelayOut::Tcp { relay, frame } => {
                if let Some(link) = self.links.get(&relay)
                    && !link.send(&frame)
                {
                    tracing::debug!(relay, "the TCP connection's queue is full; frame dropped");
                }
            }
            RelayOut::OpenTcp {
                relay,
                addr,
                server_name,
            } => self.open_link(relay, addr, server_name, now),
            RelayOut::CloseTcp { relay } => {
                self.links.remove(&relay);
            }
            RelayOut::Reroute { relay } => self.reroute(&relay),
            RelayOut::Engine(input) => self.input(input, now),
            RelayOut::Recv {
                relay,
                src,
                payload,
            } => match (classify(&payload), self.key_of(&src)) {
                (_, None) => {
                    self.shared.unknown_src.fetch_add(1, Ordering::Relaxed);
                }
                (Kind::WireGuard, Some(src)) => match self.fwds.get(&src) {
                    Some(f) => {
                        if let Err(e) = f.fwd.deliver(&payload) {
                            tracing::trace!("forwarder delivery failed: {e}");
                        }
                    }
                    None => {
                        self.shared.unknown_src.fetch_add(1, Ordering::Relaxed);
                    }
                },
                (Kind::Disco, Some(src)) => self.input(
                    Input::DiscoRelayed {
                        relay,
                        src,
                        datagram: payload,
                    },
                    now,
                ),
                _ => {
                    self.shared.unknown_src.fetch_add(1, Ordering::Relaxed);
                }
            },
            RelayOut::PeerGone { relay, dst } => {
                if let Some(dst) = self.key_of(&dst) {
                    self.input(Input::PeerGone { relay, dst }, now);
                }
            }
            RelayOut::Dropped => {
                self.shared.unknown_src.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Opens the TCP link with TLS the relay set asked for; one that cannot start is reported
    /// back as ended.
    fn open_link(&mut self, relay: String, addr: SocketAddr, server_name: String, now: Now) {
        if self.links.contains_key(&relay) {
            return;
        }
        let Some(tls) = self.setup.tls.clone() else {
            self.node.relays.handle_tcp_closed(
                &relay,
                "this node has no TLS trust for relays",
                now.at,
            );
            return;
        };
        let sink = tcp_sink(self.shared.clone(), relay.clone());
        match TcpLink::open(addr, server_name, tls, sink) {
            Ok(link) => {
                self.links.insert(relay, link);
            }
            Err(e) => {
                tracing::warn!(relay, "cannot start a TCP connection to relay {relay}: {e}");
                self.node.relays.handle_tcp_closed(
                    &relay,
                    &format!("it could not start: {e}"),
                    now.at,
                );
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
        match self.node.relays.udp_of(name) {
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
            && let Some(udp) = self.node.relays.udp_of(name)
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

    /// Tells the data plane which relays' frames to unwrap: those with a connection over UDP
    /// (registered, or registering). Only when that set changed. (The kernel's `PathControl`
    /// takes none: its default `set_relays`.)
    pub(super) fn sync_plane_relays(&mut self) {
        let relays = self.node.relays.plane_relays();
        if relays == self.plane_relays {
            return;
        }
        if let Err(e) = self.setup.control.set_relays(&relays) {
            tracing::warn!(
                "the data plane takes frames from only some relays ({e}); the others' peers use loopback forwarders"
            );
        }
        self.plane_relays = relays;
    }

    pub(super) fn tcp(&mut self, relay: String, event: TcpEvent, now: Now) {
        match event {
            TcpEvent::Frame(frame) => self.node.relays.handle_tcp_frame(&relay, frame, now.at),
            TcpEvent::Closed(why) => {
                self.links.remove(&relay);
                self.node.relays.handle_tcp_closed(&relay, &why, now.at);
            }
        }
        self.carry_relay_outs(now);
    }

    pub(super) fn relays_tick(&mut self, now: Now) {
        self.node.relays.handle_timeout(now.at);
        self.carry_relay_outs(now);
    }
}
