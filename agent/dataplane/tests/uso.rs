//! Root: a `UDP_SEGMENT` sender (as QUIC stacks send) in one namespace, through plexd-wg on
//! both sides, to a UDP receiver in the other. plexd-wg's TUN takes UDP segmentation offload
//! (Linux 6.2 and later), so the sender's super-datagram reaches plexd-wg whole and plexd-wg
//! cuts it before encryption: every datagram must arrive as sent, with its own length (the last
//! one short) and a checksum the receiving kernel accepts (`InCsumErrors` stays 0). The TUN's
//! transmit counter tells how the datagrams reached plexd-wg: one packet per send with USO,
//! one per datagram with `PLEXD_WG_USO=0` (the benchmark's switch), where the kernel cuts them.
//!
//! Needs root, `ip` and `wg`; fails (never skips) without them. Names carry the test's pid.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::sys::socket::{setsockopt, sockopt};
use plexd_dataplane::SecretKey;

mod lab;

use lab::*;

/// Payload bytes per datagram the sender asks the kernel to cut at.
const SEGMENT: u16 = 1200;
/// Full datagrams per send, then one short one.
const FULL: usize = 10;
const LAST: usize = 345;

fn datagram(send: usize, i: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| ((send * 31 + i * 7 + j) % 251) as u8)
        .collect()
}

/// `UdpInCsumErrors` in the namespace's /proc/net/snmp.
fn csum_errors(ns: &str) -> u64 {
    let snmp = sh(&["ip", "netns", "exec", ns, "cat", "/proc/net/snmp"]);
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (udp.next().unwrap_or(""), udp.next().unwrap_or(""));
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "InCsumErrors")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("no Udp InCsumErrors in:\n{snmp}"))
}

/// The packets the kernel handed to the TUN `iface` in `ns` so far (what plexd-wg read).
fn tun_tx_packets(ns: &str, iface: &str) -> u64 {
    let path = format!("/sys/class/net/{iface}/statistics/tx_packets");
    let text = sh(&["ip", "netns", "exec", ns, "cat", &path]);
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{path} is not a number ({e}): {text}"))
}

/// `UDP_SEGMENT` sends through two plexd-wg, the sender's side started with `env` (a wrapper
/// script sets it); checks every datagram and returns the packets the sender's TUN carried
/// over the sends, and how many sends there were.
fn udp_segment_sends(tag: char, env: &str, want_uso: bool) -> (u64, u64) {
    let mut lab = Lab::new(tag);
    let program = if env.is_empty() {
        PLEXD_WG.to_owned()
    } else {
        let wrapper = lab.dir.join("plexd-wg-env");
        std::fs::write(
            &wrapper,
            format!("#!/bin/sh\nexec env {env} {PLEXD_WG} \"$@\"\n"),
        )
        .expect("wrapper script");
        std::fs::set_permissions(
            &wrapper,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("wrapper mode");
        wrapper.display().to_string()
    };
    lab.start(0, &program);
    lab.start(1, PLEXD_WG);
    let log = std::fs::read_to_string(lab.log(0)).unwrap_or_default();
    assert!(
        log.contains("offloads=true"),
        "TSO/GRO stay on either way: {log}"
    );
    assert!(
        log.contains(&format!("uso={want_uso}")),
        "this kernel (6.2 or later) takes TUN USO unless {env:?} says no: {log}"
    );
    let (ka, kb) = (
        SecretKey::generate().expect("key"),
        SecretKey::generate().expect("key"),
    );
    lab.configure(0, &ka, &kb);
    lab.configure(1, &kb, &ka);
    // A session first, so no datagram waits for the handshake.
    assert_eq!(tcp_echo(&lab.ns[0], &lab.ns[1], MESH_B, 1000).len(), 1000);
    assert!(latest_handshake(&lab, 0) > 0, "a session is up");
    let errors_before = csum_errors(&lab.ns[1]);
    let tx_before = tun_tx_packets(&lab.ns[0], &lab.ifaces[0]);

    let to: SocketAddr = format!("{MESH_B}:7001").parse().expect("addr");
    let sends = 20;
    let receiver = in_netns(&lab.ns[1], move || {
        let s = UdpSocket::bind(to).expect("bind the receiver");
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .expect("timeout");
        let mut got = Vec::new();
        let mut buf = vec![0u8; 65536];
        let deadline = Instant::now() + Duration::from_secs(20);
        while got.len() < sends * (FULL + 1) && Instant::now() < deadline {
            if let Ok(n) = s.recv(&mut buf) {
                got.push(buf[..n].to_vec());
            }
        }
        got
    });
    std::thread::sleep(Duration::from_millis(200));
    in_netns(&lab.ns[0], move || {
        let s = UdpSocket::bind("0.0.0.0:0").expect("bind the sender");
        setsockopt(&s.as_fd(), sockopt::UdpGsoSegment, &i32::from(SEGMENT)).expect("UDP_SEGMENT");
        for send in 0..sends {
            let mut payload = Vec::new();
            for i in 0..=FULL {
                let len = if i == FULL {
                    LAST
                } else {
                    usize::from(SEGMENT)
                };
                payload.extend_from_slice(&datagram(send, i, len));
            }
            assert_eq!(s.send_to(&payload, to).expect("send"), payload.len());
            // Paced, so a full socket buffer is never the reason for a loss.
            std::thread::sleep(Duration::from_millis(5));
        }
    })
    .join()
    .expect("sender");
    let got = receiver.join().expect("receiver");
    let tx = tun_tx_packets(&lab.ns[0], &lab.ifaces[0]) - tx_before;
    eprintln!("{env:?}: the sender's TUN carried {tx} packets for {sends} sends");

    let mut want = Vec::new();
    for send in 0..sends {
        for i in 0..=FULL {
            let len = if i == FULL {
                LAST
            } else {
                usize::from(SEGMENT)
            };
            want.push(datagram(send, i, len));
        }
    }
    assert_eq!(
        got.len(),
        want.len(),
        "every datagram arrives; logs:\n{}",
        lab.logs()
    );
    let (mut got, mut want) = (got, want);
    got.sort();
    want.sort();
    assert!(
        got == want,
        "each datagram as sent, the last of each send short"
    );
    assert_eq!(
        csum_errors(&lab.ns[1]),
        errors_before,
        "no datagram arrived with a bad UDP checksum"
    );
    (tx, sends as u64)
}

#[test]
fn a_udp_segment_sender_through_plexd_wg_delivers_every_datagram_intact() {
    let (tx, sends) = udp_segment_sends('u', "", true);
    // One super-datagram per send; a little room for what else the interface carries.
    assert!(
        tx < 2 * sends,
        "with USO each send reaches plexd-wg as one packet: {tx} packets for {sends} sends"
    );
}

#[test]
fn plexd_wg_uso_0_leaves_the_segmentation_to_the_kernel() {
    let (tx, sends) = udp_segment_sends('n', "PLEXD_WG_USO=0", false);
    assert!(
        tx >= sends * (FULL as u64 + 1),
        "with USO off the kernel cuts each send before the TUN: {tx} packets for {sends} sends of {} datagrams",
        FULL + 1
    );
}
