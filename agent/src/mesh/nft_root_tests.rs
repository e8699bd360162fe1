//! The nftables filter against real traffic (root): two network namespaces joined by two
//! veth pairs; node B filters the first pair (its "mesh interface") with the table `nft`
//! installs; the second pair is another interface the table must leave alone. TCP, UDP and
//! ICMP from A to B and back.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sched::{CloneFlags, setns};

use super::nft::{self, Installed, NftError};
use super::nft_tests::{grant, peer, view};

/// How long a connection that the filter drops is given before the test calls it dropped.
pub(super) const DROPPED_AFTER: Duration = Duration::from_millis(800);
/// The bound on waiting for something that must happen.
pub(super) const BOUND: Duration = Duration::from_secs(20);

pub(super) const A: &str = "10.99.0.1";
pub(super) const B: &str = "10.99.0.2";
pub(super) const A2: &str = "10.98.0.1";
pub(super) const A6: &str = "fd99::1";
pub(super) const B6: &str = "fd99::2";
pub(super) const B2: &str = "10.98.0.2";

pub(super) fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `ip -n NS ARGS` (ARGS split on spaces).
pub(super) fn ip(ns: &str, args: &str) {
    let mut all = vec!["ip", "-n", ns];
    all.extend(args.split(' '));
    sh(&all);
}

/// Namespaces `a` and `b`, deleted on drop. `mesh` is B's filtered interface.
pub(super) struct Lab {
    pub(super) a: String,
    pub(super) b: String,
    pub(super) mesh: String,
}

impl Lab {
    pub(super) fn new(tag: &str) -> Lab {
        let id = std::process::id() % 100_000;
        let (a, b) = (format!("pk{tag}a{id}"), format!("pk{tag}b{id}"));
        let lab = Lab {
            a: a.clone(),
            b: b.clone(),
            mesh: format!("pkm{tag}{id}"),
        };
        let other = format!("pko{tag}{id}");
        sh(&["ip", "netns", "add", &a]);
        sh(&["ip", "netns", "add", &b]);
        for (link, ip_a, ip_b) in [(&lab.mesh, A, B), (&other, A2, B2)] {
            let peer = format!("{link}p");
            ip(
                &b,
                &format!("link add {link} type veth peer name {peer} netns {a}"),
            );
            ip(&b, &format!("addr add {ip_b}/24 dev {link}"));
            ip(&a, &format!("addr add {ip_a}/24 dev {peer}"));
            if link == &lab.mesh {
                ip(&b, &format!("addr add {B6}/64 dev {link} nodad"));
                ip(&a, &format!("addr add {A6}/64 dev {peer} nodad"));
            }
            ip(&b, &format!("link set {link} up"));
            ip(&a, &format!("link set {peer} up"));
        }
        for ns in [&a, &b] {
            sh(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        lab
    }

    /// Runs `f` on a thread inside namespace `ns` (sockets it makes stay there).
    pub(super) fn run<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/run/netns/{ns}");
        std::thread::spawn(move || {
            let fd = std::fs::File::open(&path).unwrap();
            setns(fd, CloneFlags::CLONE_NEWNET).unwrap();
            f()
        })
        .join()
        .unwrap()
    }

    pub(super) fn in_a<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        Lab::run(&self.a, f)
    }

    pub(super) fn in_b<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        Lab::run(&self.b, f)
    }

    /// `nft` on B's mesh interface.
    pub(super) fn install(
        &self,
        v: Option<plexsphere_policy::view::NodeView>,
    ) -> Result<Installed, NftError> {
        let mesh = self.mesh.clone();
        self.in_b(move || nft::install(&mesh, v.as_ref()))
    }

    /// The packets B's table dropped (every counter in it).
    pub(super) fn dropped(&self) -> u64 {
        let table = nft::table_name(&self.mesh);
        let out = self.in_b(move || {
            Command::new("nft")
                .args(["list", "table", "inet", &table])
                .output()
                .unwrap()
        });
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.split("counter packets ")
            .skip(1)
            .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    }

    pub(super) fn listing(&self) -> String {
        let table = nft::table_name(&self.mesh);
        let out = self.in_b(move || {
            Command::new("nft")
                .args(["list", "table", "inet", &table])
                .output()
                .unwrap()
        });
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn ping_from_a(&self, to: &str) -> bool {
        Command::new("ip")
            .args(["netns", "exec", &self.a, "ping", "-c1", "-W1", to])
            .output()
            .unwrap()
            .status
            .success()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// A TCP listener in B on `addr:port`, accepting in the background.
pub(super) fn listen(lab: &Lab, addr: &str, port: u16) -> TcpListener {
    let ip: std::net::IpAddr = addr.parse().unwrap();
    let at = SocketAddr::from((ip, port));
    lab.in_b(move || TcpListener::bind(at).unwrap())
}

pub(super) fn connects(lab: &Lab, from_b: bool, to: &str, port: u16) -> bool {
    let ip: std::net::IpAddr = to.parse().unwrap();
    let at = SocketAddr::from((ip, port));
    let go = move || TcpStream::connect_timeout(&at, DROPPED_AFTER).is_ok();
    if from_b { lab.in_b(go) } else { lab.in_a(go) }
}

fn udp_arrives(lab: &Lab, port: u16) -> bool {
    let at: SocketAddr = format!("{B}:{port}").parse().unwrap();
    let rx = lab.in_b(move || UdpSocket::bind(at).unwrap());
    rx.set_read_timeout(Some(DROPPED_AFTER)).unwrap();
    let tx = lab.in_a(|| UdpSocket::bind("0.0.0.0:0").unwrap());
    tx.send_to(b"x", at).unwrap();
    rx.recv(&mut [0; 8]).is_ok()
}

/// B's view: A (web) may open tcp 5432 and udp 53 on B; B may open tcp 9000 on A.
pub(super) fn b_view(icmp: bool, inbound_tcp: &[(u16, u16)]) -> plexsphere_policy::view::NodeView {
    view(
        &[B],
        vec![
            grant(inbound_tcp, &[(53, 53)], icmp, false),
            grant(&[(9000, 9000)], &[], false, false),
        ],
        vec![peer(1, &[A], Some(0), Some(1))],
    )
}

#[test]
fn the_table_lets_through_what_the_view_grants_and_nothing_else() {
    let lab = Lab::new("g");
    let _l = (
        listen(&lab, B, 5432),
        listen(&lab, B, 5433),
        listen(&lab, B2, 5433),
    );
    let a_side: Vec<TcpListener> = [9000, 9001]
        .into_iter()
        .map(|p| {
            let at: SocketAddr = format!("{A}:{p}").parse().unwrap();
            lab.in_a(move || TcpListener::bind(at).unwrap())
        })
        .collect();
    // Without a table everything passes.
    assert!(connects(&lab, false, B, 5433));
    assert!(lab.ping_from_a(B));

    assert_eq!(
        lab.install(Some(b_view(false, &[(5432, 5432)]))).unwrap(),
        Installed::Filter
    );
    assert!(connects(&lab, false, B, 5432), "the granted port");
    assert!(!connects(&lab, false, B, 5433), "a port no rule grants");
    assert!(
        connects(&lab, false, B2, 5433),
        "another interface is untouched"
    );
    assert!(udp_arrives(&lab, 53), "the granted udp port");
    assert!(!udp_arrives(&lab, 54), "a udp port no rule grants");
    assert!(!lab.ping_from_a(B), "no icmp grant");
    assert!(lab.ping_from_a(B2), "icmp on the other interface");
    // B opens what it may on A: the replies pass; elsewhere A's SYN-ACK is dropped at B.
    assert!(connects(&lab, true, A, 9000));
    assert!(!connects(&lab, true, A, 9001));
    assert!(lab.dropped() > 0);

    // Atomic replace: the new view's icmp grant, and the table is one table.
    assert_eq!(
        lab.install(Some(b_view(true, &[(5432, 5432)]))).unwrap(),
        Installed::Filter
    );
    assert!(lab.ping_from_a(B));
    assert_eq!(lab.listing().matches("table inet").count(), 1);
    drop(a_side);
}

#[test]
fn a_revocation_cuts_a_live_tcp_flow_and_a_new_grant_lets_it_through() {
    let lab = Lab::new("r");
    let listener = listen(&lab, B, 5432);
    lab.install(Some(b_view(false, &[(5432, 5432)]))).unwrap();
    let at: SocketAddr = format!("{B}:5432").parse().unwrap();
    let mut client = lab.in_a(move || TcpStream::connect_timeout(&at, BOUND).unwrap());
    let (mut server, _) = listener.accept().unwrap();
    server.set_read_timeout(Some(BOUND)).unwrap();
    let mut buf = [0u8; 5];
    client.write_all(b"hello").unwrap();
    server.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"hello");

    // Revoked: the flow's next packet is dropped, established or not.
    let before = lab.dropped();
    lab.install(Some(b_view(false, &[(6000, 6000)]))).unwrap();
    client.write_all(b"again").unwrap();
    let start = Instant::now();
    while lab.dropped() == before {
        assert!(
            start.elapsed() < BOUND,
            "the revoked flow's packet was never dropped"
        );
    }
    server.set_nonblocking(true).unwrap();
    let e = server.read(&mut buf).unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::WouldBlock,
        "data of a revoked flow reached B"
    );

    // Granted again: TCP's retransmission gets through.
    lab.install(Some(b_view(false, &[(5432, 5432)]))).unwrap();
    server.set_nonblocking(false).unwrap();
    server.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"again");
}

#[test]
fn closed_removed_and_a_refused_ruleset_leaves_the_old_table() {
    let lab = Lab::new("c");
    let _l = (listen(&lab, B, 5432), listen(&lab, B2, 5432));
    lab.install(Some(b_view(false, &[(5432, 5432)]))).unwrap();
    let old = lab.listing();
    assert!(old.contains("jump in_0"), "{old}");

    // nft refuses the whole transaction: the old table stays, byte for byte, and works.
    let mesh = lab.mesh.clone();
    let bad = lab.in_b(move || {
        let mut input = nft::ruleset(&mesh, Some(&b_view(true, &[(1, 1)])));
        input.push_str("table inet nonsense { chain c { tcp dport 70000 accept\n } }\n");
        nft_run(&input)
    });
    assert!(!bad.0, "nft accepted a bad port");
    assert!(
        bad.1.contains("70000") || bad.1.contains("rror"),
        "{}",
        bad.1
    );
    assert_eq!(lab.listing(), old);
    assert!(connects(&lab, false, B, 5432));

    // A corrupt view: the closed table, everything from the interface dropped.
    let corrupt = view(&[B], vec![], vec![peer(1, &[A], Some(9), None)]);
    assert!(matches!(
        lab.install(Some(corrupt)).unwrap(),
        Installed::Closed(_)
    ));
    assert!(!connects(&lab, false, B, 5432));
    assert!(!lab.ping_from_a(B));
    assert!(
        connects(&lab, false, B2, 5432),
        "another interface is untouched"
    );

    // No policy: no table; removing again is fine.
    assert_eq!(lab.install(None).unwrap(), Installed::Removed);
    let mesh = lab.mesh.clone();
    assert!(!lab.in_b(move || nft::exists(&mesh).unwrap()));
    let mesh = lab.mesh.clone();
    lab.in_b(move || nft::remove(&mesh)).unwrap();
    assert!(connects(&lab, false, B, 5432));

    // A name nft would misread is refused before nft runs.
    assert!(matches!(
        nft::remove("a\"b"),
        Err(NftError::BadInterface(_))
    ));
}

/// `nft -f -` with `input`: (success, stderr).
fn nft_run(input: &str) -> (bool, String) {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// IPv6 takes the same way through the per-family maps.
#[test]
fn ipv6_peers_get_the_same_filter() {
    let lab = Lab::new("6");
    let _l = (
        listen(&lab, B6, 5432),
        listen(&lab, B6, 5433),
        listen(&lab, B, 5432),
    );
    assert!(connects(&lab, false, B6, 5433));
    let v = view(
        &[B, B6],
        vec![grant(&[(5432, 5432)], &[], false, false)],
        vec![peer(1, &[A, A6], Some(0), None)],
    );
    lab.install(Some(v)).unwrap();
    assert!(connects(&lab, false, B6, 5432));
    assert!(!connects(&lab, false, B6, 5433));
    // A view without B's IPv6 address: every IPv6 packet from the interface is dropped.
    let v4only = view(
        &[B],
        vec![grant(&[(5432, 5432)], &[], false, false)],
        vec![peer(1, &[A, A6], Some(0), None)],
    );
    lab.install(Some(v4only)).unwrap();
    assert!(!connects(&lab, false, B6, 5432));
    assert!(connects(&lab, false, B, 5432));
}

/// A network C behind B: the mesh may not route through B into it (the policy grants
/// nothing to route), but C's own flows out through the mesh get their replies.
#[test]
fn the_mesh_interface_forwards_only_replies() {
    struct Gone(String);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }
    let lab = Lab::new("w");
    let c = format!("pkwc{}", std::process::id() % 100_000);
    sh(&["ip", "netns", "add", &c]);
    let _c = Gone(c.clone());
    let link = format!("pkwl{}", std::process::id() % 100_000);
    ip(
        &lab.b,
        &format!("link add {link} type veth peer name {link}c netns {c}"),
    );
    ip(&lab.b, &format!("addr add 10.97.0.2/24 dev {link}"));
    ip(&c, &format!("addr add 10.97.0.3/24 dev {link}c"));
    ip(&lab.b, &format!("link set {link} up"));
    ip(&c, &format!("link set {link}c up"));
    ip(&c, "route add default via 10.97.0.2");
    ip(&lab.a, &format!("route add 10.97.0.0/24 via {B}"));
    sh(&[
        "ip",
        "netns",
        "exec",
        &lab.b,
        "sysctl",
        "-qw",
        "net.ipv4.ip_forward=1",
    ]);
    let in_c = |at: SocketAddr| Lab::run(&c, move || TcpListener::bind(at).unwrap());
    let _lc = in_c("10.97.0.3:80".parse().unwrap());
    let _la = lab.in_a(|| TcpListener::bind(SocketAddr::from(([10, 99, 0, 1], 9000))).unwrap());
    let from_c = |to: SocketAddr| {
        Lab::run(&c, move || {
            TcpStream::connect_timeout(&to, DROPPED_AFTER).is_ok()
        })
    };
    assert!(connects(&lab, false, "10.97.0.3", 80), "no table: routed");

    // A may open every tcp port on B itself; routing through B is not B's to grant.
    lab.install(Some(b_view(false, &[(0, u16::MAX)]))).unwrap();
    assert!(
        !connects(&lab, false, "10.97.0.3", 80),
        "routed into C from the mesh"
    );
    assert!(
        from_c(SocketAddr::from(([10, 99, 0, 1], 9000))),
        "C's flow out gets its replies"
    );
}

/// A minimal root (debootstrap's minbase, many container images) has no `/etc/protocols`
/// (Debian's `netbase`), and nft resolves a protocol name it has no keyword for through that
/// file: a table naming `ipv6-icmp` is refused there, and plexd's filter stays closed. Every
/// table plexd writes (the policy's, with ICMP and other protocols granted, and a router's)
/// must load with `/etc/protocols` empty.
#[test]
fn the_tables_load_on_a_host_without_etc_protocols() {
    // The sample's grant 2 lets ICMP through; a peer on grant 3 brings the other-protocols rule.
    let mut view = super::nft_tests::sample();
    view.peers.push(peer(4, &["10.64.0.5"], Some(3), None));
    let tables = [
        ("policy", nft::ruleset("plx0", Some(&view))),
        (
            "router",
            nft::ruleset("plx0", Some(&super::nft_routes_tests::routed())),
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (name, table) in tables {
        assert!(table.contains("icmpv6"), "{name}: {table}");
        let file = dir.path().join(format!("{name}.nft"));
        std::fs::write(&file, &table).unwrap();
        // A mount namespace of its own, where /etc/protocols is empty; `nft -c` checks the
        // table against the kernel without changing anything.
        let out = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg("mount --bind /dev/null /etc/protocols && nft -c -f \"$1\"")
            .arg("sh")
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "the {name} table does not load without /etc/protocols: {}\n{table}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
