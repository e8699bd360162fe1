//! The ordered crypto pool: one peer's packets sealed and opened on several threads, released
//! in the order they were read (issue 14, "every core").
//!
//! As in wireguard-go and the kernel, the reading thread does everything that needs the peer's
//! lock: it picks the session and the counter of each packet (`noise::Tunnel::reserve_send`,
//! `open_check`) and lays the packet out in a [`Job`]'s batch; the ChaCha20-Poly1305 work of
//! the job, a quantum of the lane (about 64 KiB), is done by whichever thread gets to it
//! first; and the reading thread hands jobs on strictly in the order it made them
//! ([`Ordered`]), so no flow is reordered, whatever finishes first. A job's lock is held while
//! it is worked, so waiting for the oldest job is locking it; a waiting thread works rather
//! than sleeps: the oldest job itself if nobody started it, else other queued jobs while a
//! worker finishes it. With no workers at all the pool degenerates into the inline path plus
//! one copy.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use crate::batch::PacketBatch;
use crate::noise::handshake::DATA_HEADER;
use crate::noise::{Keys, OpenTicket};
use crate::peer::Peer;
use crate::source::Source;

/// The most crypto workers a pool starts (more than any machine's cores is no use).
pub const MAX_WORKERS: usize = 64;

/// One AEAD operation on a slot of a job's batch.
pub struct Op {
    pub slot: usize,
    pub ticket: OpenTicket,
    /// Seal: the plaintext's length (after the 16-byte header). Open: the ciphertext's with
    /// its tag (from the slot's start).
    pub len: usize,
    pub kind: OpKind,
}

/// Which way an operation goes, with what the receive side needs once it is done.
pub enum OpKind {
    Seal,
    Open(Opening),
}

/// A received data message: who sent it, and its plaintext's length once it authenticated.
pub struct Opening {
    pub peer: Arc<Peer>,
    pub from: SocketAddr,
    pub local: Option<Source>,
    /// The datagram's length (for the peer's counters).
    pub datagram_len: usize,
    pub opened: Option<usize>,
}

impl Op {
    pub fn seal(slot: usize, keys: Arc<Keys>, counter: u64, len: usize) -> Self {
        Self {
            slot,
            ticket: OpenTicket { keys, counter },
            len,
            kind: OpKind::Seal,
        }
    }
}

/// A batch and the operations on its slots; slots without one are final already (handshake
/// messages, packets the inline path handled).
pub struct Job {
    pub batch: PacketBatch,
    pub ops: Vec<Op>,
}

impl Job {
    pub fn new(batch: PacketBatch) -> Self {
        Self {
            batch,
            ops: Vec::new(),
        }
    }

    fn clear(&mut self) {
        self.batch.clear();
        self.ops.clear();
    }

    /// Does the job's AEAD work.
    pub fn work(&mut self) {
        for op in &mut self.ops {
            let slot = self.batch.slot_mut(op.slot);
            let keys = &op.ticket.keys;
            match &mut op.kind {
                OpKind::Seal => {
                    if let Some(buf) = slot.get_mut(DATA_HEADER..) {
                        keys.send.seal(op.ticket.counter, &[], buf, op.len);
                    }
                }
                OpKind::Open(o) => {
                    o.opened = slot
                        .get_mut(..op.len)
                        .and_then(|buf| keys.recv.open(op.ticket.counter, &[], buf));
                }
            }
        }
    }
}

struct Cell {
    job: Option<Job>,
    done: bool,
}

type Shared = Arc<Mutex<Cell>>;

fn lock(cell: &Mutex<Cell>) -> MutexGuard<'_, Cell> {
    cell.lock().unwrap_or_else(PoisonError::into_inner)
}

struct Queue {
    jobs: Mutex<VecDeque<Shared>>,
    ready: Condvar,
    stop: AtomicBool,
}

/// The workers; see the module docs. Dropping the pool stops them.
pub struct CryptoPool {
    queue: Arc<Queue>,
    workers: Vec<JoinHandle<()>>,
}

impl CryptoPool {
    /// Starts `workers` threads (at most [`MAX_WORKERS`]), each running `init` first (the
    /// runner sets their priority there).
    pub fn new(workers: usize, init: impl Fn() + Send + Sync + 'static) -> std::io::Result<Self> {
        let queue = Arc::new(Queue {
            jobs: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let init = Arc::new(init);
        let mut pool = Self {
            queue,
            workers: Vec::new(),
        };
        for i in 0..workers.min(MAX_WORKERS) {
            let q = pool.queue.clone();
            let init = init.clone();
            let h = std::thread::Builder::new()
                .name(format!("wg-crypto-{i}"))
                .spawn(move || {
                    init();
                    work(&q)
                })?;
            pool.workers.push(h);
        }
        Ok(pool)
    }

    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// Takes the oldest job no worker has started, to work it on the calling thread.
    fn steal(&self) -> Option<Shared> {
        self.queue
            .jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front()
    }

    fn submit(&self, cell: Shared) {
        if self.workers.is_empty() {
            return;
        }
        self.queue
            .jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(cell);
        self.queue.ready.notify_one();
    }
}

impl Drop for CryptoPool {
    fn drop(&mut self) {
        self.queue.stop.store(true, Ordering::Release);
        self.queue.ready.notify_all();
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

fn work(q: &Queue) {
    loop {
        let cell = {
            let mut jobs = q.jobs.lock().unwrap_or_else(PoisonError::into_inner);
            loop {
                if q.stop.load(Ordering::Acquire) {
                    return;
                }
                if let Some(c) = jobs.pop_front() {
                    break c;
                }
                jobs = q.ready.wait(jobs).unwrap_or_else(PoisonError::into_inner);
            }
        };
        work_cell(&cell);
    }
}

/// Works a job unless someone did already.
fn work_cell(cell: &Mutex<Cell>) {
    let mut c = lock(cell);
    if !c.done {
        if let Some(job) = c.job.as_mut() {
            job.work();
        }
        c.done = true;
    }
}

/// One direction's jobs in flight, handed back in the order they were submitted.
pub struct Ordered {
    pool: Arc<CryptoPool>,
    in_flight: VecDeque<Shared>,
    max_in_flight: usize,
    spare: Vec<Job>,
}

impl Ordered {
    /// At most `max_in_flight` jobs out at once (at least one).
    pub fn new(pool: Arc<CryptoPool>, max_in_flight: usize) -> Self {
        Self {
            pool,
            in_flight: VecDeque::new(),
            max_in_flight: max_in_flight.max(1),
            spare: Vec::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.in_flight.is_empty()
    }

    pub fn is_full(&self) -> bool {
        self.in_flight.len() >= self.max_in_flight
    }

    /// An empty job to fill: a recycled one, or one around `make()`.
    pub fn spare(&mut self, make: impl FnOnce() -> PacketBatch) -> Job {
        self.spare.pop().unwrap_or_else(|| Job::new(make()))
    }

    /// Takes a job back for reuse once its batch was sent.
    pub fn recycle(&mut self, mut job: Job) {
        if self.spare.len() <= self.max_in_flight {
            job.clear();
            self.spare.push(job);
        }
    }

    /// Hands a filled job to the workers (a job without operations is done already).
    pub fn submit(&mut self, job: Job) {
        let done = job.ops.is_empty();
        let cell = Arc::new(Mutex::new(Cell {
            job: Some(job),
            done,
        }));
        if !done {
            self.pool.submit(cell.clone());
        }
        self.in_flight.push_back(cell);
    }

    /// The oldest job, worked. `wait`: if it is not done, wait for it: work it here if no
    /// worker has started it, and while a worker is on it, work other queued jobs (of either
    /// direction) rather than sleep; without `wait`, answer None while it is not done.
    pub fn next_done(&mut self, wait: bool) -> Option<Job> {
        let head = self.in_flight.front()?.clone();
        let mut c = loop {
            match head.try_lock() {
                Ok(c) => break c,
                Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) if !wait => return None,
                Err(std::sync::TryLockError::WouldBlock) => match self.pool.steal() {
                    Some(other) => work_cell(&other),
                    None => break lock(&head),
                },
            }
        };
        if !c.done {
            if !wait {
                return None;
            }
            if let Some(job) = c.job.as_mut() {
                job.work();
            }
            c.done = true;
        }
        let job = c.job.take();
        drop(c);
        self.in_flight.pop_front();
        job
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::noise::crypto::AeadKey;

    fn keys() -> Arc<Keys> {
        Arc::new(Keys {
            local_index: 1,
            remote_index: 2,
            send: AeadKey::new(&[5; 32]),
            recv: AeadKey::new(&[5; 32]),
        })
    }

    /// Jobs of numbered packets through 0 to 3 workers: every packet comes back sealed, in
    /// the order submitted, and opens with its counter.
    #[test]
    fn jobs_come_back_in_order_whatever_the_workers() {
        for workers in 0..4 {
            let pool = Arc::new(CryptoPool::new(workers, || {}).expect("threads"));
            let mut ordered = Ordered::new(pool, 3);
            let k = keys();
            let mut counter = 0u64;
            let mut seen = Vec::new();
            for j in 0..50u64 {
                let mut job = ordered.spare(|| PacketBatch::new(256, 8));
                for _ in 0..(j % 7 + 1) {
                    let slot = job.batch.next_slot();
                    slot[DATA_HEADER..DATA_HEADER + 8].copy_from_slice(&counter.to_le_bytes());
                    let i = job.batch.len();
                    job.batch
                        .commit(DATA_HEADER + 8 + 16, crate::batch::NO_ADDR);
                    job.ops.push(Op::seal(i, k.clone(), counter, 8));
                    counter += 1;
                }
                ordered.submit(job);
                while let Some(mut done) = ordered.next_done(ordered.is_full()) {
                    for op in &done.ops {
                        let mut body = done.batch.get(op.slot)[DATA_HEADER..].to_vec();
                        let n = k
                            .recv
                            .open(op.ticket.counter, &[], &mut body)
                            .expect("sealed");
                        assert_eq!(n, 8);
                        seen.push(u64::from_le_bytes(body[..8].try_into().expect("8")));
                    }
                    done.ops.clear();
                    ordered.recycle(done);
                }
            }
            while let Some(done) = ordered.next_done(true) {
                for op in &done.ops {
                    let mut body = done.batch.get(op.slot)[DATA_HEADER..].to_vec();
                    k.recv
                        .open(op.ticket.counter, &[], &mut body)
                        .expect("sealed");
                    seen.push(u64::from_le_bytes(body[..8].try_into().expect("8")));
                }
            }
            assert_eq!(seen, (0..counter).collect::<Vec<_>>(), "{workers} workers");
            assert!(ordered.is_empty());
        }
    }

    #[test]
    fn a_forged_slot_fails_to_open_and_the_rest_still_do() {
        let pool = Arc::new(CryptoPool::new(2, || {}).expect("threads"));
        let mut ordered = Ordered::new(pool, 2);
        let k = keys();
        let peer = Arc::new(Peer::new(crate::key::PublicKey([7; 32]), 1));
        let mut job = ordered.spare(|| PacketBatch::new(256, 4));
        for (i, c) in [0u64, 1, 2].into_iter().enumerate() {
            let mut buf = [0u8; 64];
            buf[..4].copy_from_slice(b"data");
            let n = k.send.seal(c, &[], &mut buf, 4);
            if c == 1 {
                buf[0] ^= 1;
            }
            job.batch.push(&buf[..n], crate::batch::NO_ADDR);
            let mut op = Op::seal(i, k.clone(), c, n);
            op.kind = OpKind::Open(Opening {
                peer: peer.clone(),
                from: crate::batch::NO_ADDR,
                local: None,
                datagram_len: n + DATA_HEADER,
                opened: None,
            });
            job.ops.push(op);
        }
        ordered.submit(job);
        let done = ordered.next_done(true).expect("job");
        let opened: Vec<_> = done
            .ops
            .iter()
            .map(|o| match &o.kind {
                OpKind::Open(o) => o.opened,
                OpKind::Seal => panic!("an open stays an open"),
            })
            .collect();
        assert_eq!(opened, vec![Some(4), None, Some(4)]);
        assert_eq!(&done.batch.get(2)[..4], b"data");
    }
}
