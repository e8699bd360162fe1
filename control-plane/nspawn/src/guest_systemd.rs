//! The machine's systemd, asked by the host's own `systemctl` (a trusted host binary; nothing
//! of the machine runs on the host's side).
//!
//! systemd takes a connection on its private socket (`/run/systemd/private`) only from root
//! whose PID it can see, so `systemctl` runs in the machine's PID namespace (and no other
//! namespace of the machine: its files stay the host's), in a mount namespace of its own where
//! `/run/systemd/private` is a symlink to a descriptor this process opened inside the machine's
//! root without following the machine's symlinks (`crate::guest`). A command the host wants
//! run in the machine becomes a runtime unit of the machine's systemd (`/run/systemd/system`),
//! started with `systemctl start` and read back from files: it runs as a service of the
//! machine, under its PID 1's capability bounding set and seccomp filter.

use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::process::ExitStatusExt as _;
use std::process::{Command, ExitStatus, Output};
use std::time::Duration;

use nix::fcntl::OFlag;

use crate::cmd::{Tool, run_bounded};
use crate::error::{Error, Result};
use crate::guest::{self, PRIVATE_BUS};

/// The most output of one command that is read back, per stream.
pub const MAX_OUTPUT: usize = 4 * 1024 * 1024;
/// The bound on one `systemctl` call that is not the command itself.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);
const HOST_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Makes `/run/systemd` of the new mount namespace point at the machine's socket (`$0`), then
/// runs the host's systemctl.
const WRAP: &str = "mount -t tmpfs plexsphere /run/systemd && mkdir /run/systemd/system && ln -s \"$0\" /run/systemd/private && exec \"$@\"";

/// The machine's systemd, through its PID 1 as the host numbers it.
pub struct GuestSystemd {
    leader: i32,
    socket: OwnedFd,
}

impl GuestSystemd {
    pub fn connect(leader: i32) -> Result<Self> {
        let Some(socket) = guest::open_inside(leader, PRIVATE_BUS, OFlag::O_PATH)? else {
            // Not an end state: systemd creates it early in the boot.
            return Err(Error::Command {
                what: "connecting to the machine's systemd".into(),
                program: "systemd".into(),
                status: "not listening yet".into(),
                detail: format!("the machine has no {PRIVATE_BUS} (yet)"),
            });
        };
        Ok(Self { leader, socket })
    }

    /// The host's `systemctl <args>` against the machine's systemd.
    fn systemctl(&self, args: &[&str], timeout: Duration) -> Result<Output> {
        let via = format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            self.socket.as_raw_fd()
        );
        let mut cmd = Command::new(Tool::Nsenter.path()?);
        cmd.arg("-t")
            .arg(self.leader.to_string())
            .arg("--pid")
            .arg("--")
            .arg("unshare")
            .arg("--mount")
            .arg("--propagation")
            .arg("private")
            .arg("--")
            .arg("/bin/sh")
            .arg("-c")
            .arg(WRAP)
            .arg(&via)
            .arg(Tool::Systemctl.path()?)
            .args(args)
            .env_clear()
            .env("PATH", HOST_PATH)
            .env("LANG", "C.UTF-8")
            .env("SYSTEMD_PAGER", "")
            .env("SYSTEMD_COLORS", "0");
        run_bounded(
            cmd,
            &format!(
                "asking the machine's systemd ({})",
                args.first().copied().unwrap_or_default()
            ),
            timeout,
        )
    }

    /// What `systemctl is-system-running` says in the machine (`starting`, `running`, ...).
    pub fn system_state(&self) -> Result<String> {
        let out = self.systemctl(&["is-system-running"], CALL_TIMEOUT)?;
        let state = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if state.is_empty() {
            return Err(Error::Command {
                what: "asking the machine's systemd for its state".into(),
                program: "systemctl".into(),
                status: out.status.to_string(),
                detail: crate::cmd::last_words(&out.stderr, &out.stdout),
            });
        }
        Ok(state)
    }

    /// Runs `argv` (looked up on the machine's PATH) as a service of the machine and answers
    /// its exit status and output, like `std::process::Command::output`.
    pub fn run(&self, argv: &[&str], timeout: Duration) -> Result<Output> {
        let Some(program) = argv.first() else {
            return Err(Error::InvalidPath {
                path: String::new(),
                reason: "no command given",
            });
        };
        let id = hex::encode(rand_bytes());
        let unit = format!("plexsphere-exec-{id}.service");
        let out_path = format!("/run/plexsphere-exec-{id}.out");
        let err_path = format!("/run/plexsphere-exec-{id}.err");
        guest::create_runtime_unit(
            self.leader,
            &unit,
            unit_file(argv, &out_path, &err_path).as_bytes(),
        )?;
        let started = self.systemctl(&["start", &unit], timeout);
        let result = match started {
            Ok(_) => self.exit_status(&unit),
            Err(e) => Err(e),
        };
        let stdout = guest::read_regular(self.leader, &out_path, MAX_OUTPUT)?.unwrap_or_default();
        let stderr = guest::read_regular(self.leader, &err_path, MAX_OUTPUT)?.unwrap_or_default();
        let _ = self.systemctl(&["stop", &unit], CALL_TIMEOUT);
        let _ = self.systemctl(&["reset-failed", &unit], CALL_TIMEOUT);
        guest::remove_runtime_unit(self.leader, &unit);
        guest::remove_in_run(self.leader, &out_path);
        guest::remove_in_run(self.leader, &err_path);
        let status = result.map_err(|e| match e {
            Error::Timeout { after, .. } => Error::Timeout {
                what: format!("running {program:?} in the machine"),
                after,
                hint: "the machine may be overloaded or the command hangs; it was stopped",
            },
            other => other,
        })?;
        Ok(Output {
            status,
            stdout,
            stderr,
        })
    }

    fn exit_status(&self, unit: &str) -> Result<ExitStatus> {
        let out = self.systemctl(
            &["show", "-p", "ExecMainCode", "-p", "ExecMainStatus", unit],
            CALL_TIMEOUT,
        )?;
        let text = String::from_utf8_lossy(&out.stdout);
        let value = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
                .and_then(|v| v.trim().parse::<i32>().ok())
        };
        match (value("ExecMainCode"), value("ExecMainStatus")) {
            // ExecMainCode follows waitid(): 1 exited (status = exit code), 2 killed, 3 dumped.
            (Some(1), Some(status)) => Ok(ExitStatus::from_raw((status & 0xff) << 8)),
            (Some(_), Some(signal)) => Ok(ExitStatus::from_raw(signal & 0x7f)),
            _ => Err(Error::Command {
                what: format!("reading how {unit} ended in the machine"),
                program: "systemctl".into(),
                status: out.status.to_string(),
                detail: crate::cmd::last_words(&out.stderr, &out.stdout),
            }),
        }
    }
}

/// The runtime unit that runs `argv` once, its output in two files of /run.
fn unit_file(argv: &[&str], out_path: &str, err_path: &str) -> String {
    let mut exec = String::from("/bin/sh -c 'exec \"$$0\" \"$$@\"'");
    for a in argv {
        exec.push(' ');
        exec.push_str(&quote(a));
    }
    format!(
        "[Unit]\nDescription=plexsphere: a command run in the machine\nDefaultDependencies=no\n\n[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart={exec}\nStandardInput=null\nStandardOutput=file:{out_path}\nStandardError=file:{err_path}\nEnvironment=LANG=C.UTF-8 TERM=dumb\n"
    )
}

/// One argument as a unit file's command line takes it: double-quoted, with `\`, `"` and
/// control characters escaped, `$` and `%` doubled (no variable or specifier expansion).
fn quote(arg: &str) -> String {
    let mut out = String::with_capacity(arg.len() + 2);
    out.push('"');
    for c in arg.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '$' => out.push_str("$$"),
            '%' => out.push_str("%%"),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32 & 0xff)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn rand_bytes() -> [u8; 8] {
    use ring::rand::SecureRandom as _;
    let mut b = [0u8; 8];
    let _ = ring::rand::SystemRandom::new().fill(&mut b);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_reach_the_unit_verbatim() {
        assert_eq!(quote("a b"), "\"a b\"");
        assert_eq!(quote("$HOME %n \"x\" \\"), "\"$$HOME %%n \\\"x\\\" \\\\\"");
        assert_eq!(quote("l1\nl2"), "\"l1\\nl2\"");
        let unit = unit_file(&["sh", "-c", "echo $1"], "/run/o", "/run/e");
        assert!(
            unit.contains(
                "ExecStart=/bin/sh -c 'exec \"$$0\" \"$$@\"' \"sh\" \"-c\" \"echo $$1\"\n"
            ),
            "{unit}"
        );
        assert!(unit.contains("StandardOutput=file:/run/o\n"));
    }
}
