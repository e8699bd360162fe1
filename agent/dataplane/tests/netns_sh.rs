//! Root: WireGuard's own conformance script, wireguard-go's `tests/netns.sh` (kept unchanged in
//! tests/wireguard-go/, see its README), run whole against plexd-wg: every step of it must pass,
//! the UAPI checks that delete an interface and start it again at once included.
//!
//! The binary is `PLEXD_WG_NETNS_BIN` when set (scripts/test gives a release build: the script
//! moves 16 GB through iperf3), else this package's plexd-wg. Needs root, `ip`, `wg`, `ping`,
//! `iperf3`, `ncat`, `iptables` and `ss`; fails (never skips) without them.

use std::io::Read as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The whole script takes about a minute with a release plexd-wg on two cores.
const BOUND: Duration = Duration::from_secs(20 * 60);
/// How much of the script's output a failure shows.
const TAIL_LINES: usize = 80;

fn binary() -> PathBuf {
    match std::env::var_os("PLEXD_WG_NETNS_BIN") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_BIN_EXE_plexd-wg")),
    }
}

#[test]
fn wireguard_go_netns_sh_passes_whole_against_plexd_wg() {
    for tool in ["ip", "wg", "ping", "iperf3", "ncat", "iptables", "ss"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(found, "{tool} is missing: run scripts/deps.sh");
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/wireguard-go/netns.sh");
    let bin = binary();
    assert!(bin.is_file(), "no plexd-wg at {}", bin.display());
    let log = tempfile::NamedTempFile::new().expect("a log file");
    let mut child = Command::new("bash")
        .arg(&script)
        .arg(&bin)
        .stdin(Stdio::null())
        .stdout(log.reopen().expect("the log for stdout"))
        .stderr(log.reopen().expect("the log for stderr"))
        .process_group(0)
        .spawn()
        .expect("start netns.sh");
    let deadline = Instant::now() + BOUND;
    let status = loop {
        if let Some(status) = child.try_wait().expect("watch netns.sh") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            // The whole group: the script, its iperf3s and the plexd-wg it started.
            let _ = Command::new("kill")
                .args(["-KILL", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut output = String::new();
    let _ = log.reopen().expect("the log").read_to_string(&mut output);
    let lines: Vec<&str> = output.lines().collect();
    let tail = lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n");
    match status {
        Some(s) if s.success() => assert!(
            output.contains("Objects that were created were also destroyed."),
            "netns.sh exited 0 without reaching its last step:\n{tail}"
        ),
        Some(s) => panic!("netns.sh failed ({s}); its last {TAIL_LINES} lines:\n{tail}"),
        None => panic!(
            "netns.sh did not finish within {} s; its last {TAIL_LINES} lines:\n{tail}",
            BOUND.as_secs()
        ),
    }
}
