//! From the host to the network: packets read from the TUN are routed to their peer by
//! destination, checked by the policy, and encrypted (inline, or laid out for the crypto pool)
//! into datagrams for the peer's endpoint; packets boringtun queued before a session are
//! remembered so they leave, in order, once one is up.

use std::sync::PoisonError;
use std::sync::atomic::Ordering;
use std::time::Instant;

use boringtun::noise::Tunn;

use crate::machine::Step;
use crate::noise::handshake::{DATA_HEADER, INITIATION};
use crate::noise::write_data_header;
use crate::pool::Op;

use crate::batch::{PacketBatch, WG_OVERHEAD};
use crate::key::PublicKey;
use crate::peer::Peer;

use super::{Counters, Crypto, Device, MIN_SLOT, State};

impl Device {
    /// Seals packets from the host (a TUN read, a queue's chunk, one packet) for the network,
    /// under one read lock: with `Crypto::Inline(out)` into `out`; with `Crypto::Pool(job)` a
    /// packet for a peer with a session of plexd's own protocol is only laid out in the job
    /// (header, counter, plaintext) with an operation to seal it, which any thread may do
    /// (`crate::pool`), the rest sealed inline into the job's batch, in order.
    pub fn handle_tun<'a>(
        &self,
        now: Instant,
        packets: impl IntoIterator<Item = &'a [u8]>,
        crypto: Crypto<'_>,
    ) {
        let state = self.read();
        match crypto {
            Crypto::Inline(out) => {
                for p in packets {
                    self.tun_packet(&state, now, p, out, None);
                }
            }
            Crypto::Pool(job) => {
                for p in packets {
                    self.tun_packet(&state, now, p, &mut job.batch, Some(&mut job.ops));
                }
            }
        }
    }

    fn tun_packet(
        &self,
        state: &State,
        now: Instant,
        packet: &[u8],
        out: &mut PacketBatch,
        defer: Option<&mut Vec<Op>>,
    ) {
        let Some(dst) = Tunn::dst_address(packet) else {
            Counters::bump(&self.counters.malformed);
            return;
        };
        let Some(peer) = state.routes.get(dst) else {
            tracing::trace!(%dst, "no peer's allowed IPs cover this destination; dropped");
            Counters::bump(&self.counters.no_route);
            return;
        };
        let mut p = peer.lock();
        if !packet.is_empty() && !self.policy_passes(state, peer, &mut p, false, packet, now) {
            return;
        }
        let Some(endpoint) = p.endpoint else {
            Counters::bump(&self.counters.no_endpoint);
            return;
        };
        let Some(machine) = peer.machine(
            &mut p,
            state.private_key.as_ref(),
            &state.rate_limiter,
            state.protocol,
            state.clock,
        ) else {
            Counters::bump(&self.counters.no_key);
            return;
        };
        let slot = out.next_slot();
        if slot.len() < (packet.len() + WG_OVERHEAD).max(MIN_SLOT) {
            Counters::bump(&self.counters.malformed);
            return;
        }
        // The pool's path: only while no peer waits for its queue to be flushed (that one
        // ordering case stays inline).
        if let Some(ops) = defer
            && self.pending_count.load(Ordering::Acquire) == 0
            && let Some(t) = machine.plexd()
            && let Some((keys, counter)) = t.reserve_send(now, packet.is_empty())
        {
            write_data_header(&keys, counter, slot);
            slot[DATA_HEADER..DATA_HEADER + packet.len()].copy_from_slice(packet);
            let n = packet.len() + WG_OVERHEAD;
            ops.push(Op::seal(out.len(), keys, counter, packet.len()));
            Counters::bump(&self.counters.pooled);
            p.tx_bytes += n as u64;
            p.last_sent = Some(now);
            out.commit(n, endpoint);
            out.set_src(p.source());
            return;
        }
        let (sent, queued) = match machine.handle_packet(packet, slot, now) {
            // Without a session the machine queues the packet and answers with an initiation.
            Step::Network(n) => (n, slot.first() == Some(&INITIATION)),
            Step::Rejected(e) => {
                tracing::debug!(peer = %peer.public_key(), error = %e, "encapsulate failed");
                return;
            }
            // Queued until the handshake in flight completes.
            _ => (0, true),
        };
        if queued {
            self.set_pending(peer.public_key(), true);
        } else if self.pending_count.load(Ordering::Acquire) > 0 && self.take_pending(peer) {
            // The first packet on a new session: what boringtun queued before it goes first,
            // so the flow keeps its order (their counters are higher; the replay window takes
            // them in any order).
            let this = out.next_slot()[..sent].to_vec();
            self.flush_queue(&mut p, now, endpoint, out);
            out.push(&this, endpoint);
            p.tx_bytes += sent as u64;
            p.last_sent = Some(now);
            return;
        }
        if sent == 0 {
            return;
        }
        p.tx_bytes += sent as u64;
        p.last_sent = Some(now);
        out.commit(sent, endpoint);
        out.set_src(p.source());
    }

    fn set_pending(&self, key: PublicKey, pending: bool) {
        let mut set = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let changed = if pending {
            set.insert(key)
        } else {
            set.remove(&key)
        };
        if changed {
            self.pending_count.store(set.len(), Ordering::Release);
        }
    }

    /// Whether boringtun may hold queued packets of `peer`; forgets it.
    pub(super) fn take_pending(&self, peer: &Peer) -> bool {
        let mut set = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let was = set.remove(&peer.public_key());
        self.pending_count.store(set.len(), Ordering::Release);
        was
    }
}
