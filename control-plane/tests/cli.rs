//! The `plexsphere` binary: config errors exit 64 before binding; `dev` prints the contract
//! lines and writes the files the cross-process tests and plexctl rely on.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use std::os::unix::fs::PermissionsExt as _;
use std::process::Command;

mod common;

use common::dev::BIN;

#[test]
fn bad_config_exits_64_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<Vec<&str>> = vec![
        vec!["serve", "--listen", "127.0.0.1:0"],
        vec!["serve", "--listen", "nope", "--tls-terminated-by-proxy"],
        vec![
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            "/nonexistent.pem",
            "--tls-key",
            "/nonexistent.key",
        ],
        vec![
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--tls-terminated-by-proxy",
            "--trusted-proxy",
            "10.0.0.0/99",
        ],
        vec![
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--tls-terminated-by-proxy",
            "--register-burst",
            "0",
        ],
        vec!["frobnicate"],
    ];
    for args in cases {
        let out = Command::new(BIN)
            .env("PLEXSPHERE_NO_LOCAL_MACHINES", "1")
            .args(&args)
            .arg("--data-dir")
            .arg(dir.path())
            .env_remove("PLEXSPHERE_LOG")
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(64),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.stderr.is_empty(), "{args:?}");
    }
    // Nothing was created for a refused config.
    assert!(!dir.path().join("plexsphere.db").exists());
}

/// A bad `--relay` or `--stun-advertise` on serve or dev exits 64 with one line that names the
/// bad part, before anything binds.
#[test]
fn bad_reach_flags_exit_64_naming_the_bad_part() {
    const KEY: &str = "AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=";
    let good = format!("name=r1,key={KEY},udp=203.0.113.5:3479");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--relay".into(), "name=r1,udp=203.0.113.5:3479".into()],
            "key= is missing",
        ),
        (
            vec![
                "--relay".into(),
                "name=r1,key=AAAA,udp=203.0.113.5:3479".into(),
            ],
            "key= must be 32 bytes",
        ),
        (
            vec!["--relay".into(), format!("name=r1,key={KEY}")],
            "give udp=IP:PORT, tls=IP:PORT or both",
        ),
        (
            vec![
                "--relay".into(),
                format!("name=r1,key={KEY},tls=relay.example:443"),
            ],
            "tls=\"relay.example:443\" is not IP:PORT",
        ),
        (
            vec![
                "--relay".into(),
                good.clone(),
                "--relay".into(),
                good.clone(),
            ],
            "--relay name=r1 is given twice",
        ),
        (
            vec!["--stun-advertise".into(), "203.0.113.5".into()],
            "--stun-advertise",
        ),
        (
            vec!["--stun-advertise".into(), "203.0.113.5:0".into()],
            "port 0",
        ),
    ];
    for command in ["serve", "dev"] {
        for (flags, says) in &cases {
            let dir = tempfile::tempdir().unwrap();
            let mut args = vec![command.to_owned(), "--listen".into(), "127.0.0.1:0".into()];
            if command == "serve" {
                args.push("--tls-terminated-by-proxy".into());
            }
            args.extend(flags.iter().cloned());
            let out = Command::new(BIN)
                .env("PLEXSPHERE_NO_LOCAL_MACHINES", "1")
                .args(&args)
                .arg("--data-dir")
                .arg(dir.path())
                .env_remove("PLEXSPHERE_LOG")
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
            assert!(stderr.contains(says), "{args:?}: {stderr}");
            assert!(!dir.path().join("plexsphere.db").exists(), "{args:?}");
        }
    }
}

#[test]
fn seed_apply_and_operator_tokens_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let seed = dir.path().join("seed.yaml");
    std::fs::write(
        &seed,
        "domains:\n  - slug: lab\n    mesh_cidr: 10.64.0.0/16\n",
    )
    .unwrap();
    let run = |args: &[&str]| {
        Command::new(BIN)
            .env("PLEXSPHERE_NO_LOCAL_MACHINES", "1")
            .args(args)
            .arg("--data-dir")
            .arg(dir.path())
            .output()
            .unwrap()
    };
    let out = run(&["seed", "apply", "--file", seed.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("created domain lab"));
    let out = run(&["seed", "apply", "--file", seed.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing changed"));
    std::fs::write(
        &seed,
        "domains:\n  - slug: lab\n    mesh_cidr: 10.65.0.0/16\n",
    )
    .unwrap();
    let out = run(&["seed", "apply", "--file", seed.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("refused"));

    let out = run(&["operator-token", "create", "--name", "ci"]);
    assert!(out.status.success());
    let token = String::from_utf8(out.stdout).unwrap();
    assert_eq!(token.lines().count(), 1);
    assert!(token.starts_with("pxop_"));
    let id = token.trim().split('_').nth(1).unwrap().to_owned();
    let out = run(&["operator-token", "list"]);
    let listing = String::from_utf8(out.stdout).unwrap();
    assert!(listing.contains(&id) && listing.contains("active") && !listing.contains(token.trim()));
    assert!(run(&["operator-token", "revoke", &id]).status.success());
    let listing = String::from_utf8(run(&["operator-token", "list"]).stdout).unwrap();
    assert!(listing.contains("revoked"));
}

#[test]
fn dev_prints_the_listening_line_and_writes_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let (child, lines) = common::dev::start_dev(&[], dir.path());
    let last = lines.last().cloned().unwrap_or_default();
    let port: u16 = last
        .strip_prefix("listening on https://127.0.0.1:")
        .unwrap_or_else(|| panic!("no listening line in {lines:?}"))
        .parse()
        .unwrap();
    assert!(port > 0);
    let text = lines.join("\n");
    assert!(text.contains("ca fingerprint (sha256): "), "{text}");
    assert!(
        text.contains("project openstack: 019a0816-0000-7000-8000-000000000001"),
        "{text}"
    );
    let config_path = dir.path().join("plexctl.yaml");
    assert!(
        text.contains(&format!("export PLEXCTL_CONFIG={}", config_path.display())),
        "{text}"
    );
    let config = std::fs::read_to_string(&config_path).unwrap();
    assert!(
        config.contains(&format!("server: https://127.0.0.1:{port}\n")),
        "{config}"
    );
    assert!(config.contains(&format!(
        "token_file: {}\n",
        dir.path().join("operator-token").display()
    )));
    assert!(config.contains(&format!(
        "ca_file: {}\n",
        dir.path().join("tls/ca.crt").display()
    )));
    for f in [
        "plexctl.yaml",
        "operator-token",
        "tls/ca.key",
        "tls/server.key",
    ] {
        let mode = std::fs::metadata(dir.path().join(f))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600, "{f}");
    }
    let token = std::fs::read_to_string(dir.path().join("operator-token")).unwrap();
    assert!(token.starts_with("pxop_") && token.ends_with('\n'));

    // SIGTERM stops it cleanly.
    common::dev::stop(child);
}
