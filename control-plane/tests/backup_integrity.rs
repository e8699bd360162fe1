//! What a backup holds and what `restore` takes: secrets stay out unless `--include-secrets`
//! (and then each is named), the manifest is keyed under the key-encryption key so that a file
//! changed together with its line is refused, and a symlink in the backup or in the data
//! directory is refused with nothing written. Real `plexsphere` processes.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use plexsphere_wire::RegisterResponse;

mod common;

use common::backup::{enrol, list_files, node_works, path, plexsphere};
use common::process::DevProcess;

/// The secret files of a dev data directory (with an older version's seed file planted).
const SECRETS: [&str; 5] = [
    "key-encryption-key",
    "operator-token",
    "tls/ca.key",
    "tls/server.key",
    "domain-keys/old.seed",
];

/// A dev server on `<dir>/live` with two nodes and an older version's seed file beside its
/// database; answers it, its data directory and the registrations.
async fn live(dir: &Path) -> (DevProcess, PathBuf, Vec<RegisterResponse>) {
    let live = dir.join("live");
    let dev = Arc::new(DevProcess::start(&live, &[]));
    let regs = enrol(dev.clone(), dev.issue_tokens(2).await, 0).await;
    std::fs::create_dir_all(live.join("domain-keys")).unwrap();
    std::fs::write(live.join("domain-keys/old.seed"), [7u8; 32]).unwrap();
    (Arc::into_inner(dev).unwrap(), live, regs)
}

fn backup(live: &Path, out: &Path, extra: &[&str]) -> String {
    let mut args = vec!["backup", "--data-dir", path(live), "--out", path(out)];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = plexsphere(&args);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("backed up"), "{stdout}");
    stderr
}

fn restore(out: &Path, data_dir: &Path, kek: Option<&Path>) -> (Option<i32>, String) {
    let mut args = vec!["restore", "--from", path(out), "--data-dir", path(data_dir)];
    if let Some(k) = kek {
        args.extend(["--key-encryption-key-file", path(k)]);
    }
    let (code, _, stderr) = plexsphere(&args);
    (code, stderr)
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_without_secrets_holds_none_and_restores_with_the_kek_kept_apart() {
    let dir = tempfile::tempdir().unwrap();
    let (dev, live, regs) = live(dir.path()).await;
    let (out, restored) = (dir.path().join("backup"), dir.path().join("restored"));
    backup(&live, &out, &[]);
    dev.stop();

    let held = list_files(&out);
    let expected: BTreeSet<String> = ["BACKUP", "plexsphere.db", "tls/ca.crt", "tls/server.crt"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(held, expected, "the backup holds secret files");
    // Not under another name either: no file of the backup holds a secret's bytes.
    let kek_text = std::fs::read_to_string(live.join("key-encryption-key")).unwrap();
    let token = std::fs::read_to_string(live.join("operator-token")).unwrap();
    for rel in &held {
        let bytes = std::fs::read(out.join(rel)).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains(kek_text.trim()), "{rel} holds the KEK");
        assert!(
            !text.contains(token.trim()),
            "{rel} holds the operator token"
        );
    }

    // Without the KEK restore says what is missing and how to give it, and writes nothing.
    let (code, stderr) = restore(&out, &restored, None);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("--key-encryption-key-file"), "{stderr}");
    assert!(!restored.exists());

    let kek = live.join("key-encryption-key");
    let (code, stderr) = restore(&out, &restored, Some(&kek));
    assert_eq!(code, Some(0), "{stderr}");
    for secret in SECRETS {
        assert!(stderr.contains(secret), "{secret} not named: {stderr}");
    }
    // dev reads its KEK from its data directory: restore put the one given there.
    assert_eq!(
        std::fs::read(restored.join("key-encryption-key")).unwrap(),
        std::fs::read(&kek).unwrap()
    );
    for key in ["ca.key", "server.key"] {
        std::fs::copy(live.join("tls").join(key), restored.join("tls").join(key)).unwrap();
    }
    let back = DevProcess::start(&restored, &[]);
    assert_eq!(
        std::fs::read(restored.join("tls/ca.crt")).unwrap(),
        std::fs::read(live.join("tls/ca.crt")).unwrap()
    );
    for reg in &regs {
        node_works(&back, reg).await;
    }
    back.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn include_secrets_carries_every_secret_and_names_each_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let (dev, live, regs) = live(dir.path()).await;
    let (out, restored) = (dir.path().join("backup"), dir.path().join("restored"));
    let stderr = backup(&live, &out, &["--include-secrets"]);
    dev.stop();
    let held = list_files(&out);
    for secret in SECRETS {
        assert!(held.contains(secret), "{secret} missing: {held:?}");
        let line = stderr
            .lines()
            .find(|l| l.contains(&path(&out.join(secret)).to_owned()))
            .unwrap_or_else(|| panic!("{secret} not named on stderr: {stderr}"));
        assert!(line.starts_with("warning: "), "{line}");
    }
    // Such a backup restores on its own, and restore says what its manifest check proves.
    let (code, stderr) = restore(&out, &restored, None);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("inside the backup"), "{stderr}");
    let back = DevProcess::start(&restored, &[]);
    for reg in &regs {
        node_works(&back, reg).await;
    }
    back.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_file_changed_with_its_manifest_line_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (dev, live, _) = live(dir.path()).await;
    let out = dir.path().join("backup");
    backup(&live, &out, &[]);
    dev.stop();
    let kek = live.join("key-encryption-key");

    // Whoever can write the backup changes the CA certificate (the same size) and puts its
    // new SHA-256 into the manifest, as the manifest's own format says.
    let cert = out.join("tls/ca.crt");
    let mut pem = std::fs::read(&cert).unwrap();
    let before = sha256_hex(&pem);
    let at = pem.iter().position(|&b| b == b'\n').unwrap() + 10;
    pem[at] = if pem[at] == b'A' { b'B' } else { b'A' };
    std::fs::write(&cert, &pem).unwrap();
    let manifest = std::fs::read_to_string(out.join("BACKUP")).unwrap();
    assert!(manifest.contains(&before));
    std::fs::write(
        out.join("BACKUP"),
        manifest.replace(&before, &sha256_hex(&pem)),
    )
    .unwrap();
    let target = dir.path().join("restored");
    let (code, stderr) = restore(&out, &target, Some(&kek));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("does not verify"), "{stderr}");
    assert!(stderr.contains("changed after it was made"), "{stderr}");
    assert!(!target.exists(), "restore wrote before it checked");

    // Nor does rewriting it as an older, unkeyed manifest get around the MAC.
    let v1: String = std::iter::once("plexsphere backup 1\n".to_owned())
        .chain(
            list_files(&out)
                .into_iter()
                .filter(|f| f != "BACKUP")
                .map(|f| {
                    let digest = sha256_hex(&std::fs::read(out.join(&f)).unwrap());
                    format!("{digest}  {f}\n")
                }),
        )
        .collect();
    std::fs::write(out.join("BACKUP"), v1).unwrap();
    let (code, stderr) = restore(&out, &target, Some(&kek));
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("--allow-unkeyed-backup"), "{stderr}");
    assert!(!target.exists(), "restore wrote before it checked");
    // With the flag an older backup restores, and restore says what was not checked (the
    // changed certificate goes through: that is what format 1 cannot find).
    let (code, _, stderr) = plexsphere(&[
        "restore",
        "--from",
        path(&out),
        "--data-dir",
        path(&target),
        "--key-encryption-key-file",
        path(&kek),
        "--allow-unkeyed-backup",
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("has no MAC"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn symlinks_in_the_backup_or_the_data_directory_are_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (dev, live, _) = live(dir.path()).await;
    let out = dir.path().join("backup");
    backup(&live, &out, &[]);
    dev.stop();
    let kek = live.join("key-encryption-key");

    // A listed file replaced by a symlink to a file outside with the very same bytes: its
    // digest matches, only the link is wrong.
    let cert = out.join("tls/ca.crt");
    let outside = dir.path().join("outside.crt");
    std::fs::rename(&cert, &outside).unwrap();
    std::os::unix::fs::symlink(&outside, &cert).unwrap();
    let target = dir.path().join("restored");
    let (code, stderr) = restore(&out, &target, Some(&kek));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("is a symlink"), "{stderr}");
    assert!(!target.exists(), "restore wrote before it checked");
    // An extra symlink the manifest does not name is refused too.
    std::fs::remove_file(&cert).unwrap();
    std::fs::copy(&outside, &cert).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", out.join("tls/extra")).unwrap();
    let (code, stderr) = restore(&out, &target, Some(&kek));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("is a symlink"), "{stderr}");
    assert!(!target.exists(), "restore wrote before it checked");
    std::fs::remove_file(out.join("tls/extra")).unwrap();

    // The data directory's tls/ a symlink to a directory elsewhere: restore writes nothing
    // through it (nor anything at all).
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::create_dir_all(&target).unwrap();
    std::os::unix::fs::symlink(&elsewhere, target.join("tls")).unwrap();
    let (code, stderr) = restore(&out, &target, Some(&kek));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("is a symlink"), "{stderr}");
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    assert!(!target.join("plexsphere.db").exists());
    // With the symlink gone the same backup restores.
    std::fs::remove_file(target.join("tls")).unwrap();
    let (code, stderr) = restore(&out, &target, Some(&kek));
    assert_eq!(code, Some(0), "{stderr}");
}
