//! Reach's decisions as sans-IO machines the runtime drives and only carries out (issue 26,
//! "reach as one sans-IO node"; docs/reach.md "The runtime"). So far:
//!
//! - [`relays`]: the relay set (the relays in use, their connections, the home relay, the
//!   move to TCP with TLS, idle closes, replay floors, the relay token).
//! - [`schedule`]: the schedule (when the runtime's pass runs, the host address and handshake
//!   reads, STUN runs and the probe, the tick of the relays and the engine).

pub mod relays;
pub mod schedule;
#[cfg(test)]
mod tests;
