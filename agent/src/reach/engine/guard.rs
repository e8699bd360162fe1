//! What a disco message must pass before it costs this node anything: its stamp is new
//! ([`Replay`]: each stamp of a sender once, within [`DISCO_REPLAY_WINDOW`] stamps and
//! [`DISCO_MAX_AGE`] of the newest), and the address (or relay) it came from has budget left
//! ([`Sources`]: [`MAX_ANSWERS_PER_SOURCE_PER_SEC`] per source, at most [`MAX_PING_SOURCES`]
//! sources per peer), on top of the peer's own budgets.
//!
//! `Engine::open` (in engine.rs, so that this file needs nothing of the engine) checks the stamp after the message authenticates (so a forger cannot
//! move the window) and before anything is answered, learned or counted against a budget: a
//! captured ping replayed any number of times costs one AEAD opening each. A message of
//! another disco version is counted and said once per peer.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::bounds::{
    DISCO_MAX_AGE, DISCO_REPLAY_WINDOW, MAX_ANSWERS_PER_SOURCE_PER_SEC, MAX_PING_SOURCES,
};

/// The stamps one sender key used lately.
#[derive(Debug, Default)]
pub(super) struct Replay {
    /// The newest stamp accepted.
    newest: Option<u64>,
    /// The last [`DISCO_REPLAY_WINDOW`] stamps accepted.
    seen: BTreeSet<u64>,
}

impl Replay {
    /// Whether `stamp` is new: not seen, not older than the oldest remembered once the window
    /// is full (it may have been seen and forgotten), not [`DISCO_MAX_AGE`] older than the
    /// newest. A new stamp is remembered.
    pub fn accept(&mut self, stamp: u64) -> bool {
        let max_age = u64::try_from(DISCO_MAX_AGE.as_micros()).unwrap_or(u64::MAX);
        if self
            .newest
            .is_some_and(|n| stamp.saturating_add(max_age) < n)
        {
            return false;
        }
        if self.seen.contains(&stamp) {
            return false;
        }
        let full = self.seen.len() >= DISCO_REPLAY_WINDOW;
        if full && self.seen.first().is_some_and(|oldest| stamp < *oldest) {
            return false;
        }
        self.seen.insert(stamp);
        while self.seen.len() > DISCO_REPLAY_WINDOW {
            self.seen.pop_first();
        }
        self.newest = Some(self.newest.map_or(stamp, |n| n.max(stamp)));
        true
    }
}

/// Where a disco message came from, for its source budget.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Origin {
    /// Directly, from this address (any port: one host is one source).
    Addr(IpAddr),
    /// Through this relay.
    Relay(String),
}

/// A budget per source of one peer's disco messages.
#[derive(Debug, Default)]
pub(super) struct Sources {
    budgets: BTreeMap<Origin, Budget>,
}

impl Sources {
    /// Takes one answer from `origin`'s budget. A new source gets a budget while fewer than
    /// [`MAX_PING_SOURCES`] sources were heard within the last second; else it is refused.
    pub fn take(&mut self, origin: Origin, now: Instant) -> bool {
        if !self.budgets.contains_key(&origin) && self.budgets.len() >= MAX_PING_SOURCES {
            self.budgets
                .retain(|_, b| !b.idle(now, Duration::from_secs(1)));
            if self.budgets.len() >= MAX_PING_SOURCES {
                return false;
            }
        }
        self.budgets
            .entry(origin)
            .or_insert_with(|| Budget::new(MAX_ANSWERS_PER_SOURCE_PER_SEC))
            .take(now)
    }
}

/// At most `max` sends in any one-second window.
#[derive(Debug, Clone)]
pub(super) struct Budget {
    window: Option<Instant>,
    used: u32,
    max: u32,
}

impl Budget {
    pub fn new(max: u32) -> Self {
        Self {
            window: None,
            used: 0,
            max,
        }
    }

    /// Takes one send if the current window has room.
    pub fn take(&mut self, now: Instant) -> bool {
        let fresh = self
            .window
            .is_none_or(|w| now.saturating_duration_since(w) >= Duration::from_secs(1));
        if fresh {
            self.window = Some(now);
            self.used = 0;
        }
        if self.used >= self.max {
            return false;
        }
        self.used += 1;
        true
    }

    /// Nothing taken for `quiet` (a source that may be forgotten).
    pub fn idle(&self, now: Instant, quiet: Duration) -> bool {
        self.window
            .is_none_or(|w| now.saturating_duration_since(w) >= quiet)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_stamp_is_taken_once_within_the_window() {
        let mut r = Replay::default();
        assert!(r.accept(1_000));
        assert!(!r.accept(1_000), "the same stamp again");
        assert!(r.accept(900), "out of order, within the window");
        assert!(!r.accept(900));
        let max_age = DISCO_MAX_AGE.as_micros() as u64;
        assert!(r.accept(1_000 + max_age + 1));
        assert!(
            !r.accept(999),
            "older than the newest by more than the maximum age"
        );
        // Fill the window: the oldest stamps are forgotten, and anything older is refused.
        let base = 2 * max_age;
        for s in 0..DISCO_REPLAY_WINDOW as u64 {
            assert!(r.accept(base + 10 * s));
        }
        assert!(r.accept(base + 1), "between two remembered stamps: new");
        assert!(!r.accept(base - 1), "older than everything remembered");
        assert!(r.accept(base + 10 * DISCO_REPLAY_WINDOW as u64 + 5));
    }

    #[test]
    fn one_source_spends_only_its_own_budget() {
        let mut s = Sources::default();
        let now = Instant::now();
        let a = Origin::Addr(IpAddr::from([192, 0, 2, 1]));
        let b = Origin::Addr(IpAddr::from([192, 0, 2, 2]));
        for _ in 0..MAX_ANSWERS_PER_SOURCE_PER_SEC {
            assert!(s.take(a.clone(), now));
        }
        assert!(!s.take(a.clone(), now));
        assert!(s.take(b, now), "another source still has its budget");
        assert!(s.take(a, now + Duration::from_secs(1)), "a new second");
    }

    #[test]
    fn sources_are_bounded() {
        let mut s = Sources::default();
        let now = Instant::now();
        for i in 0..MAX_PING_SOURCES {
            let origin = Origin::Addr(IpAddr::from([192, 0, 2, i as u8]));
            assert!(s.take(origin, now));
        }
        let late = Origin::Addr(IpAddr::from([198, 51, 100, 1]));
        assert!(!s.take(late.clone(), now), "full within this second");
        assert!(
            s.take(late, now + Duration::from_secs(1)),
            "the idle ones went"
        );
        assert!(s.budgets.len() <= MAX_PING_SOURCES);
    }
}
