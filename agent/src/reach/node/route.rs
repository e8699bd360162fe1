//! How the node routes between its machines: the engine's effects (relayed sends and relay
//! paths to the relay set, the rest out), the relay set's outputs (engine inputs to the engine,
//! relayed datagrams named by the wanted peers' key prefixes), the schedule's dues (engine
//! inputs, UDP blocked, the tick of the relay set and the engine), and the bounded output
//! queue the runtime drains ([`super::OUT_QUEUE`]).

use plexsphere_wire::key::PublicKey;
use plexsphere_wire::reach::relay::KeyPrefix;
use plexsphere_wire::reach::{Kind, classify};

use super::relays::RelayOut;
use super::schedule::Due;
use super::{Node, NodeOut, OUT_QUEUE};
use crate::reach::io::{Effect, Input, Now, Path};

impl Node {
    pub(super) fn push(&mut self, out: NodeOut) {
        if self.out.len() >= OUT_QUEUE {
            self.out_dropped += 1;
            tracing::debug!(?out, "the node's output queue is full; output dropped");
            return;
        }
        self.out.push_back(out);
    }

    /// The wanted peer whose key starts with `p`, unless two share it.
    pub(super) fn key_of(&self, p: &KeyPrefix) -> Option<PublicKey> {
        self.by_prefix.get(p).copied().flatten()
    }

    /// The engine takes `input`; its effects are carried out in order.
    pub(super) fn input(&mut self, input: Input, now: Now) {
        self.engine.handle(input, now);
        while let Some(e) = self.engine.poll_effect() {
            self.perform(e, now);
        }
    }

    pub(super) fn perform(&mut self, effect: Effect, now: Now) {
        match effect {
            Effect::SendDirect { to, datagram } => self.push(NodeOut::Send { to, datagram }),
            Effect::SendRelayed {
                relay,
                dst,
                datagram,
            } => {
                if !self.relays.handle_send(&relay, dst, datagram, now.at) {
                    tracing::debug!(relay = %relay, "no such relay in the state; disco dropped");
                    return;
                }
                self.carry_relays(now);
            }
            Effect::SetPath { peer, path } => {
                if let Path::Relay { relay, transport } = &path {
                    if !self.relays.handle_path(relay, *transport, now.at) {
                        tracing::warn!(peer_key = %peer, relay = %relay, "the path names a relay the state does not have; unchanged");
                        return;
                    }
                    self.carry_relays(now);
                }
                self.carry_path(peer, &path, now.at);
            }
            Effect::Candidates {
                reflexive,
                home_relay,
                nat,
            } => self.push(NodeOut::Candidates {
                reflexive,
                home_relay,
                nat,
            }),
        }
    }

    /// Routes what the relay set asks for, until it asks nothing: engine inputs to the
    /// engine, relayed datagrams by their sender, the rest to the output queue.
    pub(super) fn carry_relays(&mut self, now: Now) {
        while let Some(out) = self.relays.poll_out() {
            match out {
                RelayOut::Udp { to, frame } => self.push(NodeOut::RelayUdp { to, frame }),
                RelayOut::Tcp { relay, frame } => self.push(NodeOut::RelayTcp { relay, frame }),
                RelayOut::OpenTcp {
                    relay,
                    addr,
                    server_name,
                } => self.push(NodeOut::OpenTcp {
                    relay,
                    addr,
                    server_name,
                }),
                RelayOut::CloseTcp { relay } => self.push(NodeOut::CloseTcp { relay }),
                RelayOut::Reroute { relay } => self.reroute(&relay),
                RelayOut::Engine(input) => self.input(input, now),
                RelayOut::Recv {
                    relay,
                    src,
                    payload,
                } => match (classify(&payload), self.key_of(&src)) {
                    (Kind::WireGuard, Some(peer)) => self.push(NodeOut::Recv {
                        peer,
                        datagram: payload,
                    }),
                    (Kind::Disco, Some(src)) => self.input(
                        Input::DiscoRelayed {
                            relay,
                            src,
                            datagram: payload,
                        },
                        now,
                    ),
                    _ => self.push(NodeOut::Dropped),
                },
                RelayOut::PeerGone { relay, dst } => {
                    if let Some(dst) = self.key_of(&dst) {
                        self.input(Input::PeerGone { relay, dst }, now);
                    }
                }
                RelayOut::Dropped => self.push(NodeOut::Dropped),
            }
        }
    }

    /// Routes what the schedule asks for, until it asks nothing or asks for a read (the pass
    /// goes on with the answer): engine inputs to the engine, what STUN said about UDP to the
    /// relay set, the tick to the relay set and the engine, the rest to the output queue.
    pub(super) fn carry_schedule(&mut self, now: Now) {
        if self.awaiting_read {
            return;
        }
        while let Some(due) = self.schedule.poll_out() {
            match due {
                Due::ReadAddrs => {
                    self.awaiting_read = true;
                    self.push(NodeOut::ReadAddrs);
                    return;
                }
                Due::ReadHandshakes => {
                    self.awaiting_read = true;
                    self.push(NodeOut::ReadHandshakes);
                    return;
                }
                Due::Send { to, datagram } => self.push(NodeOut::Send { to, datagram }),
                Due::UdpBlocked(blocked) => self.relays.handle_udp_blocked(blocked),
                Due::Engine(input) => self.input(input, now),
                Due::Tick => {
                    self.relays.handle_timeout(now.at);
                    self.carry_relays(now);
                    self.input(Input::Tick, now);
                    let paths = self.engine.paths();
                    self.push(NodeOut::Publish(paths));
                    self.tell_plane_relays();
                }
            }
        }
    }

    /// Tells the data plane the relays whose frames it unwraps, when that set changed since
    /// it was last told: once at the end of a pass or of a timeout that ran no pass, so a
    /// change undone within them (a key rotation's connections opening again) is not told.
    pub(super) fn tell_plane_relays(&mut self) {
        let relays = self.relays.plane_relays();
        if relays != self.plane_relays {
            self.plane_relays = relays.clone();
            self.push(NodeOut::PlaneRelays(relays));
        }
    }
}
