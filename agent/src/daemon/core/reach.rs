//! What the core tells the reach runtime (the wanted peers, the relays and STUN servers, the
//! relay token) and what `plexd status` shows of each peer's path.
//!
//! | when | what goes to the runtime |
//! |---|---|
//! | the wanted set changed (a state, an event, the revocation) | `Peers`, when it differs from the last sent |
//! | a state was installed | `Relays` (when they differ), its `RelayToken` (when newer) |
//! | a heartbeat answer carries a relay token | `RelayToken` (when it differs) |
//!
//! Back from the runtime (`ReachRead`, with every live-peer answer): the paths, and our own
//! candidates; when those changed since the last endpoint report started, the next one is due
//! now.
//!
//! What was sent and read last is [`super::reach_state::ReachFeed`]'s.
//!
//! A peer's path in status is the runtime's view of it; without a view (no runtime, the
//! `none` or a kernel backend without one, or a peer the runtime has not taken yet) it is the
//! data plane's own endpoint when a handshake happened, else none.

use plexsphere_wire::node::{NodeState, PeerSpec};
use plexsphere_wire::signed::SignedEnvelope;

use super::schedule::Task;
use super::status::PeerPath;
use super::{Core, Effect, Now};
use crate::mesh::LivePeer;
use crate::reach::io::{OwnCandidates, PeerPathView, PeerReach};
use plexsphere_wire::key::PublicKey;

/// A wanted peer as the reach runtime takes it; `None` for a key that is not base64 of 32
/// bytes (the mesh diff refuses that peer too).
pub fn peer_reach(p: &PeerSpec) -> Option<PeerReach> {
    Some(PeerReach {
        key: PublicKey::from_base64(&p.public_key).ok()?,
        node_id: p.node_id,
        hostname: p.hostname.clone(),
        endpoints: p.endpoints.clone(),
        home_relay: p.home_relay.clone(),
        // Not the mesh addresses (the mesh range is no candidate anyway) nor the exit's
        // default routes (plexd's own datagrams are marked past the exit's table).
        routes: p
            .allowed_ips
            .iter()
            .filter(|n| n.prefix_len() > 0 && !n.contains(&p.mesh_ip))
            .copied()
            .collect(),
    })
}

/// What status shows of one peer's path: the path, its RTT in ms, and why.
pub fn peer_path(
    public_key: &str,
    live: Option<&LivePeer>,
    views: &[PeerPathView],
) -> (PeerPath, Option<u64>, String) {
    if let Some(v) = views.iter().find(|v| v.public_key == public_key) {
        return (PeerPath::from(&v.path), v.rtt_ms, v.reason.clone());
    }
    let handshake = live.and_then(|l| l.last_handshake).is_some();
    match live.and_then(|l| l.endpoint) {
        Some(endpoint) if handshake => (
            PeerPath::Direct { endpoint },
            None,
            "the data plane's endpoint (no reach runtime path)".to_owned(),
        ),
        Some(_) => (PeerPath::None, None, "no handshake yet".to_owned()),
        None => (PeerPath::None, None, "no endpoint known".to_owned()),
    }
}

impl Core {
    /// What the runtime said: paths for status; own candidates that changed since the last
    /// report started bring the next report forward (peers learn a new reflexive address or
    /// home relay within a heartbeat, not an endpoint-report interval).
    pub(super) fn on_reach_read(&mut self, paths: Vec<PeerPathView>, own: OwnCandidates, now: Now) {
        if self.reach.read(paths, own) {
            self.schedule.run_soon(Task::EndpointReport, now.at);
        }
    }

    /// Sends the wanted set to the runtime when it differs from the last one sent.
    pub(super) fn feed_reach_peers(&mut self) {
        let peers: Vec<PeerReach> = self.wanted.iter().filter_map(peer_reach).collect();
        if let Some(op) = self.reach.peers(peers) {
            self.emit(Effect::Reach(op));
        }
    }

    /// A state was installed: its relays and STUN servers, and its relay token.
    pub(super) fn feed_reach_state(&mut self, state: &NodeState) {
        if let Some(op) = self.reach.relays(state.relays.clone(), state.stun.clone()) {
            self.emit(Effect::Reach(op));
        }
        if let Some(token) = &state.relay_token {
            self.feed_relay_token(token);
        }
    }

    /// A relay token from the state or a heartbeat answer, unless it is the one sent last.
    pub(super) fn feed_relay_token(&mut self, token: &SignedEnvelope) {
        if let Some(op) = self.reach.relay_token(token) {
            self.emit(Effect::Reach(op));
        }
    }
}
