//! plexsphere, the lean control plane: registration with single-use bootstrap tokens, mesh IP
//! allocation, operator tokens, the Domain signing keys, the node API (heartbeat, endpoints,
//! signed state, the event stream) and the HTTPS API of docs/api.md.
//!
//! The binary (`src/bin/plexsphere.rs`) is a thin shell over [`cli`]. One folder per
//! capability (`node/`, `bus/`, `routes/`, `policy/`, `keys/`, `store/`, ...); README.md's
//! "Layout" maps what each owns and what it may import.

pub mod api;
pub mod audit;
pub mod auth;
pub mod broker;
pub mod bus;
pub(crate) mod candidates;
pub mod cli;
pub(crate) mod console;
pub mod error;
pub mod ipam;
pub mod keys;
pub mod leader;
pub mod maintenance;
pub(crate) mod metrics;
pub mod node;
pub mod operator_tokens;
pub(crate) mod path_map;
pub mod policy;
pub mod ratelimit;
pub(crate) mod relay_health;
pub mod routes;
pub mod seed;
pub mod server;
pub mod store;
pub mod tags;
pub mod tls;
pub(crate) mod views;

pub use error::Error;
