//! `plexd install` as a real process into a temp root.
#![allow(clippy::unwrap_used)] // helpers outside #[test] fns

mod support;

use support::*;

const URL: &str = "https://plexsphere.example";

fn install(node: &Node, extra: &[&str]) -> std::process::Output {
    let token = node.token_file();
    let mut args = vec![
        "install",
        "--api-url",
        URL,
        "--token-file",
        token.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    node.plexd(&args)
}

#[test]
fn fresh_install_writes_private_config_and_the_unit() {
    let node = Node::new();
    let out = install(&node, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(mode(&node.config_dir()), 0o700);
    assert_eq!(mode(&node.config_file()), 0o600);
    let config = std::fs::read_to_string(node.config_file()).unwrap();
    assert!(
        config.contains("api_url: https://plexsphere.example\n"),
        "{config}"
    );
    assert!(
        config.contains(&format!("token_file: {}", node.token_file().display())),
        "{config}"
    );

    let unit = std::fs::read_to_string(node.unit_dir().join("plexd.service")).unwrap();
    assert_eq!(mode(&node.unit_dir().join("plexd.service")), 0o644);
    let exe = env!("CARGO_BIN_EXE_plexd");
    assert!(unit.contains(&format!("\nExecStart={exe} run\n")), "{unit}");
    assert!(unit.contains("Type=notify"));

    let text = stdout(&out);
    assert!(text.contains("warning: the token file"), "{text}");
    assert!(text.contains("systemctl enable --now plexd"), "{text}");
    assert!(text.contains("journalctl -u plexd -f"), "{text}");
    assert!(text.contains("registration.project_id"), "{text}");
    assert!(!node.state_dir().exists(), "install does not enrol");
}

#[test]
fn second_identical_install_changes_nothing_and_keeps_operator_keys() {
    let node = Node::new();
    node.write_token();
    assert_eq!(install(&node, &[]).status.code(), Some(0));
    let mut config = std::fs::read_to_string(node.config_file()).unwrap();
    config.push_str("registration:\n  project_id: 019a0816-0000-7000-8000-000000000002\n  resource_handle: web-1\n");
    std::fs::write(node.config_file(), &config).unwrap();

    let out = install(&node, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("nothing changed"), "{}", stdout(&out));
    assert!(!stdout(&out).contains("warning:"), "{}", stdout(&out));
    assert_eq!(std::fs::read_to_string(node.config_file()).unwrap(), config);

    // A new key (--ca-file) is merged; the operator's keys survive.
    let ca = node.root.path().join("ca.pem");
    std::fs::write(&ca, TestPki::new().ca_pem()).unwrap();
    let out = install(&node, &["--ca-file", ca.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let merged = std::fs::read_to_string(node.config_file()).unwrap();
    assert!(
        merged.contains("project_id: 019a0816-0000-7000-8000-000000000002"),
        "{merged}"
    );
    assert!(merged.contains("resource_handle: web-1"), "{merged}");
    assert!(
        merged.contains(&format!("ca_file: {}", ca.display())),
        "{merged}"
    );
}

#[test]
fn conflicting_install_is_refused_unless_forced() {
    let node = Node::new();
    assert_eq!(install(&node, &[]).status.code(), Some(0));
    let before = std::fs::read_to_string(node.config_file()).unwrap();
    let token = node.token_file();
    let out = node.plexd(&[
        "install",
        "--api-url",
        "https://other.example",
        "--token-file",
        token.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("api_url")
            && err.contains("https://plexsphere.example")
            && err.contains("https://other.example")
            && err.contains("--force"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(node.config_file()).unwrap(), before);

    let out = node.plexd(&[
        "install",
        "--api-url",
        "https://other.example",
        "--token-file",
        token.to_str().unwrap(),
        "--force",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let after = std::fs::read_to_string(node.config_file()).unwrap();
    assert!(after.contains("api_url: https://other.example"), "{after}");
}

#[test]
fn bad_input_is_refused() {
    let node = Node::new();
    let out = node.plexd(&["install", "--api-url", "http://plain.example"]);
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("allow_insecure_http"),
        "{}",
        stderr(&out)
    );
    assert!(!node.config_file().exists());

    let junk = node.root.path().join("junk.pem");
    std::fs::write(&junk, "junk").unwrap();
    let out = install(&node, &["--ca-file", junk.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    assert!(stderr(&out).contains("junk.pem"), "{}", stderr(&out));

    let out = node.plexd(&["install"]);
    assert_eq!(out.status.code(), Some(64), "usage errors exit 64");
}

#[test]
fn help_and_version() {
    let node = Node::new();
    let out = node.plexd(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("Exit codes:"), "{}", stdout(&out));
    let out = node.plexd(&["version"]);
    assert_eq!(
        stdout(&out),
        format!("plexd {}\n", env!("CARGO_PKG_VERSION"))
    );
}
