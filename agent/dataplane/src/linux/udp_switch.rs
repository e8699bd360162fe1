//! The WireGuard UDP socket under the operator's offload switch ([`UdpOffloadSwitch`]): a
//! binder and socket around [`LinuxUdpBinder`]/[`LinuxUdp`] that apply a new request at the
//! next send or receive (the receive thread wakes at least every poll interval, so within
//! about 100 ms even without traffic) and report what the kernel does after it. A rebind
//! (a new listen port) applies the current request to the new socket.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::udp::{LinuxUdp, LinuxUdpBinder};
use crate::batch::PacketBatch;
use crate::io::{Udp, UdpBind};
use crate::udp_offload::UdpOffloadSwitch;

/// Binds [`SwitchedUdp`] sockets: `inner` says what the socket may use, `switch` whether it
/// does now.
#[derive(Debug, Clone)]
pub struct SwitchedBinder {
    pub inner: LinuxUdpBinder,
    pub switch: Arc<UdpOffloadSwitch>,
}

/// A [`LinuxUdp`] that follows the switch.
pub struct SwitchedUdp {
    inner: LinuxUdp,
    /// What the socket may use when the switch allows it.
    config: LinuxUdpBinder,
    switch: Arc<UdpOffloadSwitch>,
    /// The switch generation this socket applied.
    applied: AtomicU64,
}

impl UdpBind for SwitchedBinder {
    type Socket = SwitchedUdp;

    fn bind(&self, port: u16) -> io::Result<SwitchedUdp> {
        let socket = SwitchedUdp {
            inner: self.inner.bind(port)?,
            config: self.inner,
            switch: self.switch.clone(),
            applied: AtomicU64::new(0),
        };
        socket.follow();
        Ok(socket)
    }
}

impl SwitchedUdp {
    /// Applies the switch's request if this socket has not yet (one atomic load otherwise).
    fn follow(&self) {
        let seen = self.applied.load(Ordering::Relaxed);
        let Some((generation, allowed)) = self.switch.pending(seen) else {
            return;
        };
        // Both threads may see the request; the one that moves the generation applies it.
        if self
            .applied
            .compare_exchange(seen, generation, Ordering::SeqCst, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let (gso, gro) = self
            .inner
            .set_offload(allowed && self.config.gso, allowed && self.config.gro);
        tracing::info!(
            gso,
            gro,
            allowed,
            "UDP offload of the WireGuard socket: GSO {}, GRO {}",
            on(gso),
            on(gro)
        );
        self.switch.report(generation, gso, gro);
    }
}

fn on(b: bool) -> &'static str {
    if b { "on" } else { "off" }
}

impl Udp for SwitchedUdp {
    fn recv(&self, batch: &mut PacketBatch, timeout: Duration) -> io::Result<usize> {
        self.follow();
        self.inner.recv(batch, timeout)
    }

    fn send(&self, batch: &PacketBatch) -> io::Result<usize> {
        self.follow();
        self.inner.send(batch)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use nix::sys::socket::{getsockopt, sockopt};

    use super::*;

    /// The socket's `UDP_GRO` as the kernel reports it (not as the switch says).
    fn kernel_gro(s: &SwitchedUdp) -> bool {
        getsockopt(&s.inner.as_fd(), sockopt::UdpGroSegment).expect("getsockopt UDP_GRO")
    }

    fn one_round_trip(a: &SwitchedUdp, b: &SwitchedUdp, what: &[u8]) {
        let to = SocketAddr::from(([127, 0, 0, 1], b.local_addr().expect("addr").port()));
        let mut out = PacketBatch::new(64, 2);
        out.push(what, to);
        out.push(what, to);
        assert_eq!(a.send(&out).expect("send"), 2);
        let mut got = PacketBatch::new(64, 8);
        let mut seen = Vec::new();
        for _ in 0..50 {
            b.recv(&mut got, Duration::from_millis(100)).expect("recv");
            seen.extend(got.datagrams().map(|(d, _)| d.to_vec()));
            if seen.len() >= 2 {
                break;
            }
        }
        assert_eq!(seen, vec![what.to_vec(), what.to_vec()]);
    }

    #[test]
    fn the_switch_turns_gso_and_gro_off_and_on_on_a_live_socket() {
        let switch = Arc::new(UdpOffloadSwitch::new(true));
        let binder = SwitchedBinder {
            inner: LinuxUdpBinder::default(),
            switch: switch.clone(),
        };
        let a = binder.bind(0).expect("bind a");
        let b = binder.bind(0).expect("bind b");
        let s = switch.state();
        assert!(s.applied && s.gso && s.gro, "{s:?}");
        assert!(kernel_gro(&b));
        one_round_trip(&a, &b, b"on");

        switch.set(false);
        assert!(!switch.state().applied);
        one_round_trip(&a, &b, b"off");
        let s = switch.state();
        assert!(s.applied && !s.gso && !s.gro && !s.allowed, "{s:?}");
        assert!(
            !kernel_gro(&a) && !kernel_gro(&b),
            "UDP_GRO is off in the kernel"
        );

        switch.set(true);
        one_round_trip(&a, &b, b"again");
        assert!(switch.state().gso && kernel_gro(&a) && kernel_gro(&b));
    }

    #[test]
    fn a_socket_bound_while_off_starts_off_and_a_binder_without_gro_never_gets_it() {
        let switch = Arc::new(UdpOffloadSwitch::new(false));
        let binder = SwitchedBinder {
            inner: LinuxUdpBinder::default(),
            switch: switch.clone(),
        };
        let a = binder.bind(0).expect("bind");
        assert!(!kernel_gro(&a) && !switch.state().gso);
        let plain = SwitchedBinder {
            inner: LinuxUdpBinder {
                gro: false,
                ..LinuxUdpBinder::default()
            },
            switch: Arc::new(UdpOffloadSwitch::new(true)),
        };
        let b = plain.bind(0).expect("bind");
        assert!(!kernel_gro(&b), "GRO was not asked for");
        assert!(plain.switch.state().gso);
    }
}
