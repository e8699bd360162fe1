//! A simulated network for the engine's tests: two engines, a direct link that can drop
//! datagrams per direction (a NAT that lets nothing in, or a firewall) or pass a NAT router per
//! node ([`super::sim_nat`], applied when a datagram leaves and when it arrives), and
//! relays that carry relayed datagrams between the nodes registered with them, answer
//! `PeerGone` for a node that is not, and can die. Time is a fixed clock stepped by the
//! simulation (ticks every [`TICK`], and when an engine's `poll_timeout` asks); nothing sleeps.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use plexsphere_wire::node::RelaySpec;

use super::Engine;
use super::sim_nat::Router;
use crate::reach::io::{Effect, Input, Now, Path, PeerReach, TICK, Transport};
use plexsphere_wire::key::PublicKey;

/// One way over the direct link.
pub const DIRECT_LATENCY: Duration = Duration::from_millis(2);
/// One way through a relay.
pub const RELAY_LATENCY: Duration = Duration::from_millis(10);

pub fn secret(n: u8) -> [u8; 32] {
    [n; 32]
}

pub fn key_of(n: u8) -> PublicKey {
    plexsphere_wire::reach::public_key(&secret(n))
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
    Engine::seeded(secret(n), mesh(), u64::from(n))
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
    pub key: PublicKey,
    pub addr: SocketAddr,
    /// The last path the engine set for the other node.
    pub path: Path,
    /// Every effect, with when.
    pub log: Vec<(Instant, Effect)>,
    /// Relays this node is connected (and so registered) to.
    pub up: BTreeSet<String>,
}

/// What happens at a moment of the simulation, to one node.
enum Event {
    Input(Input),
    /// A direct datagram reaches the node's router (or the node, without one).
    Arrive {
        src: SocketAddr,
        dst: SocketAddr,
        datagram: Vec<u8>,
    },
}

pub struct Net {
    pub start: Instant,
    pub now: Instant,
    next_tick: Instant,
    pub nodes: [Node; 2],
    /// `drop_direct[i]`: direct datagrams node `i` sends are lost.
    pub drop_direct: [bool; 2],
    /// The NAT router in front of each node, if any: `nodes[i].addr` is then its inside address.
    pub nat: [Option<Router>; 2],
    pub alive: BTreeSet<String>,
    queue: Vec<(Instant, usize, Event)>,
}

impl Net {
    /// Nodes 0 and 1 (keys from secrets 1 and 2), both homed on `r1`, relays `r1` and `r2`
    /// alive, each listing the other with its address and one address that never answers.
    pub fn new(drop_direct: [bool; 2]) -> Self {
        let mut net = Self::unintroduced(drop_direct, [None, None]);
        net.introduce(0);
        net.introduce(1);
        net
    }

    /// Nodes 0 and 1 behind the routers `nat` (with a router, a node's address is its inside
    /// one, 10.200.`i`.10, and its router's WAN address with its port is its reflexive
    /// candidate, as STUN would report it); neither knows the other yet ([`Net::introduce`]).
    pub fn unintroduced(drop_direct: [bool; 2], nat: [Option<Router>; 2]) -> Self {
        let start = Instant::now();
        let node = |n: u8, addr: SocketAddr| Node {
            engine: engine(n),
            key: key_of(n),
            addr,
            path: Path::None,
            log: Vec::new(),
            up: BTreeSet::new(),
        };
        let addr = |i: u8, public: SocketAddr| match &nat[usize::from(i)] {
            Some(_) => SocketAddr::from(([10, 200, i, 10], public.port())),
            None => public,
        };
        let mut net = Self {
            start,
            now: start,
            next_tick: start,
            nodes: [
                node(1, addr(0, SocketAddr::from(([192, 0, 2, 1], 51820)))),
                node(2, addr(1, SocketAddr::from(([198, 51, 100, 2], 41641)))),
            ],
            drop_direct,
            nat,
            alive: ["r1".to_owned(), "r2".to_owned()].into(),
            queue: Vec::new(),
        };
        for i in 0..2 {
            let own = net.nodes[i].addr;
            net.deliver(i, Input::Relays(vec![relay("r1", 3478), relay("r2", 3479)]));
            net.deliver(i, Input::LocalAddrs(vec![own]));
            if let Some(public) = net.public(i)
                && public != own
            {
                let nat = plexsphere_wire::node::NatReport {
                    mapping: plexsphere_wire::node::NatMapping::EndpointIndependent,
                    ..Default::default()
                };
                let addrs = vec![public];
                net.deliver(i, Input::Reflexive { addrs, nat });
            }
            net.connect(i, "r1");
            net.deliver(i, Input::HomeRelay(Some("r1".to_owned())));
        }
        net
    }

    /// Node `i` learns of the other node (its state lists it now).
    pub fn introduce(&mut self, i: usize) {
        let other = self.spec(1 - i, Some("r1"));
        self.deliver(i, Input::Peers(vec![other]));
    }

    /// Node `i`'s address as the world sees it with its port kept: its router's WAN address,
    /// or its own.
    pub fn public(&self, i: usize) -> Option<SocketAddr> {
        let own = self.nodes.get(i)?.addr;
        Some(match &self.nat[i] {
            Some(r) => SocketAddr::new(r.wan, own.port()),
            None => own,
        })
    }

    /// How node `i` is listed in the other's state.
    pub fn spec(&self, i: usize, home: Option<&str>) -> PeerReach {
        PeerReach {
            key: self.nodes[i].key,
            node_id: uuid::Uuid::from_u128(i as u128 + 1),
            hostname: format!("node-{i}"),
            endpoints: match self.public(i) {
                Some(public) if public != self.nodes[i].addr => vec![public, self.nodes[i].addr],
                _ => vec![self.nodes[i].addr, SocketAddr::from(([10, 9, 9, 9], 51820))],
            },
            home_relay: home.map(str::to_owned),
            routes: Vec::new(),
        }
    }

    pub fn at(&self) -> Now {
        Now {
            at: self.now,
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

    /// Hands node `i` an input now and routes the effects it decided on.
    pub fn deliver(&mut self, i: usize, input: Input) {
        let now = self.at();
        // Every effect of this input first: routing one may deliver to node `i` again.
        let effects = self.nodes[i].engine.step(input, now);
        for e in effects {
            self.route(i, e);
        }
    }

    fn route(&mut self, i: usize, effect: Effect) {
        let j = 1 - i;
        self.nodes[i].log.push((self.now, effect.clone()));
        match effect {
            Effect::SendDirect { to, datagram } => {
                if self.drop_direct[i] {
                    return;
                }
                let inside = self.nodes[i].addr;
                let src = match &mut self.nat[i] {
                    Some(router) => match router.outbound(inside, to, self.now) {
                        Some(src) => src,
                        None => return,
                    },
                    None => inside,
                };
                let arrive = Event::Arrive {
                    src,
                    dst: to,
                    datagram,
                };
                self.queue.push((self.now + DIRECT_LATENCY, j, arrive));
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
                    self.queue.push((at, j, Event::Input(input)));
                } else {
                    let gone = Input::PeerGone { relay, dst };
                    self.queue.push((at, i, Event::Input(gone)));
                }
            }
            Effect::SetPath { path, .. } => self.nodes[i].path = path,
            Effect::Candidates { .. } => {}
        }
    }

    /// A direct datagram reaches node `j`'s router (or node `j`): delivered if it lets it in.
    fn arrive(&mut self, j: usize, src: SocketAddr, dst: SocketAddr, datagram: Vec<u8>) {
        let reached = match &mut self.nat[j] {
            Some(router) => router.inbound(src, dst, self.now).is_some(),
            None => dst == self.nodes[j].addr,
        };
        if reached {
            let from = src;
            self.deliver(j, Input::DiscoDirect { from, datagram });
        }
    }

    /// Runs the network for `d`: deliveries in time order, a tick every [`TICK`] and whenever
    /// an engine's `poll_timeout` comes.
    pub fn run(&mut self, d: Duration) {
        let end = self.now + d;
        loop {
            let first = (0..self.queue.len()).min_by_key(|&k| self.queue[k].0);
            let next_q = first.map(|k| self.queue[k].0);
            let polls = [0, 1].map(|i| self.nodes[i].engine.poll_timeout());
            let next_poll = polls.iter().flatten().min().copied();
            let mut next = next_q.map_or(self.next_tick, |q| q.min(self.next_tick));
            if let Some(p) = next_poll {
                next = next.min(p.max(self.now));
            }
            if next > end {
                self.now = end;
                return;
            }
            self.now = next;
            match first {
                Some(k) if next_q == Some(next) => {
                    let (_, to, event) = self.queue.remove(k);
                    match event {
                        Event::Input(input) => self.deliver(to, input),
                        Event::Arrive { src, dst, datagram } => self.arrive(to, src, dst, datagram),
                    }
                }
                _ if next < self.next_tick => {
                    for (i, poll) in polls.iter().enumerate() {
                        if poll.is_some_and(|p| p <= next) {
                            self.deliver(i, Input::Tick);
                        }
                    }
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
