//! A simulated network for the engine's tests: two engines, a direct link that can drop
//! datagrams per direction (a NAT that lets nothing in, or a firewall), and relays that carry
//! relayed datagrams between the nodes registered with them, answer `PeerGone` for a node that
//! is not, and can die. Time is a fixed clock stepped by the simulation; nothing sleeps.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use plexsphere_wire::node::RelaySpec;
use plexsphere_wire::reach::disco::TxId;

use super::engine::Engine;
use super::io::{Effect, Input, Now, Path, PeerReach, TICK, Transport};
use crate::peer_key::PeerKey;

/// One way over the direct link.
pub const DIRECT_LATENCY: Duration = Duration::from_millis(2);
/// One way through a relay.
pub const RELAY_LATENCY: Duration = Duration::from_millis(10);

pub fn secret(n: u8) -> [u8; 32] {
    [n; 32]
}

pub fn key_of(n: u8) -> PeerKey {
    PeerKey(plexsphere_wire::reach::public_key(&secret(n)))
}

/// Tx ids counting up from a seed, so runs repeat exactly.
pub fn counting_tx(seed: u8) -> Box<dyn FnMut() -> TxId + Send> {
    let mut n: u64 = 0;
    Box::new(move || {
        n += 1;
        let mut tx = [seed; 12];
        tx[4..].copy_from_slice(&n.to_be_bytes());
        tx
    })
}

/// The mesh range of the simulated Domain.
pub fn mesh() -> ipnet::IpNet {
    ipnet::IpNet::from(
        ipnet::Ipv4Net::new(std::net::Ipv4Addr::new(10, 64, 0, 0), 16).unwrap_or_default(),
    )
}

/// Node 1 as node 0's state lists it, with these endpoints.
pub fn net_spec_with(endpoints: Vec<SocketAddr>) -> PeerReach {
    let mut spec = Net::new([false, false]).spec(1, None);
    spec.endpoints = endpoints;
    spec
}

pub fn engine(n: u8) -> Engine {
    Engine::with_tx_source(secret(n), mesh(), counting_tx(n))
}

pub fn relay(name: &str, port: u16) -> RelaySpec {
    RelaySpec {
        name: name.to_owned(),
        public_key: String::new(),
        udp: Some(SocketAddr::from(([203, 0, 113, 9], port))),
        tls: None,
        tls_server_name: None,
    }
}

pub struct Node {
    pub engine: Engine,
    pub key: PeerKey,
    pub addr: SocketAddr,
    /// The last path the engine set for the other node.
    pub path: Path,
    /// Every effect, with when.
    pub log: Vec<(Instant, Effect)>,
    /// Relays this node is connected (and so registered) to.
    pub up: BTreeSet<String>,
}

pub struct Net {
    pub start: Instant,
    pub now: Instant,
    next_tick: Instant,
    pub nodes: [Node; 2],
    /// `drop_direct[i]`: direct datagrams node `i` sends are lost.
    pub drop_direct: [bool; 2],
    pub alive: BTreeSet<String>,
    queue: Vec<(Instant, usize, Input)>,
}

impl Net {
    /// Nodes 0 and 1 (keys from secrets 1 and 2), both homed on `r1`, relays `r1` and `r2`
    /// alive, each listing the other with its address and one address that never answers.
    pub fn new(drop_direct: [bool; 2]) -> Self {
        let start = Instant::now();
        let node = |n: u8, addr: SocketAddr| Node {
            engine: engine(n),
            key: key_of(n),
            addr,
            path: Path::None,
            log: Vec::new(),
            up: BTreeSet::new(),
        };
        let mut net = Self {
            start,
            now: start,
            next_tick: start,
            nodes: [
                node(1, SocketAddr::from(([192, 0, 2, 1], 51820))),
                node(2, SocketAddr::from(([198, 51, 100, 2], 41641))),
            ],
            drop_direct,
            alive: ["r1".to_owned(), "r2".to_owned()].into(),
            queue: Vec::new(),
        };
        for i in 0..2 {
            let own = net.nodes[i].addr;
            net.deliver(i, Input::Relays(vec![relay("r1", 3478), relay("r2", 3479)]));
            net.deliver(i, Input::LocalAddrs(vec![own]));
            net.connect(i, "r1");
            net.deliver(i, Input::HomeRelay(Some("r1".to_owned())));
        }
        for i in 0..2 {
            let other = net.spec(1 - i, Some("r1"));
            net.deliver(i, Input::Peers(vec![other]));
        }
        net
    }

    /// How node `i` is listed in the other's state.
    pub fn spec(&self, i: usize, home: Option<&str>) -> PeerReach {
        PeerReach {
            key: self.nodes[i].key,
            node_id: uuid::Uuid::from_u128(i as u128 + 1),
            hostname: format!("node-{i}"),
            endpoints: vec![self.nodes[i].addr, SocketAddr::from(([10, 9, 9, 9], 51820))],
            home_relay: home.map(str::to_owned),
        }
    }

    pub fn at(&self) -> Now {
        Now {
            mono: self.now,
            wall: SystemTime::UNIX_EPOCH + self.now.duration_since(self.start),
        }
    }

    pub fn connect(&mut self, i: usize, relay: &str) {
        self.nodes[i].up.insert(relay.to_owned());
        let input = Input::RelayUp {
            relay: relay.to_owned(),
            transport: Transport::Udp,
            rtt: Some(RELAY_LATENCY * 2),
        };
        self.deliver(i, input);
    }

    /// The relay dies: both nodes lose it, and each runtime homes on `next`.
    pub fn kill_relay(&mut self, relay: &str, next: &str) {
        self.alive.remove(relay);
        for i in 0..2 {
            self.nodes[i].up.remove(relay);
            let why = "connection reset".to_owned();
            let relay = relay.to_owned();
            self.deliver(i, Input::RelayDown { relay, why });
            self.connect(i, next);
            self.deliver(i, Input::HomeRelay(Some(next.to_owned())));
        }
    }

    /// Hands node `i` an input now and routes what it answers.
    pub fn deliver(&mut self, i: usize, input: Input) {
        let now = self.at();
        let effects = self.nodes[i].engine.handle(now, input);
        for e in effects {
            self.route(i, e);
        }
    }

    fn route(&mut self, i: usize, effect: Effect) {
        let j = 1 - i;
        self.nodes[i].log.push((self.now, effect.clone()));
        match effect {
            Effect::SendDirect { to, datagram } => {
                if to == self.nodes[j].addr && !self.drop_direct[i] {
                    let from = self.nodes[i].addr;
                    let input = Input::DiscoDirect { from, datagram };
                    self.queue.push((self.now + DIRECT_LATENCY, j, input));
                }
            }
            Effect::SendRelayed {
                relay,
                dst,
                datagram,
            } => {
                if !self.alive.contains(&relay) {
                    return;
                }
                if !self.nodes[i].up.contains(&relay) {
                    self.connect(i, &relay);
                }
                let at = self.now + RELAY_LATENCY;
                if dst == self.nodes[j].key && self.nodes[j].up.contains(&relay) {
                    let src = self.nodes[i].key;
                    let input = Input::DiscoRelayed {
                        relay,
                        src,
                        datagram,
                    };
                    self.queue.push((at, j, input));
                } else {
                    self.queue.push((at, i, Input::PeerGone { relay, dst }));
                }
            }
            Effect::SetPath { path, .. } => self.nodes[i].path = path,
            Effect::Candidates { .. } => {}
        }
    }

    /// Runs the network for `d`: deliveries in time order, a tick every [`TICK`].
    pub fn run(&mut self, d: Duration) {
        let end = self.now + d;
        loop {
            let first = (0..self.queue.len()).min_by_key(|&k| self.queue[k].0);
            let next_q = first.map(|k| self.queue[k].0);
            let next = next_q.map_or(self.next_tick, |q| q.min(self.next_tick));
            if next > end {
                self.now = end;
                return;
            }
            self.now = next;
            match first {
                Some(k) if next_q == Some(next) => {
                    let (_, to, input) = self.queue.remove(k);
                    self.deliver(to, input);
                }
                _ => {
                    self.next_tick += TICK;
                    self.deliver(0, Input::Tick);
                    self.deliver(1, Input::Tick);
                }
            }
        }
    }

    /// Runs until both nodes' paths satisfy `want`, at most `bound`; answers how long it took.
    pub fn run_until(&mut self, bound: Duration, want: impl Fn(&Path) -> bool) -> Option<Duration> {
        let start = self.now;
        while self.now < start + bound {
            if want(&self.nodes[0].path) && want(&self.nodes[1].path) {
                return Some(self.now - start);
            }
            self.run(TICK);
        }
        None
    }

    pub fn direct_to(&self, i: usize) -> Path {
        Path::Direct {
            endpoint: self.nodes[1 - i].addr,
        }
    }
}

pub fn is_relay(name: &'static str) -> impl Fn(&Path) -> bool {
    move |p| matches!(p, Path::Relay { relay, transport: Transport::Udp } if relay == name)
}

pub fn is_direct(p: &Path) -> bool {
    matches!(p, Path::Direct { .. })
}
