//! The provisioning broker's pure core, shared by the plexsphere server (HTTP routes, database,
//! the reconcile loop's I/O) and the substrates (local machines, local directories, Crossplane).
//!
//! - [`catalog`] / [`blueprint`]: versioned blueprints with stable ids, built-ins plus files;
//! - [`admit`] / [`params`]: a create request checked against the catalog, failing closed;
//! - [`phase`] / [`resource`]: the phase machine driven by observations, and the resource JSON;
//! - [`cloudinit`]: the `#cloud-config` document a machine boots with;
//! - [`composite`] / [`crossplane`]: the object handed to a substrate, and its Crossplane form;
//! - [`credentials`]: cloud credentials sealed with ChaCha20-Poly1305.
//!
//! Nothing here does network I/O, reads the clock or spawns tasks: time is a parameter.

pub mod admit;
pub mod blueprint;
pub mod catalog;
pub mod cloudinit;
pub mod composite;
pub mod credentials;
pub mod crossplane;
pub mod param;
pub mod params;
pub mod phase;
pub mod resource;

pub use admit::{AdmitError, Admitted, admit};
pub use blueprint::{Blueprint, BlueprintError, Class, Substrate};
pub use catalog::Catalog;
pub use param::ParameterError;
pub use params::{ParameterErrors, resolve};
pub use phase::{Observation, Outcome, Phase, Provisioning};
pub use resource::Resource;
