//! What a turn's stream events owe the wanted set, done once when the core's effects run out
//! (`install.rs`, `Core::settle_owed`). Its own file so the core's struct can hold it without
//! naming an item of a file that imports the core.

use plexsphere_wire::clock::Now;

/// The work a stream event owes, done once per batch of inputs instead of once per event: the
/// executor feeds every input already waiting (up to its `MAX_TURN_INPUTS`) before it asks for
/// effects, and the core settles what they owe when its effect queue runs out. A burst of
/// 1,000 `peer_added` events is then one apply, one peer list for reach and one cache write,
/// where it was 1,000 of each (every one of them as long as the peer list: O(n^2)).
#[derive(Debug, Default)]
pub(super) struct Owed {
    /// The wanted set changed: apply it (the time of the last change).
    pub(super) apply: Option<Now>,
    /// The events or the position changed: write the cache.
    pub(super) save: bool,
}
