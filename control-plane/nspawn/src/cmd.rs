//! Running the host tools this crate drives (debootstrap, systemd-nspawn, nsenter, ip,
//! systemctl): found by name, run with a bound on their run time, failures turned into
//! one-line errors that quote the tool's own last words.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::error::{Error, Result};
use crate::wait::{POLL_FAST, poll_until};

/// The host tools, with the Debian package that ships each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    Debootstrap,
    SystemdNspawn,
    Nsenter,
    /// Runs nsenter with a parent-death signal (util-linux, like nsenter).
    Setpriv,
    Ip,
    Systemctl,
}

impl Tool {
    pub const ALL: [Tool; 6] = [
        Tool::Debootstrap,
        Tool::SystemdNspawn,
        Tool::Nsenter,
        Tool::Setpriv,
        Tool::Ip,
        Tool::Systemctl,
    ];

    pub fn program(self) -> &'static str {
        match self {
            Tool::Debootstrap => "debootstrap",
            Tool::SystemdNspawn => "systemd-nspawn",
            Tool::Nsenter => "nsenter",
            Tool::Setpriv => "setpriv",
            Tool::Ip => "ip",
            Tool::Systemctl => "systemctl",
        }
    }

    pub fn package(self) -> &'static str {
        match self {
            Tool::Debootstrap => "debootstrap",
            Tool::SystemdNspawn => "systemd-container",
            Tool::Nsenter | Tool::Setpriv => "util-linux",
            Tool::Ip => "iproute2",
            Tool::Systemctl => "systemd",
        }
    }

    /// The tool's absolute path: `$PATH` first, then the sbin directories a service's
    /// environment often lacks.
    pub fn path(self) -> Result<PathBuf> {
        let from_env = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .unwrap_or_default();
        let fallback = [
            "/usr/local/sbin",
            "/usr/local/bin",
            "/usr/sbin",
            "/usr/bin",
            "/sbin",
            "/bin",
        ];
        from_env
            .into_iter()
            .chain(fallback.iter().map(PathBuf::from))
            .map(|dir| dir.join(self.program()))
            .find(|p| p.is_file())
            .ok_or(Error::ToolMissing {
                tool: self.program(),
                package: self.package(),
            })
    }

    pub fn command(self) -> Result<Command> {
        Ok(Command::new(self.path()?))
    }
}

/// Checks what every operation of this crate needs: root, the host tools and TUN.
pub fn preflight() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        return Err(Error::NotRoot);
    }
    for tool in Tool::ALL {
        tool.path()?;
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Err(Error::NoTun);
    }
    Ok(())
}

/// Runs `cmd` to completion within `timeout` and returns its output whatever its exit status.
/// On timeout the whole process group is killed.
pub(crate) fn run_bounded(mut cmd: Command, what: &str, timeout: Duration) -> Result<Output> {
    let program = program_name(&cmd);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    tracing::debug!(program = %program, what, "running");
    let mut child = cmd.spawn().map_err(|e| Error::Command {
        what: what.to_string(),
        program: program.clone(),
        status: "could not start".into(),
        detail: e.to_string(),
    })?;
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let waited = poll_until(
        what,
        timeout,
        POLL_FAST,
        "the host may be overloaded; retry",
        || {
            let done = child.try_wait().map_err(|e| Error::Command {
                what: what.to_string(),
                program: program.clone(),
                status: "could not be waited for".into(),
                detail: e.to_string(),
            })?;
            if done.is_none() {
                resume_if_stopped(&child);
            }
            Ok(done)
        },
    );
    let status = match waited {
        Ok(status) => status,
        Err(e) => {
            kill_group(&mut child);
            return Err(e);
        }
    };
    Ok(Output {
        status,
        stdout: join(stdout),
        stderr: join(stderr),
    })
}

/// Like [`run_bounded`], and a non-zero exit is an error quoting the tool's stderr.
pub(crate) fn run_ok(cmd: Command, what: &str, timeout: Duration) -> Result<Output> {
    let program = program_name(&cmd);
    let out = run_bounded(cmd, what, timeout)?;
    if out.status.success() {
        return Ok(out);
    }
    Err(Error::Command {
        what: what.to_string(),
        program,
        status: out.status.to_string(),
        detail: last_words(&out.stderr, &out.stdout),
    })
}

fn program_name(cmd: &Command) -> String {
    std::path::Path::new(cmd.get_program())
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> Option<JoinHandle<Vec<u8>>> {
    pipe.map(|mut r| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            // A read error ends the capture; what was read so far is still useful.
            let _ = r.read_to_end(&mut buf);
            buf
        })
    })
}

fn join(handle: Option<JoinHandle<Vec<u8>>>) -> Vec<u8> {
    handle.and_then(|h| h.join().ok()).unwrap_or_default()
}

/// Continues the command's process group when the command is stopped. A machine that powers
/// off stops every process of its PID namespace (systemd's last kill round starts with
/// SIGSTOP); `nsenter` then stops itself too, waiting for a SIGCONT that nobody in the machine
/// sends, and would hold the machine's network namespace until the timeout.
fn resume_if_stopped(child: &Child) {
    let Ok(pid) = i32::try_from(child.id()) else {
        return;
    };
    let stopped = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| crate::procfs::parse_stat(&stat))
        .is_some_and(|(state, _)| state == 'T');
    if stopped {
        tracing::debug!(pid, "the command was stopped; continuing it");
        let _ = killpg(Pid::from_raw(pid), Signal::SIGCONT);
    }
}

fn kill_group(child: &mut Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The last few non-empty lines a tool printed (stderr first), as one line.
pub(crate) fn last_words(stderr: &[u8], stdout: &[u8]) -> String {
    let pick = |bytes: &[u8]| -> Vec<String> {
        String::from_utf8_lossy(bytes)
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()
    };
    let mut lines = pick(stderr);
    if lines.is_empty() {
        lines = pick(stdout);
    }
    if lines.is_empty() {
        return "no output".into();
    }
    let tail = lines[lines.len().saturating_sub(3)..].join(" | ");
    if tail.chars().count() > 400 {
        let cut: String = tail.chars().rev().take(400).collect();
        format!("...{}", cut.chars().rev().collect::<String>())
    } else {
        tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_words_prefers_stderr_and_keeps_three_lines() {
        let err = b"one\n\ntwo\nthree\nfour\n";
        assert_eq!(last_words(err, b"out"), "two | three | four");
        assert_eq!(last_words(b"  \n", b"only stdout\n"), "only stdout");
        assert_eq!(last_words(b"", b""), "no output");
    }

    #[test]
    fn last_words_is_bounded() {
        let long = "x".repeat(2000);
        let words = last_words(long.as_bytes(), b"");
        assert!(words.starts_with("..."));
        assert_eq!(words.chars().count(), 403);
    }

    #[test]
    fn setpriv_pdeathsig_kills_the_command_when_its_parent_thread_is_gone() {
        // How exec_timeout starts nsenter: the thread that spawns it goes away (as plexsphere
        // does when it is killed) and the command must not outlive it, even when stopped.
        let child = std::thread::spawn(|| {
            let mut cmd = Tool::Setpriv.command().unwrap();
            cmd.args([
                "--pdeathsig",
                "KILL",
                "--",
                "sh",
                "-c",
                "kill -STOP $$; sleep 60",
            ]);
            let child = cmd.spawn().unwrap();
            // Stopped means setpriv has set the signal and exec'd sh; only then may this
            // thread go (a parent gone before the prctl would not count).
            let pid = i32::try_from(child.id()).unwrap();
            let stat = || std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            poll_until(
                "the command stops",
                Duration::from_secs(30),
                POLL_FAST,
                "",
                || Ok(crate::procfs::parse_stat(&stat()).filter(|(s, _)| *s == 'T')),
            )
            .unwrap();
            child
        })
        .join()
        .unwrap();
        let mut child = child;
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(status.signal(), Some(9), "{status:?}");
    }

    #[test]
    fn a_stopped_command_is_continued_not_left_to_time_out() {
        // What nsenter does when the machine's systemd stops its child: it stops itself.
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "kill -STOP $$; echo continued"]);
        let out = run_bounded(cmd, "testing", Duration::from_secs(30)).unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(out.stdout, b"continued\n");
    }

    #[test]
    fn run_bounded_captures_output_and_status() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo out; echo err >&2; exit 3"]);
        let out = run_bounded(cmd, "testing", Duration::from_secs(10)).unwrap();
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
    }

    #[test]
    fn run_ok_names_the_failure() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo 'E: no such suite' >&2; exit 1"]);
        let err = run_ok(cmd, "building the image", Duration::from_secs(10)).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("`sh` failed while building the image"),
            "{msg}"
        );
        assert!(msg.contains("E: no such suite"), "{msg}");
    }

    #[test]
    fn run_bounded_kills_on_timeout() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "sleep 30 & sleep 30"]);
        let err = run_bounded(cmd, "sleeping", Duration::from_millis(200)).unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
    }
}
