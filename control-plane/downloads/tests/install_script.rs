//! `cloud-init/install-plexd.sh` against a real downloads server: it installs only a plexd
//! whose checksums carry a valid Domain signature, fails closed when the signature cannot be
//! had (the attack: something on the path answers 404 for `checksums.sha256.sig`), and installs
//! with a loud warning only when `PLEXD_INSTALL_INSECURE_SKIP_SIGNATURE=1` says so, never past
//! a signature that does not verify. Needs sh, curl, sha256sum and openssl on the PATH.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns

mod support;

use std::path::Path;
use std::process::Output;
use std::sync::Arc;

use plexsphere_downloads::ChecksumSigner;
use plexsphere_wire::signed::DomainSigner;
use support::local::{Fixture, fixture};
use support::show;

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../cloud-init/install-plexd.sh"
);

/// The SPKI PEM of the Domain key with this seed (the fixture signs with seed 42).
fn domain_pem(seed: u8) -> String {
    ChecksumSigner::from_domain(Arc::new(DomainSigner::from_seed(&[seed; 32]).unwrap()))
        .unwrap()
        .public_key_pem()
}

/// Runs the script against `f` with the Domain key `key` (none: no key file) and the opt-out.
async fn install(f: &Fixture, work: &Path, key: Option<&str>, insecure: bool) -> Output {
    let key_file = work.join("domain-signing.pub.pem");
    let _ = std::fs::remove_file(&key_file);
    if let Some(pem) = key {
        std::fs::write(&key_file, pem).unwrap();
    }
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg(SCRIPT)
        .arg(f.server.url(""))
        .env("PLEXD_INSTALL_PATH", work.join("bin/plexd"))
        .env("PLEXD_SIGNING_KEY", &key_file)
        .env_remove("PLEXD_INSTALL_INSECURE_SKIP_SIGNATURE");
    if insecure {
        cmd.env("PLEXD_INSTALL_INSECURE_SKIP_SIGNATURE", "1");
    }
    cmd.output().await.unwrap()
}

fn host_binary(f: &Fixture) -> &[u8] {
    match std::env::consts::ARCH {
        "aarch64" => &f.arm64,
        _ => &f.amd64,
    }
}

fn installed(work: &Path) -> Option<Vec<u8>> {
    std::fs::read(work.join("bin/plexd")).ok()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
async fn a_signed_release_installs() {
    let f = fixture(true).await;
    let work = tempfile::tempdir().unwrap();
    let out = install(&f, work.path(), Some(&domain_pem(42)), false).await;
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(installed(work.path()).as_deref(), Some(host_binary(&f)));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("is signed by the Domain key"),
        "{}",
        show(&out)
    );
    assert!(!stderr(&out).contains("WARNING"), "{}", show(&out));
}

#[tokio::test]
async fn a_signature_answering_404_fails_closed_and_the_opt_out_installs_loudly() {
    // No signer: checksums.sha256.sig is 404, as an attacker on the path would answer.
    let f = fixture(false).await;
    let work = tempfile::tempdir().unwrap();
    let out = install(&f, work.path(), Some(&domain_pem(42)), false).await;
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    let err = stderr(&out);
    assert!(err.contains("checksums.sha256.sig"), "{err}");
    assert!(err.contains("refusing to install"), "{err}");
    assert!(
        err.contains("PLEXD_INSTALL_INSECURE_SKIP_SIGNATURE=1"),
        "{err}"
    );
    assert_eq!(installed(work.path()), None);

    let out = install(&f, work.path(), Some(&domain_pem(42)), true).await;
    assert!(out.status.success(), "{}", show(&out));
    assert!(stderr(&out).contains("WARNING"), "{}", show(&out));
    assert_eq!(installed(work.path()).as_deref(), Some(host_binary(&f)));
}

#[tokio::test]
async fn without_a_domain_key_it_fails_closed_unless_opted_out() {
    let f = fixture(true).await;
    let work = tempfile::tempdir().unwrap();
    let out = install(&f, work.path(), None, false).await;
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    let err = stderr(&out);
    assert!(err.contains("no Domain signing key at"), "{err}");
    assert!(err.contains("PLEXD_SIGNING_KEY"), "{err}");
    assert_eq!(installed(work.path()), None);

    let out = install(&f, work.path(), None, true).await;
    assert!(out.status.success(), "{}", show(&out));
    assert!(stderr(&out).contains("WARNING"), "{}", show(&out));
}

#[tokio::test]
async fn another_domains_key_fails_even_with_the_opt_out() {
    let f = fixture(true).await;
    let work = tempfile::tempdir().unwrap();
    for insecure in [false, true] {
        let out = install(&f, work.path(), Some(&domain_pem(43)), insecure).await;
        assert_eq!(out.status.code(), Some(1), "{}", show(&out));
        assert!(stderr(&out).contains("does not verify"), "{}", show(&out));
        assert_eq!(installed(work.path()), None);
    }
}
