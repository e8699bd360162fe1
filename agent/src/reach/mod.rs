//! Reach: every node reaches every node, directly where NATs allow, through a relay otherwise.
//!
//! - [`io`]: the contract between the sans-IO engine and the runtime that owns the sockets.
//! - [`engine`]: the sans-IO path choice per peer (its folder: `peer`, `probe`, `punch` (cold
//!   candidates pinged in a punch timed through a relay), `choice`, `guard` (disco replay
//!   windows and source budgets), `bounds`; `sim`, `sim_nat` and `tests/` for the tests).
//! - [`node`]: reach's decisions outside the engine as sans-IO machines (so far the relay
//!   set: connections, home relay, TCP fallback, idle closes), which the runtime carries out.
//! - [`runtime`]: the thread that drives the engine and performs its effects (docs/reach.md;
//!   its folder: the handle in `mod.rs`, the loop in `event_loop` with its relay connections
//!   in `relays` and its peers and their paths in `peers`, the kernel backend's underlay
//!   socket in `underlay`, what the handle and the loop share in `shared`), with [`stun`] (reflexive addresses, NAT report), [`relay_client`]
//!   (registration and relayed frames; [`relay_client::tcp`] over TCP with TLS) and
//!   [`forward`] (the loopback forwarders of relayed peers).
//! - `seeded` (tests only): a random source from a seed, so machines built with it repeat
//!   byte for byte.

pub mod engine;
pub mod forward;
#[cfg(test)]
mod forward_tests;
pub mod io;
#[cfg(test)]
pub mod journal;
pub mod node;
pub mod relay_client;
pub mod runtime;
pub mod stun;
