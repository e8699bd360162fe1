//! Runs the install script exactly as the document writes it, with real curl, sha256sum and
//! openssl, against a small HTTP server on 127.0.0.1:0 serving /downloads/plexd/*. Also runs
//! shellcheck on the template. Under CI a missing tool fails the test.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use plexsphere_broker::cloudinit::{INSTALL_SCRIPT_PATH, SIGNING_KEY_PATH, ed25519_spki_pem};
use ring::signature::Ed25519KeyPair;

/// Serves a fixed set of paths (anything else is a 404) until the test process ends.
fn serve(files: HashMap<String, Vec<u8>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let files = Arc::new(files);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let files = Arc::clone(&files);
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut request = String::new();
                if reader.read_line(&mut request).is_err() {
                    return;
                }
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let path = request.split_whitespace().nth(1).unwrap_or("/").to_owned();
                let (status, body) = match files.get(&path) {
                    Some(b) => ("200 OK", b.clone()),
                    None => ("404 Not Found", b"not found\n".to_vec()),
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(head.as_bytes());
                let _ = conn.write_all(&body);
            });
        }
    });
    format!("http://{addr}")
}

fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => panic!("no plexd build for {other}"),
    }
}

fn sha256_hex(b: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, b);
    d.as_ref().iter().map(|x| format!("{x:02x}")).collect()
}

/// The script as the document writes it (extracted from the rendered YAML).
fn script_from_document(dir: &Path) -> PathBuf {
    let v: serde_yaml::Value = serde_yaml::from_str(common::document().as_str()).unwrap();
    let content = v["write_files"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|f| f["path"].as_str() == Some(INSTALL_SCRIPT_PATH))
        .and_then(|f| f["content"].as_str())
        .unwrap()
        .to_owned();
    let p = dir.join("install-plexd.sh");
    std::fs::write(&p, content).unwrap();
    p
}

struct Run {
    out: Output,
    dest: PathBuf,
}

impl Run {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }
}

/// Runs the script against `files` with the signing key file present or not.
fn run(files: HashMap<String, Vec<u8>>, key_pem: Option<String>) -> Run {
    run_with(files, key_pem, false)
}

/// `run`, with `PLEXD_INSTALL_INSECURE_SKIP_SIGNATURE=1` when `insecure`.
fn run_with(files: HashMap<String, Vec<u8>>, key_pem: Option<String>, insecure: bool) -> Run {
    let base = serve(files);
    let dir = tempfile::tempdir().unwrap().keep();
    let script = script_from_document(&dir);
    let dest = dir.join("bin/plexd");
    let key = dir.join("domain-signing.pub.pem");
    if let Some(pem) = key_pem {
        std::fs::write(&key, pem).unwrap();
    }
    let mut cmd = Command::new("sh");
    cmd.arg(&script)
        .arg(&base)
        .env("PLEXD_INSTALL_PATH", &dest)
        .env("PLEXD_SIGNING_KEY", &key)
        .env_remove("PLEXD_INSTALL_INSECURE_SKIP_SIGNATURE");
    if insecure {
        cmd.env("PLEXD_INSTALL_INSECURE_SKIP_SIGNATURE", "1");
    }
    let out = cmd.output().unwrap();
    Run { out, dest }
}

fn release(binary: &[u8]) -> HashMap<String, Vec<u8>> {
    let a = arch();
    let sums = format!(
        "{}  plexd-linux-{a}\n{}  plexd-linux-other\n",
        sha256_hex(binary),
        sha256_hex(b"other")
    );
    HashMap::from([
        (format!("/downloads/plexd/linux-{a}"), binary.to_vec()),
        (
            "/downloads/plexd/checksums.sha256".to_owned(),
            sums.into_bytes(),
        ),
    ])
}

fn sign(files: &mut HashMap<String, Vec<u8>>, seed: &[u8; 32]) {
    let kp = Ed25519KeyPair::from_seed_unchecked(seed).unwrap();
    let sig = kp.sign(&files["/downloads/plexd/checksums.sha256"]);
    files.insert(
        "/downloads/plexd/checksums.sha256.sig".to_owned(),
        sig.as_ref().to_vec(),
    );
}

/// The Domain key's PEM the document writes.
fn key_pem() -> Option<String> {
    Some(ed25519_spki_pem(&common::signing_public_key()))
}

/// `files` with checksums.sha256 signed by the document's Domain key.
fn signed(mut files: HashMap<String, Vec<u8>>) -> HashMap<String, Vec<u8>> {
    sign(&mut files, &common::SIGNING_SEED);
    files
}

fn tools() -> bool {
    common::require("curl", "apt-get install curl")
        && common::require("sha256sum", "apt-get install coreutils")
        && common::require("openssl", "apt-get install openssl")
}

#[test]
fn installs_a_checked_binary_0755() {
    if !tools() {
        return;
    }
    let binary = b"#!/bin/sh\necho plexd\n".to_vec();
    let r = run(signed(release(&binary)), key_pem());
    assert!(r.out.status.success(), "{}{}", r.stdout(), r.stderr());
    assert_eq!(std::fs::read(&r.dest).unwrap(), binary);
    let mode = std::fs::metadata(&r.dest).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o755);
    assert!(
        r.stdout()
            .contains("checksums.sha256 is signed by the Domain key"),
        "{}",
        r.stdout()
    );
    assert!(
        r.stdout()
            .contains(&format!("installed plexd ({})", arch()))
    );
}

#[test]
fn a_corrupt_binary_is_refused_with_one_line() {
    if !tools() {
        return;
    }
    let mut files = release(b"good");
    files.insert(
        format!("/downloads/plexd/linux-{}", arch()),
        b"evil".to_vec(),
    );
    let r = run(signed(files), key_pem());
    assert!(!r.out.status.success());
    assert_eq!(
        r.stderr().trim(),
        format!(
            "install-plexd: plexd-linux-{} does not match its checksum in checksums.sha256; the download is corrupt or tampered with",
            arch()
        )
    );
    assert!(!r.dest.exists());
}

#[test]
fn a_checksum_list_without_this_arch_is_refused() {
    if !tools() {
        return;
    }
    let mut files = release(b"good");
    files.insert(
        "/downloads/plexd/checksums.sha256".to_owned(),
        format!("{}  plexd-linux-{}x\n", sha256_hex(b"good"), arch()).into_bytes(),
    );
    let r = run(signed(files), key_pem());
    assert!(!r.out.status.success());
    assert!(
        r.stderr()
            .contains(&format!("lists no plexd-linux-{}", arch())),
        "{}",
        r.stderr()
    );
}

#[test]
fn a_missing_binary_names_the_url() {
    if !tools() {
        return;
    }
    let mut files = release(b"good");
    files.remove(&format!("/downloads/plexd/linux-{}", arch()));
    let r = run(files, None);
    assert!(!r.out.status.success());
    let err = r.stderr();
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("install-plexd: downloading http://127.0.0.1:")
            && last.contains(&format!(
                "/downloads/plexd/linux-{} failed (curl exit 22)",
                arch()
            )),
        "{err}"
    );
}

#[test]
fn a_signed_checksum_list_is_verified_with_openssl() {
    if !tools() {
        return;
    }
    let mut files = release(b"signed binary");
    sign(&mut files, &common::SIGNING_SEED);
    // The key file exactly as the document writes it.
    let v: serde_yaml::Value = serde_yaml::from_str(common::document().as_str()).unwrap();
    let pem = v["write_files"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|f| f["path"].as_str() == Some(SIGNING_KEY_PATH))
        .and_then(|f| f["content"].as_str())
        .unwrap()
        .to_owned();
    assert_eq!(pem, ed25519_spki_pem(&common::signing_public_key()));
    let r = run(files.clone(), Some(pem.clone()));
    assert!(r.out.status.success(), "{}{}", r.stdout(), r.stderr());
    assert!(
        r.stdout()
            .contains("checksums.sha256 is signed by the Domain key"),
        "{}",
        r.stdout()
    );

    // Signed by another key: refused, nothing installed.
    sign(&mut files, &[9; 32]);
    let r = run(files.clone(), Some(pem));
    assert!(!r.out.status.success());
    assert!(
        r.stderr().contains("does not verify with the Domain key"),
        "{}",
        r.stderr()
    );
    assert!(!r.dest.exists());

    // Signed by another key, even with the opt-out: refused.
    let r = run_with(files.clone(), key_pem(), true);
    assert!(!r.out.status.success());
    assert!(!r.dest.exists());

    // No key on the machine: nothing can be verified, so nothing is installed.
    let r = run(files, None);
    assert!(!r.out.status.success());
    assert!(
        r.stderr().contains("no Domain signing key"),
        "{}",
        r.stderr()
    );
    assert!(!r.dest.exists());
}

#[test]
fn a_key_but_no_signature_served_fails_closed_unless_opted_out() {
    if !tools() {
        return;
    }
    let r = run(release(b"unsigned"), key_pem());
    assert!(!r.out.status.success());
    let err = r.stderr();
    assert!(
        err.contains("cannot fetch") && err.contains("checksums.sha256.sig"),
        "{err}"
    );
    assert!(
        err.contains("PLEXD_INSTALL_INSECURE_SKIP_SIGNATURE=1"),
        "{err}"
    );
    assert!(!r.dest.exists());

    let r = run_with(release(b"unsigned"), key_pem(), true);
    assert!(r.out.status.success(), "{}", r.stderr());
    assert!(r.stderr().contains("WARNING"), "{}", r.stderr());
    assert_eq!(std::fs::read(&r.dest).unwrap(), b"unsigned");
}

#[test]
fn shellcheck_passes_on_the_template() {
    if !common::require(
        "shellcheck",
        "apt-get install --no-install-recommends shellcheck",
    ) {
        return;
    }
    let script = common::repo_dir().join("cloud-init/install-plexd.sh");
    let out = Command::new("shellcheck")
        .args(["-s", "sh"])
        .arg(&script)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
