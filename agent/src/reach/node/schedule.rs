//! The schedule as a sans-IO machine: when the runtime's pass runs (every [`TICK`], and at
//! once after a daemon input), and what it does: read the host's addresses (every
//! [`ADDRS_EVERY`]; a change is a network change), read the data plane's handshakes (every
//! [`HANDSHAKES_EVERY`]), run STUN (at once first, every [`STUN_EVERY`], and at once after an
//! address change or a change of the relays or the STUN servers), then tick the relays and the
//! engine and publish the views. It owns the running [`StunProbe`] and reports what a finished
//! probe says as soon as its last answer arrives.
//!
//! No sockets, no clock, no OS randomness: the runtime hands it the time and what it read, and
//! carries out what it answers ([`Schedule::poll_out`], [`Due`]) until it answers `None`. A
//! pass is produced step by step: after [`Due::ReadAddrs`] the runtime answers with
//! [`Schedule::handle_local_addrs`] before it polls on, so an address change restarts STUN in
//! the same pass. STUN transaction ids come from the random source given at construction (the
//! OS's CSPRNG in the runtime: an id an off-path host could guess would let it answer for a
//! server).

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use rand_core::CryptoRngCore;

use crate::reach::io::{Input, TICK};
use crate::reach::stun::{self, Poll, StunProbe};

/// STUN runs again this often (and on every network change).
pub const STUN_EVERY: Duration = Duration::from_secs(60);
/// The host's addresses are read this often (a change is a network change).
pub const ADDRS_EVERY: Duration = Duration::from_secs(5);
/// The data plane's handshake times are read this often.
pub const HANDSHAKES_EVERY: Duration = Duration::from_secs(2);

/// What the runtime carries out for the schedule, in order.
#[derive(Debug)]
pub enum Due {
    /// Read the host's addresses and answer with [`Schedule::handle_local_addrs`] before
    /// polling again.
    ReadAddrs,
    /// Read the data plane's handshake times and hand them to the engine
    /// (`Input::Handshakes`).
    ReadHandshakes,
    /// A STUN Binding request to send from the WireGuard socket.
    Send { to: SocketAddr, datagram: Vec<u8> },
    /// What the last STUN run said about UDP, for the relay set (`handle_udp_blocked`).
    UdpBlocked(bool),
    /// An input for the engine (`LocalAddrs`, `NetworkChanged`, `Reflexive`).
    Engine(Input),
    /// The pass's end: the relay set's `handle_timeout`, then the engine's `Input::Tick`, then
    /// the published views.
    Tick,
}

/// Where a pass is: what it does next.
#[derive(Debug, Clone, Copy)]
enum Step {
    Addrs,
    Handshakes,
    Stun,
    Tick,
}

/// The schedule; see the module docs.
pub struct Schedule {
    next_tick: Instant,
    next_addrs: Instant,
    next_handshakes: Instant,
    next_stun: Instant,
    /// The pass under way and the time it runs at.
    pass: Option<(Step, Instant)>,
    probe: Option<StunProbe>,
    /// The state's STUN servers, and the UDP addresses of its relays (asked too).
    stun_servers: Vec<SocketAddr>,
    relay_servers: Vec<SocketAddr>,
    /// The host's addresses as last read (sorted, no duplicates), and the WireGuard port read
    /// with them.
    local: Vec<IpAddr>,
    port: u16,
    rng: Box<dyn CryptoRngCore + Send>,
    out: VecDeque<Due>,
}

impl Schedule {
    /// A schedule whose first pass is due at `now`: it reads the addresses and the handshakes
    /// and starts STUN.
    pub fn new(rng: Box<dyn CryptoRngCore + Send>, now: Instant) -> Self {
        Self {
            next_tick: now,
            next_addrs: now,
            next_handshakes: now,
            next_stun: now,
            pass: None,
            probe: None,
            stun_servers: Vec::new(),
            relay_servers: Vec::new(),
            local: Vec::new(),
            port: 0,
            rng,
            out: VecDeque::new(),
        }
    }

    /// When the next pass is due, or the running STUN probe's next retry or give-up, whichever
    /// comes first. Never `None`, and never later than [`TICK`] after the last pass.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let probe = self.probe.as_ref().and_then(StunProbe::poll_timeout);
        Some(probe.map_or(self.next_tick, |p| p.min(self.next_tick)))
    }

    /// The next thing to carry out.
    pub fn poll_out(&mut self) -> Option<Due> {
        loop {
            if let Some(due) = self.out.pop_front() {
                return Some(due);
            }
            let (step, t) = self.pass?;
            match step {
                Step::Addrs => {
                    self.pass = Some((Step::Handshakes, t));
                    if t >= self.next_addrs {
                        self.next_addrs = t + ADDRS_EVERY;
                        self.out.push_back(Due::ReadAddrs);
                    }
                }
                Step::Handshakes => {
                    self.pass = Some((Step::Stun, t));
                    if t >= self.next_handshakes {
                        self.next_handshakes = t + HANDSHAKES_EVERY;
                        self.out.push_back(Due::ReadHandshakes);
                    }
                }
                Step::Stun => {
                    self.pass = Some((Step::Tick, t));
                    self.start_stun(t);
                    self.poll_probe(t);
                }
                Step::Tick => {
                    self.pass = None;
                    self.out.push_back(Due::Tick);
                }
            }
        }
    }

    /// A daemon input arrived (peers, relays, a token, a key, a pinned path): the next pass
    /// runs at once.
    pub fn handle_daemon_input(&mut self, now: Instant) {
        self.next_tick = self.next_tick.min(now);
    }

    /// Whether [`Self::handle_timeout`] at `now` starts a pass.
    pub fn pass_due(&self, now: Instant) -> bool {
        now >= self.next_tick
    }

    /// Time passed: the pass runs when it is due, and otherwise the STUN probe is polled when
    /// its retry or give-up is.
    pub fn handle_timeout(&mut self, now: Instant) {
        if now >= self.next_tick {
            self.next_tick = now + TICK;
            self.pass = Some((Step::Addrs, now));
        } else if self
            .probe
            .as_ref()
            .and_then(StunProbe::poll_timeout)
            .is_some_and(|at| at <= now)
        {
            self.poll_probe(now);
        }
    }

    /// The host's addresses (the answer to [`Due::ReadAddrs`]) and the WireGuard port. A
    /// change hands the engine its local candidates, is a network change (not the first
    /// time), and restarts STUN.
    pub fn handle_local_addrs(&mut self, mut ips: Vec<IpAddr>, port: u16, now: Instant) {
        ips.sort();
        ips.dedup();
        self.port = port;
        if ips == self.local {
            return;
        }
        let first = self.local.is_empty();
        self.local = ips;
        let candidates = self
            .local
            .iter()
            .map(|ip| SocketAddr::new(*ip, port))
            .collect();
        self.out
            .push_back(Due::Engine(Input::LocalAddrs(candidates)));
        if !first {
            tracing::info!("the host's addresses changed; probing every path again");
            self.out.push_back(Due::Engine(Input::NetworkChanged));
        }
        self.next_stun = now;
    }

    /// The state's STUN servers; a change starts a STUN run with the next pass.
    pub fn handle_stun_servers(&mut self, servers: Vec<SocketAddr>, now: Instant) {
        if servers != self.stun_servers {
            self.stun_servers = servers;
            self.next_stun = now;
        }
    }

    /// The relays changed (the relay set said so); their UDP addresses are asked too. A STUN
    /// run starts with the next pass.
    pub fn handle_relays_changed(&mut self, relay_udp: Vec<SocketAddr>, now: Instant) {
        self.relay_servers = relay_udp;
        self.next_stun = now;
    }

    /// The key rotated and the engine started over: the next pass reads the addresses and
    /// hands them to the new engine again.
    pub fn handle_rekey(&mut self, now: Instant) {
        self.local.clear();
        self.next_addrs = now;
    }

    /// A STUN datagram arrived from `from`: the running probe's, if it is an answer to it. The
    /// probe's last answer finishes it at once (its report is then in [`Self::poll_out`]).
    pub fn handle_stun_datagram(&mut self, datagram: &[u8], from: SocketAddr, now: Instant) {
        let Some(p) = &mut self.probe else { return };
        if p.handle_datagram(datagram, from) && p.poll_timeout().is_none() {
            self.poll_probe(now);
        }
    }

    /// Starts a STUN run when one is due and none runs (and there is a server to ask).
    fn start_stun(&mut self, t: Instant) {
        if self.probe.is_some() || t < self.next_stun {
            return;
        }
        self.next_stun = t + STUN_EVERY;
        let mut servers = self.stun_servers.clone();
        servers.extend(&self.relay_servers);
        if servers.is_empty() {
            return;
        }
        let rng = &mut self.rng;
        self.probe = Some(StunProbe::new(&servers, t, || {
            let mut id = [0u8; 12];
            rng.fill_bytes(&mut id);
            id
        }));
    }

    /// The requests the running probe sends now, or its report once it is done.
    fn poll_probe(&mut self, t: Instant) {
        let Some(p) = &mut self.probe else { return };
        match p.poll_probe(t) {
            Poll::Send(requests) => {
                for (to, datagram) in requests {
                    self.out.push_back(Due::Send { to, datagram });
                }
            }
            Poll::Done(answers) => {
                self.probe = None;
                let (addrs, nat) = stun::nat_report(&answers, &self.local, self.port);
                tracing::debug!(reflexive = ?addrs, nat = ?nat, "STUN done");
                self.out.push_back(Due::UdpBlocked(nat.udp_blocked));
                self.out
                    .push_back(Due::Engine(Input::Reflexive { addrs, nat }));
            }
        }
    }
}
