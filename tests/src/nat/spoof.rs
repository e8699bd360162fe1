//! Datagrams with a forged source address, sent from inside a lab namespace: a socket with
//! `IP_TRANSPARENT` may bind an address that is not its namespace's own (root only), so a
//! router's namespace can send what looks like a relay's datagram to a node behind it.

use std::net::SocketAddrV4;
use std::os::fd::AsRawFd as _;

use anyhow::{Context as _, Result};
use nix::sys::socket::{
    AddressFamily, MsgFlags, SockFlag, SockType, SockaddrIn, bind, sendto, setsockopt, socket,
    sockopt,
};

use crate::netns::on_thread_in;

/// Sends each of `datagrams` from `from` (any address, even another host's) to `to`, from a
/// thread inside namespace `ns`.
pub fn send_spoofed(
    ns: &str,
    from: SocketAddrV4,
    to: SocketAddrV4,
    datagrams: Vec<Vec<u8>>,
) -> Result<()> {
    on_thread_in(ns, move || {
        let fd = socket(
            AddressFamily::Inet,
            SockType::Datagram,
            SockFlag::empty(),
            None,
        )
        .context("a UDP socket")?;
        setsockopt(&fd, sockopt::IpTransparent, &true).context("IP_TRANSPARENT")?;
        bind(fd.as_raw_fd(), &SockaddrIn::from(from)).with_context(|| format!("binding {from}"))?;
        for d in &datagrams {
            sendto(fd.as_raw_fd(), d, &SockaddrIn::from(to), MsgFlags::empty())
                .with_context(|| format!("sending to {to} as {from}"))?;
        }
        Ok(())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the spoofing thread panicked"))?
}
