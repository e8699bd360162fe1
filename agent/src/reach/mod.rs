//! Reach: every node reaches every node, directly where NATs allow, through a relay otherwise.
//!
//! - [`io`]: the contract between the sans-IO engine and the runtime that owns the sockets.
//!
//! (The engine and the runtime land in their own modules; see agent/README.md, "Reach".)

pub mod io;
