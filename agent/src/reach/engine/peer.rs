//! One peer as the reach engine tracks it: its pair key, its direct candidates with their last
//! pong and RTT, the relays that answered for it, the pings in flight, and its send budgets.
//! Plain data with small rules; the engine ([`super`]) decides when to use them.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use plexsphere_wire::reach::disco::{PairKey, TxId};

use super::bounds::{
    CANDIDATE_FRESH, DIRECT_DEAD_AFTER, GONE_HOLD, LEARNED_LIFETIME, MAX_LEARNED_CANDIDATES,
    MAX_OUTSTANDING_TX, MAX_STATE_CANDIDATES, MISSED_PINGS, PING_TIMEOUT, PUNCH_QUIET,
    PUNCHES_BEFORE_QUIET, TX_LIFETIME,
};
use super::guard::{Budget, Replay, Sources};
use crate::reach::io::{Path, PeerReach};

/// One direct address of a peer.
#[derive(Debug, Clone)]
pub(super) struct Candidate {
    pub addr: SocketAddr,
    /// Learned (a ping came from it, or a call-me-maybe named it) rather than from the state,
    /// and when.
    pub learned: Option<Instant>,
    pub last_pong: Option<Instant>,
    pub rtt: Option<Duration>,
    pub last_ping: Option<Instant>,
    /// Pings sent since the last pong.
    pub unanswered: u32,
    /// When the [`MISSED_PINGS`]th of them went out (later pings do not move it, so probing
    /// a dead candidate again does not bring it back; only a pong does).
    pub missed_at: Option<Instant>,
}

impl Candidate {
    fn new(addr: SocketAddr, learned: Option<Instant>) -> Self {
        Self {
            addr,
            learned,
            last_pong: None,
            rtt: None,
            last_ping: None,
            unanswered: 0,
            missed_at: None,
        }
    }

    /// [`MISSED_PINGS`] pings unanswered, the last of them [`PING_TIMEOUT`] old, and no pong
    /// for [`DIRECT_DEAD_AFTER`].
    pub fn dead(&self, now: Instant) -> bool {
        let quiet = self
            .last_pong
            .is_none_or(|p| now.saturating_duration_since(p) >= DIRECT_DEAD_AFTER);
        let timed_out = self
            .missed_at
            .is_some_and(|p| now.saturating_duration_since(p) >= PING_TIMEOUT);
        quiet && timed_out
    }

    /// Answered recently and not dead: a path WireGuard may take.
    pub fn alive(&self, now: Instant) -> bool {
        let fresh = self
            .last_pong
            .is_some_and(|p| now.saturating_duration_since(p) < CANDIDATE_FRESH);
        fresh && !self.dead(now)
    }

    /// A learned candidate with no pong for [`LEARNED_LIFETIME`] (since its last pong, or
    /// since it was learned).
    fn stale(&self, now: Instant) -> bool {
        self.learned.is_some_and(|at| {
            let heard = self.last_pong.map_or(at, |p| p.max(at));
            now.saturating_duration_since(heard) >= LEARNED_LIFETIME
        })
    }
}

/// Where a ping went: a pong counts only from there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Dest {
    Direct(SocketAddr),
    Relay(String),
}

#[derive(Debug, Clone)]
struct Sent {
    tx: TxId,
    dest: Dest,
    at: Instant,
}

/// A relay that carried a pong from the peer.
#[derive(Debug, Clone, Copy)]
pub(super) struct Heard {
    pub at: Instant,
    pub rtt: Duration,
}

pub(super) struct Peer {
    pub reach: PeerReach,
    pub pair: PairKey,
    /// State endpoints first (in the state's order), then learned ones (oldest first).
    pub candidates: Vec<Candidate>,
    sent: VecDeque<Sent>,
    /// Relays that carried a pong from this peer, with when and how fast.
    pub heard: BTreeMap<String, Heard>,
    /// Relays that said this peer is not registered with them, and when.
    pub gone: BTreeMap<String, Instant>,
    pub path: Path,
    pub rtt: Option<Duration>,
    pub reason: String,
    /// The data plane's last handshake with the peer (`Input::Handshakes`; only reported).
    pub handshake: Option<std::time::SystemTime>,
    pub last_probe: Option<Instant>,
    pub pings: Budget,
    pub pongs: Budget,
    /// The stamps of the peer's disco messages (each is taken once).
    pub replay: Replay,
    /// A budget per source of the peer's disco messages.
    pub sources: Sources,
    /// The peer spoke another disco version, and we said so in the journal (once).
    pub warned_version: bool,
    /// The last probe round pinged through a relay: the first pong through a relay starts the
    /// punch (`punch`).
    pub punch_wanted: bool,
    /// When the cold candidates are pinged: half the relay round trip after the relay's pong
    /// (and our call-me-maybe), the moment the peer's answering pings leave its NAT.
    pub punch_at: Option<Instant>,
    /// Call-me-maybes sent to or received from the peer in the current series of punches
    /// (since a direct candidate answered, the addresses changed, or the pair was quiet for
    /// [`PUNCH_QUIET`]).
    pub punches: u32,
    /// When the last of them was sent or received.
    pub last_punch: Option<Instant>,
}

impl Peer {
    pub fn new(reach: PeerReach, pair: PairKey, pings: u32, pongs: u32) -> Self {
        let mut peer = Self {
            reach: reach.clone(),
            pair,
            candidates: Vec::new(),
            sent: VecDeque::new(),
            heard: BTreeMap::new(),
            gone: BTreeMap::new(),
            path: Path::None,
            rtt: None,
            reason: "not probed yet".to_owned(),
            handshake: None,
            last_probe: None,
            pings: Budget::new(pings),
            pongs: Budget::new(pongs),
            replay: Replay::default(),
            sources: Sources::default(),
            warned_version: false,
            punch_wanted: false,
            punch_at: None,
            punches: 0,
            last_punch: None,
        };
        peer.set_reach(reach);
        peer
    }

    /// Takes the peer's newest spec; answers whether its endpoints or home relay changed. Known
    /// candidates keep what they learned; learned ones the state now lists become state ones.
    /// New endpoints start a new series of punches.
    pub fn set_reach(&mut self, reach: PeerReach) -> bool {
        let changed =
            reach.endpoints != self.reach.endpoints || reach.home_relay != self.reach.home_relay;
        if reach.endpoints != self.reach.endpoints {
            self.reset_punches();
            // New endpoints: the peer runs (again) and reported them. What the relays said of
            // it before (not registered: it had not started yet) is stale, and a probe through
            // them times the punch; else its new candidates would be pinged untimed, before it
            // sent to us (its input-accepting router would keep that ping's tuple).
            self.gone.clear();
        }
        let mut next: Vec<Candidate> = Vec::new();
        for addr in reach.endpoints.iter().take(MAX_STATE_CANDIDATES) {
            if next.iter().any(|c| c.addr == *addr) {
                continue;
            }
            let mut c = self
                .candidates
                .iter()
                .find(|c| c.addr == *addr)
                .cloned()
                .unwrap_or_else(|| Candidate::new(*addr, None));
            c.learned = None;
            next.push(c);
        }
        for c in self.candidates.iter().filter(|c| c.learned.is_some()) {
            if !next.iter().any(|n| n.addr == c.addr) {
                next.push(c.clone());
            }
        }
        self.candidates = next;
        self.reach = reach;
        changed
    }

    /// Adds a learned candidate (the caller checked it is an address peers may send to);
    /// answers whether it is new. Past [`MAX_LEARNED_CANDIDATES`] the oldest learned one goes
    /// (never the current path).
    pub fn learn(&mut self, addr: SocketAddr, now: Instant) -> bool {
        if self.candidates.iter().any(|c| c.addr == addr) {
            return false;
        }
        self.candidates.push(Candidate::new(addr, Some(now)));
        if self
            .candidates
            .iter()
            .filter(|c| c.learned.is_some())
            .count()
            > MAX_LEARNED_CANDIDATES
        {
            let current = self.current();
            if let Some(i) = self
                .candidates
                .iter()
                .position(|c| c.learned.is_some() && Some(c.addr) != current)
            {
                self.candidates.remove(i);
            }
        }
        true
    }

    /// The pair's punches failed [`PUNCHES_BEFORE_QUIET`] times in a row and the last was
    /// less than [`PUNCH_QUIET`] ago: no cold candidate is pinged (`punch`).
    pub fn quiet(&self, now: Instant) -> bool {
        self.punches >= PUNCHES_BEFORE_QUIET
            && self
                .last_punch
                .is_some_and(|at| now.saturating_duration_since(at) < PUNCH_QUIET)
    }

    /// Counts a call-me-maybe sent or received now; answers whether it may be punched for
    /// (the first [`PUNCHES_BEFORE_QUIET`] of a series). One after [`PUNCH_QUIET`] of quiet
    /// starts a new series; one during the quiet extends it.
    pub fn count_punch(&mut self, now: Instant) -> bool {
        if self
            .last_punch
            .is_some_and(|at| now.saturating_duration_since(at) >= PUNCH_QUIET)
        {
            self.punches = 0;
        }
        self.last_punch = Some(now);
        self.punches = self.punches.saturating_add(1);
        self.punches <= PUNCHES_BEFORE_QUIET
    }

    /// A new series of punches: a direct candidate answered, or addresses changed (new
    /// tuples, which no router holds an entry for).
    pub fn reset_punches(&mut self) {
        self.punches = 0;
        self.last_punch = None;
    }

    /// The direct endpoint the peer's path is on, if it is direct.
    fn current(&self) -> Option<SocketAddr> {
        match &self.path {
            Path::Direct { endpoint } => Some(*endpoint),
            _ => None,
        }
    }

    pub fn candidate(&self, addr: SocketAddr) -> Option<&Candidate> {
        self.candidates.iter().find(|c| c.addr == addr)
    }

    /// Remembers a ping in flight (the oldest is forgotten past [`MAX_OUTSTANDING_TX`]).
    pub fn sent_ping(&mut self, tx: TxId, dest: Dest, now: Instant) {
        if let Dest::Direct(addr) = &dest
            && let Some(c) = self.candidates.iter_mut().find(|c| c.addr == *addr)
        {
            c.last_ping = Some(now);
            c.unanswered = c.unanswered.saturating_add(1);
            if c.unanswered == MISSED_PINGS {
                c.missed_at = Some(now);
            }
        }
        self.sent.push_back(Sent { tx, dest, at: now });
        while self.sent.len() > MAX_OUTSTANDING_TX {
            self.sent.pop_front();
        }
    }

    /// The round trip of the ping this pong answers, if we sent `tx` to `dest` no longer than
    /// [`TX_LIFETIME`] ago; the tx id is used up. A ping cannot have left before `not_before`
    /// (a relayed one waits in the connection's queue until the relay registered it), so the
    /// round trip counts from then when that is later: a punch timed by the queue's wait fires
    /// late, after the peer's pings reached our router.
    pub fn take_pong(
        &mut self,
        tx: &TxId,
        dest: &Dest,
        not_before: Option<Instant>,
        now: Instant,
    ) -> Option<Duration> {
        let i = self.sent.iter().position(|s| {
            s.tx == *tx && s.dest == *dest && now.saturating_duration_since(s.at) <= TX_LIFETIME
        })?;
        let sent = self.sent.remove(i)?;
        let left = not_before.map_or(sent.at, |t| t.max(sent.at));
        let rtt = now.saturating_duration_since(left);
        match dest {
            Dest::Direct(addr) => {
                self.reset_punches();
                if let Some(c) = self.candidates.iter_mut().find(|c| c.addr == *addr) {
                    c.last_pong = Some(now);
                    c.rtt = Some(rtt);
                    c.unanswered = 0;
                    c.missed_at = None;
                }
            }
            Dest::Relay(relay) => {
                self.gone.remove(relay);
                self.heard.insert(relay.clone(), Heard { at: now, rtt });
            }
        }
        Some(rtt)
    }

    /// Forgets pings past [`TX_LIFETIME`], "not registered" answers past [`GONE_HOLD`], and
    /// learned candidates without a pong for [`LEARNED_LIFETIME`] (never the current path).
    pub fn expire(&mut self, now: Instant) {
        let current = self.current();
        self.candidates
            .retain(|c| Some(c.addr) == current || !c.stale(now));
        self.sent
            .retain(|s| now.saturating_duration_since(s.at) <= TX_LIFETIME);
        self.gone
            .retain(|_, at| now.saturating_duration_since(*at) < GONE_HOLD);
    }

    /// How many pings are in flight (for tests and bounds).
    #[cfg(test)]
    pub fn in_flight(&self) -> usize {
        self.sent.len()
    }
}
