//! Reach: every node reaches every node, directly where NATs allow, through a relay otherwise.
//!
//! - [`io`]: the contract between the sans-IO engine and the runtime that owns the sockets.
//! - [`engine`]: the sans-IO path choice per peer.
//!
//! (The runtime lands in its own module; see agent/README.md, "Reach".)

pub mod engine;
pub mod io;
