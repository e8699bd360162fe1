//! Real machines on this host (root): the cached base image, a bridge, two machines booting
//! systemd and cloud-init, reaching a server on the bridge and each other, then torn down.
//! Under `CI` a host without root or the tools fails these tests instead of skipping them.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use ipnet::Ipv4Net;
use plexsphere_nspawn::{
    BaseImage, Bridge, CloudInitStatus, Error, ExtraFile, Life, Machine, MachineSpec, NoCloudSeed,
};

use common::{Cleanup, IMAGE_CACHE, host_ready, init_tracing, mounts_under, serve_http};
use plexsphere_test_support::eventually;

const BOOT: Duration = Duration::from_secs(180);
const CLOUD_INIT: Duration = Duration::from_secs(300);

fn user_data(name: &str, server: SocketAddr) -> String {
    format!(
        "#cloud-config
write_files:
  - path: /etc/plexsphere-test/greeting
    content: |
      hello from {name}
    permissions: '0644'
runcmd:
  - echo 'nspawn-test runcmd on {name} ok'
  - curl -fsS --max-time 20 --retry 5 --retry-connrefused -o /var/tmp/reply http://{server}/hello/{name}
"
    )
}

fn spec(
    name: &str,
    image: &BaseImage,
    bridge: &Bridge,
    host: u32,
    server: SocketAddr,
) -> MachineSpec {
    MachineSpec {
        name: name.to_string(),
        image: image.clone(),
        bridge: bridge.name().to_string(),
        address: bridge
            .machine_address(host)
            .expect("an address in the bridge network"),
        gateway: bridge.host_address(),
        seed: NoCloudSeed {
            instance_id: format!("{name}-{}", std::process::id()),
            user_data: user_data(name, server),
        },
        files: vec![ExtraFile::new(
            "/etc/plexsphere-test/extra",
            "extra file\n",
            0o600,
        )],
    }
}

fn stdout(m: &Machine, argv: &[&str]) -> String {
    let out = m
        .exec_ok(argv)
        .unwrap_or_else(|e| panic!("{argv:?} in {}: {e}", m.name()));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn assert_left_nothing(m: &Machine, state: &Path, leader: i32) {
    assert!(m.gone(), "{} is not gone", m.name());
    assert!(!m.dir().exists(), "{} still exists", m.dir().display());
    assert!(
        mounts_under(m.dir()).is_empty(),
        "mounts left: {:?}",
        mounts_under(state)
    );
    let nspawn = m.nspawn().expect("an nspawn process was recorded");
    assert!(!nspawn.alive(), "systemd-nspawn {} still runs", nspawn.pid);
    let status = std::fs::read_to_string(format!("/proc/{leader}/status")).unwrap_or_default();
    assert!(
        status.is_empty() || status.contains("State:\tZ"),
        "the machine's PID 1 ({leader}) still runs"
    );
    let veth = format!("/sys/class/net/vb-{}", m.name());
    assert!(
        eventually(Duration::from_secs(10), || !Path::new(&veth).exists()),
        "{veth} is left"
    );
}

#[test]
fn two_machines_boot_run_cloud_init_reach_the_host_and_each_other_and_leave_nothing() {
    if !host_ready() {
        return;
    }
    init_tracing();
    let image = BaseImage::ensure(Path::new(IMAGE_CACHE)).expect("base image");
    let cleanup = Cleanup::new("plexbrt0");
    let bridge = Bridge::ensure("plexbrt0", "172.30.232.1/24".parse().unwrap()).expect("bridge");
    let (server, seen) = serve_http(
        SocketAddr::new(IpAddr::V4(bridge.host_address()), 0),
        "pong\n",
    );

    // A machine needs its bridge; a failed create leaves nothing behind.
    let mut orphan = spec("nspt-orphan", &image, &bridge, 20, server);
    orphan.bridge = "plexbrt-none".into();
    let err = Machine::create(cleanup.dir(), orphan).unwrap_err();
    assert!(matches!(err, Error::BridgeMissing(_)), "{err}");
    assert!(Machine::list(cleanup.dir()).unwrap().is_empty());

    let a = Machine::create(cleanup.dir(), spec("nspt-a", &image, &bridge, 10, server))
        .expect("machine a");
    let b = Machine::create(cleanup.dir(), spec("nspt-b", &image, &bridge, 11, server))
        .expect("machine b");
    let mut failing = spec("nspt-c", &image, &bridge, 12, server);
    failing.seed.user_data = "#cloud-config\nruncmd:\n  - exit 3\n".into();
    let c = Machine::create(cleanup.dir(), failing).expect("machine c");
    let again = Machine::create(cleanup.dir(), spec("nspt-a", &image, &bridge, 13, server));
    assert!(
        matches!(again, Err(Error::MachineExists { .. })),
        "{again:?}"
    );
    assert_eq!(
        Machine::list(cleanup.dir()).unwrap(),
        ["nspt-a", "nspt-b", "nspt-c"]
    );

    for m in [&a, &b] {
        let life = m.observe().unwrap();
        assert!(
            matches!(life, Life::Starting { .. } | Life::Booted { .. }),
            "{life:?}"
        );
        m.wait_booted(BOOT)
            .unwrap_or_else(|e| panic!("{e}\n{}", m.console_log().unwrap_or_default()));
        assert!(m.is_booted().unwrap());
        let leader = m.leader_pid().unwrap();
        assert_ne!(
            Some(leader),
            m.nspawn().map(|p| p.pid),
            "the leader is the machine's PID 1"
        );
        let status = m.wait_cloud_init(CLOUD_INIT).unwrap();
        assert_eq!(
            status,
            CloudInitStatus::Done,
            "{}",
            m.journal("cloud-final.service").unwrap_or_default()
        );
        match m.observe().unwrap() {
            Life::Booted {
                system_state,
                cloud_init,
            } => {
                assert!(
                    system_state == "running" || system_state == "degraded",
                    "{system_state}"
                );
                assert_eq!(cloud_init, CloudInitStatus::Done);
            }
            other => panic!("{} booted but observed as {other:?}", m.name()),
        }
    }

    // A failing runcmd is cloud-init's error, in cloud-init's own words.
    match c.wait_cloud_init(CLOUD_INIT).unwrap() {
        CloudInitStatus::Error { detail } => assert!(detail.contains("runcmd"), "{detail}"),
        other => panic!("nspt-c: expected a cloud-init error, got {other:?}"),
    }
    let c_leader = c.leader_pid().unwrap();
    c.destroy().unwrap();
    assert_left_nothing(&c, cleanup.dir(), c_leader);

    // cloud-init's work, inside: write_files, the extra file, runcmd's curl to the host.
    for m in [&a, &b] {
        let name = m.name();
        assert_eq!(
            stdout(m, &["cat", "/etc/plexsphere-test/greeting"]),
            format!("hello from {name}")
        );
        assert_eq!(
            stdout(m, &["stat", "-c", "%a %U", "/etc/plexsphere-test/extra"]),
            "600 root"
        );
        assert_eq!(stdout(m, &["cat", "/var/tmp/reply"]), "pong");
        assert_eq!(stdout(m, &["hostname"]), name);
        // read_file: whole, cut at the limit, and None for a file the machine does not have.
        let greeting = format!("hello from {name}\n");
        let t = Duration::from_secs(10);
        let read = |path, max| m.read_file(path, max, t).unwrap();
        assert_eq!(
            read("/etc/plexsphere-test/greeting", 4096).as_deref(),
            Some(greeting.as_bytes())
        );
        assert_eq!(
            read("/etc/plexsphere-test/greeting", 5).as_deref(),
            Some(&b"hello"[..])
        );
        assert_eq!(read("/etc/plexsphere-test/absent", 4096), None);
        assert!(
            stdout(m, &["ip", "-4", "-br", "addr", "show", "dev", "host0"])
                .contains(&m.address().to_string())
        );
        let marker = format!("nspawn-test runcmd on {name} ok");
        assert!(
            eventually(Duration::from_secs(30), || m
                .console_log()
                .unwrap_or_default()
                .contains(&marker)),
            "the console log of {name} lacks {marker:?}"
        );
        assert!(m.journal("cloud-final.service").unwrap().contains(&marker));
        // The userspace data plane needs TUN.
        stdout(m, &["ip", "tuntap", "add", "dev", "tuntest", "mode", "tun"]);
    }
    let mut peers: Vec<IpAddr> = (0..2)
        .map(|_| {
            seen.recv_timeout(Duration::from_secs(30))
                .expect("a request")
                .peer
        })
        .collect();
    peers.sort();
    assert_eq!(
        peers,
        [a.address().addr(), b.address().addr()].map(IpAddr::V4)
    );

    // Distinct machine ids; each reaches the other over the bridge.
    let ids = [
        stdout(&a, &["cat", "/etc/machine-id"]),
        stdout(&b, &["cat", "/etc/machine-id"]),
    ];
    assert_eq!(ids[0].len(), 32, "{ids:?}");
    assert_ne!(ids[0], ids[1]);
    stdout(
        &a,
        &[
            "ping",
            "-c",
            "1",
            "-W",
            "5",
            &b.address().addr().to_string(),
        ],
    );
    stdout(
        &b,
        &[
            "ping",
            "-c",
            "1",
            "-W",
            "5",
            &a.address().addr().to_string(),
        ],
    );

    // a: an orderly destroy from the handle that created it, twice.
    let a_leader = a.leader_pid().unwrap();
    a.destroy().expect("destroy a");
    a.destroy().expect("destroying twice is fine");
    assert_left_nothing(&a, cleanup.dir(), a_leader);
    assert_eq!(a.observe().unwrap(), Life::Gone);
    assert!(matches!(a.exec(&["true"]), Err(Error::NotRunning(_))));

    // b: its nspawn dies (a crashed server's machine); a restarted server finds and removes it.
    let b_leader = b.leader_pid().unwrap();
    let b_nspawn = b.nspawn().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(b_nspawn.pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(eventually(Duration::from_secs(10), || !b_nspawn.alive()));
    assert!(
        Path::new(&format!("/proc/{b_leader}")).exists(),
        "the orphaned machine still runs"
    );
    assert_eq!(b.observe().unwrap(), Life::Stopped);
    assert!(!b.gone(), "its PID 1 and its mount are still there");
    drop(b);
    assert_eq!(Machine::list(cleanup.dir()).unwrap(), ["nspt-b"]);
    let found = Machine::reattach(cleanup.dir(), "nspt-b").unwrap();
    assert_eq!(
        found.address(),
        "172.30.232.11/24".parse::<Ipv4Net>().unwrap()
    );
    assert_eq!(
        Machine::destroy_leftovers(cleanup.dir()).unwrap(),
        ["nspt-b"]
    );
    assert_left_nothing(&found, cleanup.dir(), b_leader);
    assert!(Machine::list(cleanup.dir()).unwrap().is_empty());
    assert!(matches!(
        Machine::reattach(cleanup.dir(), "nspt-b"),
        Err(Error::MachineNotFound { .. })
    ));
}

#[test]
fn the_base_image_is_reused_and_ready_for_machines() {
    if !host_ready() {
        return;
    }
    init_tracing();
    let first = BaseImage::ensure(Path::new(IMAGE_CACHE)).expect("base image");
    let second = BaseImage::ensure(Path::new(IMAGE_CACHE)).expect("base image again");
    assert_eq!(first, second);
    let root = first.rootfs();
    let dir = first
        .dir()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(dir.starts_with("bookworm-"), "{dir}");
    assert_eq!(
        std::fs::read(root.join("etc/machine-id")).unwrap(),
        b"",
        "machine-id must be empty"
    );
    let cfg =
        std::fs::read_to_string(root.join("etc/cloud/cloud.cfg.d/90-plexsphere.cfg")).unwrap();
    assert!(cfg.contains("datasource_list: [ NoCloud, None ]") && cfg.contains("locale: false"));
    assert!(
        root.join("etc/systemd/system/multi-user.target.wants/systemd-networkd.service")
            .exists()
    );
    for tool in [
        "usr/bin/cloud-init",
        "usr/bin/curl",
        "usr/bin/openssl",
        "usr/bin/ping",
        "usr/sbin/ip",
    ] {
        assert!(root.join(tool).exists(), "{tool} missing from the image");
    }
    let recipe = std::fs::read_to_string(first.dir().join("recipe.txt")).unwrap();
    assert!(recipe.contains("mirror http"), "{recipe}");
    // No half-built image is left next to it.
    let stray: Vec<_> = std::fs::read_dir(IMAGE_CACHE)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!(".build-{dir}"))
        })
        .collect();
    assert!(stray.is_empty(), "{stray:?}");
}

#[test]
fn the_bridge_is_idempotent_and_removable() {
    if !host_ready() {
        return;
    }
    let name = "plexbrt1";
    let addr: Ipv4Net = "172.30.233.1/24".parse().unwrap();
    let _cleanup = Cleanup::new(name);
    let first = Bridge::ensure(name, addr).unwrap();
    let second = Bridge::ensure(name, addr).unwrap();
    assert_eq!(first, second);
    assert_eq!(first.host_address(), Ipv4Addr::new(172, 30, 233, 1));
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "dev", name])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches("172.30.233.1/24").count(), 1, "{text}");
    assert!(
        Path::new("/sys/class/net")
            .join(name)
            .join("bridge")
            .is_dir()
    );
    let state = std::fs::read_to_string(format!("/sys/class/net/{name}/flags")).unwrap();
    let flags = u32::from_str_radix(state.trim().trim_start_matches("0x"), 16).unwrap();
    assert_eq!(flags & 1, 1, "the bridge is up");
    Bridge::remove(name).unwrap();
    Bridge::remove(name).unwrap();
    assert!(!Path::new("/sys/class/net").join(name).exists());
    // An interface that is not a bridge is never taken over or deleted.
    assert!(matches!(
        Bridge::ensure("lo", addr),
        Err(Error::NotABridge(_))
    ));
    assert!(matches!(Bridge::remove("lo"), Err(Error::NotABridge(_))));
}
