//! How each peer's chosen path is carried: the node decides it, the runtime only performs it
//! ([`NodeOut::Carry`]). A direct path is the peer's endpoint itself. A path through a relay
//! over UDP is first the data plane's own relay endpoint (the userspace data plane frames for
//! relays itself); when the data plane has none (the kernel) or refuses one, the runtime says
//! so ([`Node::handle_plane_refused`]) and the peer gets a loopback forwarder to the relay's
//! UDP address. A path through a relay whose connection runs over TCP is the data plane's own
//! endpoint on that TLS link, else (the kernel, or a refusal) a forwarder on the link. When a
//! relay's transport changes, its relayed peers are carried anew; a key rotation holds them until their paths are chosen again. A relayed peer left with
//! no path (its relay said it is gone, and no other relay carries it) is no longer carried by
//! its relay's changes, and after [`FORWARDER_LINGER`] without a path it is released: its
//! forwarder closes. A peer whose home relay keeps saying it is gone comes back to that relay
//! every `GONE_HOLD` (30 s, shorter than the linger), so it keeps its one forwarder: coming
//! back costs no new socket and no new kernel endpoint.

use std::time::Instant;

use plexsphere_wire::key::PublicKey;

use super::{Carry, FORWARDER_LINGER, Node, NodeOut, OUT_QUEUE, Via};
use crate::reach::io::Path;

impl Node {
    /// The data plane has no endpoint of its own through a relay for `peer`, or refused one
    /// (the answer to [`Carry::PlaneRelay`]): the peer is carried through a loopback forwarder
    /// instead. This is the next output, ahead of any already queued.
    pub fn handle_plane_refused(&mut self, peer: PublicKey) {
        let Some(relay) = self.relayed.get(&peer).cloned() else {
            return;
        };
        let how = Carry::Forward(self.via(&relay));
        if self.out.len() >= OUT_QUEUE {
            self.out_dropped += 1;
            tracing::debug!(peer_key = %peer, "the node's output queue is full; fallback dropped");
            return;
        }
        self.out.push_front(NodeOut::Carry { peer, how });
    }

    /// The engine chose `path` for `peer` (a relay path's connection is already asked for).
    pub(super) fn carry_path(&mut self, peer: PublicKey, path: &Path, now: Instant) {
        if !matches!(path, Path::None) {
            self.lingering.remove(&peer);
        }
        match path {
            Path::None => {
                // A relayed peer that lost its path (its relay said it is gone, or went away
                // and no other relay carries it): its relay's transport changing carries it
                // no more, and its forwarder closes once it stayed without a path for
                // `FORWARDER_LINGER`. Until then the forwarder stays as it was: a peer back on
                // that relay gets WireGuard's next handshake at once.
                if self.relayed.remove(&peer).is_some() {
                    self.lingering.insert(peer, now + FORWARDER_LINGER);
                }
            }
            Path::Direct { endpoint } => {
                // Straight from WireGuard's socket (the data plane's, or the kernel's): no
                // forwarder in the way.
                self.relayed.remove(&peer);
                self.push(NodeOut::Carry {
                    peer,
                    how: Carry::Direct(*endpoint),
                });
            }
            Path::Relay { relay, .. } => {
                self.relayed.insert(peer, relay.clone());
                self.carry_relayed(peer, relay);
            }
        }
        tracing::info!(peer_key = %peer, path = ?path, "reach: path set");
    }

    /// Carries the peers relayed through relay `relay` over its current transport.
    pub(super) fn reroute(&mut self, relay: &str) {
        let peers: Vec<PublicKey> = self
            .relayed
            .iter()
            .filter(|(_, r)| r.as_str() == relay)
            .map(|(peer, _)| *peer)
            .collect();
        for peer in peers {
            self.carry_relayed(peer, relay);
        }
    }

    /// Releases the peers that stayed without a path for [`FORWARDER_LINGER`]: their
    /// forwarders close.
    pub(super) fn release_lingering(&mut self, now: Instant) {
        let due: Vec<PublicKey> = self
            .lingering
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(peer, _)| *peer)
            .collect();
        for peer in due {
            self.lingering.remove(&peer);
            self.push(NodeOut::Carry {
                peer,
                how: Carry::Release,
            });
        }
    }

    /// A key rotation: every relayed peer holds until a path is chosen anew.
    pub(super) fn hold_relayed(&mut self) {
        for peer in std::mem::take(&mut self.relayed).into_keys() {
            self.push(NodeOut::Carry {
                peer,
                how: Carry::Hold,
            });
        }
    }

    /// Carries `peer` through relay `relay`: the data plane's own relay endpoint first, over
    /// its TCP link or its UDP address (a refusal falls back to the peer's forwarder); without
    /// either, the peer's forwarder holds.
    fn carry_relayed(&mut self, peer: PublicKey, relay: &str) {
        let how = if self.relays.is_over_tcp(relay) {
            Carry::PlaneLink {
                relay: relay.to_owned(),
            }
        } else {
            match self.relays.udp_of(relay) {
                Some(udp) => Carry::PlaneRelay {
                    relay: relay.to_owned(),
                    udp,
                },
                None => Carry::Forward(self.via(relay)),
            }
        };
        self.push(NodeOut::Carry { peer, how });
    }

    /// Where a forwarder reaches relay `relay` now: its TCP link, else its UDP address.
    fn via(&self, relay: &str) -> Via {
        if self.relays.is_over_tcp(relay) {
            return Via::Tcp(relay.to_owned());
        }
        match self.relays.udp_of(relay) {
            Some(udp) => Via::Udp(udp),
            None => Via::Nowhere,
        }
    }
}
