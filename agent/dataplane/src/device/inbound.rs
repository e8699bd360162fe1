//! From the network to the host: datagrams find their peer (by receiver index, or an
//! initiation by its MAC1 after the rate limiter), are decrypted inline (the crypto pool's
//! openings are in `pooled.rs`), move the peer's endpoint (roaming, sticky source), and reach
//! the TUN only if the peer may use their source address, they are not a probe's reply and the
//! policy lets them in.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use boringtun::noise::handshake::parse_handshake_anon;
use boringtun::noise::{Packet, Tunn, TunnResult};

use crate::machine::Step;
use crate::noise::handshake::{COOKIE_REPLY, INITIATION, RESPONSE};

use crate::batch::PacketBatch;
use crate::key::PublicKey;
use crate::peer::{Peer, PeerState};
use crate::source::Source;

use super::{Counters, Crypto, Device, MIN_SLOT, State};

/// An authenticated data message or handshake of `len` bytes came from `from` to our `local`
/// address: the peer follows it there (roaming) and is answered from where it sent to (sticky
/// source). A cookie reply never gets here (see `datagram`).
pub(super) fn follow(
    peer: &Peer,
    p: &mut PeerState,
    from: SocketAddr,
    local: Option<Source>,
    len: usize,
) {
    if p.endpoint != Some(from) {
        tracing::debug!(peer = %peer.public_key(), endpoint = %from, "peer endpoint updated");
    }
    p.seen_at(from, local);
    p.rx_bytes += len as u64;
}

impl Device {
    /// Opens datagrams from the network, each with its source and the local address it
    /// arrived at (the reply leaves from there), under one read lock: handshake answers and
    /// packets queued for a new session into `to_network`; the plaintext with
    /// `Crypto::Inline(to_tun)` into `to_tun`, with `Crypto::Pool(job)` into the job's batch,
    /// a data message on a session of plexd's own protocol only checked and laid out there
    /// for the pool to open (`finish_opened` delivers it, in order).
    pub fn handle_udp<'a>(
        &self,
        now: Instant,
        datagrams: impl IntoIterator<Item = (&'a [u8], SocketAddr, Option<Source>)>,
        to_network: &mut PacketBatch,
        crypto: Crypto<'_>,
    ) {
        let state = self.read();
        match crypto {
            Crypto::Inline(to_tun) => {
                for (d, from, local) in datagrams {
                    self.datagram(&state, now, (from, local), d, to_network, to_tun);
                }
            }
            Crypto::Pool(job) => {
                for (d, from, local) in datagrams {
                    self.datagram_deferred(&state, now, (from, local), d, to_network, job);
                }
            }
        }
    }

    fn find_peer(
        &self,
        state: &State,
        (from, local): (SocketAddr, Option<Source>),
        datagram: &[u8],
        to_network: &mut PacketBatch,
    ) -> Option<Arc<Peer>> {
        let receiver = match Tunn::parse_incoming_packet(datagram) {
            Ok(Packet::HandshakeInit(init)) => {
                let (Some(sk), Some(pk)) = (&state.private_key, &state.public_key) else {
                    Counters::bump(&self.counters.no_key);
                    return None;
                };
                // MAC1 and the load check before any Diffie-Hellman, so a flood of forged
                // initiations costs a hash each, and a loaded device answers with a cookie.
                let slot = to_network.next_slot();
                match state
                    .rate_limiter
                    .verify_packet(Some(from.ip()), datagram, slot)
                {
                    Ok(_) => {}
                    Err(TunnResult::WriteToNetwork(cookie)) => {
                        let n = cookie.len();
                        to_network.commit(n, from);
                        to_network.set_src(local);
                        return None;
                    }
                    Err(_) => {
                        Counters::bump(&self.counters.rejected);
                        return None;
                    }
                }
                let found =
                    parse_handshake_anon(&sk.static_secret(), &crate::key::x25519(pk), &init)
                        .ok()
                        .and_then(|half| {
                            state
                                .peers
                                .get(&PublicKey(half.peer_static_public))
                                .cloned()
                        });
                if found.is_none() {
                    Counters::bump(&self.counters.unknown_peer);
                }
                return found;
            }
            Ok(Packet::HandshakeResponse(p)) => p.receiver_idx,
            Ok(Packet::PacketCookieReply(p)) => p.receiver_idx,
            Ok(Packet::PacketData(p)) => p.receiver_idx,
            Err(_) => {
                Counters::bump(&self.counters.malformed);
                return None;
            }
        };
        let found = state.by_index.get(&(receiver >> 8)).cloned();
        if found.is_none() {
            Counters::bump(&self.counters.unknown_peer);
        }
        found
    }

    pub(super) fn datagram(
        &self,
        state: &State,
        now: Instant,
        (from, local): (SocketAddr, Option<Source>),
        datagram: &[u8],
        to_network: &mut PacketBatch,
        to_tun: &mut PacketBatch,
    ) {
        let Some(peer) = self.find_peer(state, (from, local), datagram, to_network) else {
            return;
        };
        if !self.relay_names(&peer, from) {
            return;
        }
        let kind = datagram.first().copied().unwrap_or(0);
        let mut p = peer.lock();
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
        // Plaintext lands straight in the TUN batch; handshake answers are copied out of it.
        let slot = to_tun.next_slot();
        if slot.len() < datagram.len().max(MIN_SLOT) {
            Counters::bump(&self.counters.malformed);
            return;
        }
        let mut answered = false;
        match machine.handle_datagram(datagram, from.ip(), slot, now) {
            Step::Tunnel(n, src) => {
                self.deliver(state, &peer, &mut p, (src, n, now), from, to_tun);
            }
            Step::Network(n) => {
                let buf = &to_tun.next_slot()[..n];
                if buf.first() == Some(&COOKIE_REPLY) {
                    // We are under load and the sender has not proven its address yet:
                    // answer it where it is, but do not trust the address for the peer.
                    to_network.push(buf, from);
                    to_network.set_src(local);
                    return;
                }
                to_network.push(buf, from);
                to_network.set_src(local);
                answered = true;
            }
            Step::Done => {}
            Step::Rejected(e) => {
                tracing::trace!(peer = %peer.public_key(), %from, error = %e, "datagram rejected");
                Counters::bump(&self.counters.rejected);
                return;
            }
        }
        if kind == COOKIE_REPLY {
            // A cookie reply only stores a cookie for our next initiation. Anyone who saw that
            // initiation and knows the peer's public key (every other peer of it does) can
            // make one that opens, so, like the kernel, the peer does not roam on it: only an
            // authenticated data message or handshake moves the endpoint.
            return;
        }
        follow(&peer, &mut p, from, local, datagram.len());
        if answered {
            // An initiation we answered, or a response we confirmed with a keepalive.
            if kind == INITIATION || kind == RESPONSE {
                p.last_handshake = Some(now);
            }
            p.tx_bytes += to_network.get(to_network.len() - 1).len() as u64;
            p.last_sent = Some(now);
            self.flush_queue(&mut p, now, from, to_network);
        } else if self.pending_count.load(Ordering::Acquire) > 0 && self.take_pending(&peer) {
            // Data on the session confirms it (a responder may send only now): what boringtun
            // queued before it leaves now, ahead of any later packet.
            self.flush_queue(&mut p, now, from, to_network);
        }
    }

    /// Sends what boringtun queued while the handshake was in flight.
    pub(super) fn flush_queue(
        &self,
        p: &mut PeerState,
        now: Instant,
        to: SocketAddr,
        to_network: &mut PacketBatch,
    ) {
        let src = p.source();
        let Some(machine) = p.machine.as_mut() else {
            return;
        };
        loop {
            let slot = to_network.next_slot();
            let Some(n) = machine.poll_queued(slot, now) else {
                break;
            };
            to_network.commit(n, to);
            to_network.set_src(src);
            p.tx_bytes += n as u64;
            p.last_sent = Some(now);
        }
    }

    /// A decrypted packet goes to the TUN only if its source is one the peer may use.
    fn deliver(
        &self,
        state: &State,
        peer: &Arc<Peer>,
        p: &mut PeerState,
        (src, len, now): (IpAddr, usize, Instant),
        from: SocketAddr,
        to_tun: &mut PacketBatch,
    ) {
        if self.allowed(state, peer, p, src, &to_tun.next_slot()[..len], now) {
            to_tun.commit(len, from);
        }
    }

    /// Whether a decrypted `packet` from `src` goes to the host: the source is one `peer`
    /// may use (else counted), it is not a probe's echo reply (counted there), and the
    /// policy's filter lets it in (else counted and logged).
    pub(super) fn allowed(
        &self,
        state: &State,
        peer: &Arc<Peer>,
        p: &mut PeerState,
        src: IpAddr,
        packet: &[u8],
        now: Instant,
    ) -> bool {
        match state.routes.get(src) {
            Some(owner) if Arc::ptr_eq(owner, peer) => {
                !self.probes.claim(packet, src)
                    && self.policy_passes(state, peer, p, true, packet, now)
            }
            _ => {
                tracing::trace!(peer = %peer.public_key(), %src, "source outside the peer's allowed IPs; dropped");
                Counters::bump(&self.counters.not_allowed);
                false
            }
        }
    }
}
