//! Datagrams with a forged source, sent from inside a lab namespace as an attacker on the path
//! could: a raw UDP socket writes its own UDP header, so it sends "from" a port another socket
//! (a relay's) holds. Sent from the public segment to a router's WAN address and the port its
//! NAT mapped for a node's flow to that source, they pass the router's conntrack as that flow's
//! answers and reach the node as if the source had sent them.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsRawFd as _;
use std::process::Command;

use anyhow::{Context as _, Result, bail};
use nix::sys::socket::{
    AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, SockaddrIn, bind, sendto, socket,
};

use crate::netns::{in_netns, on_thread_in};

/// The WAN port router namespace `router_ns` mapped for the UDP flow from `inside` to
/// `outside`, from its conntrack table.
pub fn nat_mapped_port(
    router_ns: &str,
    inside: SocketAddrV4,
    outside: SocketAddrV4,
) -> Result<u16> {
    let out = in_netns(
        router_ns,
        Command::new("conntrack").args(["-L", "-p", "udp"]),
    )
    .output()
    .context("running conntrack -L")?;
    let text = String::from_utf8_lossy(&out.stdout);
    // udp 17 29 src=IN dst=OUT sport=P dport=Q src=OUT dst=WAN sport=Q dport=MAPPED ...
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let get = |key: &str, nth: usize| {
            fields
                .iter()
                .filter_map(|f| f.strip_prefix(key))
                .nth(nth)
                .map(str::to_owned)
        };
        let matches = get("src=", 0) == Some(inside.ip().to_string())
            && get("sport=", 0) == Some(inside.port().to_string())
            && get("dst=", 0) == Some(outside.ip().to_string())
            && get("dport=", 0) == Some(outside.port().to_string());
        if matches && let Some(port) = get("dport=", 1).and_then(|p| p.parse().ok()) {
            return Ok(port);
        }
    }
    bail!("no conntrack entry in {router_ns} for {inside} -> {outside}:\n{text}")
}

/// Sends each of `datagrams` as UDP from `from` to `to`, from a thread inside namespace `ns`,
/// where `from`'s address is local (its port may be bound by another socket).
pub fn send_spoofed(
    ns: &str,
    from: SocketAddrV4,
    to: SocketAddrV4,
    datagrams: Vec<Vec<u8>>,
) -> Result<()> {
    on_thread_in(ns, move || {
        let fd = socket(
            AddressFamily::Inet,
            SockType::Raw,
            SockFlag::empty(),
            SockProtocol::Udp,
        )
        .context("a raw UDP socket (root only)")?;
        bind(
            fd.as_raw_fd(),
            &SockaddrIn::from(SocketAddrV4::new(*from.ip(), 0)),
        )
        .with_context(|| format!("binding {}", from.ip()))?;
        for d in &datagrams {
            let len = u16::try_from(8 + d.len()).context("a datagram over 64 KiB")?;
            let mut packet = Vec::with_capacity(8 + d.len());
            packet.extend_from_slice(&from.port().to_be_bytes());
            packet.extend_from_slice(&to.port().to_be_bytes());
            packet.extend_from_slice(&len.to_be_bytes());
            packet.extend_from_slice(&checksum(*from.ip(), *to.ip(), &packet, d).to_be_bytes());
            packet.extend_from_slice(d);
            sendto(
                fd.as_raw_fd(),
                &packet,
                &SockaddrIn::from(SocketAddrV4::new(*to.ip(), 0)),
                MsgFlags::empty(),
            )
            .with_context(|| format!("sending to {to} as {from}"))?;
        }
        Ok(())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the spoofing thread panicked"))?
}

/// The UDP checksum over the IPv4 pseudo-header, the first six header bytes and the payload.
fn checksum(src: Ipv4Addr, dst: Ipv4Addr, head: &[u8], payload: &[u8]) -> u16 {
    let len = u16::try_from(8 + payload.len()).unwrap_or(u16::MAX);
    let mut bytes = Vec::with_capacity(20 + payload.len());
    bytes.extend_from_slice(&src.octets());
    bytes.extend_from_slice(&dst.octets());
    bytes.extend_from_slice(&[0, 17]);
    bytes.extend_from_slice(&len.to_be_bytes());
    bytes.extend_from_slice(&head[..6]);
    bytes.extend_from_slice(&[0, 0]);
    bytes.extend_from_slice(payload);
    let mut sum: u32 = 0;
    for pair in bytes.chunks(2) {
        let word = u16::from_be_bytes([pair[0], pair.get(1).copied().unwrap_or(0)]);
        sum += u32::from(word);
    }
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    match !(sum as u16) {
        0 => 0xFFFF,
        c => c,
    }
}
