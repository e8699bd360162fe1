//! Local machines for the broker's embedded substrate: real systemd, real journald and real
//! cloud-init on one host, as root.
//!
//! - [`BaseImage::ensure`]: a Debian bookworm root (debootstrap, then cloud-init) built once
//!   per [`Recipe`] and cached under `<cache_dir>/bookworm-<recipe hash>/`.
//! - [`Bridge::ensure`]: the host bridge carrying the machines' gateway address.
//! - [`Machine::create`]: an overlay over the image, the machine's files and NoCloud seed,
//!   booted by `systemd-nspawn --boot` with its console in `console.log`; then
//!   [`Machine::wait_booted`], [`Machine::wait_cloud_init`], [`Machine::exec`],
//!   [`Machine::journal`], [`Machine::destroy`] and, after a restart,
//!   [`Machine::reattach`] / [`Machine::destroy_leftovers`].
//!
//! Every call blocks (it runs host tools with `std::process`): call it from a blocking
//! thread (`tokio::task::spawn_blocking`). Every wait is bounded and polls what the host shows.

mod bridge;
mod cloud_init;
mod cmd;
mod error;
mod guest;
mod guest_systemd;
mod image;
mod layer;
mod machine;
mod nspawn;
mod observe;
mod procfs;
mod recipe;
mod rootfs;
mod state;
mod teardown;
mod wait;

pub use bridge::{Bridge, DEFAULT_BRIDGE, DEFAULT_BRIDGE_ADDRESS, machine_address};
pub use cloud_init::{CloudInitStatus, parse_status};
pub use cmd::{Tool, preflight};
pub use error::{Error, Result};
pub use image::{BaseImage, prune_unused};
pub use layer::{ExtraFile, NoCloudSeed, SEED_DIR, validate_name};
pub use machine::{Machine, MachineSpec, machine_dir};
pub use nspawn::nspawn_args;
pub use observe::{EXEC_TIMEOUT, Life, booted_state};
pub use procfs::ProcId;
pub use recipe::{CLOUD_CFG, DEFAULT_MIRROR, Recipe, host_mirror, mirror_in};

/// For the machine tests of this crate and of its users.
pub mod testing {
    /// True when this host can run machines. Under `CI` a host that cannot is a failure (a
    /// panic naming the reason), not a skip: the tests must run there. Elsewhere the test says
    /// why it skips.
    pub fn host_ready() -> bool {
        match super::preflight() {
            Ok(()) => true,
            Err(e) if std::env::var_os("CI").is_some() => {
                panic!("CI is set and this host cannot run local machines: {e}")
            }
            Err(e) => {
                eprintln!("skipping (set CI=1 to make this a failure): {e}");
                false
            }
        }
    }
}

/// Where the base image is cached by default (CI reuses it between runs).
pub const DEFAULT_IMAGE_CACHE: &str = "/var/cache/plexsphere/images";
