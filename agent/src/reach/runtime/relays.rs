//! The loop's relays: the state's relays as usable ones (a key, a UDP address, a TLS address),
//! one connection to each in use ([`RelayConn`]) over UDP or over TCP with TLS, opened on
//! demand and closed when idle (the home relay's stays), the frames they exchange, what their
//! notes mean for the engine (`RelayUp`, `RelayDown`, relayed disco, `PeerGone`), and how the
//! peers relayed through each are carried (their forwarders' routes, the data plane's relay
//! endpoints).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Instant;

use base64::Engine as _;
use plexsphere_wire::node::RelaySpec;
use plexsphere_wire::reach::relay::Frame;
use plexsphere_wire::reach::{Kind, classify};

use super::event_loop::{Loop, Relay};
use super::shared::{Mode, RELAY_IDLE, tcp_sink};
use crate::peer_key::PeerKey;
use crate::reach::forward::Route;
use crate::reach::io::{Input, Now, Transport};
use crate::reach::relay_client::tcp::{TcpEvent, TcpLink};
use crate::reach::relay_client::{Note, RelayConn};
use crate::reach::stun::StunProbe;

impl Loop {
    pub(super) fn set_relays(&mut self, specs: Vec<RelaySpec>, stun: Vec<SocketAddr>, now: Now) {
        let mut relays = Vec::new();
        for spec in &specs {
            let key = base64::engine::general_purpose::STANDARD
                .decode(spec.public_key.trim())
                .ok()
                .and_then(|b| <[u8; 32]>::try_from(b).ok());
            let Some(key) = key else {
                tracing::warn!(relay = %spec.name, "relay {}: its public key is not base64 of 32 bytes; not used", spec.name);
                continue;
            };
            let tls = match (spec.tls, &spec.tls_server_name) {
                (Some(a), Some(n)) => Some((a, n.clone())),
                _ => None,
            };
            if spec.udp.is_none() && (tls.is_none() || self.setup.tls.is_none()) {
                if !self.said_tcp_only {
                    self.said_tcp_only = true;
                    tracing::warn!(relay = %spec.name, "relay {} has no UDP address, and no TLS address with a server name (or this node has no TLS trust for relays); not used", spec.name);
                }
                continue;
            }
            relays.push(Relay {
                spec: spec.clone(),
                key,
                udp: spec.udp,
                tls,
            });
        }
        let changed = relays.len() != self.relays.len()
            || relays
                .iter()
                .zip(&self.relays)
                .any(|(a, b)| a.spec != b.spec);
        let stun_changed = stun != self.stun_servers;
        self.stun_servers = stun;
        if changed {
            self.conns
                .retain(|name, _| relays.iter().any(|r| r.spec.name == *name));
            let conns = &self.conns;
            self.links.retain(|name, _| conns.contains_key(name));
            self.relays = relays;
            self.home = 0;
            self.input(Input::Relays(specs), now);
        }
        if changed || stun_changed {
            self.next_stun = now.at;
        }
    }

    pub(super) fn relay_udp(&self, name: &str) -> Option<SocketAddr> {
        self.relays
            .iter()
            .find(|r| r.spec.name == name)
            .and_then(|r| r.udp)
    }

    /// How a forwarder reaches `dst` through relay `name` now.
    pub(super) fn relay_route(&self, name: &str, dst: PeerKey) -> Route {
        if let Some(link) = self.links.get(name) {
            return Route::RelayTcp {
                link: link.sender(),
                dst: dst.0,
            };
        }
        match self.relay_udp(name) {
            Some(relay) => Route::Relay { relay, dst: dst.0 },
            None => Route::Hold,
        }
    }

    /// Carries the peers relayed through relay `name` over its current transport.
    pub(super) fn reroute(&mut self, name: &str) {
        let peers: Vec<PeerKey> = self
            .relayed
            .iter()
            .filter(|(_, relay)| relay.as_str() == name)
            .map(|(peer, _)| *peer)
            .collect();
        for peer in peers {
            self.carry_relayed(peer, name);
        }
    }

    /// Carries `peer` through relay `name`: over UDP with the userspace data plane, as the
    /// data plane's own relay endpoint (no forwarder); otherwise (TCP, the kernel, a data
    /// plane that cannot take one more relay) through the peer's forwarder.
    pub(super) fn carry_relayed(&mut self, peer: PeerKey, name: &str) {
        if self.setup.mode == Mode::Userspace
            && !self.links.contains_key(name)
            && let Some(udp) = self.relay_udp(name)
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
    /// (registered, or registering). Only when that set changed.
    pub(super) fn sync_plane_relays(&mut self) {
        if self.setup.mode != Mode::Userspace {
            return;
        }
        let mut relays: Vec<SocketAddr> = self
            .conns
            .keys()
            .filter(|name| !self.links.contains_key(*name))
            .filter_map(|name| self.relay_udp(name))
            .collect();
        relays.sort();
        relays.dedup();
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

    /// Moves relay `name` to TCP with TLS; `false` when it has no TLS address or this node no
    /// TLS trust.
    pub(super) fn open_tcp(&mut self, name: &str, t: Instant) -> bool {
        if self.links.contains_key(name) {
            return true;
        }
        let (Some(tls), Some(r)) = (
            self.setup.tls.clone(),
            self.relays.iter().find(|r| r.spec.name == name),
        ) else {
            return false;
        };
        let Some((addr, server_name)) = r.tls.clone() else {
            return false;
        };
        let key = r.key;
        let sink = tcp_sink(self.shared.clone(), name.to_owned());
        let link = TcpLink::open(addr, server_name, tls, sink);
        match link {
            Ok(link) => {
                tracing::info!(relay = name, %addr, "relay {name}: over TCP with TLS to {addr}");
                self.links.insert(name.to_owned(), link);
                let mut c = RelayConn::new(name.to_owned(), key, self.token.clone(), t);
                c.resume_counter(self.floors.get(name).copied().unwrap_or(0));
                self.conns.insert(name.to_owned(), c);
                self.reroute(name);
                true
            }
            Err(e) => {
                tracing::warn!(
                    relay = name,
                    "cannot start a TCP connection to relay {name}: {e}"
                );
                false
            }
        }
    }

    pub(super) fn tcp(&mut self, relay: String, event: TcpEvent, now: Now) {
        match event {
            TcpEvent::Frame(frame) => self.relay_frame(&relay, frame, now),
            TcpEvent::Closed(why) => {
                self.links.remove(&relay);
                self.reroute(&relay);
                if let Some(c) = self.conns.get_mut(&relay) {
                    let notes = c.lost(format!("the TCP connection ended: {why}"), now.at);
                    self.notes(&relay, notes, now);
                }
            }
        }
    }

    /// The connection to relay `name`, opened on demand.
    pub(super) fn conn(&mut self, name: &str, t: Instant) -> Option<&mut RelayConn> {
        if !self.conns.contains_key(name) {
            let r = self.relays.iter().find(|r| r.spec.name == name)?;
            let tcp_first = r.udp.is_none() || self.udp_blocked;
            let mut c = RelayConn::new(name.to_owned(), r.key, self.token.clone(), t);
            c.resume_counter(self.floors.get(name).copied().unwrap_or(0));
            self.conns.insert(name.to_owned(), c);
            if tcp_first {
                self.open_tcp(name, t);
            }
        }
        self.conns.get_mut(name)
    }

    pub(super) fn send_frame(&self, relay: &str, frame: &Frame) {
        if let Some(link) = self.links.get(relay) {
            if !link.send(frame) {
                tracing::debug!(relay, "the TCP connection's queue is full; frame dropped");
            }
            return;
        }
        if let Some(udp) = self.relay_udp(relay)
            && let Err(e) = self.setup.underlay.send(&frame.to_datagram(), udp)
        {
            tracing::trace!(relay, "relay send failed: {e}");
        }
    }

    pub(super) fn relay_frame(&mut self, name: &str, frame: Frame, now: Now) {
        let Some(conn) = self.conns.get_mut(name) else {
            return;
        };
        let (out, notes) = conn.handle_frame(frame, &self.id, now.at);
        self.floors.insert(name.to_owned(), conn.counter());
        for f in out {
            self.send_frame(name, &f);
        }
        self.notes(name, notes, now);
    }

    pub(super) fn notes(&mut self, relay: &str, notes: Vec<Note>, now: Now) {
        for n in notes {
            match n {
                Note::Up { rtt } => {
                    tracing::info!(relay, "registered with relay {relay}");
                    let transport = if self.links.contains_key(relay) {
                        Transport::Tcp
                    } else {
                        Transport::Udp
                    };
                    self.input(
                        Input::RelayUp {
                            relay: relay.to_owned(),
                            transport,
                            rtt,
                        },
                        now,
                    );
                    let home = self.relays.get(self.home).map(|r| r.spec.name.as_str());
                    if home == Some(relay) && self.home_up.as_deref() != Some(relay) {
                        self.home_up = Some(relay.to_owned());
                        self.input(Input::HomeRelay(Some(relay.to_owned())), now);
                    }
                }
                Note::Down { why, unanswered } => {
                    if unanswered && !self.links.contains_key(relay) && self.open_tcp(relay, now.at)
                    {
                        tracing::info!(relay, "relay {relay}: {why} over UDP; trying TCP");
                        continue;
                    }
                    tracing::warn!(relay, "relay {relay} is down: {why}");
                    self.input(
                        Input::RelayDown {
                            relay: relay.to_owned(),
                            why,
                        },
                        now,
                    );
                    let home = self.relays.get(self.home).map(|r| r.spec.name.clone());
                    if home.as_deref() == Some(relay) && !self.relays.is_empty() {
                        // The next relay of the state becomes the home candidate.
                        self.home = (self.home + 1) % self.relays.len();
                        if self.home_up.take().is_some() {
                            self.input(Input::HomeRelay(None), now);
                        }
                    }
                }
                Note::Recv { src, payload } => match (classify(&payload), self.key_of(&src)) {
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
                            relay: relay.to_owned(),
                            src,
                            datagram: payload,
                        },
                        now,
                    ),
                    _ => {
                        self.shared.unknown_src.fetch_add(1, Ordering::Relaxed);
                    }
                },
                Note::PeerGone { dst } => {
                    if let Some(dst) = self.key_of(&dst) {
                        self.input(
                            Input::PeerGone {
                                relay: relay.to_owned(),
                                dst,
                            },
                            now,
                        );
                    }
                }
            }
        }
    }

    /// The earliest deadline of the relay connections and the running STUN probe: when
    /// `relays_tick` or `stun` next has something to do before the tick.
    pub(super) fn relays_due(&self) -> Option<Instant> {
        let probe = self.probe.as_ref().and_then(StunProbe::poll_timeout);
        self.conns
            .values()
            .filter_map(RelayConn::poll_timeout)
            .chain(probe)
            .min()
    }

    pub(super) fn relays_tick(&mut self, now: Now) {
        let t = now.at;
        // The home candidate keeps a connection; others close when idle.
        if let Some(home) = self.relays.get(self.home).map(|r| r.spec.name.clone()) {
            let _ = self.conn(&home, t);
            self.conns.retain(|name, c| {
                *name == home || t.saturating_duration_since(c.last_used) < RELAY_IDLE
            });
            let conns = &self.conns;
            self.links.retain(|name, _| conns.contains_key(name));
        }
        let names: Vec<String> = self.conns.keys().cloned().collect();
        for name in names {
            let Some(c) = self.conns.get_mut(&name) else {
                continue;
            };
            let (out, notes) = c.poll_frames(&self.id, t);
            for f in out {
                self.send_frame(&name, &f);
            }
            self.notes(&name, notes, now);
        }
    }
}
