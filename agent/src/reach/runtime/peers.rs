//! The loop's peers: the wanted peers as the daemon hands them (their key prefixes, for the
//! relays' sender names), their loopback forwarders with the kernel backend, the endpoint the
//! mesh is told for each (and who owns it, for the mesh diff), and the path the engine chose
//! carried out.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, PoisonError};

use plexsphere_wire::reach::relay::{KeyPrefix, prefix};

use super::event_loop::{Fwd, Loop};
use super::shared::Mode;
use crate::peer_key::PeerKey;
use crate::reach::forward::{Forwarder, Route};
use crate::reach::io::{Input, Now, Path, PeerReach};

impl Loop {
    /// The wanted peer whose key starts with `p`, unless two share it.
    pub(super) fn key_of(&self, p: &KeyPrefix) -> Option<PeerKey> {
        self.by_prefix.get(p).copied().flatten()
    }

    pub(super) fn set_peers(&mut self, peers: Vec<PeerReach>, now: Now) {
        if self.setup.mode == Mode::Kernel {
            // Every peer is carried by a forwarder; a new one starts at its first candidate.
            for p in &peers {
                if !self.fwds.contains_key(&p.key)
                    && let Some(f) = self.forwarder(p.key)
                    && let Some(ep) = p.endpoints.first()
                {
                    f.set_route(Route::Direct(*ep));
                    self.index_direct(p.key, Some(*ep), &f);
                }
            }
        }
        // Sets, not lists: a change at 10k peers must not cost 10k x 10k comparisons.
        let wanted: HashSet<PeerKey> = peers.iter().map(|p| p.key).collect();
        self.fwds.retain(|k, _| wanted.contains(k));
        {
            let mut owners = self
                .shared
                .owners
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            owners.retain(|k, _| wanted.contains(k));
        }
        let live: HashSet<_> = self.fwds.values().map(|x| Arc::as_ptr(&x.fwd)).collect();
        self.shared
            .by_direct
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|_, f| live.contains(&Arc::as_ptr(f)));
        self.by_prefix.clear();
        for p in &peers {
            self.by_prefix
                .entry(prefix(&p.key.0))
                .and_modify(|k| *k = None)
                .or_insert(Some(p.key));
        }
        self.peers = peers.clone();
        self.input(Input::Peers(peers), now);
    }

    /// The peer's forwarder, opened (and made its endpoint) if it has none.
    pub(super) fn forwarder(&mut self, peer: PeerKey) -> Option<Arc<Forwarder>> {
        if let Some(f) = self.fwds.get(&peer) {
            return Some(f.fwd.clone());
        }
        let opened = Forwarder::open((self.setup.wg_port)()).and_then(|f| {
            let t = f.spawn(self.setup.underlay.clone())?;
            Ok((f, t))
        });
        let (f, thread) = match opened {
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
                thread: Some(thread),
            },
        );
        Some(f)
    }

    pub(super) fn set_endpoint(&mut self, peer: PeerKey, endpoint: SocketAddr) {
        if let Err(e) = self.setup.control.set_endpoint(peer, endpoint) {
            tracing::warn!(peer_key = %peer, %endpoint, "cannot set the peer's endpoint: {e}");
        }
        self.shared
            .owners
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(peer, Some(endpoint));
    }

    pub(super) fn index_direct(&self, peer: PeerKey, ep: Option<SocketAddr>, f: &Arc<Forwarder>) {
        let mut by = self
            .shared
            .by_direct
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        by.retain(|_, x| !Arc::ptr_eq(x, f));
        if let Some(ep) = ep {
            by.insert(ep, f.clone());
        }
        let _ = peer;
    }

    pub(super) fn set_path(&mut self, peer: PeerKey, path: Path, now: Now) {
        match (self.setup.mode, &path) {
            (_, Path::None) => {}
            (Mode::Userspace, Path::Direct { endpoint }) => {
                // Straight from the WireGuard socket: no forwarder in the way.
                self.relayed.remove(&peer);
                self.fwds.remove(&peer);
                self.set_endpoint(peer, *endpoint);
            }
            (Mode::Kernel, Path::Direct { endpoint }) => {
                self.relayed.remove(&peer);
                if let Some(f) = self.forwarder(peer) {
                    f.set_route(Route::Direct(*endpoint));
                    self.index_direct(peer, Some(*endpoint), &f);
                }
            }
            (_, Path::Relay { relay, transport }) => {
                if !self.relay_set.handle_path(relay, *transport, now.at) {
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
