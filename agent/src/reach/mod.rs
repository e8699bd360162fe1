//! Reach: every node reaches every node, directly where NATs allow, through a relay otherwise.
//!
//! - [`io`]: the contract between the sans-IO engine and the runtime that owns the sockets.
//! - [`engine`]: the sans-IO path choice per peer (with `engine_peer`, `engine_probe`,
//!   `engine_punch` (cold candidates pinged in a punch timed through a relay),
//!   `engine_choice`, and `engine_guard`: disco replay windows and source budgets).
//! - [`runtime`]: the thread that drives the engine and performs its effects (docs/reach.md),
//!   with [`stun`] (reflexive addresses, NAT report), [`relay_client`] (registration and
//!   relayed frames; [`relay_client_tcp`] over TCP with TLS) and [`forward`] (the loopback
//!   forwarders of relayed peers).

pub mod engine;
pub mod engine_bounds;
mod engine_choice;
#[cfg(test)]
mod engine_disco_tests;
mod engine_guard;
#[cfg(test)]
mod engine_guard_tests;
mod engine_peer;
mod engine_probe;
mod engine_punch;
#[cfg(test)]
mod engine_punch_tests;
#[cfg(test)]
mod engine_sim;
#[cfg(test)]
mod engine_sim_nat;
#[cfg(test)]
mod engine_tests;
pub mod forward;
pub mod io;
pub mod relay_client;
pub mod relay_client_tcp;
pub mod runtime;
mod runtime_loop;
mod runtime_shared;
pub mod stun;
