//! The reach engine: sans-IO path choice per peer (disco probes, relay fallback, upgrades).
//!
//! NOT YET IMPLEMENTED: this is the signature the runtime drives; the engine's logic lands
//! with its table tests. Until then it chooses no path and sends nothing.

use super::io::{Effect, Input, Now, PeerPathView};

/// The per-node reach state machine; see the module docs.
pub struct Engine {
    #[allow(dead_code)]
    secret: [u8; 32],
}

impl Engine {
    /// An engine for the node with this WireGuard private key.
    pub fn new(secret: [u8; 32]) -> Self {
        Self { secret }
    }

    /// Takes one input; answers what to do.
    pub fn handle(&mut self, _now: Now, _input: Input) -> Vec<Effect> {
        Vec::new()
    }

    /// Every peer's path, for `plexd status`.
    pub fn paths(&self) -> Vec<PeerPathView> {
        Vec::new()
    }
}
