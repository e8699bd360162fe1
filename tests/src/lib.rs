//! Utilities for the end-to-end tests: they run the real `plexsphere`, `plexctl` and `plexd`
//! binaries as separate processes, over real TLS, with real files, in temporary roots.
//!
//! The binaries come from `PLEXSPHERE_BIN_DIR`, or else from the cargo target directory this
//! test executable was built into; `scripts/test` builds them first.

pub mod broker;
pub mod browser;
pub mod control_plane;
pub mod daemon;
pub mod dist;
pub mod dns;
pub mod ha;
pub mod ha_client;
pub mod host;
pub mod lan;
pub mod machines;
pub mod nat;
pub mod netns;
pub mod oidc;
pub mod openstack;
pub mod process;
pub mod proxy;
pub mod qemu;
pub mod readme;
pub mod route_lab;
pub mod scrape;
pub mod wait;

pub use control_plane::{ControlPlane, LAB_NODES_PROJECT, OPENSTACK_PROJECT};
pub use host::Host;
pub use process::{Proc, STARTUP_BOUND, bin, tail};
pub use wait::{mode, wait_until};
