//! Real machines for the end-to-end tests: systemd-nspawn machines booted from the cached
//! Debian base image (plexsphere-nspawn), on a bridge of their own, destroyed on drop. The
//! guards live in plexsphere-test-support (shared with the control plane's and the nspawn
//! crate's machine tests); this module keeps their old names for the tests here.

pub use plexsphere_test_support::machines::{BOOT, TestBridge, TestMachine, preflight};
