//! Nothing of a machine runs with the host's privileges, and no read follows the machine's
//! symlinks out of its root (root). A machine plants wrappers for the commands a host would run
//! in it (systemctl, cloud-init, head, journalctl); every probe the substrate makes and every
//! `exec` runs, and each wrapper that ran recorded its capabilities and seccomp mode: none ran
//! with more than the machine's own PID 1 has. Then a symlink to a host path, a `..` walk, a FIFO
//! and a device node planted in the machine are read without leaving it or blocking.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use plexsphere_nspawn::{
    BaseImage, Bridge, CloudInitStatus, ExtraFile, Machine, MachineSpec, NoCloudSeed,
};

use common::{Cleanup, IMAGE_CACHE, host_ready, init_tracing};

const BOOT: Duration = Duration::from_secs(180);
const CLOUD_INIT: Duration = Duration::from_secs(300);
const RECORD: &str = "/var/tmp/wrapper-runs.log";

/// A wrapper that records who runs it, then runs the real command.
fn wrapper(name: &str) -> ExtraFile {
    let body = format!(
        "#!/bin/sh\n{{ echo \"== {name}\"; grep -E '^(Uid|CapEff|CapBnd|Seccomp):' /proc/self/status; }} >>{RECORD} 2>/dev/null\nexec /usr/bin/{name} \"$@\"\n"
    );
    ExtraFile::new(format!("/usr/local/bin/{name}"), body, 0o755)
}

fn field(status: &str, name: &str) -> Option<String> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .map(|v| v.trim().to_owned())
}

fn caps(hex: &str) -> u64 {
    u64::from_str_radix(hex, 16).unwrap_or(u64::MAX)
}

#[test]
fn no_command_of_a_machine_runs_with_more_privilege_than_the_machine() {
    if !host_ready() {
        return;
    }
    init_tracing();
    let image = BaseImage::ensure(Path::new(IMAGE_CACHE)).expect("base image");
    let cleanup = Cleanup::new("plexbrg0");
    let bridge = Bridge::ensure("plexbrg0", "172.30.233.1/24".parse().unwrap()).expect("bridge");
    let secret = format!("/tmp/plexsphere-host-secret-{}", std::process::id());
    std::fs::write(&secret, "HOST SECRET\n").unwrap();
    let spec = MachineSpec {
        name: "nspt-priv".into(),
        image,
        bridge: bridge.name().to_string(),
        address: bridge.machine_address(10).unwrap(),
        gateway: bridge.host_address(),
        seed: NoCloudSeed {
            instance_id: format!("nspt-priv-{}", std::process::id()),
            user_data: "#cloud-config\nruncmd:\n  - echo planted\n".into(),
        },
        files: ["systemctl", "cloud-init", "head", "journalctl", "cat"]
            .iter()
            .map(|n| wrapper(n))
            .collect(),
    };
    let m = Machine::create(cleanup.dir(), spec).expect("machine");
    m.wait_booted(BOOT)
        .unwrap_or_else(|e| panic!("{e}\n{}", m.console_log().unwrap_or_default()));
    assert_eq!(
        m.wait_cloud_init(CLOUD_INIT).unwrap(),
        CloudInitStatus::Done
    );
    let _ = m.observe().unwrap();
    let _ = m.journal("cloud-final.service").unwrap();
    let out = m.exec_ok(&["systemctl", "is-system-running"]).unwrap();
    assert!(!out.stdout.is_empty(), "exec returns the command's output");
    let _ = m
        .read_file("/etc/hostname", 4096, Duration::from_secs(5))
        .unwrap();

    // The machine's PID 1: the most any command of the machine may have.
    let leader = m.leader_pid().unwrap();
    let pid1 = std::fs::read_to_string(format!("/proc/{leader}/status")).unwrap();
    let pid1_bounding = caps(&field(&pid1, "CapBnd").unwrap());
    let pid1_seccomp = field(&pid1, "Seccomp").unwrap();
    let record = m
        .read_file(RECORD, 1 << 20, Duration::from_secs(5))
        .unwrap()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let runs: Vec<&str> = record
        .split("== ")
        .filter(|r| !r.trim().is_empty())
        .collect();
    assert!(
        runs.iter().any(|r| r.starts_with("journalctl"))
            && runs.iter().any(|r| r.starts_with("systemctl")),
        "the wrappers for the commands exec ran recorded themselves:\n{record}"
    );
    for run in runs {
        let eff = caps(&field(run, "CapEff").unwrap_or_default());
        let bnd = caps(&field(run, "CapBnd").unwrap_or_default());
        assert_eq!(
            eff & !pid1_bounding,
            0,
            "a wrapper ran with capabilities the machine lacks:\n{run}"
        );
        assert_eq!(
            bnd & !pid1_bounding,
            0,
            "a wrapper could gain capabilities the machine lacks:\n{run}"
        );
        assert_eq!(
            field(run, "Seccomp").unwrap_or_default(),
            pid1_seccomp,
            "a wrapper ran outside the machine's seccomp filter:\n{run}"
        );
    }

    // Reads stay inside the machine: an absolute symlink to a host path, a `..` walk, a FIFO
    // (no blocking) and a device node (not read).
    let plant = format!(
        "ln -sf {secret} /var/tmp/abs && ln -sf ../../../../../../..{secret} /var/tmp/rel && mkfifo /var/tmp/fifo && mknod /var/tmp/null c 1 3 && echo machine-copy > {secret}.in-machine"
    );
    m.exec_ok(&["sh", "-c", &plant]).unwrap();
    for link in ["/var/tmp/abs", "/var/tmp/rel"] {
        let read = m.read_file(link, 4096, Duration::from_secs(5)).unwrap();
        assert!(
            !read.as_deref().unwrap_or_default().starts_with(b"HOST"),
            "{link} was followed out of the machine into the host"
        );
    }
    let started = Instant::now();
    assert_eq!(
        m.read_file("/var/tmp/fifo", 4096, Duration::from_secs(5))
            .unwrap(),
        None
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a FIFO blocked the read"
    );
    assert_eq!(
        m.read_file("/var/tmp/null", 4096, Duration::from_secs(5))
            .unwrap(),
        None
    );
    let _ = std::fs::remove_file(&secret);
    m.destroy().unwrap();
}
