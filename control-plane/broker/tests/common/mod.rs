//! Fixed inputs shared by the integration tests, and the golden-file helper.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use plexsphere_broker::cloudinit::{self, CloudInitDocument, MachineBootstrap};
use plexsphere_wire::secret::BootstrapToken;
use uuid::Uuid;

pub const CA: &str = include_str!("../golden/lab-ca.pem");
pub const PROJECT: Uuid = Uuid::from_u128(0x019a0816_0000_7000_8000_000000000001);
pub const RESOURCE: Uuid = Uuid::from_u128(0x019fb9d7_fb6c_7681_a082_07407e041cc0);
pub const CREDENTIAL: Uuid = Uuid::from_u128(0x019a0816_0000_7000_8000_0000000000cc);
/// The Domain's signing seed in these tests (its public key goes into the document).
pub const SIGNING_SEED: [u8; 32] = [42; 32];

/// A syntactically valid token that was never issued by any server.
pub fn token() -> BootstrapToken {
    BootstrapToken::parse(
        "pxbt_lab_node_0123456789abcdef_ZXhhbXBsZS10b2tlbi1uZXZlci1pc3N1ZWQtMDEyMzQ",
    )
    .expect("fixture token")
}

pub fn signing_public_key() -> [u8; 32] {
    use ring::signature::KeyPair as _;
    let kp = ring::signature::Ed25519KeyPair::from_seed_unchecked(&SIGNING_SEED).expect("seed");
    let mut k = [0u8; 32];
    k.copy_from_slice(kp.public_key().as_ref());
    k
}

pub fn document() -> CloudInitDocument {
    let t = token();
    cloudinit::render(&MachineBootstrap {
        api_url: "https://plexsphere.192-0-2-10.nip.io",
        ca_pem: CA,
        bootstrap_token: &t,
        project_id: PROJECT,
        resource_handle: &format!("pr-{RESOURCE}"),
        domain_signing_public_key: Some(signing_public_key()),
    })
    .expect("render")
}

pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn repo_dir() -> PathBuf {
    crate_dir().join("../..")
}

/// Compares `got` with the checked-in file; `UPDATE_GOLDEN=1` rewrites the file instead.
pub fn golden(path: &Path, got: &str) {
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(path, got).expect("write golden");
        return;
    }
    let want = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run with UPDATE_GOLDEN=1 to create it",
            path.display()
        )
    });
    if want != got {
        let line = want
            .lines()
            .zip(got.lines())
            .position(|(a, b)| a != b)
            .map_or(want.lines().count().min(got.lines().count()) + 1, |i| i + 1);
        panic!(
            "{} differs from the rendered output at line {line}; review the change and run with UPDATE_GOLDEN=1 to accept it",
            path.display()
        );
    }
}

/// Whether this run must not skip a test for a missing tool (CI is set).
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty())
}

/// Whether a program is on PATH.
pub fn have(program: &str) -> bool {
    std::process::Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Returns false (skip) when `program` is missing outside CI; panics in CI.
pub fn require(program: &str, install_hint: &str) -> bool {
    if have(program) {
        return true;
    }
    if in_ci() {
        panic!("{program} is not installed and CI is set: {install_hint}");
    }
    eprintln!("SKIPPED: {program} is not installed ({install_hint}); under CI this fails");
    false
}
