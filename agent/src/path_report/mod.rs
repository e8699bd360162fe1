//! The path report (issue 28, docs/api.md "Paths and the console's data"): each peer's path,
//! RTT and last handshake as the reach runtime sees them, sent to the control plane for the
//! console's map and node page.
//!
//! | file | owns |
//! |---|---|
//! | [`decide`] | sans-IO: when a report goes out and what it says (the table in its docs) |
//! | [`runtime`] | the task: samples the reach runtime every [`runtime::SAMPLE_EVERY`], sends |
//!
//! Without a reach runtime (`wireguard.backend: none`, or the kernel backend with reach off)
//! there are no paths and nothing is reported.

pub mod decide;
pub mod runtime;

pub use runtime::PathsHandle;
