//! Which endpoint to set for a peer: its candidates (best first) are tried in turn until one
//! completes a handshake, and a working session is never disturbed.
//!
//! Pure: time comes in as parameters (`now` for the rotation clock, `wall` to age the
//! handshake times the interface reports). The reconcile asks [`EndpointBook::decide`] once per
//! peer per pass; the answer is the endpoint to write, or `None` to leave the live one alone.
//!
//! The rules:
//! - A fresh handshake (younger than [`FRESH`]) means the session works: leave the endpoint as
//!   the data plane has it. That is the candidate that completed the handshake, or the address
//!   the peer roamed to (WireGuard follows an authenticated packet from a new address), which
//!   plexd must not undo by writing an old candidate back.
//! - A candidate that completed a handshake is remembered ("confirmed") and set again when the
//!   session goes idle, until the candidate list changes.
//! - Otherwise the current candidate is set; when no handshake completed [`TRY_FOR`] after it
//!   was set, the next one is (wrapping around).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use plexsphere_wire::key::PublicKey;

/// How long a candidate gets to complete a handshake before the next one is tried.
pub const TRY_FOR: Duration = Duration::from_secs(15);
/// A handshake younger than this means the session works (WireGuard's REJECT_AFTER_TIME).
pub const FRESH: Duration = Duration::from_secs(180);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rotation {
    candidates: Vec<SocketAddr>,
    index: usize,
    /// When the current candidate was chosen.
    since: Instant,
    /// The candidate that completed a handshake, if any.
    confirmed: Option<usize>,
}

/// The rotation state of every peer, by public key.
#[derive(Debug, Clone, Default)]
pub struct EndpointBook {
    peers: HashMap<PublicKey, Rotation>,
}

/// Whether `last_handshake` is recent enough to call the session working.
pub fn is_fresh(last_handshake: Option<SystemTime>, wall: SystemTime) -> bool {
    last_handshake.is_some_and(|t| wall.duration_since(t).map_or(true, |age| age < FRESH))
}

impl EndpointBook {
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets the peers that are no longer wanted.
    pub fn retain(&mut self, keep: impl Fn(&PublicKey) -> bool) {
        self.peers.retain(|k, _| keep(k));
    }

    /// Forgets one peer's rotation (reach took its endpoint over).
    pub fn forget(&mut self, key: &PublicKey) {
        self.peers.remove(key);
    }

    pub fn len(&self) -> usize {
        self.peers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// The endpoint to write for `key`, or `None` to leave the live one as it is.
    pub fn decide(
        &mut self,
        key: PublicKey,
        candidates: &[SocketAddr],
        live_endpoint: Option<SocketAddr>,
        last_handshake: Option<SystemTime>,
        now: Instant,
        wall: SystemTime,
    ) -> Option<SocketAddr> {
        if candidates.is_empty() {
            // Nothing to try: the peer reaches us and the data plane learns its address.
            self.peers.remove(&key);
            return None;
        }
        let r = self.peers.entry(key).or_insert_with(|| Rotation {
            candidates: candidates.to_vec(),
            index: 0,
            since: now,
            confirmed: None,
        });
        if r.candidates != candidates {
            *r = Rotation {
                candidates: candidates.to_vec(),
                index: 0,
                since: now,
                confirmed: None,
            };
        }
        let live_index = live_endpoint.and_then(|ep| candidates.iter().position(|c| *c == ep));
        if is_fresh(last_handshake, wall) {
            if let Some(i) = live_index {
                r.index = i;
                r.confirmed = Some(i);
            }
            r.since = now;
            return None;
        }
        if let Some(i) = r.confirmed {
            r.index = i;
        } else if now.saturating_duration_since(r.since) >= TRY_FOR {
            r.index = (r.index + 1) % candidates.len();
            r.since = now;
        }
        let want = candidates[r.index];
        (live_endpoint != Some(want)).then_some(want)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(last: u8) -> SocketAddr {
        SocketAddr::from(([192, 0, 2, last], 51820))
    }

    const K: PublicKey = PublicKey([7; 32]);

    #[test]
    fn tries_each_candidate_for_fifteen_seconds_then_keeps_the_one_that_worked() {
        let mut book = EndpointBook::new();
        let t0 = Instant::now();
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let cands = [ep(1), ep(2), ep(3)];
        // New peer: the best candidate.
        assert_eq!(book.decide(K, &cands, None, None, t0, wall), Some(ep(1)));
        // Set and waiting: nothing to write.
        let t = t0 + Duration::from_secs(14);
        assert_eq!(book.decide(K, &cands, Some(ep(1)), None, t, wall), None);
        // 15 s without a handshake: the next one.
        let t = t0 + TRY_FOR;
        assert_eq!(
            book.decide(K, &cands, Some(ep(1)), None, t, wall),
            Some(ep(2))
        );
        assert_eq!(book.decide(K, &cands, Some(ep(2)), None, t, wall), None);
        // The second one completes a handshake: kept.
        let hs = Some(wall);
        let t = t + Duration::from_secs(3);
        assert_eq!(book.decide(K, &cands, Some(ep(2)), hs, t, wall), None);
        // Idle for long (stale handshake): still the confirmed one, no rotation.
        let later = wall + Duration::from_secs(3600);
        for step in 1..5 {
            let t = t + TRY_FOR * step;
            assert_eq!(book.decide(K, &cands, Some(ep(2)), hs, t, later), None);
        }
        // Someone reset the endpoint while idle: the confirmed one is written back.
        assert_eq!(
            book.decide(K, &cands, Some(ep(3)), hs, t + TRY_FOR * 9, later),
            Some(ep(2))
        );
    }

    #[test]
    fn wraps_around_and_restarts_when_the_candidates_change() {
        let mut book = EndpointBook::new();
        let t0 = Instant::now();
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let cands = [ep(1), ep(2)];
        assert_eq!(book.decide(K, &cands, None, None, t0, wall), Some(ep(1)));
        let t1 = t0 + TRY_FOR;
        assert_eq!(
            book.decide(K, &cands, Some(ep(1)), None, t1, wall),
            Some(ep(2))
        );
        let t2 = t1 + TRY_FOR;
        assert_eq!(
            book.decide(K, &cands, Some(ep(2)), None, t2, wall),
            Some(ep(1))
        );
        // New candidates from the control plane: start over at the best one.
        let new = [ep(9), ep(2)];
        assert_eq!(
            book.decide(K, &new, Some(ep(1)), None, t2, wall),
            Some(ep(9))
        );
        // No candidates: leave the endpoint to the data plane, forget the rotation.
        assert_eq!(book.decide(K, &[], Some(ep(9)), None, t2, wall), None);
        assert!(book.is_empty());
    }

    #[test]
    fn a_roamed_endpoint_with_a_fresh_handshake_is_not_undone() {
        let mut book = EndpointBook::new();
        let t0 = Instant::now();
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let cands = [ep(1)];
        assert_eq!(book.decide(K, &cands, None, None, t0, wall), Some(ep(1)));
        // The peer roamed to an address that is not a candidate, with a fresh handshake.
        let roamed = SocketAddr::from(([203, 0, 113, 5], 40000));
        let hs = Some(wall - Duration::from_secs(10));
        for s in 0..20 {
            let t = t0 + Duration::from_secs(s * 10);
            assert_eq!(book.decide(K, &cands, Some(roamed), hs, t, wall), None);
        }
        // Once that session is stale, the candidate is tried again.
        let stale = wall + FRESH;
        assert_eq!(
            book.decide(K, &cands, Some(roamed), hs, t0, stale),
            Some(ep(1))
        );
        book.retain(|_| false);
        assert_eq!(book.len(), 0);
    }

    #[test]
    fn freshness() {
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        assert!(!is_fresh(None, wall));
        assert!(is_fresh(Some(wall - Duration::from_secs(179)), wall));
        assert!(!is_fresh(Some(wall - FRESH), wall));
        assert!(
            is_fresh(Some(wall + Duration::from_secs(5)), wall),
            "clock skew"
        );
    }
}
