//! In-memory TUN devices and a virtual UDP network, so the whole packet path runs in unit
//! tests and benches without root.
//!
//! - `tun_pair()` links two `MemoryTun`s: what one sends, the other receives. One end is the
//!   data plane's device, the other plays the host's IP stack.
//! - `MemoryNetwork` delivers datagrams between `MemorySocket`s bound to virtual addresses,
//!   and drops what is sent to an address nobody bound, like a real network.
//!
//! Queues are bounded (`QUEUE_LIMIT`); a full queue drops, as a kernel buffer would.
//!
//! Compiled only for this crate's tests and with the `test-support` feature (the integration
//! tests and benches/ turn it on), so plexd never ships it.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::batch::PacketBatch;
use crate::io::{Tun, Udp, UdpBind};

/// Packets a queue holds before it drops.
pub(crate) const QUEUE_LIMIT: usize = 4096;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A bounded queue of (address, packet) with a condition variable for blocking reads.
#[derive(Default)]
struct Pipe {
    queue: Mutex<Queue>,
    ready: Condvar,
}

#[derive(Default)]
struct Queue {
    packets: VecDeque<(SocketAddr, Vec<u8>)>,
    /// Buffers handed back by readers, reused by writers.
    spare: Vec<Vec<u8>>,
    dropped: u64,
}

impl Pipe {
    fn push_all<'a>(&self, items: impl Iterator<Item = (&'a [u8], SocketAddr)>) -> usize {
        let mut q = lock(&self.queue);
        let mut n = 0;
        for (packet, addr) in items {
            if q.packets.len() >= QUEUE_LIMIT {
                q.dropped += 1;
                continue;
            }
            let mut buf = q.spare.pop().unwrap_or_default();
            buf.clear();
            buf.extend_from_slice(packet);
            q.packets.push_back((addr, buf));
            n += 1;
        }
        drop(q);
        if n > 0 {
            self.ready.notify_one();
        }
        n
    }

    fn pop_into(&self, batch: &mut PacketBatch, timeout: Duration) -> usize {
        batch.clear();
        let q = lock(&self.queue);
        let (mut q, _) = self
            .ready
            .wait_timeout_while(q, timeout, |q| q.packets.is_empty())
            .unwrap_or_else(PoisonError::into_inner);
        while !batch.is_full() {
            let Some((addr, buf)) = q.packets.pop_front() else {
                break;
            };
            batch.push(&buf, addr);
            q.spare.push(buf);
        }
        batch.len()
    }

    fn dropped(&self) -> u64 {
        lock(&self.queue).dropped
    }
}

/// One end of an in-memory TUN link (see `tun_pair`).
pub struct MemoryTun {
    inbox: Arc<Pipe>,
    peer_inbox: Arc<Pipe>,
}

/// Two linked in-memory TUN ends: packets sent on one are received on the other.
pub fn tun_pair() -> (MemoryTun, MemoryTun) {
    let a = Arc::new(Pipe::default());
    let b = Arc::new(Pipe::default());
    (
        MemoryTun {
            inbox: a.clone(),
            peer_inbox: b.clone(),
        },
        MemoryTun {
            inbox: b,
            peer_inbox: a,
        },
    )
}

impl MemoryTun {
    /// Sends one packet to the other end.
    pub fn send_one(&self, packet: &[u8]) {
        let unspecified = SocketAddr::from(([0, 0, 0, 0], 0));
        self.peer_inbox
            .push_all(std::iter::once((packet, unspecified)));
    }

    /// Packets this end dropped because its queue was full.
    pub fn dropped(&self) -> u64 {
        self.inbox.dropped()
    }
}

impl Tun for MemoryTun {
    fn recv(&self, batch: &mut PacketBatch, timeout: Duration) -> io::Result<usize> {
        Ok(self.inbox.pop_into(batch, timeout))
    }

    fn send(&self, batch: &PacketBatch) -> io::Result<usize> {
        Ok(self.peer_inbox.push_all(batch.iter()))
    }
}

/// A virtual UDP network; clone it to share.
#[derive(Clone, Default)]
pub struct MemoryNetwork {
    sockets: Arc<Mutex<NetworkState>>,
}

#[derive(Default)]
struct NetworkState {
    bound: HashMap<SocketAddr, Arc<Pipe>>,
    next_port: u16,
}

impl MemoryNetwork {
    pub fn new() -> Self {
        Self::default()
    }

    /// Binds `addr` (port 0: a free port from 40000 up).
    pub fn bind(&self, addr: SocketAddr) -> io::Result<MemorySocket> {
        let mut state = lock(&self.sockets);
        let mut addr = addr;
        if addr.port() == 0 {
            loop {
                state.next_port = state.next_port.wrapping_add(1);
                let port = 40_000 + state.next_port % 20_000;
                addr.set_port(port);
                if !state.bound.contains_key(&addr) {
                    break;
                }
            }
        }
        if state.bound.contains_key(&addr) {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{addr} is already bound on the in-memory network"),
            ));
        }
        let inbox = Arc::new(Pipe::default());
        state.bound.insert(addr, inbox.clone());
        Ok(MemorySocket {
            addr,
            inbox,
            network: self.clone(),
        })
    }

    /// A binder for the runner: sockets on `ip`, on the port it asks for.
    pub fn binder(&self, ip: IpAddr) -> MemoryBinder {
        MemoryBinder {
            network: self.clone(),
            ip,
        }
    }

    fn deliver(&self, batch: &PacketBatch, from: SocketAddr) -> usize {
        let state = lock(&self.sockets);
        let mut sent = 0;
        for (packet, to) in batch.iter() {
            if let Some(inbox) = state.bound.get(&to) {
                sent += inbox.push_all(std::iter::once((packet, from)));
            }
        }
        sent
    }
}

/// A socket on a `MemoryNetwork`; unbinds on drop.
pub struct MemorySocket {
    addr: SocketAddr,
    inbox: Arc<Pipe>,
    network: MemoryNetwork,
}

impl MemorySocket {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MemorySocket {
    fn drop(&mut self) {
        lock(&self.network.sockets).bound.remove(&self.addr);
    }
}

impl Udp for MemorySocket {
    fn recv(&self, batch: &mut PacketBatch, timeout: Duration) -> io::Result<usize> {
        Ok(self.inbox.pop_into(batch, timeout))
    }

    fn send(&self, batch: &PacketBatch) -> io::Result<usize> {
        Ok(self.network.deliver(batch, self.addr))
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

/// Binds sockets on one virtual IP of a `MemoryNetwork`.
#[derive(Clone)]
pub struct MemoryBinder {
    network: MemoryNetwork,
    ip: IpAddr,
}

impl UdpBind for MemoryBinder {
    type Socket = MemorySocket;

    fn bind(&self, port: u16) -> io::Result<MemorySocket> {
        self.network.bind(SocketAddr::new(self.ip, port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tun_ends_are_linked_both_ways() {
        let (a, b) = tun_pair();
        a.send_one(b"to b");
        let mut batch = PacketBatch::new(64, 8);
        assert_eq!(b.recv(&mut batch, Duration::ZERO).expect("recv"), 1);
        assert_eq!(batch.get(0), b"to b");
        b.send(&batch).expect("send");
        assert_eq!(a.recv(&mut batch, Duration::ZERO).expect("recv"), 1);
        assert_eq!(a.recv(&mut batch, Duration::ZERO).expect("recv"), 0);
    }

    #[test]
    fn datagrams_reach_bound_sockets_with_their_source_and_unbound_ones_are_dropped() {
        let net = MemoryNetwork::new();
        let a = net
            .bind("10.0.0.1:51820".parse().expect("addr"))
            .expect("bind a");
        let b = net
            .bind("10.0.0.2:0".parse().expect("addr"))
            .expect("bind b");
        assert!(net.bind(a.addr()).is_err(), "double bind is refused");
        let mut out = PacketBatch::new(64, 4);
        out.push(b"hello", b.addr());
        out.push(b"lost", "10.0.0.9:1".parse().expect("addr"));
        assert_eq!(a.send(&out).expect("send"), 1);
        let mut batch = PacketBatch::new(64, 4);
        assert_eq!(b.recv(&mut batch, Duration::ZERO).expect("recv"), 1);
        assert_eq!(batch.get(0), b"hello");
        assert_eq!(batch.addr(0), a.addr());
        let port = a.addr().port();
        drop(a);
        let again = net.binder("10.0.0.1".parse().expect("ip")).bind(port);
        assert!(again.is_ok(), "a dropped socket frees its address");
    }
}
