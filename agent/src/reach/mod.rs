//! Reach: every node reaches every node, directly where NATs allow, through a relay otherwise.
//!
//! - [`io`]: the contract between the sans-IO engine and the runtime that owns the sockets.
//! - [`engine`]: the sans-IO path choice per peer (with `engine_peer`, `engine_probe`,
//!   `engine_choice`).
//!
//! (The runtime lands in its own module; see agent/README.md, "Reach".)

pub mod engine;
mod engine_choice;
#[cfg(test)]
mod engine_disco_tests;
mod engine_peer;
mod engine_probe;
#[cfg(test)]
mod engine_sim;
#[cfg(test)]
mod engine_tests;
pub mod io;
