//! A Linux guest under `qemu-system-x86_64 -accel tcg`, for what this machine's kernel cannot
//! do: the WireGuard kernel module. `scripts/kernel-guest.sh` builds (once, cached) Debian's
//! kernel and an initramfs; the guest's root is the host's `/` over 9p, read-only (so it runs
//! the host's plexd, `ip`, `wg` and their libraries), with tmpfs on /run and /tmp and a work
//! directory of the test shared read-write at the same path.
//!
//! Commands run through a tiny agent (a shell loop in the guest): the host writes
//! `<work>/.guest/<n>.cmd`, the guest runs it and writes `<n>.out` and then `<n>.rc`. The
//! guest's network is a virtio NIC on a tap the caller created in a namespace of its
//! topology ([`crate::nat::Topology::add_tap`]); qemu runs inside that namespace.
//!
//! KVM does not start a guest on this machine kind (no nested virtualization), so it is TCG:
//! fine for correctness, meaningless for speed. Nothing here skips: no qemu, no kernel package,
//! no guest agent are errors that say what is missing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};

use crate::netns::in_netns;
use crate::{Proc, wait_until};

/// How long the guest may take from qemu's start to its agent's first line (TCG boots the
/// Debian kernel in about 10 s here; a loaded machine takes longer).
pub const BOOT_BOUND: Duration = Duration::from_secs(90);
/// The guest's memory in MiB.
const MEMORY_MIB: u32 = 512;
/// The line the agent prints on the console once it polls for commands.
const AGENT_UP: &str = "plexguest: agent up";
/// How often the agent looks for the next command.
const AGENT_POLL: &str = "0.05";

/// The kernel and initramfs the guest boots.
#[derive(Debug, Clone)]
pub struct Image {
    pub vmlinuz: PathBuf,
    pub initrd: PathBuf,
}

/// Builds or finds the cached image with `scripts/kernel-guest.sh`.
pub fn image() -> Result<Image> {
    // One build at a time: the script writes one cache (tests run on several threads).
    static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = BUILD
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/kernel-guest.sh");
    let out = Command::new(&script)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    ensure!(
        out.status.success(),
        "{} failed (the kernel-backend tests need Debian's kernel package and qemu; run scripts/deps.sh): {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let text = String::from_utf8(out.stdout)?;
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .map(PathBuf::from)
            .with_context(|| format!("{} printed no {key}: {text}", script.display()))
    };
    Ok(Image {
        vmlinuz: field("vmlinuz=")?,
        initrd: field("initrd=")?,
    })
}

/// What one command printed and how it ended.
#[derive(Debug)]
pub struct GuestOutput {
    pub rc: i32,
    pub out: String,
}

/// A booted guest with its agent answering.
pub struct Guest {
    proc: Proc,
    queue: PathBuf,
    next: Mutex<u64>,
}

impl Guest {
    /// Boots `image` with qemu inside `ns`, its NIC on `tap` (which must exist in `ns`) with
    /// MAC `mac`, and `work` (an absolute directory) shared read-write at the same path.
    pub fn boot(image: &Image, ns: &str, tap: &str, mac: &str, work: &Path) -> Result<Self> {
        ensure!(work.is_absolute(), "the work directory must be absolute");
        let qemu = "qemu-system-x86_64";
        ensure!(
            Command::new(qemu).arg("--version").output().is_ok(),
            "{qemu} is missing: apt-get install --no-install-recommends qemu-system-x86 (scripts/deps.sh does)"
        );
        let queue = work.join(".guest");
        std::fs::create_dir_all(&queue)?;
        std::fs::write(work.join("agent.sh"), agent_script(&queue))?;
        let mut cmd = Command::new(qemu);
        cmd.args(["-accel", "tcg", "-m", &MEMORY_MIB.to_string(), "-smp", "1"])
            .args(["-nographic", "-no-reboot", "-kernel"])
            .arg(&image.vmlinuz)
            .arg("-initrd")
            .arg(&image.initrd)
            .arg("-append")
            .arg(format!(
                "console=ttyS0 quiet panic=-1 plexguest.work={}",
                work.display()
            ))
            .arg("-virtfs")
            .arg("local,path=/,mount_tag=hostroot,security_model=passthrough,readonly=on,multidevs=remap")
            .arg("-virtfs")
            .arg(format!(
                "local,path={},mount_tag=work,security_model=passthrough,multidevs=remap",
                work.display()
            ))
            .arg("-netdev")
            .arg(format!("tap,id=n0,ifname={tap},script=no,downscript=no"))
            .arg("-device")
            .arg(format!("virtio-net-pci,netdev=n0,romfile=,mac={mac}"));
        let proc = Proc::spawn(in_netns(ns, &cmd))?;
        proc.wait_for_line(BOOT_BOUND, |l| l.contains(AGENT_UP))
            .context("the guest's agent did not come up")?;
        Ok(Self {
            proc,
            queue,
            next: Mutex::new(0),
        })
    }

    /// Runs `script` (sh) in the guest and waits up to `bound` for it to end.
    pub fn run(&self, script: &str, bound: Duration) -> Result<GuestOutput> {
        let n = {
            let mut next = self
                .next
                .lock()
                .map_err(|_| anyhow::anyhow!("the guest's command counter is poisoned"))?;
            let n = *next;
            *next += 1;
            n
        };
        let tmp = self.queue.join(format!("{n}.cmd.tmp"));
        std::fs::write(&tmp, script)?;
        std::fs::rename(&tmp, self.queue.join(format!("{n}.cmd")))?;
        let rc_file = self.queue.join(format!("{n}.rc"));
        let rc = wait_until(bound, &format!("the guest runs `{script}`"), || {
            Ok(std::fs::read_to_string(&rc_file)
                .ok()
                .and_then(|t| t.trim().parse::<i32>().ok()))
        })
        .with_context(|| format!("--- guest console:\n{}", self.console()))?;
        let out = std::fs::read_to_string(self.queue.join(format!("{n}.out"))).unwrap_or_default();
        Ok(GuestOutput { rc, out })
    }

    /// Runs `script` and insists it exited 0; returns its output.
    pub fn run_ok(&self, script: &str, bound: Duration) -> Result<String> {
        let o = self.run(script, bound)?;
        if o.rc != 0 {
            bail!("`{script}` exited {} in the guest:\n{}", o.rc, o.out);
        }
        Ok(o.out)
    }

    /// Everything the guest printed on its console.
    pub fn console(&self) -> String {
        self.proc.output()
    }
}

/// The agent: runs `<n>.cmd` in order, one at a time, and records its output and exit code.
fn agent_script(queue: &Path) -> String {
    let q = queue.display();
    format!(
        "#!/bin/sh\n\
         # plexguest agent: written by tests/src/qemu.rs, run by the guest's init.\n\
         echo {host} > /proc/sys/kernel/hostname\n\
         ip link set lo up\n\
         n=0\n\
         echo '{AGENT_UP}'\n\
         while :; do\n\
         \x20 if [ -f {q}/$n.cmd ]; then\n\
         \x20   sh {q}/$n.cmd > {q}/$n.out 2>&1 < /dev/null\n\
         \x20   echo $? > {q}/$n.rc.tmp && mv {q}/$n.rc.tmp {q}/$n.rc\n\
         \x20   n=$((n + 1))\n\
         \x20 else\n\
         \x20   sleep {AGENT_POLL}\n\
         \x20 fi\n\
         done\n",
        host = GUEST_HOSTNAME,
    )
}

/// The guest's hostname (what a plexd in it registers with).
pub const GUEST_HOSTNAME: &str = "kernel-guest";
