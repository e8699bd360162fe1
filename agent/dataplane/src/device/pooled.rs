//! The crypto pool's half of the inbound path: a data message on a session of plexd's own
//! protocol is only checked and laid out in a job with an operation to open it (any thread
//! may, `crate::pool`); the job, once worked, is finished here in the order it was read:
//! replay windows marked, the peer followed, the plaintext kept only where it may go.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::machine::{Machine, Protocol};
use crate::noise::Output;
use crate::noise::handshake::{DATA, DATA_HEADER, DATA_MIN, le32};
use crate::pool::{Job, Op, OpKind, Opening};

use crate::batch::PacketBatch;
use crate::source::Source;

use super::inbound::follow;
use super::{Counters, Device, State};

impl Device {
    /// One datagram of `handle_udp` with `Crypto::Pool(job)`: a data message on a session of
    /// plexd's own protocol is only checked and laid out in `job` with an operation to open
    /// it; the rest (handshakes, other peers) as inline, into `job`'s batch and `to_network`.
    pub(super) fn datagram_deferred(
        &self,
        state: &State,
        now: Instant,
        (from, local): (SocketAddr, Option<Source>),
        d: &[u8],
        to_network: &mut PacketBatch,
        job: &mut Job,
    ) {
        if state.protocol == Protocol::Plexd
            && d.len() >= DATA_MIN
            && d[0] == DATA
            && self.defer_open(state, now, (from, local), d, job)
        {
            return;
        }
        self.datagram(state, now, (from, local), d, to_network, &mut job.batch);
    }

    /// Lays a data message out for the pool; false when the inline path must take it.
    fn defer_open(
        &self,
        state: &State,
        now: Instant,
        (from, local): (SocketAddr, Option<Source>),
        d: &[u8],
        job: &mut Job,
    ) -> bool {
        let Some(peer) = state.by_index.get(&(le32(d, 4) >> 8)) else {
            return false;
        };
        if !self.relay_names(peer, from) {
            return true;
        }
        let mut p = peer.lock();
        let Some(t) = p.machine.as_mut().and_then(Machine::plexd) else {
            return false;
        };
        let ticket = match t.open_check(now, d) {
            Ok(ticket) => ticket,
            Err(e) => {
                tracing::trace!(peer = %peer.public_key(), %from, error = %e, "datagram rejected");
                Counters::bump(&self.counters.rejected);
                return true;
            }
        };
        let body = &d[DATA_HEADER..];
        let slot = job.batch.next_slot();
        if slot.len() < body.len() {
            Counters::bump(&self.counters.malformed);
            return true;
        }
        slot[..body.len()].copy_from_slice(body);
        let i = job.batch.len();
        job.batch.commit(body.len(), from);
        job.batch.set_src(local);
        job.ops.push(Op {
            slot: i,
            ticket,
            len: body.len(),
            kind: OpKind::Open(Opening {
                peer: peer.clone(),
                from,
                local,
                datagram_len: d.len(),
                opened: None,
            }),
        });
        Counters::bump(&self.counters.pooled);
        true
    }

    /// Delivers a job the pool opened, in the order it was read: each message's counter is
    /// marked in its replay window, the peer follows it (roaming, sticky source), and its
    /// plaintext stays in the batch only if the peer may use its source address. Packets a
    /// new session lets out go to `to_network`. The batch is left with the packets for the
    /// host only.
    pub fn finish_opened(&self, now: Instant, job: &mut Job, to_network: &mut PacketBatch) {
        let state = self.read();
        for op in job.ops.drain(..) {
            let OpKind::Open(o) = &op.kind else { continue };
            let keep = self.finish_one(&state, now, &op, o, job.batch.get(op.slot), to_network);
            job.batch.truncate(op.slot, keep);
        }
        job.batch.retain_nonempty();
    }

    /// One opened data message (`slot`: its slot, plaintext first): how many of its bytes go
    /// to the host (0: none).
    fn finish_one(
        &self,
        state: &State,
        now: Instant,
        op: &Op,
        o: &Opening,
        slot: &[u8],
        to_network: &mut PacketBatch,
    ) -> usize {
        let peer = &o.peer;
        let Some(n) = o.opened else {
            tracing::trace!(peer = %peer.public_key(), from = %o.from, "data message does not authenticate");
            Counters::bump(&self.counters.rejected);
            return 0;
        };
        let packet = &slot[..n];
        let mut p = peer.lock();
        let finished = match p.machine.as_mut().and_then(Machine::plexd) {
            Some(t) => t.open_finish(now, &op.ticket, packet),
            None => Err(crate::noise::NoiseError::UnknownSession),
        };
        let keep = match finished {
            Ok(Output::Tunnel(len, src))
                if self.allowed(state, peer, &mut p, src, &packet[..len], now) =>
            {
                len
            }
            Ok(_) => 0,
            Err(e) => {
                tracing::trace!(peer = %peer.public_key(), from = %o.from, error = %e, "datagram rejected");
                Counters::bump(&self.counters.rejected);
                return 0;
            }
        };
        follow(peer, &mut p, o.from, o.local, o.datagram_len);
        if self.pending_count.load(Ordering::Acquire) > 0 && self.take_pending(peer) {
            self.flush_queue(&mut p, now, o.from, to_network);
        }
        keep
    }
}
