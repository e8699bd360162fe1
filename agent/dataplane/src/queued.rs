//! The runner's two packet threads with a queue in front of the cipher (`QueueConfig::enabled`):
//! each drains its device into a [`Lane`], sends the small packets of every read at once, and
//! works the rest off a quantum at a time, draining again in between; see [`crate::lane`].
//! The runner hands each loop what it needs in a [`Loop`].

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::batch::PacketBatch;
use crate::codel::{CODEL_INTERVAL, CODEL_TARGET, Codel};
use crate::device::Device;
use crate::io::{Tun, Udp};
use crate::lane::{
    Chunk, Lane, RX_LANE_BYTES, RX_LANE_DATAGRAMS, TX_LANE_BYTES, is_urgent_datagram,
    is_urgent_packet, take_urgent,
};
use crate::pool::{CryptoPool, Job, Ordered};
use crate::relay::send_framed;
use crate::shutdown::Shutdown;
use crate::side::SideSink;
use crate::side::is_wireguard;
use crate::source::Source;

/// A queue holding less than this is never dropped from (one TSO/GRO super-packet).
const CODEL_MIN_BYTES: usize = 64 << 10;

/// How the packet threads queue; see [`crate::lane`]. The defaults are the design; each switch
/// turns one technique off to measure what it buys.
#[derive(Debug, Clone, Copy)]
pub struct QueueConfig {
    /// Drain the devices into queues and work them off a quantum at a time. Off: read a batch,
    /// process it whole, send it, read the next (no priority, no AQM, no byte bound).
    pub enabled: bool,
    /// CoDel on the queues' sojourn time (off: only the byte bound limits them).
    pub aqm: bool,
    /// Handshakes, keepalives and small packets ahead of the queue.
    pub priority: bool,
    /// Bytes encrypted or decrypted between two looks at the devices.
    pub quantum: usize,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            aqm: true,
            priority: true,
            quantum: crate::lane::QUANTUM_BYTES,
        }
    }
}

/// What a packet loop works with, lent by the runner.
pub(crate) struct Loop<'a, T, U> {
    pub device: &'a Device,
    pub tun: &'a T,
    /// The current UDP socket (it changes when the listen port does).
    pub udp: &'a dyn Fn() -> Arc<U>,
    pub side: Option<&'a SideSink>,
    pub batch: usize,
    pub poll: Duration,
    pub queue: QueueConfig,
    pub shutdown: &'a Shutdown,
    /// The crypto pool, when `RunConfig::crypto_workers` asks for one.
    pub pool: Option<&'a Arc<CryptoPool>>,
}

/// A packet loop, as the runner starts it.
pub(crate) type LoopFn<T, U> = fn(&Loop<'_, T, U>) -> Result<(), LoopError>;

/// Which device failed.
pub(crate) enum LoopError {
    Tun(io::Error),
    Udp(io::Error),
}

impl QueueConfig {
    fn codel(&self) -> Option<Codel> {
        self.aqm
            .then(|| Codel::new(CODEL_TARGET, CODEL_INTERVAL, CODEL_MIN_BYTES))
    }
}

/// Reads the TUN into the lane until it is full or the TUN has nothing more; waits (up to the
/// poll interval) only when the lane is empty. The urgent packets of each read are encrypted
/// and sent at once, before the next read.
fn drain_tun<T: Tun, U: Udp>(
    s: &Loop<'_, T, U>,
    lane: &mut Lane,
    out: &mut PacketBatch,
) -> Result<(), LoopError> {
    let q = s.queue;
    while !lane.is_full() {
        let mut batch = lane.spare(|| PacketBatch::for_packets(s.batch));
        let timeout = if lane.is_empty() {
            s.poll
        } else {
            Duration::ZERO
        };
        let n = s.tun.recv(&mut batch, timeout).map_err(LoopError::Tun)?;
        let more = n >= batch.max();
        if n == 0 {
            lane.give_back(batch);
            break;
        }
        let now = Instant::now();
        if q.priority {
            take_urgent(&mut batch, is_urgent_packet, |p, _, _| {
                s.device.handle_tun_packet(now, p, out)
            });
            if !out.is_empty() {
                send_framed(s.device.relays(), &*(s.udp)(), out).map_err(LoopError::Udp)?;
                out.clear();
            }
        }
        lane.push(batch, now);
        if !more {
            break;
        }
    }
    Ok(())
}

/// Jobs in flight per direction and pool worker: one being worked, one being filled.
const JOBS_PER_WORKER: usize = 2;

fn ordered<T, U>(s: &Loop<'_, T, U>) -> Option<Ordered> {
    s.pool
        .map(|pool| Ordered::new(pool.clone(), JOBS_PER_WORKER * pool.workers().max(1)))
}

pub(super) fn tun_to_network<T: Tun, U: Udp>(s: &Loop<'_, T, U>) -> Result<(), LoopError> {
    if let Some(ordered) = ordered(s) {
        return tun_to_network_pooled(s, ordered);
    }
    let q = s.queue;
    let mut lane = Lane::new(TX_LANE_BYTES, usize::MAX, q.codel());
    let mut out = PacketBatch::for_datagrams(s.batch);
    while !s.shutdown.is_triggered() {
        out.clear();
        drain_tun(s, &mut lane, &mut out)?;
        let now = Instant::now();
        if let Some(chunk) = lane.next_chunk(now, q.quantum) {
            s.device.count_queue_dropped(chunk.dropped);
            s.device
                .handle_tun_iter(now, chunk.datagrams().map(|(p, _, _)| p), &mut out);
        }
        if !out.is_empty() {
            send_framed(s.device.relays(), &*(s.udp)(), &mut out).map_err(LoopError::Udp)?;
        }
    }
    Ok(())
}

/// One datagram outside a chunk (an urgent one): WireGuard (relayed WireGuard unwrapped, see
/// [`crate::relay`]) to the device, the rest to the side channel.
fn urgent_datagram<T: Tun, U: Udp>(
    s: &Loop<'_, T, U>,
    now: Instant,
    d: &[u8],
    (from, local): (SocketAddr, Option<Source>),
    to_network: &mut PacketBatch,
    to_tun: &mut PacketBatch,
) {
    let Some((d, from)) = wireguard(s, d, from) else {
        return;
    };
    s.device
        .handle_udp_datagram_at(now, (from, local), d, to_network, to_tun);
}

/// The WireGuard datagram in `d` and its source for the device: `d` itself, or the inner
/// datagram of a relay `recv` with the relay endpoint as its source; None when `d` went to the
/// side channel (counted when it is full).
fn wireguard<'d, T, U>(
    s: &Loop<'_, T, U>,
    d: &'d [u8],
    from: SocketAddr,
) -> Option<(&'d [u8], SocketAddr)> {
    let Some(side) = s.side else {
        return Some((d, from));
    };
    if is_wireguard(d) {
        return Some((d, from));
    }
    if let Some(relayed) = s.device.relays().unwrap(d, from) {
        return Some(relayed);
    }
    if !side.offer(d, from) {
        s.device.count_side_dropped();
    }
    None
}

/// Reads the socket into the lane; see `drain_tun`.
fn drain_udp<T: Tun, U: Udp>(
    s: &Loop<'_, T, U>,
    udp: &U,
    lane: &mut Lane,
    to_network: &mut PacketBatch,
    to_tun: &mut PacketBatch,
) -> Result<(), LoopError> {
    let q = s.queue;
    while !lane.is_full() {
        let mut batch = lane.spare(|| PacketBatch::for_datagrams(s.batch));
        let timeout = if lane.is_empty() {
            s.poll
        } else {
            Duration::ZERO
        };
        let n = udp.recv(&mut batch, timeout).map_err(LoopError::Udp)?;
        let more = n >= batch.max();
        if n == 0 {
            lane.give_back(batch);
            break;
        }
        let now = Instant::now();
        if q.priority {
            take_urgent(&mut batch, is_urgent_datagram, |d, from, local| {
                urgent_datagram(s, now, d, (from, local), to_network, to_tun)
            });
            // Out before the next read: a handshake's answer and the packets boringtun queued
            // behind it, and small packets for the host.
            flush(s, udp, to_network, to_tun)?;
        }
        lane.push(batch, now);
        if !more {
            break;
        }
    }
    Ok(())
}

/// `tun_to_network` with the crypto pool: each quantum becomes a job, sealed by the pool and
/// sent in the order read. Before the thread waits for the TUN, everything in flight is sent.
fn tun_to_network_pooled<T: Tun, U: Udp>(
    s: &Loop<'_, T, U>,
    mut ordered: Ordered,
) -> Result<(), LoopError> {
    let q = s.queue;
    let mut lane = Lane::new(TX_LANE_BYTES, usize::MAX, q.codel());
    let mut urgent = PacketBatch::for_datagrams(s.batch);
    let send = |job: &mut Job| -> Result<(), LoopError> {
        if !job.batch.is_empty() {
            send_framed(s.device.relays(), &*(s.udp)(), &mut job.batch).map_err(LoopError::Udp)?;
        }
        Ok(())
    };
    while !s.shutdown.is_triggered() {
        if lane.is_empty() {
            while let Some(mut job) = ordered.next_done(true) {
                send(&mut job)?;
                ordered.recycle(job);
            }
        }
        urgent.clear();
        drain_tun(s, &mut lane, &mut urgent)?;
        let now = Instant::now();
        if let Some(chunk) = lane.next_chunk(now, q.quantum) {
            s.device.count_queue_dropped(chunk.dropped);
            let mut job = ordered.spare(|| PacketBatch::for_datagrams(s.batch));
            s.device
                .handle_tun_iter_deferred(now, chunk.datagrams().map(|(p, _, _)| p), &mut job);
            ordered.submit(job);
        }
        while let Some(mut job) = ordered.next_done(ordered.is_full()) {
            send(&mut job)?;
            ordered.recycle(job);
        }
    }
    Ok(())
}

pub(super) fn network_to_tun<T: Tun, U: Udp>(s: &Loop<'_, T, U>) -> Result<(), LoopError> {
    if let Some(ordered) = ordered(s) {
        return network_to_tun_pooled(s, ordered);
    }
    let q = s.queue;
    let mut lane = Lane::new(RX_LANE_BYTES, RX_LANE_DATAGRAMS, q.codel());
    let mut to_network = PacketBatch::for_datagrams(8);
    let mut to_tun = PacketBatch::for_packets(s.batch);
    while !s.shutdown.is_triggered() {
        let udp = (s.udp)();
        to_network.clear();
        to_tun.clear();
        drain_udp(s, &udp, &mut lane, &mut to_network, &mut to_tun)?;
        flush(s, &udp, &mut to_network, &mut to_tun)?;
        let now = Instant::now();
        if let Some(chunk) = lane.next_chunk(now, q.quantum) {
            s.device.count_queue_dropped(chunk.dropped);
            let datagrams = wireguard_only(s, &chunk);
            s.device
                .handle_udp_iter(now, datagrams, &mut to_network, &mut to_tun);
        }
        flush(s, &udp, &mut to_network, &mut to_tun)?;
    }
    Ok(())
}

/// `network_to_tun` with the crypto pool: each quantum becomes a job, opened by the pool and
/// delivered (replay window, roaming, allowed IPs) in the order read.
fn network_to_tun_pooled<T: Tun, U: Udp>(
    s: &Loop<'_, T, U>,
    mut ordered: Ordered,
) -> Result<(), LoopError> {
    let q = s.queue;
    let mut lane = Lane::new(RX_LANE_BYTES, RX_LANE_DATAGRAMS, q.codel());
    let mut to_network = PacketBatch::for_datagrams(8);
    let mut to_tun = PacketBatch::for_packets(s.batch);
    let deliver = |mut job: Job, ordered: &mut Ordered, udp: &U, to_network: &mut PacketBatch| {
        s.device.finish_opened(Instant::now(), &mut job, to_network);
        if !job.batch.is_empty() {
            s.tun.send(&job.batch).map_err(LoopError::Tun)?;
        }
        ordered.recycle(job);
        if !to_network.is_empty() {
            send_framed(s.device.relays(), udp, to_network).map_err(LoopError::Udp)?;
            to_network.clear();
        }
        Ok::<(), LoopError>(())
    };
    while !s.shutdown.is_triggered() {
        let udp = (s.udp)();
        if lane.is_empty() {
            while let Some(job) = ordered.next_done(true) {
                deliver(job, &mut ordered, &udp, &mut to_network)?;
            }
        }
        to_network.clear();
        to_tun.clear();
        drain_udp(s, &udp, &mut lane, &mut to_network, &mut to_tun)?;
        flush(s, &udp, &mut to_network, &mut to_tun)?;
        let now = Instant::now();
        if let Some(chunk) = lane.next_chunk(now, q.quantum) {
            s.device.count_queue_dropped(chunk.dropped);
            let datagrams = wireguard_only(s, &chunk);
            let mut job = ordered.spare(|| PacketBatch::for_packets(s.batch));
            s.device
                .handle_udp_iter_deferred(now, datagrams, &mut to_network, &mut job);
            ordered.submit(job);
        }
        flush(s, &udp, &mut to_network, &mut to_tun)?;
        while let Some(job) = ordered.next_done(ordered.is_full()) {
            deliver(job, &mut ordered, &udp, &mut to_network)?;
        }
    }
    Ok(())
}

/// The chunk's WireGuard datagrams, relayed ones unwrapped; the others go to the side channel
/// (counted when it is full).
fn wireguard_only<'c, T, U>(
    s: &'c Loop<'_, T, U>,
    chunk: &'c Chunk<'_>,
) -> impl Iterator<Item = (&'c [u8], SocketAddr, Option<Source>)> + 'c {
    chunk
        .datagrams()
        .filter_map(move |(d, from, local)| wireguard(s, d, from).map(|(d, from)| (d, from, local)))
}

fn flush<T: Tun, U: Udp>(
    s: &Loop<'_, T, U>,
    udp: &U,
    to_network: &mut PacketBatch,
    to_tun: &mut PacketBatch,
) -> Result<(), LoopError> {
    if !to_tun.is_empty() {
        s.tun.send(to_tun).map_err(LoopError::Tun)?;
        to_tun.clear();
    }
    if !to_network.is_empty() {
        send_framed(s.device.relays(), udp, to_network).map_err(LoopError::Udp)?;
        to_network.clear();
    }
    Ok(())
}
