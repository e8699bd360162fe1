//! Everything the control plane does for one node, from its registration to its removal:
//! registering with a bootstrap token and the proof of its WireGuard key ([`register`],
//! [`key_proof`]), what an enrolled node changes (heartbeat, endpoints, leave; [`ops`]) and
//! what its signed state and event stream say ([`decisions`], pure), the key and credential
//! rotations ([`rotation`]), what an operator sets on it ([`settings`], [`names`]), clone
//! detection ([`clone`]) and the live rows a state build shares ([`live_cache`]).
//!
//! May import: the store, the bus, the keys, the policy and the routes (a node's state
//! carries its peers' view and its routes), the error type and the pure rules at the crate's
//! top (`candidates`). The HTTP API, the broker and the maintenance task
//! import it; nothing it imports imports it back.

pub mod clone;
pub(crate) mod decisions;
pub(crate) mod key_proof;
pub(crate) mod live_cache;
pub(crate) mod names;
pub mod ops;
pub mod register;
pub(crate) mod rotation;
pub mod settings;
