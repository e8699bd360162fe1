//! The Domain's access policy as the control plane keeps and applies it (issue 25,
//! docs/policy.md): changing it and a node's tags ([`ops`]), one compiled policy per Domain
//! ([`cache`]), and the pure view a state build reads ([`view`]: the inventory, the verdicts).
//! The document, its checks and the compiler live in the `plexsphere-policy` crate.
//!
//! May import: the store, the bus, the error type, and the routes (the compile sees the
//! Domain's routes, `routes::ops::route_inventory`). The node API imports it; it imports
//! nothing of `node/`.

pub(crate) mod cache;
pub mod ops;
pub mod view;
