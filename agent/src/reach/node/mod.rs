//! Reach's decisions as sans-IO machines the runtime drives and only carries out (issue 26,
//! "reach as one sans-IO node"; docs/reach.md "The runtime"). So far:
//!
//! - [`relays`]: the relay set (the relays in use, their connections, the home relay, the
//!   move to TCP with TLS, idle closes, replay floors, the relay token).
//! - [`schedule`]: the schedule (when the runtime's pass runs, the host address and handshake
//!   reads, STUN runs and the probe, the tick of the relays and the engine).
//! - [`Node`] (here): the engine, the relay set and the schedule together, and the decisions
//!   that span them: the one deadline the runtime sleeps until, which machine is due when no
//!   pass runs, a change of the relays or STUN servers, a key rotation. The runtime still
//!   feeds each machine and carries out each one's outputs itself (`engine`, `relays`,
//!   `schedule` are its to drive until their outputs meet in the node).

use std::net::SocketAddr;
use std::time::Instant;

use ipnet::IpNet;
use plexsphere_wire::node::RelaySpec;
use rand_core::CryptoRngCore;

use crate::reach::engine::Engine;

pub mod relays;
pub mod schedule;
#[cfg(test)]
mod tests;

use self::relays::RelaySet;
use self::schedule::Schedule;

/// The node; see the module docs.
pub struct Node {
    pub engine: Engine,
    pub relays: RelaySet,
    pub schedule: Schedule,
    mesh: IpNet,
}

impl Node {
    /// A node with this WireGuard private key in a Domain with this mesh range, with or
    /// without TLS trust for relays; STUN transaction ids come from `rng` (the engine's tx ids
    /// and disco nonces from the OS's CSPRNG, `Engine::new`). Its first pass is due at `now`.
    pub fn new(
        secret: [u8; 32],
        mesh: IpNet,
        tls_trust: bool,
        rng: Box<dyn CryptoRngCore + Send>,
        now: Instant,
    ) -> Self {
        Self {
            engine: Engine::new(secret, mesh),
            relays: RelaySet::new(secret, tls_trust),
            schedule: Schedule::new(rng, now),
            mesh,
        }
    }

    /// The earliest deadline of the schedule (its next pass, the STUN probe), the engine (a
    /// timed punch) and the relay set (a connection's retry, keepalive, give-up, ...). Never
    /// `None`: the schedule always has its next pass.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [
            self.schedule.poll_timeout(),
            self.engine.poll_timeout(),
            self.relays.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Whether the engine's own deadline has come (it then gets `Input::Tick` even when no
    /// pass runs).
    pub fn engine_due(&self, now: Instant) -> bool {
        self.engine.poll_timeout().is_some_and(|at| at <= now)
    }

    /// Whether a relay connection's deadline has come (the relay set's `handle_timeout` then
    /// runs even when no pass runs).
    pub fn relays_due(&self, now: Instant) -> bool {
        self.relays.poll_timeout().is_some_and(|at| at <= now)
    }

    /// The state's relays and STUN servers: the relay set takes the relays (its outputs, an
    /// engine input among them, are in `relays.poll_out`), and a change of the usable relays or
    /// of the STUN servers starts a STUN run with the next pass.
    pub fn handle_relays(&mut self, specs: Vec<RelaySpec>, stun: Vec<SocketAddr>, now: Instant) {
        if self.relays.handle_relays(specs) {
            let udp = self.relays.relays().iter().filter_map(|r| r.udp).collect();
            self.schedule.handle_relays_changed(udp, now);
        }
        self.schedule.handle_stun_servers(stun, now);
    }

    /// A key rotation: the disco keys and relay registrations derive from the WireGuard key,
    /// so the engine starts over with the new one, every relay connection registers again
    /// (the relay set's outputs close its TLS links and hand the new engine the relays), and
    /// the next pass hands the engine the local addresses again. The wanted peers are the
    /// runtime's to hand over again.
    pub fn handle_secret(&mut self, secret: [u8; 32], now: Instant) {
        self.engine = Engine::new(secret, self.mesh);
        self.relays.handle_secret(secret);
        self.schedule.handle_rekey(now);
    }
}
