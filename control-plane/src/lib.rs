//! plexsphere, the lean control plane: registration with single-use bootstrap tokens, mesh IP
//! allocation, operator tokens, the Domain signing keys, and the HTTPS API of docs/api.md.
//!
//! The binary (`src/bin/plexsphere.rs`) is a thin shell over [`cli`].

pub mod api;
pub mod cli;
pub mod error;
pub mod ipam;
pub mod keys;
pub mod operator_tokens;
pub mod ratelimit;
pub mod register;
pub mod seed;
pub mod server;
pub mod store;
pub mod tls;

pub use error::Error;
