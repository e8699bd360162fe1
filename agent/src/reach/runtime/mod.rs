//! The reach runtime: the thread that owns reach's sockets, drives the sans-IO
//! [`Engine`](super::engine::Engine) and performs its effects. docs/reach.md has the picture.
//!
//! - Inbound: every datagram of the WireGuard socket that is not WireGuard (the data plane's
//!   side channel, or the shared port with the kernel backend: `mesh::shared_port`, read by
//!   the kernel backend and handed in with [`Runtime::offer`]) arrives as an
//!   [`Event`] on one bounded queue ([`EVENT_QUEUE`]; full = dropped and counted) and goes to
//!   the [`Node`](super::node::Node), which routes it: STUN answers to its schedule, disco to
//!   its engine, relay frames to its relay set. The loop carries out the node's one output
//!   queue ([`NodeOut`](super::node::NodeOut): datagrams, relay frames, TCP links, how each
//!   peer is carried, candidates, the reads it asks for, the published views, the relays the
//!   data plane unwraps frames from) after every input. The loop is thin: it moves bytes,
//!   owns the sockets, the TLS links and the forwarders, and performs what the node decided;
//!   where the data plane refuses a relay endpoint it says so to the node
//!   (`Node::handle_plane_refused`), which picks the fallback.
//! - Outbound: everything goes out of the same socket ([`Underlay`]), so the reflexive address
//!   STUN learns is the one peers reach.
//! - The daemon's calls ([`ReachHandle`]) only store what they bring and wake the loop; the
//!   views (`paths`, `own_candidates`) are copies the loop refreshes after each step.
//! - The mesh diff asks [`Runtime`] (as [`EndpointOwners`]) whose a peer's endpoint is: a
//!   peer reach has a path for is reach's.
//!
//! The schedule (a sans-IO machine, `reach::node::schedule`) decides when the loop's pass
//! runs (every [`TICK`], and at once after a daemon input) and what it does: the host address
//! read ([`ADDRS_EVERY`]), the handshake read ([`HANDSHAKES_EVERY`]), STUN ([`STUN_EVERY`],
//! and at once on a network change or a change of the relays or STUN servers), then the relay
//! connections' and the engine's tick and the published views. The loop wakes sooner when the
//! engine, a relay connection or the STUN probe names an earlier deadline (their
//! `poll_timeout`): then only that machine is polled. The loop reads the clock once per turn
//! and hands that `Now` to everything the turn does.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};

use plexsphere_wire::node::RelaySpec;
use plexsphere_wire::signed::SignedEnvelope;

pub use self::shared::{
    ADDRS_EVERY, EVENT_QUEUE, Event, HANDSHAKES_EVERY, LocalAddrs, PathControl, PortFn, RELAY_IDLE,
    RuntimeSetup, STUN_EVERY,
};
use self::shared::{Shared, lock, offer};
use super::io::{Effect, Now, OwnCandidates, PeerPathView, PeerReach, ReachHandle};
use super::io::{EndpointOwners, Owner};
use plexsphere_wire::key::PublicKey;

mod event_loop;
mod peers;
mod relays;
mod shared;
#[cfg(test)]
mod tests;

/// The daemon's handle on the runtime; see the module docs.
pub struct Runtime {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Runtime {
    /// Starts the loop on its own thread.
    pub fn start(setup: RuntimeSetup) -> io::Result<Arc<Self>> {
        let (tx, rx): (SyncSender<Event>, Receiver<Event>) = mpsc::sync_channel(EVENT_QUEUE);
        let shared = Arc::new(Shared::new(tx));
        let s = shared.clone();
        let thread = thread::Builder::new()
            .name("plexd-reach".into())
            .spawn(move || event_loop::Loop::new(setup, s, Now::system()).run(&rx))?;
        Ok(Arc::new(Self {
            shared,
            thread: Mutex::new(Some(thread)),
        }))
    }

    /// Hands a datagram to the loop without blocking; `false` when the queue was full (the
    /// datagram is dropped and counted). The data plane's side channel calls this.
    pub fn offer(&self, datagram: &[u8], from: SocketAddr) -> bool {
        offer(&self.shared, datagram, from)
    }

    /// A sink for the data plane's side channel.
    pub fn side_sink(&self) -> plexd_dataplane::SideSink {
        let shared = self.shared.clone();
        plexd_dataplane::SideSink::new(move |d, from| offer(&shared, d, from))
    }

    /// Performs `effect` as if the engine had answered it (tests and tools: pin a path).
    pub fn perform(&self, effect: Effect) {
        lock(&self.shared.pending).effects.push(effect);
        self.wake();
    }

    /// Events dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// Whether [`Self::stop`] was called (readers of the runtime's sockets end then).
    pub fn stopped(&self) -> bool {
        self.shared.stop.load(Ordering::Relaxed)
    }

    /// The WireGuard private key rotated: the loop starts over with the new one.
    pub fn set_secret(&self, secret: [u8; 32]) {
        lock(&self.shared.pending).secret = Some(secret);
        self.wake();
    }

    /// Stops the loop and its forwarders; waits for the loop thread.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.wake();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }

    fn wake(&self) {
        let _ = self.shared.events.try_send(Event::Wake);
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.stop();
    }
}

impl ReachHandle for Runtime {
    fn set_peers(&self, peers: Vec<PeerReach>) {
        lock(&self.shared.pending).peers = Some(peers);
        self.wake();
    }

    fn set_relays(&self, relays: Vec<RelaySpec>, stun: Vec<SocketAddr>) {
        lock(&self.shared.pending).relays = Some((relays, stun));
        self.wake();
    }

    fn set_relay_token(&self, token: SignedEnvelope) {
        lock(&self.shared.pending).token = Some(token);
        self.wake();
    }

    fn paths(&self) -> Vec<PeerPathView> {
        lock(&self.shared.view).paths.clone()
    }

    fn own_candidates(&self) -> OwnCandidates {
        lock(&self.shared.view).own.clone()
    }
}

impl EndpointOwners for Runtime {
    fn owner(&self, key: &PublicKey) -> Owner {
        match self
            .shared
            .owners
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
        {
            Some(endpoint) => Owner::Reach {
                endpoint: *endpoint,
            },
            None => Owner::Rotation,
        }
    }
}
