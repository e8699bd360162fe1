//! A session's keys (shared with the crypto workers) and the receiving side's replay window.

use std::time::Instant;

use super::crypto::AeadKey;

/// The last counters of a session are never used (whitepaper section 6.1); re-exported by the
/// protocol module with its other limits.
pub(crate) const REJECT_AFTER_MESSAGES: u64 = u64::MAX - (1 << 13);

/// The keys of one session, immutable once the handshake made them, so any thread may seal or
/// open with them; the counters and the replay window stay with the peer's state machine.
pub struct Keys {
    /// Our index for this session: what the peer puts in its data messages to us.
    pub local_index: u32,
    /// The peer's index: what we put in our data messages.
    pub remote_index: u32,
    pub send: AeadKey,
    pub recv: AeadKey,
}

/// What the state machine keeps per session.
pub(crate) struct Session {
    pub keys: std::sync::Arc<Keys>,
    pub created: Instant,
    /// Whether we initiated the handshake (only the initiator rekeys after time).
    pub initiator: bool,
    pub next_send: u64,
    pub replay: ReplayWindow,
}

/// Bits in the replay window's ring: 8192, of which one word is kept free (so the window is
/// 8128 counters, as the kernel's).
const WINDOW_WORDS: usize = 128;
const WINDOW_BITS: u64 = (WINDOW_WORDS as u64) * 64;
/// How far behind the highest counter seen a counter may be.
pub(crate) const WINDOW: u64 = WINDOW_BITS - 64;

/// The sliding window of received counters (RFC 6479's bitmap ring, as the kernel does it).
pub(crate) struct ReplayWindow {
    /// One past the highest counter accepted (0: none yet).
    next: u64,
    bits: Box<[u64; WINDOW_WORDS]>,
}

impl ReplayWindow {
    pub(crate) fn new() -> Self {
        Self {
            next: 0,
            bits: Box::new([0; WINDOW_WORDS]),
        }
    }

    /// Whether `counter` may still be new: below the highest accepted by less than `WINDOW`
    /// and not seen, or above it (a cheap look before the decryption).
    pub(crate) fn may_accept(&self, counter: u64) -> bool {
        if counter >= REJECT_AFTER_MESSAGES {
            return false;
        }
        if counter >= self.next {
            return true;
        }
        if self.next - counter > WINDOW {
            // next - counter = highest + 1 - counter
            return false;
        }
        let (word, bit) = Self::at(counter);
        self.bits[word] & bit == 0
    }

    /// Marks `counter` received after it authenticated; false if it was seen or is too old.
    pub(crate) fn accept(&mut self, counter: u64) -> bool {
        if !self.may_accept(counter) {
            return false;
        }
        if counter >= self.next {
            // Clear the words the window slides over (at most the whole ring).
            let from = self.next.saturating_sub(1) / 64;
            let to = counter / 64;
            let clear = (to.saturating_sub(from)).min(WINDOW_WORDS as u64);
            for k in 1..=clear {
                self.bits[((from + k) % WINDOW_WORDS as u64) as usize] = 0;
            }
            self.next = counter + 1;
        }
        let (word, bit) = Self::at(counter);
        self.bits[word] |= bit;
        true
    }

    fn at(counter: u64) -> (usize, u64) {
        (
            ((counter / 64) % WINDOW_WORDS as u64) as usize,
            1u64 << (counter % 64),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn each_counter_is_taken_once_and_old_ones_are_refused() {
        let mut w = ReplayWindow::new();
        assert!(w.accept(0));
        assert!(!w.accept(0), "a replay");
        assert!(w.accept(5));
        assert!(w.accept(3), "late but inside the window");
        assert!(!w.accept(3));
        assert!(w.accept(WINDOW + 5));
        assert!(w.accept(6), "WINDOW - 1 behind the highest");
        assert!(!w.accept(5), "WINDOW behind");
        assert!(w.accept(100_000), "a jump clears the ring");
        assert!(w.accept(100_000 - WINDOW + 1), "inside after the jump");
        assert!(!w.accept(100_000 - WINDOW + 1), "and only once");
        assert!(w.accept(100_000 - 64), "a word the jump cleared");
        assert!(
            !w.accept(REJECT_AFTER_MESSAGES),
            "the last counters are never used"
        );
    }

    proptest! {
        /// Against a set of everything seen: a counter is accepted exactly when it is new and
        /// less than WINDOW behind the highest accepted before it.
        #[test]
        fn matches_a_set_model(counters in proptest::collection::vec(0u64..20_000, 1..400)) {
            let mut w = ReplayWindow::new();
            let mut seen = std::collections::HashSet::new();
            let mut highest: Option<u64> = None;
            for c in counters {
                let fresh = !seen.contains(&c) && highest.is_none_or(|h| c + WINDOW > h);
                prop_assert_eq!(w.accept(c), fresh, "counter {}", c);
                if fresh {
                    seen.insert(c);
                    highest = Some(highest.map_or(c, |h| h.max(c)));
                }
            }
        }
    }
}
