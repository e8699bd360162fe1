//! The shared port against real sockets (root): in a network namespace of the test's own, a
//! plain UDP socket holds the port (as the kernel's WireGuard does), and the shared port must
//! see exactly the STUN, disco and relay datagrams to that port, on IPv4 and IPv6, and send
//! from that port.

use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::time::Duration;

use nix::sched::{CloneFlags, unshare};
use plexsphere_wire::reach::{DISCO_MAGIC, MAX_DATAGRAM, RELAY_MAGIC};

use super::shared_port::SharedPort;

const PORT: u16 = 51820;
const WAIT: Duration = Duration::from_millis(500);

/// Runs `f` on a thread inside a new network namespace with loopback up.
fn in_new_netns(f: impl FnOnce() + Send + 'static) {
    std::thread::spawn(move || {
        unshare(CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET): the tests run as root");
        let up = Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status()
            .expect("ip");
        assert!(up.success(), "ip link set lo up");
        f();
    })
    .join()
    .expect("the test thread panicked");
}

fn stun() -> Vec<u8> {
    let mut m = vec![0x00, 0x01, 0x00, 0x00, 0x21, 0x12, 0xA4, 0x42];
    m.extend_from_slice(&[9; 12]);
    m
}

fn wireguard() -> Vec<u8> {
    let mut m = vec![1, 0, 0, 0];
    m.extend_from_slice(&[7; 144]);
    m
}

fn with_magic(magic: [u8; 4]) -> Vec<u8> {
    let mut m = magic.to_vec();
    m.extend_from_slice(&[5; 40]);
    m
}

/// What the shared port gets within WAIT, if anything.
fn next(shared: &SharedPort) -> Option<(Vec<u8>, SocketAddr)> {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let deadline = std::time::Instant::now() + WAIT;
    while std::time::Instant::now() < deadline {
        if let Some((n, from)) = shared.recv_from(&mut buf, WAIT).expect("recv") {
            return Some((buf[..n].to_vec(), from));
        }
    }
    None
}

fn sees_only_its_own_kinds_and_sends_from_the_port(lo: &str) {
    let owner = UdpSocket::bind(format!("{lo}:{PORT}").parse::<SocketAddr>().unwrap()).unwrap();
    owner.set_read_timeout(Some(WAIT)).unwrap();
    let shared = SharedPort::open(PORT).expect("open the shared port");
    let peer = UdpSocket::bind(format!("{lo}:0").parse::<SocketAddr>().unwrap()).unwrap();
    peer.set_read_timeout(Some(WAIT)).unwrap();
    let other =
        UdpSocket::bind(format!("{lo}:{}", PORT + 1).parse::<SocketAddr>().unwrap()).unwrap();
    let to = owner.local_addr().unwrap();
    let mut buf = vec![0u8; MAX_DATAGRAM];

    // WireGuard goes to the port's owner only.
    peer.send_to(&wireguard(), to).unwrap();
    let (n, _) = owner.recv_from(&mut buf).expect("the owner gets WireGuard");
    assert_eq!(&buf[..n], &wireguard()[..]);
    assert_eq!(
        next(&shared),
        None,
        "WireGuard must not reach the shared port"
    );

    // STUN, disco and relay frames go to both; the shared port sees the peer's address and port.
    for m in [stun(), with_magic(DISCO_MAGIC), with_magic(RELAY_MAGIC)] {
        peer.send_to(&m, to).unwrap();
        let (n, _) = owner.recv_from(&mut buf).expect("the owner gets its copy");
        assert_eq!(&buf[..n], &m[..]);
        assert_eq!(
            next(&shared),
            Some((m.clone(), peer.local_addr().unwrap())),
            "{lo}: the shared port gets {:02x?}",
            &m[..4]
        );
    }

    // The same kinds to another port are not ours.
    peer.send_to(&stun(), other.local_addr().unwrap()).unwrap();
    assert_eq!(
        next(&shared),
        None,
        "STUN to another port must not reach the shared port"
    );

    // Sends leave from the shared port, whole, with a checksum the receiver accepts.
    let answer = with_magic(DISCO_MAGIC);
    let sent = shared
        .send_to(&answer, peer.local_addr().unwrap())
        .expect("send");
    assert_eq!(sent, answer.len());
    let (n, from) = peer
        .recv_from(&mut buf)
        .expect("the peer gets the shared port's datagram");
    assert_eq!(&buf[..n], &answer[..]);
    assert_eq!(from, to, "it comes from the port WireGuard owns");
}

#[test]
fn over_ipv4_the_shared_port_sees_stun_disco_and_relay_but_never_wireguard() {
    in_new_netns(|| sees_only_its_own_kinds_and_sends_from_the_port("127.0.0.1"));
}

#[test]
fn over_ipv6_the_shared_port_sees_stun_disco_and_relay_but_never_wireguard() {
    in_new_netns(|| sees_only_its_own_kinds_and_sends_from_the_port("[::1]"));
}

#[test]
fn port_zero_and_oversized_datagrams_are_refused_with_a_reason() {
    in_new_netns(|| {
        let err = SharedPort::open(0).err().expect("port 0 is refused");
        assert!(err.to_string().contains("listen_port"), "{err}");
        let shared = SharedPort::open(PORT).expect("open");
        let err = shared
            .send_to(&vec![0u8; MAX_DATAGRAM + 1], "127.0.0.1:9".parse().unwrap())
            .unwrap_err();
        assert!(err.to_string().contains("longer than"), "{err}");
    });
}
