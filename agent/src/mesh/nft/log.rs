//! How the tables log what they drop (the chains of the filter and of the routes share it).

/// The log prefix of dropped packets (kernel log, so the journal).
pub const LOG_PREFIX: &str = "plexd-policy drop: ";
/// Drop log lines per second per table (the burst is twice that).
pub const LOG_PER_SECOND: u32 = 5;
