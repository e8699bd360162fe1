//! Relayed peers inside the data plane: a peer's endpoint may be "through the relay at this
//! UDP address, to the node whose key starts with this prefix", and the packet threads frame
//! and unframe such datagrams themselves, in the same batches as direct ones.
//!
//! A relay endpoint is written as an ordinary `SocketAddr` so that the device, its batches and
//! the UAPI carry it like any other endpoint: an address in `100::/64`, the IPv6 discard-only
//! prefix (RFC 6666, never a real peer's address), whose low 64 bits are the node-key prefix
//! and whose port is one more than the relay's slot in the [`RelayTable`] (so never port 0):
//!
//! ```text
//! [100::P0P1:P2P3:P4P5:P6P7]:(slot+1)      P = the peer's key prefix (8 bytes), slot < MAX_RELAYS
//! ```
//!
//! - **Out** ([`RelayTable::frame`], just before a batch goes to the socket): a datagram for a
//!   relay endpoint is moved [`RELAY_HEAD`] bytes up in its own slot, the relay `send` head
//!   (`plexsphere_wire::reach::relay::write_send_head`) is written in front, and its address
//!   becomes the relay's. No allocation, no other copy; a run of equal-size frames to one relay
//!   still leaves as one GSO send.
//! - **In** ([`RelayTable::unwrap`], where the receive path classifies a datagram): a relay
//!   `recv` carrying WireGuard, from the address of a relay in the table (and only from one),
//!   is handed to the device as its inner datagram, borrowed in place, with the relay
//!   endpoint of its source prefix as the source. The device answers there, so replies go back
//!   through the same relay. Everything else (control frames, disco, frames from any other
//!   address) goes to the side channel as before.
//! - **Over TCP/TLS**: a slot may hold a relay link's queue instead of a UDP address; its
//!   datagrams leave the batch into that queue and its `recv`s come in through the link's
//!   reader (`crate::relay_link`).
//! - **Trust**: the table holds only the relays the reach runtime put there (those it uses for
//!   a relayed peer over UDP; [`RelayTable::retain`] drops the others; a link's slot is free
//!   once the link closed). WireGuard authenticates
//!   the inner datagram; the device also refuses one whose peer is not the one the `recv`
//!   names (`Device::datagram`: counted in `Counters::relay_misnamed`), so a frame naming peer
//!   A that carries peer B's datagram cannot move B's endpoint to the relay's A path.
//!
//! MTU: the head is 13 bytes; a 1420-byte tunnel MTU makes 1452-byte WireGuard datagrams, so
//! 1465 bytes of UDP payload, 1493 on an IPv4 underlay (docs/reach.md, "MTU").

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use plexsphere_wire::reach::relay::{KeyPrefix, UDP_DATA_HEAD, parse_recv, write_send_head};

use crate::batch::PacketBatch;
use crate::io::Udp;
use crate::link_queue::LinkQueue;
use crate::side::is_wireguard;

/// The bytes a relay `send` or `recv` head puts in front of a WireGuard datagram over UDP.
pub(crate) const RELAY_HEAD: usize = UDP_DATA_HEAD;
/// The most relays the data plane frames for at once (a state names a handful; the runtime
/// uses one or two at a time). A relay past it stays with the loopback forwarder.
pub(crate) const MAX_RELAYS: usize = 64;
/// The first 64 bits of a relay endpoint: `100::/64` (RFC 6666, discard-only).
const RELAY_NET: [u16; 4] = [0x0100, 0, 0, 0];

/// Why a relay endpoint could not be made.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RelayError {
    #[error(
        "the data plane already frames for {MAX_RELAYS} relays; this one is carried by a loopback forwarder"
    )]
    Full,
    #[error("{0} is a relay endpoint, not a relay's UDP address")]
    NotARelay(SocketAddr),
    #[error("the relay link closed")]
    Closed,
}

/// The relay endpoint for relay slot `slot` and node-key prefix `prefix`.
pub fn endpoint(slot: u16, prefix: &KeyPrefix) -> SocketAddr {
    let seg = |i: usize| u16::from_be_bytes([prefix[i], prefix[i + 1]]);
    let ip = Ipv6Addr::new(
        RELAY_NET[0],
        RELAY_NET[1],
        RELAY_NET[2],
        RELAY_NET[3],
        seg(0),
        seg(2),
        seg(4),
        seg(6),
    );
    SocketAddr::new(IpAddr::V6(ip), slot.saturating_add(1))
}

/// The relay slot and node-key prefix of a relay endpoint; None for any other address.
pub fn decode(addr: SocketAddr) -> Option<(u16, KeyPrefix)> {
    let SocketAddr::V6(v6) = addr else {
        return None;
    };
    let seg = v6.ip().segments();
    if seg[..4] != RELAY_NET || v6.port() == 0 {
        return None;
    }
    let mut prefix = [0u8; 8];
    for (i, s) in seg[4..].iter().enumerate() {
        prefix[2 * i..2 * i + 2].copy_from_slice(&s.to_be_bytes());
    }
    Some((v6.port() - 1, prefix))
}

/// Whether `addr` is a relay endpoint.
pub fn is_relay_endpoint(addr: SocketAddr) -> bool {
    decode(addr).is_some()
}

/// What the relay path counted.
#[derive(Debug, Default)]
pub struct RelayCounters {
    /// WireGuard datagrams framed for a relay.
    pub framed: AtomicU64,
    /// WireGuard datagrams unwrapped from a relay's `recv`.
    pub unwrapped: AtomicU64,
    /// Datagrams for a relay endpoint whose relay the table no longer holds (dropped, like a
    /// datagram to an unreachable address).
    pub gone: AtomicU64,
}

/// Where a relay slot's datagrams go.
#[derive(Debug, Clone)]
enum Slot {
    /// To the relay's UDP address, from the data plane's socket.
    Udp(SocketAddr),
    /// Into the queue of the relay's TCP/TLS link (`crate::relay_link`).
    Link(Arc<LinkQueue>),
}

impl Slot {
    fn is_udp(&self, addr: SocketAddr) -> bool {
        matches!(self, Slot::Udp(a) if *a == addr)
    }

    fn is_link(&self, link: &LinkQueue) -> bool {
        matches!(self, Slot::Link(q) if std::ptr::eq(Arc::as_ptr(q), link))
    }

    /// The index of the first slot `is` holds.
    fn find(slots: &[Option<Slot>], is: impl Fn(&Slot) -> bool) -> Option<usize> {
        slots.iter().position(|s| s.as_ref().is_some_and(&is))
    }

    /// A closed link's slot is as good as free.
    fn is_free(slot: &Option<Slot>) -> bool {
        match slot {
            None => true,
            Some(Slot::Link(q)) => q.is_closed(),
            Some(Slot::Udp(_)) => false,
        }
    }
}

/// The relays the data plane frames for; see the module docs.
#[derive(Debug, Default)]
pub struct RelayTable {
    /// Slot = index; None: free (a relay the runtime no longer uses).
    slots: RwLock<Vec<Option<Slot>>>,
    pub counters: RelayCounters,
}

impl RelayTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// The endpoint "through the relay at `relay` to the node whose key starts with
    /// `prefix`"; the relay is added to the table (its slot kept if it has one).
    pub fn endpoint(
        &self,
        relay: SocketAddr,
        prefix: &KeyPrefix,
    ) -> Result<SocketAddr, RelayError> {
        Ok(endpoint(self.add(relay)?, prefix))
    }

    /// Makes the table exactly `relays`: the ones it holds keep their slots, the others are
    /// dropped ([`Self::retain`]), new ones are added. Fails (after adding what fits) when
    /// more than [`MAX_RELAYS`] are asked for.
    pub fn set(&self, relays: &[SocketAddr]) -> Result<(), RelayError> {
        self.retain(relays);
        let mut result = Ok(());
        for r in relays {
            if let Err(e) = self.add(*r) {
                result = Err(e);
            }
        }
        result
    }

    /// The endpoint "through the relay link `link` (TCP/TLS) to the node whose key starts
    /// with `prefix`"; the link gets a slot (kept if it has one). A closed link has none.
    pub fn link_endpoint(
        &self,
        link: &Arc<LinkQueue>,
        prefix: &KeyPrefix,
    ) -> Result<SocketAddr, RelayError> {
        if link.is_closed() {
            return Err(RelayError::Closed);
        }
        let slot = self.slot(|s| s.is_link(link), || Slot::Link(link.clone()))?;
        Ok(endpoint(slot, prefix))
    }

    /// The slot of `link`; None when it has none (its peers are not carried here) or closed.
    pub(crate) fn link_slot(&self, link: &LinkQueue) -> Option<u16> {
        let slots = self.slots.read().unwrap_or_else(PoisonError::into_inner);
        let slot = Slot::find(&slots, |s| s.is_link(link))?;
        // MAX_RELAYS is far below u16::MAX.
        (!link.is_closed()).then_some(slot as u16)
    }

    /// The slot of `relay`, added if the table does not hold it.
    fn add(&self, relay: SocketAddr) -> Result<u16, RelayError> {
        let relay = plexsphere_wire::endpoint::canonical(relay);
        if is_relay_endpoint(relay) {
            return Err(RelayError::NotARelay(relay));
        }
        self.slot(|s| s.is_udp(relay), || Slot::Udp(relay))
    }

    /// The slot `is` finds, else a free one given `make()`'s slot.
    fn slot(
        &self,
        is: impl Fn(&Slot) -> bool,
        make: impl FnOnce() -> Slot,
    ) -> Result<u16, RelayError> {
        let mut slots = self.slots.write().unwrap_or_else(PoisonError::into_inner);
        let slot = match Slot::find(&slots, is) {
            Some(i) => i,
            None => match slots.iter().position(Slot::is_free) {
                Some(i) => {
                    slots[i] = Some(make());
                    i
                }
                None if slots.len() < MAX_RELAYS => {
                    slots.push(Some(make()));
                    slots.len() - 1
                }
                None => return Err(RelayError::Full),
            },
        };
        // MAX_RELAYS is far below u16::MAX.
        Ok(slot as u16)
    }

    /// Keeps only the relays over UDP in `keep` (links stay until they close): frames from
    /// the others are no longer unwrapped, and datagrams for their endpoints are dropped
    /// (counted in `gone`).
    pub fn retain(&self, keep: &[SocketAddr]) {
        let mut slots = self.slots.write().unwrap_or_else(PoisonError::into_inner);
        for s in slots.iter_mut() {
            if let Some(Slot::Udp(addr)) = *s
                && !keep
                    .iter()
                    .any(|k| plexsphere_wire::endpoint::canonical(*k) == addr)
            {
                *s = None;
            }
        }
    }

    /// The relays over UDP in the table.
    pub fn relays(&self) -> Vec<SocketAddr> {
        self.slots
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(|s| match s {
                Some(Slot::Udp(a)) => Some(*a),
                _ => None,
            })
            .collect()
    }

    /// The inner WireGuard datagram of a relay `recv` from a relay in the table, and the relay
    /// endpoint it came from; None for anything else (which stays with the side channel).
    pub fn unwrap<'a>(
        &self,
        datagram: &'a [u8],
        from: SocketAddr,
    ) -> Option<(&'a [u8], SocketAddr)> {
        let (src, inner) = parse_recv(datagram)?;
        if !is_wireguard(inner) {
            return None;
        }
        let from = plexsphere_wire::endpoint::canonical(from);
        let slots = self.slots.read().unwrap_or_else(PoisonError::into_inner);
        let slot = Slot::find(&slots, |s| s.is_udp(from))?;
        self.counters.unwrapped.fetch_add(1, Ordering::Relaxed);
        Some((inner, endpoint(slot as u16, &src)))
    }

    /// Frames every datagram of `batch` addressed to a relay endpoint for its relay, in place
    /// (see the module docs); one for a relay link leaves the batch into the link's queue; one
    /// whose relay is gone, or whose slot has no room for the head, is dropped. Call it on
    /// every batch of the device's output before it is sent.
    pub fn frame(&self, batch: &mut PacketBatch) {
        if !(0..batch.len()).any(|i| is_relay_endpoint(batch.addr(i))) {
            return;
        }
        let slots = self.slots.read().unwrap_or_else(PoisonError::into_inner);
        let mut taken = false;
        for i in 0..batch.len() {
            let Some((slot, prefix)) = decode(batch.addr(i)) else {
                continue;
            };
            let mut head = [0u8; RELAY_HEAD];
            write_send_head(&mut head, &prefix);
            // The device's output slots hold one datagram each (no GSO segments).
            let whole = batch.segment(i) == 0;
            match slots.get(usize::from(slot)).and_then(Option::as_ref) {
                Some(Slot::Udp(relay)) if whole && batch.prepend(i, &head) => {
                    batch.set_addr(i, *relay);
                    self.counters.framed.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Some(Slot::Link(link)) if whole && !link.is_closed() => {
                    // Counted by the link's queue (queued or dropped when full).
                    if link.push_send(&prefix, batch.get(i)) {
                        self.counters.framed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                _ => {
                    self.counters.gone.fetch_add(1, Ordering::Relaxed);
                }
            }
            batch.truncate(i, 0);
            taken = true;
        }
        drop(slots);
        if taken {
            batch.retain_nonempty();
        }
    }
}

/// Frames `batch`'s datagrams for relay endpoints ([`RelayTable::frame`]), then sends the
/// batch: every send of the device's output goes through here.
pub(crate) fn send_framed<U: Udp + ?Sized>(
    relays: &RelayTable,
    udp: &U,
    batch: &mut PacketBatch,
) -> std::io::Result<usize> {
    relays.frame(batch);
    if batch.is_empty() {
        return Ok(0);
    }
    udp.send(batch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use plexsphere_wire::reach::relay::Frame;

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("addr")
    }

    #[test]
    fn relay_endpoints_encode_the_slot_and_prefix_and_nothing_else_decodes() {
        let p = [1, 2, 3, 4, 5, 6, 7, 8];
        let ep = endpoint(3, &p);
        assert_eq!(ep, addr("[100::102:304:506:708]:4"));
        assert_eq!(decode(ep), Some((3, p)));
        for other in [
            "[100::102:304:506:708]:0",
            "192.0.2.1:51820",
            "[2001:db8::1]:1",
            "[100:0:0:1::5]:2",
            "[::ffff:1.2.3.4]:5",
        ] {
            assert_eq!(decode(addr(other)), None, "{other}");
        }
    }

    #[test]
    fn datagrams_for_a_relay_endpoint_are_framed_in_place_and_others_untouched() {
        let t = RelayTable::new();
        let relay = addr("203.0.113.9:3478");
        let ep = t.endpoint(relay, &[7; 8]).expect("endpoint");
        let direct = addr("192.0.2.1:51820");
        let mut b = PacketBatch::for_datagrams(4);
        b.push(&[4, 0, 0, 0, 1, 2, 3], ep);
        b.push(&[4, 0, 0, 0, 9], direct);
        b.set_src(None);
        t.frame(&mut b);
        assert_eq!(b.len(), 2);
        assert_eq!(b.addr(0), relay);
        assert_eq!(
            Frame::from_datagram(b.get(0)).expect("a relay frame"),
            Frame::Send {
                dst: [7; 8],
                payload: vec![4, 0, 0, 0, 1, 2, 3]
            }
        );
        assert_eq!((b.get(1), b.addr(1)), (&[4, 0, 0, 0, 9][..], direct));
        assert_eq!(t.counters.framed.load(Ordering::Relaxed), 1);

        // The relay leaves the table: its datagrams are dropped, the others still go.
        t.retain(&[]);
        let mut b = PacketBatch::for_datagrams(4);
        b.push(&[4, 0, 0, 0, 1], ep);
        b.push(&[4, 0, 0, 0, 9], direct);
        t.frame(&mut b);
        assert_eq!(
            b.iter().collect::<Vec<_>>(),
            vec![(&[4, 0, 0, 0, 9][..], direct)]
        );
        assert_eq!(t.counters.gone.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_full_slot_has_no_room_for_the_head_and_is_dropped() {
        let t = RelayTable::new();
        let ep = t
            .endpoint(addr("203.0.113.9:3478"), &[7; 8])
            .expect("endpoint");
        let mut b = PacketBatch::new(16, 1);
        b.push(&[4; 16], ep);
        t.frame(&mut b);
        assert!(b.is_empty());
    }

    #[test]
    fn a_recv_is_unwrapped_only_from_a_relay_in_the_table_and_only_with_wireguard_inside() {
        let t = RelayTable::new();
        let relay = addr("203.0.113.9:3478");
        let wg = vec![4u8, 0, 0, 0, 1, 2, 3];
        let recv = Frame::Recv {
            src: [5; 8],
            payload: wg.clone(),
        }
        .to_datagram();
        // Not (yet) a relay the runtime uses: stays with the side channel.
        assert_eq!(t.unwrap(&recv, relay), None);
        let ep = t.endpoint(relay, &[5; 8]).expect("endpoint");
        assert_eq!(t.unwrap(&recv, relay), Some((&wg[..], ep)));
        // The same frame from any other address (a spoofer's) is not a relay's.
        assert_eq!(t.unwrap(&recv, addr("203.0.113.10:3478")), None);
        assert_eq!(t.unwrap(&recv, addr("203.0.113.9:3479")), None);
        // IPv4-mapped is the same relay.
        assert_eq!(
            t.unwrap(&recv, addr("[::ffff:203.0.113.9]:3478")),
            Some((&wg[..], ep))
        );
        // Disco inside a recv, and control frames, are the runtime's.
        let disco = Frame::Recv {
            src: [5; 8],
            payload: b"pxd\x02rest".to_vec(),
        }
        .to_datagram();
        assert_eq!(t.unwrap(&disco, relay), None);
        let pong = Frame::Pong { nonce: [1; 8] }.to_datagram();
        assert_eq!(t.unwrap(&pong, relay), None);
        // Once the runtime drops the relay, its frames are the side channel's again.
        t.retain(&[addr("198.51.100.1:3478")]);
        assert_eq!(t.unwrap(&recv, relay), None);
    }

    #[test]
    fn the_table_is_bounded_and_reuses_freed_slots() {
        let t = RelayTable::new();
        for i in 0..MAX_RELAYS {
            let relay = SocketAddr::new(
                IpAddr::V4([10, 0, (i / 256) as u8, (i % 256) as u8].into()),
                1,
            );
            t.endpoint(relay, &[0; 8]).expect("room");
        }
        let one_more = addr("192.0.2.200:1");
        assert_eq!(t.endpoint(one_more, &[0; 8]), Err(RelayError::Full));
        // The same relay again keeps its slot.
        assert_eq!(
            t.endpoint(addr("10.0.0.0:1"), &[0; 8]),
            Ok(endpoint(0, &[0; 8]))
        );
        t.retain(&[addr("10.0.0.0:1")]);
        assert_eq!(t.endpoint(one_more, &[1; 8]), Ok(endpoint(1, &[1; 8])));
        assert_eq!(t.relays().len(), 2);
        // `set` keeps the slots of the relays it keeps.
        t.set(&[one_more, addr("192.0.2.201:1")]).expect("room");
        assert_eq!(t.endpoint(one_more, &[1; 8]), Ok(endpoint(1, &[1; 8])));
        assert_eq!(
            t.relays(),
            vec![addr("192.0.2.201:1"), one_more],
            "the freed slot 0 went to the new relay"
        );
        assert_eq!(
            t.endpoint(endpoint(0, &[0; 8]), &[0; 8]),
            Err(RelayError::NotARelay(endpoint(0, &[0; 8])))
        );
    }
}
