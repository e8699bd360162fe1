//! `plexsphere dev` as a child process: started on 127.0.0.1:0 without local machines, read up
//! to its listening line, stopped with SIGTERM.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_plexsphere");

/// `plexsphere dev` on 127.0.0.1:0 and `data_dir`, without local machines: what every test that
/// runs `dev` as a process starts from.
pub fn command(data_dir: &std::path::Path) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env("PLEXSPHERE_NO_LOCAL_MACHINES", "1")
        .args(["dev", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir);
    cmd
}

/// Starts `dev` and answers it with its stdout lines up to the listening line.
pub fn start_dev(args: &[&str], data_dir: &std::path::Path) -> (Child, Vec<String>) {
    let mut child = command(data_dir)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        let done = line.starts_with("listening on ");
        lines.push(line);
        if done || Instant::now() > deadline {
            break;
        }
    }
    (child, lines)
}

/// SIGTERM, then the exit status must be success.
pub fn stop(mut child: Child) {
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -TERM {}", child.id());
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}
