//! The receive path's side of the segmentation probe (`crate::probe`): the matchers of the
//! running probes, which take the probe's echo replies out of the decrypted packets before
//! they reach the TUN. Kept apart from the probe itself, which drives the device.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Echo requests per probe, sent once segmented and once one by one (2 x this many in all).
pub const PROBE_PACKETS: usize = 8;
/// Probes running at once on one device (each holds a matcher on the receive path).
pub(crate) const PROBE_MAX_CONCURRENT: usize = 8;
/// The start of every probe request's payload, so an unrelated echo reply that happens to
/// carry our identifier is never taken for one.
pub(crate) const PROBE_MARKER: &[u8; 16] = b"plexd-gso-probe\0";

pub(crate) const ICMP: u8 = 1;
pub(crate) const ICMPV6: u8 = 58;
pub(crate) const ECHO_REQUEST_V4: u8 = 8;
pub(crate) const ECHO_REPLY_V4: u8 = 0;
pub(crate) const ECHO_REQUEST_V6: u8 = 128;
pub(crate) const ECHO_REPLY_V6: u8 = 129;

/// The receive path's matchers, one per running probe.
#[derive(Debug, Default)]
pub(crate) struct Probes {
    /// How many are registered: the packet path reads only this while none runs.
    active: AtomicUsize,
    list: Mutex<Vec<Arc<Track>>>,
    next_id: AtomicU16,
}

/// The replies one probe is waiting for.
#[derive(Debug)]
pub(crate) struct Track {
    pub(crate) id: u16,
    /// The peer's mesh address: a reply must come from there.
    from: IpAddr,
    /// One bit per sequence number seen: the low [`PROBE_PACKETS`] bits for the segmented
    /// requests, the next ones for the single requests.
    seen: AtomicU64,
}

const _: () = assert!(2 * PROBE_PACKETS <= 64, "the seen bitmap holds both halves");

impl Probes {
    /// Whether `packet` (decrypted, from `src`) is the reply to a running probe; takes it then.
    #[inline]
    pub(crate) fn claim(&self, packet: &[u8], src: IpAddr) -> bool {
        if self.active.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let Some((id, seq)) = echo_reply(packet) else {
            return false;
        };
        let list = self.list.lock().unwrap_or_else(PoisonError::into_inner);
        match list.iter().find(|t| t.id == id && t.from == src) {
            Some(t) if usize::from(seq) < 2 * PROBE_PACKETS => {
                t.seen.fetch_or(1 << seq, Ordering::Relaxed);
                true
            }
            _ => false,
        }
    }

    pub(crate) fn register(&self, from: IpAddr) -> Option<Arc<Track>> {
        let mut list = self.list.lock().unwrap_or_else(PoisonError::into_inner);
        if list.len() >= PROBE_MAX_CONCURRENT {
            return None;
        }
        // Identifiers start from the pid so two plexd processes' probes differ; the marker
        // in the payload rules out the rest.
        let start = (std::process::id() as u16).wrapping_mul(31);
        let id = start.wrapping_add(self.next_id.fetch_add(1, Ordering::Relaxed));
        let t = Arc::new(Track {
            id,
            from,
            seen: AtomicU64::new(0),
        });
        list.push(t.clone());
        self.active.store(list.len(), Ordering::Relaxed);
        Some(t)
    }

    pub(crate) fn unregister(&self, t: &Arc<Track>) {
        let mut list = self.list.lock().unwrap_or_else(PoisonError::into_inner);
        list.retain(|x| !Arc::ptr_eq(x, t));
        self.active.store(list.len(), Ordering::Relaxed);
    }
}

impl Track {
    pub(crate) fn counts(&self) -> (usize, usize) {
        let seen = self.seen.load(Ordering::Relaxed);
        let half = (1u64 << PROBE_PACKETS) - 1;
        (
            (seen & half).count_ones() as usize,
            ((seen >> PROBE_PACKETS) & half).count_ones() as usize,
        )
    }
}

/// The identifier and sequence number of a probe's echo reply; None for anything else. The
/// protocol byte is read first, so other traffic costs one comparison.
#[inline]
pub(crate) fn echo_reply(p: &[u8]) -> Option<(u16, u16)> {
    let icmp = match p.first()? >> 4 {
        4 if p.len() >= 20 && p[9] == ICMP => {
            let ihl = usize::from(p[0] & 0x0f) * 4;
            let icmp = p.get(ihl..)?;
            (icmp.first() == Some(&ECHO_REPLY_V4)).then_some(icmp)?
        }
        6 if p.len() >= 40 && p[6] == ICMPV6 => {
            let icmp = &p[40..];
            (icmp.first() == Some(&ECHO_REPLY_V6)).then_some(icmp)?
        }
        _ => return None,
    };
    if icmp.get(8..8 + PROBE_MARKER.len())? != PROBE_MARKER {
        return None;
    }
    let id = u16::from_be_bytes([icmp[4], icmp[5]]);
    let seq = u16::from_be_bytes([icmp[6], icmp[7]]);
    Some((id, seq))
}
