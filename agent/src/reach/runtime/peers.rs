//! The loop's peers: the wanted peers as the daemon hands them (their key prefixes, for the
//! relays' sender names), the loopback forwarders of peers relayed where the data plane cannot
//! frame for the relay (over TCP, or any relay with the kernel backend), the endpoint the
//! mesh is told for each (and who owns it, for the mesh diff), and the path the engine chose
//! carried out.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, PoisonError};

use plexsphere_wire::reach::relay::{KeyPrefix, prefix};

use super::event_loop::{Fwd, Loop};
use crate::reach::forward::{ForwardLoop, Forwarder};
use crate::reach::io::{Input, Now, Path, PeerReach};
use plexsphere_wire::key::PublicKey;

impl Loop {
    /// The wanted peer whose key starts with `p`, unless two share it.
    pub(super) fn key_of(&self, p: &KeyPrefix) -> Option<PublicKey> {
        self.by_prefix.get(p).copied().flatten()
    }

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
        self.by_prefix.clear();
        for p in &peers {
            self.by_prefix
                .entry(prefix(&p.key))
                .and_modify(|k| *k = None)
                .or_insert(Some(p.key));
        }
        self.peers = peers.clone();
        self.input(Input::Peers(peers), now);
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

    pub(super) fn set_path(&mut self, peer: PublicKey, path: Path, now: Now) {
        match &path {
            Path::None => {}
            Path::Direct { endpoint } => {
                // Straight from WireGuard's socket (the data plane's, or the kernel's): no
                // forwarder in the way.
                self.relayed.remove(&peer);
                self.fwds.remove(&peer);
                self.set_endpoint(peer, *endpoint);
            }
            Path::Relay { relay, transport } => {
                if !self.node.relays.handle_path(relay, *transport, now.at) {
                    tracing::warn!(peer_key = %peer, relay = %relay, "the path names a relay the state does not have; unchanged");
                    return;
                }
                self.carry_relay_outs(now);
                self.relayed.insert(peer, relay.clone());
                self.carry_relayed(peer, relay);
            }
        }
        tracing::info!(peer_key = %peer, path = ?path, "reach: path set");
    }
}
