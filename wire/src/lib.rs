//! Wire types shared by `plexd` (the node agent) and `plexsphere` (the control plane).
//!
//! Everything that crosses the network between the two lives here, so that both sides agree
//! on one definition and the JSON shapes are pinned by tests with literal JSON. This crate has
//! no I/O and no server dependencies: the agent's dependency tree stays small.

pub mod admin;
pub mod audit;
pub mod clock;
pub mod domain_event;
pub mod duration;
pub mod endpoint;
pub mod error;
pub mod host;
pub mod key;
pub mod node;
pub mod paths;
pub mod policy_admin;
pub mod proof;
pub mod reach;
pub mod register;
pub mod rotation;
pub mod routes;
pub mod secret;
pub mod signed;
pub mod signing_keys;
pub mod signing_keys_admin;
mod tokens_admin;
pub mod version;

pub use error::{ApiError, codes};
pub use register::{Intervals, RegisterRequest, RegisterResponse};

/// The HTTP path of node registration.
pub const REGISTER_PATH: &str = "/v1/register";

/// The UDP port WireGuard listens on unless configured otherwise.
pub const WIREGUARD_PORT: u16 = 51820;
