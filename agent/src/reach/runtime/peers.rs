//! The loop's peers: the wanted peers as the daemon hands them (their forwarders and endpoint
//! owners pruned; the node takes the peers themselves), the loopback forwarders of peers
//! relayed where the data plane cannot frame for the relay (over TCP, or any relay with the
//! kernel backend), the endpoint the mesh is told for each (and who owns it, for the mesh
//! diff), and each peer carried the way the node decided (`NodeOut::Carry`).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, PoisonError};

use super::event_loop::{Fwd, Loop};
use crate::reach::forward::{ForwardLoop, Forwarder, Route};
use crate::reach::io::{Now, PeerReach};
use crate::reach::node::{Carry, Via};
use plexsphere_wire::key::PublicKey;

impl Loop {
    /// The wanted peers: forwarders and endpoint owners of peers no longer wanted go; the
    /// node takes the peers.
    pub(super) fn set_peers(&mut self, peers: Vec<PeerReach>, now: Now) {
        // Sets, not lists: a change at 10k peers must not cost 10k x 10k comparisons.
        let wanted: HashSet<PublicKey> = peers.iter().map(|p| p.key).collect();
        self.fwds.retain(|k, _| wanted.contains(k));
        {
            let mut owners = self
                .shared
                .owners
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            owners.retain(|k, _| wanted.contains(k));
        }
        self.node.handle_peers(peers, now);
        self.drain(now);
    }

    /// The peer's forwarder, opened (and made its endpoint) if it has none.
    pub(super) fn forwarder(&mut self, peer: PublicKey) -> Option<Arc<Forwarder>> {
        if let Some(f) = self.fwds.get(&peer) {
            return Some(f.fwd.clone());
        }
        let forwards = match &self.forwards {
            Some(l) => Ok(l.clone()),
            None => ForwardLoop::start(self.setup.underlay.clone()).map(Arc::new),
        };
        let opened = forwards.and_then(|l| {
            self.forwards = Some(l.clone());
            let f = Forwarder::open((self.setup.wg_port)())?;
            let token = l.add(&f)?;
            Ok((f, (l, token)))
        });
        let (f, carried) = match opened {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(peer_key = %peer, "cannot open a loopback forwarder: {e}");
                return None;
            }
        };
        self.set_endpoint(peer, f.addr());
        self.fwds.insert(
            peer,
            Fwd {
                fwd: f.clone(),
                carried,
            },
        );
        Some(f)
    }

    pub(super) fn set_endpoint(&mut self, peer: PublicKey, endpoint: SocketAddr) {
        if let Err(e) = self.setup.control.set_endpoint(peer, endpoint) {
            tracing::warn!(peer_key = %peer, %endpoint, "cannot set the peer's endpoint: {e}");
        }
        self.shared
            .owners
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(peer, Some(endpoint));
    }

    /// The data plane's answer for `peer`'s endpoint through `relay` (over UDP or on its link):
    /// made the endpoint (its forwarder goes), or, refused, told to the node, which then picks
    /// the forwarder.
    fn plane_endpoint(
        &mut self,
        peer: PublicKey,
        relay: &str,
        endpoint: std::io::Result<Option<SocketAddr>>,
    ) {
        match endpoint {
            Ok(Some(endpoint)) => {
                self.fwds.remove(&peer);
                self.set_endpoint(peer, endpoint);
            }
            Ok(None) => self.node.handle_plane_refused(peer),
            Err(e) => {
                tracing::warn!(peer_key = %peer, relay, "the data plane cannot carry the peer through relay {relay} itself ({e}); using a loopback forwarder");
                self.node.handle_plane_refused(peer);
            }
        }
    }

    /// Carries `peer`'s traffic the way the node decided: its endpoint direct, the data
    /// plane's own relay endpoint (a refusal is answered to the node, which then picks the
    /// forwarder), its forwarder's route (opened when it has none), its forwarder held, or
    /// closed (no path).
    pub(super) fn carry_peer(&mut self, peer: PublicKey, how: Carry) {
        match how {
            Carry::Direct(endpoint) => {
                self.fwds.remove(&peer);
                self.set_endpoint(peer, endpoint);
            }
            Carry::PlaneRelay { relay, udp } => {
                let endpoint = self.setup.control.relay_endpoint(udp, peer);
                self.plane_endpoint(peer, &relay, endpoint);
            }
            Carry::PlaneLink { relay } => {
                let endpoint = match self.links.get(&relay) {
                    Some(link) => self.setup.control.link_endpoint(link.queue(), peer),
                    // Its link could not start: the forwarder holds until the node carries
                    // the peer anew.
                    None => Ok(None),
                };
                self.plane_endpoint(peer, &relay, endpoint);
            }
            Carry::Forward(via) => {
                let route = match via {
                    Via::Udp(relay) => Route::Relay { relay, dst: peer },
                    Via::Tcp(relay) => match self.links.get(&relay) {
                        Some(link) => Route::RelayTcp {
                            link: link.queue().clone(),
                            dst: peer,
                        },
                        // Its link could not start; the node carries the peer anew.
                        None => Route::Hold,
                    },
                    Via::Nowhere => Route::Hold,
                };
                if let Some(f) = self.forwarder(peer) {
                    f.set_route(route);
                }
            }
            Carry::Hold => {
                if let Some(f) = self.fwds.get(&peer) {
                    f.fwd.set_route(Route::Hold);
                }
            }
            Carry::Release => {
                self.fwds.remove(&peer);
            }
        }
    }
}
