//! Subnet routes and exits on the control plane (issue 27, docs/routes.md "Control plane"):
//! a node's route report and the operator's approval ([`ops`], [`admin`]), auto-approval by
//! the Domain's policy ([`approve`]), and the pure primary selection ([`select`]).
//!
//! May import: the store (the `node_routes` rows, `store::routes`), the bus, the error type.
//! The policy cache and the node API import it (a node's state carries its routes); it
//! imports neither.

pub(crate) mod admin;
pub(crate) mod approve;
pub mod ops;
pub(crate) mod select;
