//! The node's machines driven directly, with a stepped clock.

mod relays;
mod schedule;
