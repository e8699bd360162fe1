//! The flows this node opened, so that replies pass its inbound filter. Pure: `now` comes
//! in with every call. O(1) per packet: one hash lookup, a move to the back of a list.
//!
//! Capacity: [`FlowTable::new`] takes it ([`DEFAULT_FLOW_CAPACITY`], about 100 bytes a
//! flow). Eviction: a flow idle for its protocol's timeout ([`TCP_FLOW_IDLE`],
//! [`UDP_FLOW_IDLE`], [`ICMP_FLOW_IDLE`], [`OTHER_FLOW_IDLE`]) is gone; when the table is
//! full, the flow idle longest goes first. Each protocol keeps its flows in a list ordered
//! by last use, so the oldest of each is at the front (expiry pops at most
//! [`FLOW_EXPIRY_BATCH`] per list per call; an expired flow that is looked up is removed
//! on the spot).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::limits::{
    DEFAULT_FLOW_CAPACITY, FLOW_EXPIRY_BATCH, ICMP_FLOW_IDLE, OTHER_FLOW_IDLE, TCP_FLOW_IDLE,
    UDP_FLOW_IDLE,
};
use crate::ports::Proto;

/// A flow as this node sees it: its own address and port, the remote's. ICMP echo flows
/// carry the echo id as `local_port` and 0 as `remote_port`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub proto: Proto,
    pub local: IpAddr,
    pub local_port: u16,
    pub remote: IpAddr,
    pub remote_port: u16,
}

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Slot {
    key: FlowKey,
    last: Instant,
    prev: u32,
    next: u32,
    list: u8,
}

#[derive(Debug, Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
}

const EMPTY: List = List {
    head: NIL,
    tail: NIL,
};

fn list_of(p: Proto) -> u8 {
    match p {
        Proto::Tcp => 0,
        Proto::Udp => 1,
        Proto::Icmp => 2,
        Proto::Other(_) => 3,
    }
}

const IDLE: [Duration; 4] = [
    TCP_FLOW_IDLE,
    UDP_FLOW_IDLE,
    ICMP_FLOW_IDLE,
    OTHER_FLOW_IDLE,
];

/// The flow table's hasher: a multiply-rotate mix over the key's words (FxHash's step)
/// from a random seed per table, finished with murmur3's avalanche. The packet path hashes
/// a flow key once or twice per packet, and std's SipHash was most of the filter's cost.
/// Keyed by the seed, and the keys a table holds are the flows this node opened (a peer
/// only chooses what is looked up, which builds no chain), so a collision flood is not
/// something a peer can mount.
#[derive(Debug, Clone)]
struct FlowHash {
    seed: u64,
}

impl FlowHash {
    fn new() -> Self {
        Self {
            seed: RandomState::new().hash_one(0x666c_6f77_u64),
        }
    }
}

impl BuildHasher for FlowHash {
    type Hasher = FlowHasher;
    fn build_hasher(&self) -> FlowHasher {
        FlowHasher(self.seed)
    }
}

struct FlowHasher(u64);

impl FlowHasher {
    #[inline]
    fn add(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for FlowHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(w));
        }
    }
    #[inline]
    fn write_u8(&mut self, v: u8) {
        self.add(u64::from(v));
    }
    #[inline]
    fn write_u16(&mut self, v: u16) {
        self.add(u64::from(v));
    }
    #[inline]
    fn write_u32(&mut self, v: u32) {
        self.add(u64::from(v));
    }
    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.add(v);
    }
    #[inline]
    fn write_usize(&mut self, v: usize) {
        self.add(v as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

/// Counters for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowStats {
    pub expired: u64,
    pub evicted_when_full: u64,
}

#[derive(Debug, Clone)]
pub struct FlowTable {
    map: HashMap<FlowKey, u32, FlowHash>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    lists: [List; 4],
    capacity: usize,
    stats: FlowStats,
}

impl Default for FlowTable {
    fn default() -> Self {
        Self::new(DEFAULT_FLOW_CAPACITY)
    }
}

impl FlowTable {
    /// A table of at most `capacity` flows (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self {
            map: HashMap::with_hasher(FlowHash::new()),
            slots: Vec::new(),
            free: Vec::new(),
            lists: [EMPTY; 4],
            capacity: capacity.max(1),
            stats: FlowStats::default(),
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn stats(&self) -> FlowStats {
        self.stats
    }

    fn unlink(&mut self, i: u32) {
        let (prev, next, l) = {
            let s = &self.slots[i as usize];
            (s.prev, s.next, usize::from(s.list))
        };
        if prev == NIL {
            self.lists[l].head = next;
        } else {
            self.slots[prev as usize].next = next;
        }
        if next == NIL {
            self.lists[l].tail = prev;
        } else {
            self.slots[next as usize].prev = prev;
        }
    }

    fn push_back(&mut self, i: u32) {
        let l = usize::from(self.slots[i as usize].list);
        let tail = self.lists[l].tail;
        self.slots[i as usize].prev = tail;
        self.slots[i as usize].next = NIL;
        if tail == NIL {
            self.lists[l].head = i;
        } else {
            self.slots[tail as usize].next = i;
        }
        self.lists[l].tail = i;
    }

    fn remove(&mut self, i: u32) {
        self.unlink(i);
        let key = self.slots[i as usize].key;
        self.map.remove(&key);
        self.free.push(i);
    }

    fn expired(&self, i: u32, now: Instant) -> bool {
        let s = &self.slots[i as usize];
        now.saturating_duration_since(s.last) >= IDLE[usize::from(s.list)]
    }

    /// Drops up to [`FLOW_EXPIRY_BATCH`] expired flows from the front of each list.
    fn expire(&mut self, now: Instant) {
        for l in 0..4 {
            for _ in 0..FLOW_EXPIRY_BATCH {
                let head = self.lists[l].head;
                if head == NIL || !self.expired(head, now) {
                    break;
                }
                self.remove(head);
                self.stats.expired += 1;
            }
        }
    }

    /// Records (or refreshes) a flow this node opened.
    pub fn opened(&mut self, key: FlowKey, now: Instant) {
        self.expire(now);
        if let Some(&i) = self.map.get(&key) {
            self.slots[i as usize].last = now;
            self.unlink(i);
            self.push_back(i);
            return;
        }
        if self.map.len() >= self.capacity {
            // The oldest front of the four lists.
            let oldest = self
                .lists
                .iter()
                .map(|l| l.head)
                .filter(|&h| h != NIL)
                .min_by_key(|&h| self.slots[h as usize].last);
            if let Some(h) = oldest {
                self.remove(h);
                self.stats.evicted_when_full += 1;
            }
        }
        let slot = Slot {
            key,
            last: now,
            prev: NIL,
            next: NIL,
            list: list_of(key.proto),
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = slot;
                i
            }
            None => {
                self.slots.push(slot);
                u32::try_from(self.slots.len() - 1).unwrap_or(NIL)
            }
        };
        self.map.insert(key, i);
        self.push_back(i);
    }

    /// Whether `key` is a live flow this node opened; a hit refreshes it.
    pub fn reply(&mut self, key: &FlowKey, now: Instant) -> bool {
        self.expire(now);
        let Some(&i) = self.map.get(key) else {
            return false;
        };
        if self.expired(i, now) {
            self.remove(i);
            self.stats.expired += 1;
            return false;
        }
        self.slots[i as usize].last = now;
        self.unlink(i);
        self.push_back(i);
        true
    }

    /// Keeps only the flows `keep` accepts (after a policy change: a revoked flow is cut).
    /// O(flows); called once per policy change, never per packet.
    pub fn retain(&mut self, mut keep: impl FnMut(&FlowKey) -> bool) {
        let doomed: Vec<u32> = self
            .map
            .iter()
            .filter(|(k, _)| !keep(k))
            .map(|(_, &i)| i)
            .collect();
        for i in doomed {
            self.remove(i);
        }
    }
}
