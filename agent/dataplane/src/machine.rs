//! A peer's WireGuard state machine: boringtun's `Tunn` (the default) or plexd's own
//! (`crate::noise`), behind one small interface so the device's packet path is the same for
//! both. Only plexd's own machine can hand a session's keys out of the peer's lock, which the
//! crypto pool (`crate::pool`) needs; the device picks it with [`Protocol::Plexd`].
//!
//! The face speaks the vocabulary of the project's sans-IO machines (docs/architecture.md,
//! "One vocabulary for the sans-IO machines"): inputs are `handle_*` with `now` last, and
//! nothing here reads a clock or the OS's randomness: plexd's own machine is built with its
//! random source and both clocks read once by the caller ([`Sources`]), and takes the
//! monotonic `now: Instant` with each input (a bare `Instant`: half a `Now`'s size, and a
//! packet needs no wall clock; see `crate::noise`). boringtun's `Tunn` reads its own clock and
//! randomness inside the dependency.
//!
//! Outputs are written into the caller's `dst` and named by the returned [`Step`]: this is the
//! packet path's form of `poll_*`. The device hands each input the output slot of its batch,
//! so a sealed or opened packet is written once, where it is sent from, with no queue of owned
//! outputs and no copy or allocation per packet. What is left after an input (packets queued
//! before the session existed) is drained with [`Machine::poll_queued`]. There is no
//! `poll_timeout`: boringtun's `Tunn` cannot say when its next timer is due, so the device
//! calls [`Machine::handle_timeout`] on every peer at each tick (at least every 250 ms, as
//! both machines want).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use plexsphere_wire::clock::Now;
use rand_core::CryptoRngCore;

use boringtun::noise::errors::WireGuardError;
use boringtun::noise::rate_limiter::RateLimiter;
use boringtun::noise::{Tunn, TunnResult};

use crate::key::{PublicKey, SecretKey};
use crate::noise::{NoiseError, Output, Tunnel};

/// Which WireGuard protocol implementation a device's peers use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// boringtun's `noise::Tunn`: one packet at a time under the peer's lock.
    #[default]
    Boringtun,
    /// plexd's own (`crate::noise`): the same protocol, with keys that can go to the crypto
    /// pool's workers.
    Plexd,
}

impl std::str::FromStr for Protocol {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "boringtun" => Ok(Self::Boringtun),
            "plexd" => Ok(Self::Plexd),
            other => Err(format!(
                "unknown WireGuard protocol implementation {other:?}: use \"boringtun\" or \"plexd\""
            )),
        }
    }
}

/// Why a machine refused a message.
#[derive(Debug)]
pub(crate) enum Rejection {
    Boringtun(WireGuardError),
    Plexd(NoiseError),
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rejection::Boringtun(e) => write!(f, "{e:?}"),
            Rejection::Plexd(e) => write!(f, "{e}"),
        }
    }
}

/// What one step produced, for either machine.
#[derive(Debug)]
pub(crate) enum Step {
    /// Nothing to send or deliver (a packet may have been queued).
    Done,
    /// The first n bytes of the output slot go to the peer.
    Network(usize),
    /// The first n bytes of the output slot are a packet from this address for the host.
    Tunnel(usize, IpAddr),
    Rejected(Rejection),
}

/// What plexd's own machine is built with besides its keys: its random source (ephemeral keys,
/// retry jitter) and both clocks read once, from which its initiations take their wall time.
/// boringtun's `Tunn` is not handed these: it reads its own.
pub(crate) struct Sources {
    pub rng: Box<dyn CryptoRngCore + Send>,
    pub clock: Now,
}

pub(crate) enum Machine {
    Boringtun(Box<Tunn>),
    Plexd(Box<Tunnel>),
}

impl From<TunnResult<'_>> for Step {
    fn from(r: TunnResult<'_>) -> Self {
        match r {
            TunnResult::Done => Step::Done,
            TunnResult::Err(e) => Step::Rejected(Rejection::Boringtun(e)),
            TunnResult::WriteToNetwork(b) => Step::Network(b.len()),
            TunnResult::WriteToTunnelV4(b, a) => Step::Tunnel(b.len(), IpAddr::V4(a)),
            TunnResult::WriteToTunnelV6(b, a) => Step::Tunnel(b.len(), IpAddr::V6(a)),
        }
    }
}

impl From<Result<Output, NoiseError>> for Step {
    fn from(r: Result<Output, NoiseError>) -> Self {
        match r {
            Ok(Output::Done) => Step::Done,
            Ok(Output::Network(n)) => Step::Network(n),
            Ok(Output::Tunnel(n, a)) => Step::Tunnel(n, a),
            Err(e) => Step::Rejected(Rejection::Plexd(e)),
        }
    }
}

impl Machine {
    pub(crate) fn new(
        protocol: Protocol,
        private: &SecretKey,
        peer: PublicKey,
        psk: Option<[u8; 32]>,
        index: u32,
        rate_limiter: &Arc<RateLimiter>,
        sources: Sources,
    ) -> Self {
        match protocol {
            Protocol::Boringtun => Machine::Boringtun(Box::new(Tunn::new(
                private.static_secret(),
                crate::key::x25519(&peer),
                psk,
                None,
                index,
                Some(rate_limiter.clone()),
            ))),
            Protocol::Plexd => Machine::Plexd(Box::new(Tunnel::new(
                private.static_secret(),
                peer.0,
                psk,
                index,
                rate_limiter.clone(),
                sources.rng,
                sources.clock,
            ))),
        }
    }

    /// A packet from the host: `packet` (empty: a keepalive) is sealed into `dst`; without a
    /// session it is queued and an initiation may go into `dst` instead.
    pub(crate) fn handle_packet(&mut self, packet: &[u8], dst: &mut [u8], now: Instant) -> Step {
        match self {
            Machine::Boringtun(t) => t.encapsulate(packet, dst).into(),
            Machine::Plexd(t) => t.encapsulate(now, packet, dst).into(),
        }
    }

    /// A datagram from the peer at `from`: plaintext for the host, or an answer for the peer,
    /// into `dst`.
    pub(crate) fn handle_datagram(
        &mut self,
        datagram: &[u8],
        from: IpAddr,
        dst: &mut [u8],
        now: Instant,
    ) -> Step {
        match self {
            Machine::Boringtun(t) => t.decapsulate(Some(from), datagram, dst).into(),
            Machine::Plexd(t) => t.decapsulate(now, Some(from), datagram, dst).into(),
        }
    }

    /// The timers: a message for the peer (a retry, a rekey, a keepalive) goes into `dst`. The
    /// tick is not the packet path, so it carries both clocks (`Now`): plexd's own protocol
    /// takes the wall clock's reading from it for later initiations.
    pub(crate) fn handle_timeout(&mut self, dst: &mut [u8], now: Now) -> Option<usize> {
        let step: Step = match self {
            Machine::Boringtun(t) => t.update_timers(dst).into(),
            Machine::Plexd(t) => {
                t.handle_wall_clock(now);
                t.update_timers(now.at, dst).into()
            }
        };
        match step {
            Step::Network(n) => Some(n),
            _ => None,
        }
    }

    /// The next packet queued before the session existed, sealed into `dst` (None: none left,
    /// or no session yet).
    pub(crate) fn poll_queued(&mut self, dst: &mut [u8], now: Instant) -> Option<usize> {
        match self {
            Machine::Boringtun(t) => match t.decapsulate(None, &[], dst) {
                TunnResult::WriteToNetwork(b) => Some(b.len()),
                _ => None,
            },
            Machine::Plexd(t) => t.next_queued(now, dst),
        }
    }

    /// Whether a handshake has completed (a session may exist).
    pub(crate) fn has_session(&self, now: Instant) -> bool {
        match self {
            Machine::Boringtun(t) => t.time_since_last_handshake().is_some(),
            Machine::Plexd(t) => t.has_session(now),
        }
    }

    /// plexd's own machine, which the crypto pool works with.
    pub(crate) fn plexd(&mut self) -> Option<&mut Tunnel> {
        match self {
            Machine::Plexd(t) => Some(t),
            Machine::Boringtun(_) => None,
        }
    }
}
