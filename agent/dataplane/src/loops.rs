//! The runner's two packet loops, one per direction, each written once: TUN to network
//! ([`tun_to_network`]) and network to TUN ([`network_to_tun`]).
//!
//! Each loop drains its device into a [`Lane`], hands the urgent packets of every read (small
//! ones, handshakes; see [`crate::lane`]) to the device at once, and works the rest off a
//! quantum at a time, reading again in between. Two things vary, each a configuration of the
//! same loop, not another copy of it:
//! - **the queue** ([`QueueConfig`]): on, the lane holds many reads, with priority for small
//!   packets, CoDel and byte bounds; off, the lane holds one read and hands it over whole
//!   (read a batch, process it, send it, read the next);
//! - **the crypto** ([`Strategy`]): inline, the reading thread seals or opens each chunk into
//!   its output batch and sends it; or the ordered crypto pool (`crate::pool`), each chunk a
//!   job, sent (sealed) or delivered (opened, through `Device::finish_opened`) in the order
//!   read, and everything in flight finished before the thread waits for its device. Urgent
//!   packets are always inline: they must not wait behind a job.
//!
//! What arrives from the network is classified in one place ([`wireguard`]), for the urgent
//! datagrams and the queued ones alike: WireGuard to the device, WireGuard a relay wrapped
//! unwrapped first (`crate::relay`), the rest (STUN, disco) to the side channel
//! (`crate::side`). Everything for the network leaves through `send_framed`, which frames what
//! goes through a relay. The runner hands each loop what it needs in a [`Loop`].

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::batch::PacketBatch;
use crate::codel::{CODEL_INTERVAL, CODEL_TARGET, Codel};
use crate::device::{Crypto, Device};
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

/// The slots of the network-to-TUN loop's batch for the network (handshake answers, packets
/// a new session lets out, cookies); it is sent after every chunk and every urgent read.
const TO_NETWORK_SLOTS: usize = 8;

/// How the packet loops queue; see [`crate::lane`]. The defaults are the design; each switch
/// turns one technique off to measure what it buys.
#[derive(Debug, Clone, Copy)]
pub struct QueueConfig {
    /// Drain the devices into queues and work them off a quantum at a time. Off: read a batch,
    /// process it whole, send it, read the next (no priority, no AQM, no byte bound; with the
    /// crypto pool, one job per read).
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

impl QueueConfig {
    /// The lane's AQM: only with the queue and the AQM on.
    fn codel(&self) -> Option<Codel> {
        (self.enabled && self.aqm)
            .then(|| Codel::new(CODEL_TARGET, CODEL_INTERVAL, CODEL_MIN_BYTES))
    }

    /// Whether urgent packets skip the lane: only with the queue and priority on.
    fn priority(&self) -> bool {
        self.enabled && self.priority
    }

    /// Bytes per chunk: the quantum, or a whole read with the queue off.
    fn quantum(&self) -> usize {
        if self.enabled {
            self.quantum
        } else {
            usize::MAX
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

/// Jobs in flight per direction and pool worker: one being worked, one being filled.
const JOBS_PER_WORKER: usize = 2;

/// Where a loop seals or opens its chunks; see the module docs.
enum Strategy {
    /// The reading thread, into the loop's output batch.
    Inline,
    /// The ordered crypto pool: a job per chunk, finished in the order submitted.
    Pool(Ordered),
}

impl Strategy {
    fn new(pool: Option<&Arc<CryptoPool>>) -> Self {
        match pool {
            Some(pool) => Self::Pool(Ordered::new(
                pool.clone(),
                JOBS_PER_WORKER * pool.workers().max(1),
            )),
            None => Self::Inline,
        }
    }

    /// Seals a chunk of packets: into `out`, or as a job of `slots` slots to the pool.
    fn seal<'a>(
        &mut self,
        device: &Device,
        now: Instant,
        packets: impl IntoIterator<Item = &'a [u8]>,
        out: &mut PacketBatch,
        slots: usize,
    ) {
        match self {
            Self::Inline => device.handle_tun(now, packets, Crypto::Inline(out)),
            Self::Pool(ordered) => {
                let mut job = ordered.spare(|| PacketBatch::for_datagrams(slots));
                device.handle_tun(now, packets, Crypto::Pool(&mut job));
                ordered.submit(job);
            }
        }
    }

    /// Opens a chunk of datagrams: the plaintext into `to_tun`, or as a job of `slots` slots
    /// to the pool; handshake answers into `to_network` either way.
    fn open<'a>(
        &mut self,
        device: &Device,
        now: Instant,
        datagrams: impl IntoIterator<Item = (&'a [u8], SocketAddr, Option<Source>)>,
        to_network: &mut PacketBatch,
        to_tun: &mut PacketBatch,
        slots: usize,
    ) {
        match self {
            Self::Inline => device.handle_udp(now, datagrams, to_network, Crypto::Inline(to_tun)),
            Self::Pool(ordered) => {
                let mut job = ordered.spare(|| PacketBatch::for_packets(slots));
                device.handle_udp(now, datagrams, to_network, Crypto::Pool(&mut job));
                ordered.submit(job);
            }
        }
    }

    /// Hands the pool's worked jobs to `each`, in order: all of them with `all` (before the
    /// thread waits for its device), else those done, waiting only while the pool is full.
    /// Inline: nothing is in flight.
    fn finished(
        &mut self,
        all: bool,
        mut each: impl FnMut(&mut Job) -> Result<(), LoopError>,
    ) -> Result<(), LoopError> {
        let Self::Pool(ordered) = self else {
            return Ok(());
        };
        while let Some(mut job) = ordered.next_done(all || ordered.is_full()) {
            each(&mut job)?;
            ordered.recycle(job);
        }
        Ok(())
    }
}

/// Sends `batch` (nothing when empty) from the current socket, relayed datagrams framed.
fn send<T, U: Udp>(s: &Loop<'_, T, U>, udp: &U, batch: &mut PacketBatch) -> Result<(), LoopError> {
    if !batch.is_empty() {
        send_framed(s.device.relays(), udp, batch).map_err(LoopError::Udp)?;
    }
    Ok(())
}

/// Reads the TUN into the lane until it is full or the TUN has nothing more (with the queue
/// off: one read); waits (up to the poll interval) only when the lane is empty. With priority,
/// the urgent packets of each read are sealed into `out` and sent at once, before the next
/// read.
fn drain_tun<T: Tun, U: Udp>(
    s: &Loop<'_, T, U>,
    lane: &mut Lane,
    out: &mut PacketBatch,
) -> Result<(), LoopError> {
    drain(
        s,
        lane,
        || PacketBatch::for_packets(s.batch),
        |batch, timeout| s.tun.recv(batch, timeout).map_err(LoopError::Tun),
        |batch, now| {
            take_urgent(batch, is_urgent_packet, |p, _, _| {
                s.device.handle_tun(now, [p], Crypto::Inline(&mut *out))
            });
            send(s, &*(s.udp)(), out)?;
            out.clear();
            Ok(())
        },
    )
}

/// The read loop both directions share: reads into a spare batch of the lane until the lane is
/// full or a read comes back short (with the queue off: one read), waiting (up to the poll
/// interval) only when the lane is empty; with priority, `urgent` handles each read's urgent
/// packets before the batch joins the lane.
fn drain<T: Tun, U: Udp>(
    s: &Loop<'_, T, U>,
    lane: &mut Lane,
    fresh: impl Fn() -> PacketBatch,
    mut read: impl FnMut(&mut PacketBatch, Duration) -> Result<usize, LoopError>,
    mut urgent: impl FnMut(&mut PacketBatch, Instant) -> Result<(), LoopError>,
) -> Result<(), LoopError> {
    while !lane.is_full() {
        let mut batch = lane.spare(&fresh);
        let n = read(&mut batch, lane.read_timeout(s.poll))?;
        let more = n >= batch.max();
        if n == 0 {
            lane.give_back(batch);
            break;
        }
        let now = Instant::now();
        if s.queue.priority() {
            urgent(&mut batch, now)?;
        }
        lane.push(batch, now);
        if !more || !s.queue.enabled {
            break;
        }
    }
    Ok(())
}

/// Reads the TUN, seals, sends; see the module docs.
pub(crate) fn tun_to_network<T: Tun, U: Udp>(s: &Loop<'_, T, U>) -> Result<(), LoopError> {
    let mut lane = Lane::new(TX_LANE_BYTES, usize::MAX, s.queue.codel());
    let mut crypto = Strategy::new(s.pool);
    let mut out = PacketBatch::for_datagrams(s.batch);
    while !s.shutdown.is_triggered() {
        if lane.is_empty() {
            crypto.finished(true, |job| send(s, &*(s.udp)(), &mut job.batch))?;
        }
        out.clear();
        drain_tun(s, &mut lane, &mut out)?;
        let now = Instant::now();
        if let Some(chunk) = lane.next_chunk(now, s.queue.quantum()) {
            s.device.count_queue_dropped(chunk.dropped);
            let packets = chunk.datagrams().map(|(p, _, _)| p);
            crypto.seal(s.device, now, packets, &mut out, s.batch);
        }
        send(s, &*(s.udp)(), &mut out)?;
        crypto.finished(false, |job| send(s, &*(s.udp)(), &mut job.batch))?;
    }
    Ok(())
}

/// The WireGuard datagram in `d` and its source for the device: `d` itself, or the inner
/// datagram of a relay `recv` with the relay endpoint as its source; None when `d` went to the
/// side channel (counted when it is full). Without a side channel everything is the device's
/// (which counts what is not WireGuard as malformed). The one classification of both the
/// urgent and the queued datagrams.
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

/// The chunk's WireGuard datagrams, classified by [`wireguard`].
fn wireguard_only<'c, T, U>(
    s: &'c Loop<'_, T, U>,
    chunk: &'c Chunk<'_>,
) -> impl Iterator<Item = (&'c [u8], SocketAddr, Option<Source>)> + 'c {
    chunk
        .datagrams()
        .filter_map(move |(d, from, local)| wireguard(s, d, from).map(|(d, from)| (d, from, local)))
}

/// Reads the socket into the lane; see `drain_tun`. Urgent datagrams are opened inline into
/// `to_tun` and `to_network` and both sent before the next read: a handshake's answer and the
/// packets a new session lets out, and small packets for the host.
fn drain_udp<T: Tun, U: Udp>(
    s: &Loop<'_, T, U>,
    udp: &U,
    lane: &mut Lane,
    to_network: &mut PacketBatch,
    to_tun: &mut PacketBatch,
) -> Result<(), LoopError> {
    drain(
        s,
        lane,
        || PacketBatch::for_datagrams(s.batch),
        |batch, timeout| udp.recv(batch, timeout).map_err(LoopError::Udp),
        |batch, now| {
            take_urgent(batch, is_urgent_datagram, |d, from, local| {
                if let Some((d, from)) = wireguard(s, d, from) {
                    s.device.handle_udp(
                        now,
                        [(d, from, local)],
                        to_network,
                        Crypto::Inline(&mut *to_tun),
                    );
                }
            });
            flush(s, udp, to_network, to_tun)
        },
    )
}

/// Reads the socket, opens, writes the TUN; see the module docs.
pub(crate) fn network_to_tun<T: Tun, U: Udp>(s: &Loop<'_, T, U>) -> Result<(), LoopError> {
    let mut lane = Lane::new(RX_LANE_BYTES, RX_LANE_DATAGRAMS, s.queue.codel());
    let mut crypto = Strategy::new(s.pool);
    let mut to_network = PacketBatch::for_datagrams(TO_NETWORK_SLOTS);
    let mut to_tun = PacketBatch::for_packets(s.batch);
    // A job the pool opened: finished (replay windows, roaming, allowed IPs) and delivered.
    let deliver = |udp: &U, job: &mut Job, to_network: &mut PacketBatch| -> Result<(), LoopError> {
        s.device.finish_opened(Instant::now(), job, to_network);
        if !job.batch.is_empty() {
            s.tun.send(&job.batch).map_err(LoopError::Tun)?;
        }
        send(s, udp, to_network)?;
        to_network.clear();
        Ok(())
    };
    while !s.shutdown.is_triggered() {
        let udp = (s.udp)();
        if lane.is_empty() {
            crypto.finished(true, |job| deliver(&udp, job, &mut to_network))?;
        }
        to_network.clear();
        to_tun.clear();
        drain_udp(s, &udp, &mut lane, &mut to_network, &mut to_tun)?;
        flush(s, &udp, &mut to_network, &mut to_tun)?;
        let now = Instant::now();
        if let Some(chunk) = lane.next_chunk(now, s.queue.quantum()) {
            s.device.count_queue_dropped(chunk.dropped);
            let datagrams = wireguard_only(s, &chunk);
            crypto.open(
                s.device,
                now,
                datagrams,
                &mut to_network,
                &mut to_tun,
                s.batch,
            );
        }
        flush(s, &udp, &mut to_network, &mut to_tun)?;
        crypto.finished(false, |job| deliver(&udp, job, &mut to_network))?;
    }
    Ok(())
}

/// Writes `to_tun` to the TUN, then sends `to_network`; both left empty.
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
    send(s, udp, to_network)?;
    to_network.clear();
    Ok(())
}
