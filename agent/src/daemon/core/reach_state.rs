//! What the reach runtime was told last and what it said last ([`super::reach`] decides when
//! to tell it): the runtime is told only changes, and its own candidates bring the endpoint
//! report forward only when they changed since the last report started.

use plexsphere_wire::node::RelaySpec;
use plexsphere_wire::signed::SignedEnvelope;
use std::net::SocketAddr;

use super::io::ReachOp;
use crate::reach::io::{OwnCandidates, PeerPathView, PeerReach};

/// The reach feed's state, owned here and changed only through these methods.
#[derive(Debug, Clone, Default)]
pub struct ReachFeed {
    /// The wanted peers, the relays and STUN servers, and the relay token last sent.
    peers: Option<Vec<PeerReach>>,
    relays: Option<(Vec<RelaySpec>, Vec<SocketAddr>)>,
    relay_token: Option<SignedEnvelope>,
    /// The runtime's paths as last read (empty without a runtime).
    paths: Vec<PeerPathView>,
    /// Our own candidates as last read, and as they were when the last report started.
    own_seen: OwnCandidates,
    own_reported: OwnCandidates,
}

impl ReachFeed {
    /// The wanted peers: what to send, unless it is what was sent last.
    pub fn peers(&mut self, peers: Vec<PeerReach>) -> Option<ReachOp> {
        if self.peers.as_ref() == Some(&peers) {
            return None;
        }
        self.peers = Some(peers.clone());
        Some(ReachOp::Peers(peers))
    }

    /// A state's relays and STUN servers: what to send, unless they are what was sent last.
    pub fn relays(&mut self, relays: Vec<RelaySpec>, stun: Vec<SocketAddr>) -> Option<ReachOp> {
        let both = (relays, stun);
        if self.relays.as_ref() == Some(&both) {
            return None;
        }
        self.relays = Some(both.clone());
        let (relays, stun) = both;
        Some(ReachOp::Relays { relays, stun })
    }

    /// A relay token: what to send, unless it is the one sent last.
    pub fn relay_token(&mut self, token: &SignedEnvelope) -> Option<ReachOp> {
        if self.relay_token.as_ref() == Some(token) {
            return None;
        }
        self.relay_token = Some(token.clone());
        Some(ReachOp::RelayToken(token.clone()))
    }

    /// What the runtime said: keeps the paths and our own candidates; `true` when those
    /// candidates differ from the ones the last endpoint report started with.
    pub fn read(&mut self, paths: Vec<PeerPathView>, own: OwnCandidates) -> bool {
        self.paths = paths;
        let changed = own != self.own_reported;
        self.own_seen = own;
        changed
    }

    /// An endpoint report starts: the candidates read last are the ones it reports.
    pub fn report_started(&mut self) {
        self.own_reported = self.own_seen.clone();
    }

    /// The runtime's paths as last read.
    pub fn paths(&self) -> &[PeerPathView] {
        &self.paths
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_changes_are_sent_and_own_candidates_count_against_the_last_report() {
        let mut f = ReachFeed::default();
        assert!(matches!(f.peers(vec![]), Some(ReachOp::Peers(_))));
        assert!(f.peers(vec![]).is_none(), "the same set is not sent again");
        assert!(matches!(
            f.relays(vec![], vec![]),
            Some(ReachOp::Relays { .. })
        ));
        assert!(f.relays(vec![], vec![]).is_none());
        let stun: SocketAddr = "192.0.2.1:3478".parse().unwrap();
        assert!(
            f.relays(vec![], vec![stun]).is_some(),
            "a new STUN server is"
        );

        assert!(!f.read(vec![], OwnCandidates::default()), "nothing new yet");
        let moved = OwnCandidates {
            reflexive: vec!["198.51.100.7:51820".parse().unwrap()],
            ..Default::default()
        };
        assert!(f.read(vec![], moved.clone()));
        assert!(f.read(vec![], moved.clone()), "new until a report starts");
        f.report_started();
        assert!(!f.read(vec![], moved), "the report carried it");
        assert!(f.paths().is_empty());
    }
}
