//! The state of key and credential rotation that the core holds (the steps are in
//! `rotation.rs`): kept apart so that `mod.rs` can name these types without importing the
//! file that implements the steps on `Core`.

use std::time::{Duration, Instant};

use super::io::ControlId;

/// Which rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Key,
    Credential,
}

impl Kind {
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Key => "WireGuard key",
            Kind::Credential => "node credential",
        }
    }
}

/// What the daemon found at start: how old the key and the credential are, and whether a
/// key rotation was left unfinished.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RotationStart {
    pub key_age: Option<Duration>,
    pub credential_age: Option<Duration>,
    pub pending_key: bool,
}

/// One rotation's schedule and what waits for it.
#[derive(Debug, Clone, Default)]
pub struct Track {
    pub(super) due: Option<Instant>,
    pub(super) running: bool,
    pub(super) waiters: Vec<ControlId>,
    pub(super) done_at: Option<Instant>,
}

/// Both rotations.
#[derive(Debug, Clone, Default)]
pub struct Rotations {
    pub(super) key: Track,
    pub(super) credential: Track,
    /// When the heartbeat whose answer comes next was sent.
    pub(super) heartbeat_sent: Option<Instant>,
}

impl Rotations {
    pub(super) fn track(&mut self, k: Kind) -> &mut Track {
        match k {
            Kind::Key => &mut self.key,
            Kind::Credential => &mut self.credential,
        }
    }

    /// The earliest instant a rotation is due.
    pub fn next_due(&self) -> Option<Instant> {
        [&self.key, &self.credential]
            .into_iter()
            .filter(|t| !t.running)
            .filter_map(|t| t.due)
            .min()
    }
}
