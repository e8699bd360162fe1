//! What the core keeps between key chain fetches ([`super::domain_keys`]).

use std::time::{Duration, Instant};

/// The key chain is fetched at most this often, however many documents are refused (a
/// control plane that signs with a key nobody vouched for is not asked in a loop).
pub const KEY_CHAIN_INTERVAL: Duration = Duration::from_secs(60);

/// The key chain fetch: whether one runs, and when the last one started.
#[derive(Debug, Default)]
pub struct KeyChainFetch {
    pub running: bool,
    pub last: Option<Instant>,
}
