//! The portable binaries of `scripts/dist` (static musl plexd and plexctl for amd64 and arm64)
//! as an operator meets them: served by a real control plane from the dist directory
//! (`--plexd-artifacts`), installed by `cloud-init/install-plexd.sh` (which picks the binary
//! by `uname -m` and checks the signed checksums), then `--version`, `check-config` on a good
//! and a bad config, and a real `plexd join` whose node `plexctl node get` shows. The amd64
//! binaries run on this host directly, the arm64 ones under `qemu-aarch64-static`.
//!
//! Needs `PLEXSPHERE_DIST_DIR` (scripts/dist, then scripts/test exports it), qemu-user-static,
//! sh, curl, sha256sum and openssl; a missing one fails the test and says what to install.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use plexsphere_e2e::dist::{self, Arch};
use plexsphere_e2e::{ControlPlane, Host, LAB_NODES_PROJECT, bin};

const INSTALL_SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../cloud-init/install-plexd.sh"
);
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn show(out: &Output) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn run(mut cmd: Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    println!("$ {cmd:?}\n{}", show(&out));
    out
}

/// Every dist binary is an ELF for its architecture that needs no loader and no shared
/// library; the glibc build of the workspace (PLEXSPHERE_BIN_DIR) does, so the check can tell.
#[test]
fn dist_binaries_are_static_for_their_architecture() {
    let dir = dist::dist_dir().unwrap();
    for arch in [Arch::Amd64, Arch::Arm64] {
        for name in ["plexd", "plexctl"] {
            let path = dir.join(dist::file_name(name, arch));
            let elf = dist::elf_linking(&path).unwrap();
            println!("{}: {elf:?}", path.display());
            assert_eq!(elf.machine, arch.elf_machine(), "{}", path.display());
            assert!(elf.is_static(), "{} is not static: {elf:?}", path.display());
        }
    }
    let glibc = dist::elf_linking(&bin("plexd").unwrap()).unwrap();
    assert!(
        glibc.interpreter && glibc.needed > 0,
        "the workspace's glibc plexd reads as dynamic: {glibc:?}"
    );
    let mut check = Command::new("sha256sum");
    check.args(["-c", "checksums.sha256"]).current_dir(&dir);
    let out = run(check);
    assert!(out.status.success(), "{}", show(&out));
    let listed = String::from_utf8_lossy(&out.stdout);
    for arch in [Arch::Amd64, Arch::Arm64] {
        for name in ["plexd", "plexctl"] {
            let line = format!("{}: OK", dist::file_name(name, arch));
            assert!(listed.contains(&line), "{line} missing: {listed}");
        }
    }
}

#[test]
fn amd64_binaries_install_check_config_and_join_on_this_host() {
    install_check_and_join(Arch::Amd64);
}

#[test]
fn arm64_binaries_install_check_config_and_join_under_qemu_user() {
    install_check_and_join(Arch::Arm64);
}

fn install_check_and_join(arch: Arch) {
    let dist_dir = dist::dist_dir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let artifacts = dist_dir.display().to_string();
    let cp =
        ControlPlane::start_dev_with(&tmp.path().join("cp"), &["--plexd-artifacts", &artifacts])
            .unwrap();

    // The downloads serve the dist binaries, and their checksums are the dist's plexd lines.
    let served = curl(&cp, "/downloads/plexd/checksums.sha256", tmp.path());
    let dist_sums = std::fs::read_to_string(dist_dir.join("checksums.sha256")).unwrap();
    let plexd_lines: String = dist_sums
        .lines()
        .filter(|l| l.ends_with("  plexd-linux-amd64") || l.ends_with("  plexd-linux-arm64"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(String::from_utf8_lossy(&served), plexd_lines);

    // install-plexd.sh on a machine whose `uname -m` says this architecture.
    let plexd = install_plexd(&cp, arch, tmp.path());
    let dist_plexd = dist_dir.join(dist::file_name("plexd", arch));
    assert_eq!(
        std::fs::read(&plexd).unwrap(),
        std::fs::read(&dist_plexd).unwrap(),
        "install-plexd.sh installed another file than {}",
        dist_plexd.display()
    );
    let plexctl = dist_dir.join(dist::file_name("plexctl", arch));

    // --version of both.
    for (binary, name) in [(&plexd, "plexd"), (&plexctl, "plexctl")] {
        let mut cmd = dist::command(arch, binary).unwrap();
        cmd.arg("--version");
        let out = run(cmd);
        assert!(out.status.success(), "{}", show(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("{name} {VERSION}")
        );
    }

    // check-config: a valid config, then one with a key plexd does not know (exit 78).
    let host = Host::new(&tmp.path().join(format!("host-{}", arch.name()))).unwrap();
    let handle = format!("portable-{}", arch.name());
    host.write_config(&cp.url, &cp.ca_file(), LAB_NODES_PROJECT, &handle, "")
        .unwrap();
    let plexd_cmd = |args: &[&str]| {
        let mut cmd = host.with_env(dist::command(arch, &plexd).unwrap());
        cmd.args(args);
        run(cmd)
    };
    let out = plexd_cmd(&["check-config"]);
    assert!(out.status.success(), "{}", show(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with(&format!("{}: valid\n", host.config().display())),
        "{text}"
    );
    assert!(text.contains(&format!("  api_url: {}", cp.url)), "{text}");
    assert!(
        text.contains(&format!(
            "  ca file: {} (1 certificate)",
            cp.ca_file().display()
        )),
        "{text}"
    );
    let bad = host.etc().join("bad.yaml");
    let good = std::fs::read_to_string(host.config()).unwrap();
    std::fs::write(&bad, format!("{good}wireguard_port: 51820\n")).unwrap();
    let out = plexd_cmd(&["check-config", "--config", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(78), "{}", show(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.yaml") && err.contains("wireguard_port"),
        "{err}"
    );

    // A real join against the control plane, then the node as the dist plexctl shows it.
    host.write_machine_id(&format!("{:032x}", arch.elf_machine()))
        .unwrap();
    host.write_token(&cp.issue_token(LAB_NODES_PROJECT).unwrap())
        .unwrap();
    let out = plexd_cmd(&["join", "--max-wait", "30s"]);
    assert!(out.status.success(), "{}", show(&out));
    let (node_id, mesh_ip) = host.identity().unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.contains(&format!("node_id: {node_id}")),
        "{printed}"
    );
    assert!(
        printed.contains(&format!("mesh_ip: {mesh_ip}")),
        "{printed}"
    );
    let mut cmd = dist::command(arch, &plexctl).unwrap();
    cmd.env("PLEXCTL_CONFIG", cp.plexctl_config())
        .env_remove("PLEXCTL_SERVER")
        .env_remove("PLEXCTL_TOKEN")
        .args(["node", "get", &node_id, "--output", "json"]);
    let out = run(cmd);
    assert!(out.status.success(), "{}", show(&out));
    let node: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(node["id"], node_id.as_str(), "{node}");
    assert_eq!(node["mesh_ip"], mesh_ip.as_str(), "{node}");
    assert_eq!(node["project_id"], LAB_NODES_PROJECT, "{node}");
    assert_eq!(node["resource_handle"], handle.as_str(), "{node}");
    // plexd reports the architecture it was built for: the arm64 build really ran.
    assert_eq!(node["arch"], arch.name(), "{node}");
}

/// GET `path` from the control plane with curl, trusting its lab CA.
fn curl(cp: &ControlPlane, path: &str, work: &Path) -> Vec<u8> {
    let out_file = work.join("curl.out");
    let mut cmd = Command::new("curl");
    cmd.args(["-fsS", "--cacert"])
        .arg(cp.ca_file())
        .arg("-o")
        .arg(&out_file)
        .arg(format!("{}{path}", cp.url.trim_end_matches('/')));
    let out = run(cmd);
    assert!(out.status.success(), "curl {path}: {}", show(&out));
    std::fs::read(&out_file).unwrap()
}

/// Runs install-plexd.sh as on a machine of `arch` (a `uname` on PATH that says so), with the
/// Domain key the control plane publishes; answers the installed plexd.
fn install_plexd(cp: &ControlPlane, arch: Arch, work: &Path) -> PathBuf {
    let fake_bin = work.join(format!("uname-{}", arch.name()));
    std::fs::create_dir_all(&fake_bin).unwrap();
    let uname = fake_bin.join("uname");
    std::fs::write(
        &uname,
        format!("#!/bin/sh\necho {}\n", arch.uname_machine()),
    )
    .unwrap();
    std::fs::set_permissions(&uname, std::fs::Permissions::from_mode(0o755)).unwrap();
    let key = work.join("domain-signing.pub.pem");
    std::fs::write(&key, curl(cp, "/downloads/plexd/signing-key.pem", work)).unwrap();
    let dest = work.join(format!("bin-{}/plexd", arch.name()));
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![fake_bin];
    dirs.extend(std::env::split_paths(&path));
    let mut cmd = Command::new("sh");
    cmd.arg(INSTALL_SCRIPT)
        .arg(&cp.url)
        .env("PATH", std::env::join_paths(dirs).unwrap())
        .env("CURL_CA_BUNDLE", cp.ca_file())
        .env("PLEXD_INSTALL_PATH", &dest)
        .env("PLEXD_SIGNING_KEY", &key)
        .env_remove("PLEXD_INSTALL_INSECURE_SKIP_SIGNATURE");
    let out = run(cmd);
    assert!(out.status.success(), "{}", show(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("is signed by the Domain key"), "{said}");
    assert!(
        said.contains(&format!("installed plexd ({})", arch.name())),
        "{said}"
    );
    dest
}
