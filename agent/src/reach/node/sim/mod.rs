//! The deterministic network simulator of reach nodes (issue 26, "Tests"; docs/reach.md "The
//! simulator"): hosts that each hold a real [`Node`], behind routers of every NAT kind
//! ([`net::NatKind`]), two STUN servers, relays that run the real relay's core
//! ([`relay::SimRelay`]), and a control plane that hands each node its peers' reported
//! candidates. Time is virtual (nanoseconds since the start; an `Instant` is one base plus
//! them), events wait in a heap ordered by (time, sequence), and everything random comes from
//! the seed: keys, the nodes' random sources, latencies, the order of the start, loss. No
//! sockets, threads or sleeps; the same seed gives the same run, byte for byte
//! ([`World::trace`]).
//!
//! What it does not model: WireGuard itself (no handshakes, no data: the nodes' paths are what
//! is checked, and how they are carried), the data plane refusing a relay endpoint, IPv6,
//! hosts sharing a LAN, reordering on one link, TCP's own loss recovery (a TCP link is
//! reliable and in order), and the relays' budgets beyond their defaults.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant, SystemTime};

use plexsphere_relay::core::ConnId;
use plexsphere_test_support::seeded::SeededRng;
use plexsphere_wire::key::PublicKey;
use plexsphere_wire::reach::public_key;
use plexsphere_wire::reach::relay::{Frame, RelayToken};
use plexsphere_wire::signed::{DomainSigner, SignContext};
use rand_core::RngCore;

use self::net::{NatKind, PORT, Want};
use self::relay::{RelaySent, SimRelay};
use crate::reach::engine::sim_nat::Router;
use crate::reach::io::{Now, Path, PeerReach, Transport};
use crate::reach::node::{Carry, Node, NodeOut};

pub mod net;
pub mod relay;
mod tests;

/// Virtual time is in nanoseconds.
pub const MS: u64 = 1_000_000;
pub const SECOND: u64 = 1_000 * MS;
/// One way between a server (STUN, relay) and the Internet's core.
const SERVER_LATENCY: u64 = 5 * MS;
/// One way between a router and the core: from this, plus up to [`ACCESS_SPREAD`] from the
/// seed.
const ACCESS_LATENCY: u64 = 2 * MS;
const ACCESS_SPREAD: u64 = 18 * MS;
/// A node's reported candidates reach its peers' states this long after it reported them (by
/// default; [`World::control_delay`]).
pub const CONTROL_DELAY: u64 = SECOND;
/// A TCP connection to a dead relay fails after this long (`TCP_CONNECT`).
const TCP_CONNECT: u64 = 5 * SECOND;

/// The simulated Domain's mesh range.
fn mesh() -> ipnet::IpNet {
    "100.64.0.0/10".parse().expect("a mesh range")
}

/// A stream of seeds from one: SplitMix64's finaliser over the three.
pub fn mix(seed: u64, a: u64, b: u64) -> u64 {
    let mut z = seed ^ a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.rotate_left(32);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One simulated host: a node, where it sits, whom it wants, and what it did.
pub struct Host {
    pub node: Node,
    pub kind: NatKind,
    pub key: PublicKey,
    node_id: uuid::Uuid,
    router: usize,
    pub inside: SocketAddr,
    /// The hosts this one wants as peers.
    pub wants: Vec<usize>,
    /// How the node last said to carry each peer.
    pub carry: BTreeMap<PublicKey, Carry>,
    /// What the node last reported of itself (the control plane hands it to its peers).
    reflexive: Vec<SocketAddr>,
    home_relay: Option<String>,
    wake: u64,
    /// It started ([`World::boot_all`]): before, it is off and gets nothing.
    booted: bool,
    /// Its TCP links, by relay.
    links: BTreeMap<usize, Link>,
    next_link: u64,
}

struct Link {
    epoch: u64,
    state: LinkState,
}

enum LinkState {
    /// Connecting, and the TLS handshake: frames wait.
    Opening(Vec<Frame>),
    Open(ConnId),
}

struct Site {
    router: Router,
    /// One way to the core.
    latency: u64,
    hosts: Vec<usize>,
}

#[derive(Clone, Copy)]
enum Target {
    Site(usize),
    Stun(usize),
    Relay(usize),
}

enum Ev {
    Boot {
        host: usize,
    },
    Wake {
        host: usize,
        wake: u64,
    },
    Udp {
        src: SocketAddr,
        dst: SocketAddr,
        datagram: Vec<u8>,
    },
    ToRelay {
        relay: usize,
        conn: ConnId,
        frame: Frame,
    },
    ToHost {
        host: usize,
        relay: usize,
        conn: ConnId,
        frame: Frame,
    },
    TcpUp {
        host: usize,
        relay: usize,
        epoch: u64,
    },
    TcpFailed {
        host: usize,
        relay: usize,
        epoch: u64,
    },
    RelayWake {
        relay: usize,
    },
    Control,
}

/// A queued event; the event itself is boxed, so the heap moves 24 bytes, not a frame.
struct Queued {
    t: u64,
    seq: u64,
    ev: Box<Ev>,
}

impl PartialEq for Queued {
    fn eq(&self, other: &Self) -> bool {
        (self.t, self.seq) == (other.t, other.seq)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Queued {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.t, self.seq).cmp(&(other.t, other.seq))
    }
}

/// What the world counted.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub events: u64,
    pub datagrams: u64,
    pub lost: u64,
    pub tcp_frames: u64,
}

pub struct World {
    /// Virtual time now, in nanoseconds since the start.
    pub now: u64,
    base: Instant,
    seed: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<Queued>>,
    pub hosts: Vec<Host>,
    sites: Vec<Site>,
    pub relays: Vec<SimRelay>,
    stun: Vec<SocketAddr>,
    targets: HashMap<IpAddr, Target>,
    /// Each relay's TCP connections, by their number: whose.
    tcp_owner: HashMap<(usize, ConnId), usize>,
    rng: SeededRng,
    /// Datagrams lost, per 10,000.
    pub loss: u32,
    trace: u64,
    signer: DomainSigner,
    /// Hosts whose reported candidates changed since the control plane last pushed.
    dirty: BTreeSet<usize>,
    control_due: bool,
    pub stats: Stats,
    /// Hosts whose datagrams and wakes are printed (for a test being debugged).
    pub watch: Vec<usize>,
    /// How long the control plane takes to hand a node's new candidates to its peers.
    pub control_delay: u64,
}

impl World {
    /// A world from `seed` with `relays` relays (r1, r2, ...; every node's state lists them
    /// in that order) and two STUN servers.
    pub fn new(seed: u64, relays: usize) -> Self {
        let base = Instant::now();
        let signer = DomainSigner::from_seed(&[0x3d; 32]).expect("a Domain key");
        let mut w = Self {
            now: 0,
            base,
            seed,
            seq: 0,
            queue: BinaryHeap::new(),
            hosts: Vec::new(),
            sites: Vec::new(),
            relays: Vec::new(),
            stun: vec![net::stun(1), net::stun(2)],
            targets: HashMap::new(),
            tcp_owner: HashMap::new(),
            rng: SeededRng::new(mix(seed, u64::MAX, 0)),
            loss: 0,
            trace: 0xcbf2_9ce4_8422_2325,
            signer,
            dirty: BTreeSet::new(),
            control_due: false,
            stats: Stats::default(),
            watch: Vec::new(),
            control_delay: CONTROL_DELAY,
        };
        for (i, s) in w.stun.clone().into_iter().enumerate() {
            w.targets.insert(s.ip(), Target::Stun(i));
        }
        let domain = w.signer.public_key_b64();
        for i in 0..relays {
            let n = u8::try_from(i + 1).expect("at most 255 relays");
            let r = SimRelay::new(
                &format!("r{n}"),
                [0x70 + n; 32],
                net::relay_udp(n),
                &domain,
                w.at(0),
            );
            w.targets.insert(r.udp.ip(), Target::Relay(i));
            w.relays.push(r);
            w.push(0, Ev::RelayWake { relay: i });
        }
        w
    }

    /// The `Now` at virtual time `t`.
    pub fn at(&self, t: u64) -> Now {
        let d = Duration::from_nanos(t);
        Now::new(
            self.base + d,
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000) + d,
        )
    }

    fn ns(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    fn push(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse(Queued {
            t,
            seq: self.seq,
            ev: Box::new(ev),
        }));
    }

    /// The fold of every datagram and frame sent so far, with when and by whom.
    pub fn trace(&self) -> u64 {
        self.trace
    }

    fn fold(&mut self, who: u64, bytes: &[u8]) {
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        let mut h = (self.trace ^ self.now).wrapping_mul(PRIME);
        h = (h ^ who).wrapping_mul(PRIME);
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            h = (h ^ u64::from_le_bytes(b)).wrapping_mul(PRIME);
        }
        self.trace = h;
    }

    fn new_site(&mut self, kind: NatKind) -> usize {
        let n = self.sites.len();
        let wan = net::wan(n);
        let latency = ACCESS_LATENCY + self.rng.next_u64() % ACCESS_SPREAD;
        self.targets.insert(wan, Target::Site(n));
        self.sites.push(Site {
            router: kind.router(wan),
            latency,
            hosts: Vec::new(),
        });
        n
    }

    /// A host behind a router of `kind` of its own; it starts with [`World::boot`].
    pub fn add_host(&mut self, kind: NatKind) -> usize {
        let h = self.hosts.len();
        let site = self.new_site(kind);
        let inside = match kind {
            NatKind::Routed => SocketAddr::new(self.sites[site].router.wan, PORT),
            _ => net::inside(2),
        };
        self.sites[site].hosts.push(h);
        let mut secret = [0u8; 32];
        SeededRng::new(mix(self.seed, h as u64, 3)).fill_bytes(&mut secret);
        let node = Node::new(
            secret,
            mesh(),
            true,
            Box::new(SeededRng::new(mix(self.seed, h as u64, 1))),
            Box::new(SeededRng::new(mix(self.seed, h as u64, 2))),
            self.at(self.now).at,
        );
        self.hosts.push(Host {
            node,
            kind,
            key: public_key(&secret),
            node_id: uuid::Uuid::from_u128(h as u128 + 1),
            router: site,
            inside,
            wants: Vec::new(),
            carry: BTreeMap::new(),
            reflexive: Vec::new(),
            home_relay: None,
            wake: 0,
            booted: false,
            links: BTreeMap::new(),
            next_link: 0,
        });
        h
    }

    /// Hosts `a` and `b` want each other.
    pub fn pair(&mut self, a: usize, b: usize) {
        if a != b && !self.hosts[a].wants.contains(&b) {
            self.hosts[a].wants.push(b);
            self.hosts[b].wants.push(a);
        }
    }

    /// Every host starts within `spread` from now, in an order from the seed.
    pub fn boot_all(&mut self, spread: u64) {
        for h in 0..self.hosts.len() {
            let t = self.now + self.rng.next_u64() % spread.max(1);
            self.push(t, Ev::Boot { host: h });
        }
    }

    /// Host `h` starts at `t`.
    pub fn boot_at(&mut self, h: usize, t: u64) {
        self.push(t, Ev::Boot { host: h });
    }

    fn token(&self, h: usize) -> Vec<u8> {
        let host = &self.hosts[h];
        let t = RelayToken {
            domain_id: uuid::Uuid::nil(),
            node_id: host.node_id,
            public_key: host.key.to_base64(),
            expires_at: self.at(self.now).unix() + 540,
            key_generation: 1,
        };
        let signed = self
            .signer
            .sign(SignContext::RelayToken, &t)
            .expect("a token signs");
        serde_json::to_vec(&signed).expect("a token encodes")
    }

    /// Host `p` as its peers' states list it: its LAN address, then what it reported.
    fn listed(&self, p: usize) -> PeerReach {
        let host = &self.hosts[p];
        let mut endpoints = vec![host.inside];
        endpoints.extend(host.reflexive.iter().filter(|a| **a != host.inside));
        PeerReach {
            key: host.key,
            node_id: host.node_id,
            hostname: format!("h{p}"),
            endpoints,
            home_relay: host.home_relay.clone(),
            routes: Vec::new(),
        }
    }

    fn peers_of(&self, h: usize) -> Vec<PeerReach> {
        self.hosts[h]
            .wants
            .iter()
            .map(|p| self.listed(*p))
            .collect()
    }

    /// Runs every event up to `end` (virtual ns).
    pub fn run_until(&mut self, end: u64) {
        while let Some(Reverse(top)) = self.queue.peek() {
            if top.t > end {
                break;
            }
            let Some(Reverse(q)) = self.queue.pop() else {
                break;
            };
            self.now = q.t.max(self.now);
            self.stats.events += 1;
            self.dispatch(*q.ev);
        }
        self.now = end.max(self.now);
    }

    fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::Boot { host } => {
                self.hosts[host].booted = true;
                let token = self.token(host);
                let relays = self.relays.iter().map(|r| r.spec.clone()).collect();
                let stun = self.stun.clone();
                let peers = self.peers_of(host);
                self.input(host, move |n, now| {
                    n.handle_token(token);
                    n.handle_relays(relays, stun, now);
                });
                self.input(host, move |n, now| {
                    n.handle_peers(peers, now);
                    n.handle_daemon_input(now);
                });
            }
            Ev::Wake { host, wake } => {
                if self.hosts[host].wake == wake {
                    self.input(host, |n, now| n.handle_timeout(now));
                }
            }
            Ev::Udp { src, dst, datagram } => self.arrive(src, dst, &datagram),
            Ev::ToRelay { relay, conn, frame } => {
                if self.relays[relay].alive && self.relays[relay].has_conn(conn) {
                    let mut sent = Vec::new();
                    let now = self.at(self.now);
                    self.relays[relay].handle_tcp_frame(frame, conn, now, &mut sent);
                    self.relay_sent(relay, sent);
                }
            }
            Ev::ToHost {
                host,
                relay,
                conn,
                frame,
            } => {
                let open = matches!(
                    self.hosts[host].links.get(&relay),
                    Some(Link { state: LinkState::Open(c), .. }) if *c == conn
                );
                if open {
                    let name = self.relays[relay].spec.name.clone();
                    self.input(host, move |n, now| n.handle_tcp_frame(&name, frame, now));
                }
            }
            Ev::TcpUp { host, relay, epoch } => self.tcp_up(host, relay, epoch),
            Ev::TcpFailed { host, relay, epoch } => {
                if self.hosts[host].links.get(&relay).map(|l| l.epoch) == Some(epoch) {
                    self.hosts[host].links.remove(&relay);
                    self.tcp_closed(host, relay, "the TCP connect timed out");
                }
            }
            Ev::RelayWake { relay } => {
                let mut sent = Vec::new();
                let now = self.at(self.now);
                self.relays[relay].handle_timeout(now, &mut sent);
                self.relay_sent(relay, sent);
                if let Some(at) = self.relays[relay].poll_timeout() {
                    let t = self.ns(at).max(self.now + 1);
                    self.push(t, Ev::RelayWake { relay });
                }
            }
            Ev::Control => self.control(),
        }
    }

    /// Host `h`'s node takes an input (`f`); what it asks is carried out, and it is woken at
    /// its next deadline.
    fn input(&mut self, h: usize, f: impl FnOnce(&mut Node, Now)) {
        let now = self.at(self.now);
        f(&mut self.hosts[h].node, now);
        self.drain(h);
        let at = self.hosts[h].node.poll_timeout();
        let t = at.map_or(self.now + SECOND, |at| self.ns(at)).max(self.now);
        if self.watch.contains(&h) {
            eprintln!("{} ms h{h} wakes at {} ms", self.now / MS, t / MS);
        }
        let host = &mut self.hosts[h];
        host.wake += 1;
        let wake = host.wake;
        self.push(t, Ev::Wake { host: h, wake });
    }

    fn drain(&mut self, h: usize) {
        while let Some(out) = self.hosts[h].node.poll_out() {
            let now = self.at(self.now);
            match out {
                NodeOut::Send { to, datagram } => self.send_from_host(h, to, datagram),
                NodeOut::RelayUdp { to, frame } => {
                    self.send_from_host(h, to, frame.to_datagram());
                }
                NodeOut::RelayTcp { relay, frame } => self.tcp_send(h, &relay, frame),
                NodeOut::OpenTcp { relay, .. } => self.tcp_open(h, &relay),
                NodeOut::CloseTcp { relay } => {
                    if let Some(r) = self.relay_index(&relay) {
                        self.tcp_close(h, r);
                    }
                }
                NodeOut::Recv { .. } | NodeOut::Dropped | NodeOut::PlaneRelays(_) => {}
                NodeOut::Publish(_) => {}
                NodeOut::Carry { peer, how } => {
                    self.hosts[h].carry.insert(peer, how);
                }
                NodeOut::Candidates {
                    reflexive,
                    home_relay,
                    ..
                } => {
                    let host = &mut self.hosts[h];
                    if host.reflexive != reflexive || host.home_relay != home_relay {
                        host.reflexive = reflexive;
                        host.home_relay = home_relay;
                        self.dirty.insert(h);
                        if !self.control_due {
                            self.control_due = true;
                            self.push(self.now + self.control_delay, Ev::Control);
                        }
                    }
                }
                NodeOut::ReadAddrs => {
                    let ip = self.hosts[h].inside.ip();
                    self.hosts[h].node.handle_local_addrs(vec![ip], PORT, now);
                }
                NodeOut::ReadHandshakes => {
                    self.hosts[h].node.handle_handshakes(Some(Vec::new()), now);
                }
            }
        }
    }

    /// The control plane hands every peer of a host whose candidates changed its new listing.
    fn control(&mut self) {
        self.control_due = false;
        let mut affected = BTreeSet::new();
        for c in std::mem::take(&mut self.dirty) {
            affected.extend(self.hosts[c].wants.iter().copied());
        }
        // A host that is not on yet gets its peers as they are when it starts.
        affected.retain(|h| self.hosts[*h].booted);
        for h in affected {
            let peers = self.peers_of(h);
            self.input(h, move |n, now| {
                n.handle_peers(peers, now);
                n.handle_daemon_input(now);
            });
        }
    }

    fn relay_index(&self, name: &str) -> Option<usize> {
        self.relays.iter().position(|r| r.spec.name == name)
    }

    fn send_from_host(&mut self, h: usize, to: SocketAddr, datagram: Vec<u8>) {
        self.fold(h as u64, &datagram);
        let host = &self.hosts[h];
        let (inside, site) = (host.inside, host.router);
        let at = self.at(self.now).at;
        let src = self.sites[site].router.outbound(inside, to, at);
        if self.watch.contains(&h) {
            eprintln!(
                "{} ms h{h} {} {inside} -> {to} as {src:?}",
                self.now / MS,
                describe(&datagram)
            );
        }
        let Some(src) = src else {
            return;
        };
        let latency = self.sites[site].latency;
        self.send_udp(src, latency, to, datagram);
    }

    /// A datagram leaves `src` (`latency` from the core) for `dst`: lost, or queued to
    /// arrive.
    fn send_udp(&mut self, src: SocketAddr, latency: u64, dst: SocketAddr, datagram: Vec<u8>) {
        self.stats.datagrams += 1;
        if self.loss > 0 && self.rng.next_u32() % 10_000 < self.loss {
            self.stats.lost += 1;
            return;
        }
        let Some(target) = self.targets.get(&dst.ip()).copied() else {
            return;
        };
        let t = self.now + latency + self.latency_of(target);
        self.push(t, Ev::Udp { src, dst, datagram });
    }

    fn latency_of(&self, target: Target) -> u64 {
        match target {
            Target::Site(s) => self.sites[s].latency,
            Target::Stun(_) | Target::Relay(_) => SERVER_LATENCY,
        }
    }

    fn arrive(&mut self, src: SocketAddr, dst: SocketAddr, datagram: &[u8]) {
        let Some(target) = self.targets.get(&dst.ip()).copied() else {
            return;
        };
        match target {
            Target::Site(s) => {
                let at = self.at(self.now).at;
                let inside = self.sites[s].router.inbound(src, dst, at);
                if self.sites[s].hosts.iter().any(|h| self.watch.contains(h)) {
                    eprintln!(
                        "{} ms site {s} {} {src} -> {dst} in: {inside:?}",
                        self.now / MS,
                        describe(datagram)
                    );
                }
                let Some(inside) = inside else {
                    return;
                };
                let host = self.sites[s]
                    .hosts
                    .iter()
                    .copied()
                    .find(|h| self.hosts[*h].inside == inside);
                if let Some(h) = host.filter(|h| self.hosts[*h].booted) {
                    self.input(h, |n, now| n.handle_datagram(datagram, src, now));
                }
            }
            Target::Stun(i) => {
                if dst != self.stun[i] {
                    return;
                }
                if let Some(answer) = plexsphere_relay::stun::answer(datagram, src) {
                    self.fold(u64::MAX - i as u64, &answer);
                    self.send_udp(dst, SERVER_LATENCY, src, answer);
                }
            }
            Target::Relay(r) => {
                if !self.relays[r].alive || dst != self.relays[r].udp {
                    return;
                }
                let mut sent = Vec::new();
                let now = self.at(self.now);
                self.relays[r].handle_udp(datagram, src, now, &mut sent);
                self.relay_sent(r, sent);
            }
        }
    }

    fn relay_sent(&mut self, r: usize, sent: Vec<RelaySent>) {
        let who = u64::MAX - 100 - r as u64;
        for s in sent {
            match s {
                RelaySent::Udp { to, datagram } => {
                    self.fold(who, &datagram);
                    let from = self.relays[r].udp;
                    self.send_udp(from, SERVER_LATENCY, to, datagram);
                }
                RelaySent::Tcp { conn, frame } => {
                    let Some(host) = self.tcp_owner.get(&(r, conn)).copied() else {
                        continue;
                    };
                    self.fold(who, &frame.to_datagram());
                    self.stats.tcp_frames += 1;
                    let t = self.now + self.link_latency(host);
                    self.push(
                        t,
                        Ev::ToHost {
                            host,
                            relay: r,
                            conn,
                            frame,
                        },
                    );
                }
            }
        }
    }

    /// One way between host `h` and a relay.
    fn link_latency(&self, h: usize) -> u64 {
        self.sites[self.hosts[h].router].latency + SERVER_LATENCY
    }

    fn tcp_open(&mut self, h: usize, relay: &str) {
        let Some(r) = self.relay_index(relay) else {
            return;
        };
        self.tcp_close(h, r);
        let host = &mut self.hosts[h];
        host.next_link += 1;
        let epoch = host.next_link;
        host.links.insert(
            r,
            Link {
                epoch,
                state: LinkState::Opening(Vec::new()),
            },
        );
        let one_way = self.link_latency(h);
        if self.relays[r].alive {
            // TCP's handshake, then TLS's: two round trips.
            let t = self.now + 4 * one_way;
            self.push(
                t,
                Ev::TcpUp {
                    host: h,
                    relay: r,
                    epoch,
                },
            );
        } else {
            let t = self.now + TCP_CONNECT;
            self.push(
                t,
                Ev::TcpFailed {
                    host: h,
                    relay: r,
                    epoch,
                },
            );
        }
    }

    fn tcp_up(&mut self, h: usize, r: usize, epoch: u64) {
        let Some(link) = self.hosts[h].links.get(&r) else {
            return;
        };
        if link.epoch != epoch || !matches!(link.state, LinkState::Opening(_)) {
            return;
        }
        let site = self.hosts[h].router;
        let addr = SocketAddr::new(self.sites[site].router.wan, 40_000);
        let now = self.at(self.now);
        let conn = if self.relays[r].alive {
            self.relays[r].handle_tcp_open(addr, now)
        } else {
            None
        };
        let Some(conn) = conn else {
            self.hosts[h].links.remove(&r);
            self.tcp_closed(h, r, "the relay closed the connection");
            return;
        };
        self.tcp_owner.insert((r, conn), h);
        let waiting = match self.hosts[h].links.get_mut(&r) {
            Some(link) => match std::mem::replace(&mut link.state, LinkState::Open(conn)) {
                LinkState::Opening(frames) => frames,
                LinkState::Open(_) => Vec::new(),
            },
            None => Vec::new(),
        };
        for frame in waiting {
            self.tcp_send(h, &self.relays[r].spec.name.clone(), frame);
        }
    }

    fn tcp_send(&mut self, h: usize, relay: &str, frame: Frame) {
        let Some(r) = self.relay_index(relay) else {
            return;
        };
        let conn = match self.hosts[h].links.get_mut(&r) {
            Some(Link {
                state: LinkState::Opening(frames),
                ..
            }) => {
                frames.push(frame);
                return;
            }
            Some(Link {
                state: LinkState::Open(conn),
                ..
            }) => *conn,
            None => return,
        };
        self.fold(h as u64, &frame.to_datagram());
        self.stats.tcp_frames += 1;
        let t = self.now + self.link_latency(h);
        self.push(
            t,
            Ev::ToRelay {
                relay: r,
                conn,
                frame,
            },
        );
    }

    /// Host `h` closes its link to relay `r` (the node asked; no end is reported back).
    fn tcp_close(&mut self, h: usize, r: usize) {
        if let Some(Link {
            state: LinkState::Open(conn),
            ..
        }) = self.hosts[h].links.remove(&r)
        {
            self.tcp_owner.remove(&(r, conn));
            self.relays[r].handle_tcp_close(conn);
        }
    }

    /// Host `h`'s link to relay `r` ended under it.
    fn tcp_closed(&mut self, h: usize, r: usize, why: &str) {
        let name = self.relays[r].spec.name.clone();
        let why = why.to_owned();
        self.input(h, move |n, now| n.handle_tcp_closed(&name, &why, now));
    }

    /// The public address of host `h`'s router.
    pub fn wan_of(&self, h: usize) -> IpAddr {
        self.sites[self.hosts[h].router].router.wan
    }

    /// Relay `r` dies: it answers nothing more, and every TCP link to it ends.
    pub fn kill_relay(&mut self, r: usize) {
        for conn in self.relays[r].kill() {
            if let Some(h) = self.tcp_owner.remove(&(r, conn)) {
                self.hosts[h].links.remove(&r);
                self.tcp_closed(h, r, "connection reset");
            }
        }
        // Links still opening fail at their connect.
        let opening: Vec<usize> = (0..self.hosts.len())
            .filter(|h| self.hosts[*h].links.contains_key(&r))
            .collect();
        for h in opening {
            self.hosts[h].links.remove(&r);
            self.tcp_closed(h, r, "connection refused");
        }
    }

    /// Host `h` moves behind a new router of `kind`, with another LAN address: its TCP links
    /// end; its node finds out at its next read of the addresses.
    pub fn roam(&mut self, h: usize, kind: NatKind) {
        let old = self.hosts[h].router;
        self.sites[old].hosts.retain(|x| *x != h);
        let site = self.new_site(kind);
        self.sites[site].hosts.push(h);
        let inside = match kind {
            NatKind::Routed => SocketAddr::new(self.sites[site].router.wan, PORT),
            _ => {
                let [.., n] = match self.hosts[h].inside.ip() {
                    IpAddr::V4(v4) => v4.octets(),
                    IpAddr::V6(_) => [0, 0, 0, 2],
                };
                net::inside(n.wrapping_add(1).max(2))
            }
        };
        let host = &mut self.hosts[h];
        host.router = site;
        host.inside = inside;
        host.kind = kind;
        let links = std::mem::take(&mut host.links);
        for (r, link) in links {
            if let LinkState::Open(conn) = link.state {
                self.tcp_owner.remove(&(r, conn));
                self.relays[r].handle_tcp_close(conn);
            }
            self.tcp_closed(h, r, "the host moved");
        }
    }
}

/// A datagram in a line: its kind, and for a relay frame its type and whom it names.
fn describe(datagram: &[u8]) -> String {
    use plexsphere_wire::reach::{Kind, classify};
    match classify(datagram) {
        Kind::Relay => match Frame::from_datagram(datagram) {
            Ok(Frame::Send { dst, payload }) => {
                format!(
                    "send to {:02x}{:02x} ({} bytes)",
                    dst[0],
                    dst[1],
                    payload.len()
                )
            }
            Ok(Frame::Recv { src, payload }) => {
                format!(
                    "recv from {:02x}{:02x} ({} bytes)",
                    src[0],
                    src[1],
                    payload.len()
                )
            }
            Ok(f) => format!("relay {f:?}").chars().take(40).collect(),
            Err(_) => "relay ?".to_owned(),
        },
        kind => format!("{kind:?}"),
    }
}

/// Whether `carry` is how `path` is carried: its endpoint, the data plane's relay endpoint
/// over UDP or on the relay's TCP link.
fn carried_as(path: &Path, carry: Option<&Carry>) -> bool {
    match (path, carry) {
        (Path::None, _) => true,
        (Path::Direct { endpoint }, Some(Carry::Direct(e))) => e == endpoint,
        (
            Path::Relay {
                relay,
                transport: Transport::Udp,
            },
            Some(Carry::PlaneRelay { relay: r, .. }),
        ) => r == relay,
        (
            Path::Relay {
                relay,
                transport: Transport::Tcp,
            },
            Some(Carry::PlaneLink { relay: r }),
        ) => r == relay,
        _ => false,
    }
}

impl World {
    /// Host `h`'s path to host `p`, as its node sees it.
    pub fn path(&self, h: usize, p: usize) -> Path {
        let key = self.hosts[p].key.to_base64();
        self.hosts[h]
            .node
            .paths()
            .into_iter()
            .find(|v| v.public_key == key)
            .map_or(Path::None, |v| v.path)
    }

    /// Every wanted pair whose path is not the one its NAT kinds give ([`net::expected`]), or
    /// is not carried the way its path says, as lines; `relay_ok` says which relays a relayed
    /// path may use.
    pub fn unmet(&self, strict: bool, relay_ok: &dyn Fn(&str) -> bool) -> Vec<String> {
        let mut lines = Vec::new();
        for (h, host) in self.hosts.iter().enumerate() {
            let paths: HashMap<String, Path> = host
                .node
                .paths()
                .into_iter()
                .map(|v| (v.public_key, v.path))
                .collect();
            for &p in &host.wants {
                let peer = &self.hosts[p];
                let want: Want = net::expected(host.kind, peer.kind, strict);
                let path = paths
                    .get(&peer.key.to_base64())
                    .cloned()
                    .unwrap_or(Path::None);
                let relay_fine = match &path {
                    Path::Relay { relay, .. } => relay_ok(relay),
                    _ => true,
                };
                let carried = carried_as(&path, host.carry.get(&peer.key));
                if !want.holds(&path) || !relay_fine || !carried {
                    lines.push(format!(
                        "h{h} ({:?}) -> h{p} ({:?}): {path:?}, want {want:?}, carried {:?}",
                        host.kind,
                        peer.kind,
                        host.carry.get(&peer.key)
                    ));
                }
            }
        }
        lines
    }

    /// Runs until every wanted pair holds ([`World::unmet`]), checked every second, at most
    /// until `bound`: when they first all held, or what did not by then.
    pub fn converge(
        &mut self,
        bound: u64,
        strict: bool,
        relay_ok: &dyn Fn(&str) -> bool,
    ) -> Result<u64, Vec<String>> {
        loop {
            let unmet = self.unmet(strict, relay_ok);
            if unmet.is_empty() {
                return Ok(self.now);
            }
            if self.now >= bound {
                return Err(unmet);
            }
            self.run_until((self.now + SECOND).min(bound));
        }
    }
}
