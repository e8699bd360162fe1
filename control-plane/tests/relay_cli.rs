//! `plexsphere relay keygen`, `plexsphere domain-key`, `plexsphere relay` and dev's STUN and
//! relay, as processes.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use std::io::{BufRead as _, BufReader};
use std::os::unix::fs::PermissionsExt as _;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

mod common;

use common::dev::BIN;

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Lines of stdout until one starts with `last`.
fn lines_until(child: &mut Child, last: &str) -> Vec<String> {
    let stdout = child.stdout.take().unwrap();
    let mut lines = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        let done = line.starts_with(last);
        lines.push(line);
        if done {
            break;
        }
    }
    lines
}

fn value<'a>(lines: &'a [String], prefix: &str) -> &'a str {
    lines
        .iter()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} line in {lines:?}"))
}

fn stun_query(server: &str) -> std::net::SocketAddr {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let req = plexsphere_relay::stun::binding_request([3; 12]);
    sock.send_to(&req, server).unwrap();
    let mut buf = [0u8; 1500];
    let (n, _) = sock.recv_from(&mut buf).unwrap();
    let mapped = plexsphere_relay::stun::mapped_address(&buf[..n], [3; 12]).unwrap();
    assert_eq!(mapped, sock.local_addr().unwrap());
    mapped
}

fn stop(mut child: Child) {
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
    assert!(child.wait().unwrap().success());
}

#[test]
fn keygen_domain_key_and_a_running_relay() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("relay.key");
    let key = key.to_str().unwrap();
    let (code, public, _) = run(&["relay", "keygen", "--key-file", key]);
    assert_eq!(code, 0);
    let public = public.trim().to_owned();
    assert_eq!(
        std::fs::metadata(key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let (code, _, err) = run(&["relay", "keygen", "--key-file", key]);
    assert_eq!(code, 64, "keygen overwrote: {err}");

    // A Domain whose key is still the seed file an older version kept (not imported yet).
    let data = dir.path().join("data");
    let seed_file = dir.path().join("seed.yaml");
    std::fs::write(&seed_file, plexsphere::seed::LAB_SEED).unwrap();
    let applied = run(&[
        "seed",
        "apply",
        "--data-dir",
        data.to_str().unwrap(),
        "--file",
        seed_file.to_str().unwrap(),
    ]);
    assert_eq!(applied.0, 0, "{}", applied.2);
    std::fs::create_dir_all(data.join("domain-keys")).unwrap();
    std::fs::write(data.join("domain-keys/lab.seed"), [7u8; 32]).unwrap();
    let data = data.to_str().unwrap();
    let (code, domain_key, err) = run(&["domain-key", "--data-dir", data]);
    assert_eq!(code, 0, "{err}");
    let want = plexsphere_wire::signed::DomainSigner::from_seed(&[7; 32])
        .unwrap()
        .public_key_b64();
    assert_eq!(domain_key.trim(), want);
    assert_eq!(
        run(&["domain-key", "--data-dir", data, "--domain", "nope"]).0,
        64
    );

    // No Domain key: bad configuration.
    let (code, _, err) = run(&[
        "relay",
        "--name",
        "r",
        "--key-file",
        key,
        "--udp",
        "127.0.0.1:0",
    ]);
    assert_eq!(code, 64);
    assert!(err.contains("--domain-key"), "{err}");

    let mut child = Command::new(BIN)
        .args([
            "relay",
            "--name",
            "r1",
            "--key-file",
            key,
            "--udp",
            "127.0.0.1:0",
        ])
        .args(["--domain-key", domain_key.trim()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = lines_until(&mut child, "relay udp: ");
    assert_eq!(value(&lines, "relay: "), "r1");
    assert_eq!(value(&lines, "relay public key: "), public);
    stun_query(value(&lines, "relay udp: "));
    stop(child);
}

#[test]
fn dev_answers_stun_and_runs_a_relay() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = common::dev::command(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = lines_until(&mut child, "listening on ");
    stun_query(value(&lines, "stun: udp "));
    stun_query(value(&lines, "relay udp: "));
    assert_eq!(value(&lines, "relay: "), "dev");
    assert!(dir.path().join("relay.key").exists());
    stop(child);
}
