//! What the wanted set becomes: a verified state installed (from the API or the cache) with the
//! events since applied again on top, which states are accepted (the floors), the mesh applied
//! and the cache written, and what a turn's stream events owe, settled once (`Owed`).

use std::sync::Arc;

use plexsphere_wire::node::NodeState;
use plexsphere_wire::signed::SignedEnvelope;

use super::cache::{CacheError, Cached};
use super::io::CacheWrite;
use super::owed::Owed;
use super::schedule::Task;
use super::wanted::DesiredPeers;
use super::{Core, Effect, Now};

impl Core {
    /// Does what the inputs since the last settle owe (`Owed`), unless the core is ending
    /// (a revoked or cloned node changes nothing more).
    pub(super) fn settle_owed(&mut self) {
        if self.exited {
            self.owed = Owed::default();
            return;
        }
        if let Some(now) = self.owed.apply.take() {
            self.apply_mesh(now);
        }
        if std::mem::take(&mut self.owed.save) {
            self.save_cache();
        }
    }

    /// Sends the wanted set to the mesh; with an apply still running, the latest set goes
    /// when it answers (applies never queue up behind each other).
    pub(super) fn apply_mesh(&mut self, now: Now) {
        self.owed.apply = None;
        self.feed_reach_peers();
        if self.mesh_jobs.apply_running() {
            self.mesh_jobs.set_apply_again(true);
        } else {
            let set = Arc::new(self.in_view(self.wanted.list()));
            self.ask_apply(set, now);
        }
        self.update_status();
    }

    /// The highest state version or event seq this node applied: no event older is accepted.
    /// A state may be older than the last event (`state_accept_floor`): the control plane makes
    /// it at its head when the pull arrives, and an event after that head can reach the node
    /// first over the stream; every event newer than the state is held and applied again on top.
    pub(super) fn floor(&self) -> u64 {
        self.state_version.unwrap_or(0).max(self.last_seq)
    }

    /// The oldest state version this node accepts: `state_floor`, and above it once an event
    /// came since (a state made in that race is newer than the one installed; the installed
    /// version served again then is a replay, refused and logged as one).
    pub(super) fn state_accept_floor(&self) -> u64 {
        if self.last_seq > self.state_floor {
            self.state_floor + 1
        } else {
            self.state_floor
        }
    }

    /// The cache read at start: apply it so the mesh works before the API answers.
    pub(super) fn on_cache(&mut self, cached: Result<Option<Box<Cached>>, CacheError>, now: Now) {
        match cached {
            Ok(None) => tracing::info!("no cached state yet; waiting for the control plane"),
            Ok(Some(c)) => {
                tracing::info!(
                    state_version = c.state.version,
                    last_event_id = c.last_seq,
                    peers = c.state.peers.len(),
                    "applying the cached state"
                );
                let c = *c;
                // The cache was checked against the same keys: what it shows of a rotation
                // (an announcement, a document by the next key) the node takes as well.
                let by = if c.promoted {
                    super::accept::SignedBy::Next
                } else {
                    super::accept::SignedBy::Pinned
                };
                let announced = c.state.next_signing_key.clone();
                self.signed_by(by, announced.as_ref(), c.promoted, now);
                self.events = c.events;
                self.last_seq = c.last_seq;
                self.install_state(c.state, c.envelope, false, now);
                // Whether a resync came after the cached state is not kept: after a restart
                // the first state must be as new as the last event, as before (no event lost
                // to a resync is then missing from the state).
                self.state_floor = self.state_floor.max(c.last_seq);
            }
            Err(e) => tracing::warn!("{e}; starting without it"),
        }
    }

    /// A verified state: replaces the wanted set; events newer than it are applied again.
    pub(super) fn install_state(
        &mut self,
        state: NodeState,
        env: SignedEnvelope,
        save: bool,
        now: Now,
    ) {
        let version = state.version;
        self.state_floor = version;
        self.wanted = DesiredPeers::from_state(&state);
        self.events.retain(|(e, _)| e.seq > version);
        for (e, _) in &self.events {
            self.wanted.apply(&e.kind);
        }
        self.state_version = Some(version);
        self.take_policy(state.policy.clone());
        // An event newer than this state names a peer outside its view (the peer registered
        // after the control plane made this state, while the pull ran): pull again, one floor
        // later, until a state's view names it; the event's seq then folds into the state.
        if let Some(peer) = self
            .events
            .iter()
            .find_map(|(e, _)| self.names_peer_outside_view(&e.kind))
        {
            tracing::info!(%peer, state_version = version, "the signed state version {version} predates a peer an event since named; pulling the state again");
            let at = now.at + self.schedule.floor();
            self.schedule.run_soon(Task::StatePoll, at);
        }
        self.dns = state.dns.clone();
        self.envelope = Some(env);
        self.last_seq = self.last_seq.max(version);
        tracing::info!(
            state_version = version,
            peers = self.wanted.len(),
            "applied the signed state version {version} with {} peers",
            self.wanted.len()
        );
        self.readiness.state_installed();
        self.feed_reach_state(&state);
        self.emit(Effect::Routes(crate::routes::RoutesOp::State {
            served: state.served_routes.clone(),
            relays: state
                .relays
                .iter()
                .flat_map(|r| [r.udp, r.tls])
                .flatten()
                .chain(state.stun.iter().copied())
                .map(|a| a.ip())
                .collect(),
        }));
        if state.udp_offload != self.udp_offload {
            self.udp_offload = state.udp_offload;
            self.emit(Effect::UdpOffload(state.udp_offload));
        }
        self.apply_mesh(now);
        if save {
            self.save_cache();
            self.readiness.wait_for_last_save();
        }
    }

    /// READY=1 once the first state is applied and, when it came from the API, cached.
    pub(super) fn become_ready_when_settled(&mut self) {
        if self.readiness.settled() {
            self.become_ready();
        }
    }

    pub(super) fn save_cache(&mut self) {
        self.owed.save = false;
        let Some(env) = &self.envelope else { return };
        let write = CacheWrite {
            id: self.readiness.next_save(),
            envelope: env.clone(),
            events: self.events.iter().map(|(_, f)| f.clone()).collect(),
            last_seq: self.last_seq,
        };
        self.emit(Effect::SaveCache(write));
    }
}
