//! plexd's own WireGuard protocol: the handshake, the sessions and the timers of the
//! whitepaper (sections 5 and 6), written so that a session's keys can leave the peer's lock.
//!
//! boringtun's `Tunn` seals and opens under `&mut self` and keeps its keys private, so with it
//! one peer's packets are encrypted one at a time. Here the state machine ([`Tunnel`]) only
//! reserves: [`Tunnel::reserve_send`] hands out a session's [`Keys`] and the next counter, and
//! [`Tunnel::open_check`]/[`Tunnel::open_finish`] bracket a decryption done elsewhere; the
//! crypto pool (`crate::pool`) seals and opens on any thread in between. [`Tunnel::encapsulate`]
//! and [`Tunnel::decapsulate`] do the whole step inline.
//!
//! Nothing here reads a clock or the OS's randomness. Time is a parameter, as in the device:
//! each input takes the monotonic `now: Instant`. The wall clock is needed only for an
//! initiation's TAI64N timestamp: the tunnel is built with both clocks read once by its
//! caller (`plexsphere_wire::clock::Now`) and an initiation at `now` carries that wall time
//! plus the monotonic time since, above the last one sent (a responder refuses an initiation
//! no newer than the last it took from us), so a packet's input stays a bare `Instant` and the
//! timestamps never go backwards within a run, whatever the wall clock does meanwhile.
//! Randomness (ephemeral keys, retry jitter) comes from the source the tunnel is built with:
//! the OS's CSPRNG in production, a seeded one in tests, which then write the same messages for
//! the same inputs. When the source fails, no handshake message is made (`NoiseError::Crypto`),
//! never one with a weak key.
//!
//! The inputs keep the protocol's words (`encapsulate`, `decapsulate`, `update_timers`):
//! `crate::machine` gives them the vocabulary of the project's machines for the device.
//!
//! The load side of cookies (MAC2 checks, cookie replies) stays with boringtun's
//! `RateLimiter`, which the device shares with every peer.

pub(crate) mod crypto;
pub(crate) mod handshake;
pub(crate) mod session;

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use boringtun::noise::TunnResult;
use boringtun::noise::rate_limiter::RateLimiter;
use boringtun::x25519::StaticSecret;
use plexsphere_wire::clock::Now;
use rand_core::CryptoRngCore;

use handshake::{
    COOKIE_REPLY, DATA, DATA_HEADER, DATA_MIN, INITIATION, INITIATION_LEN, Initiation, RESPONSE,
    RESPONSE_LEN, Statics, le32, le64,
};
pub use session::Keys;
use session::{ReplayWindow, Session};

use crate::offload::{be16, be32};

/// The protocol's limits (whitepaper section 6.1).
pub(crate) const REKEY_AFTER_MESSAGES: u64 = 1 << 60;
pub(crate) use session::REJECT_AFTER_MESSAGES;
pub(crate) const REKEY_AFTER_TIME: Duration = Duration::from_secs(120);
pub const REJECT_AFTER_TIME: Duration = Duration::from_secs(180);
pub(crate) const REKEY_ATTEMPT_TIME: Duration = Duration::from_secs(90);
pub const REKEY_TIMEOUT: Duration = Duration::from_secs(5);
pub(crate) const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// A cookie is used for this long after it arrived (the responder's secret lives 120 s; the
/// kernel leaves 5 s for the trip).
pub(crate) const COOKIE_LIFETIME: Duration = Duration::from_secs(115);
/// The fewest time between two initiations from one peer that a responder consumes (the
/// kernel and wireguard-go: 20 a second); more are dropped, so a replayed burst costs nothing.
pub(crate) const MIN_INITIATION_INTERVAL: Duration = Duration::from_millis(50);
/// Packets held per peer while its handshake is in flight; more are dropped (boringtun's
/// figure; the kernel holds 1024).
pub const MAX_QUEUED: usize = 256;
/// The most random delay added to a handshake retry, so two peers do not retry in step.
const RETRY_JITTER_MS: u64 = 333;

/// Why a message was refused. Each is a drop; the device counts them as rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NoiseError {
    #[error("not a WireGuard message of a known type and length")]
    Malformed,
    #[error("MAC1 does not match our key")]
    Mac1,
    #[error("the rate limiter refused the handshake message (load without a valid cookie)")]
    RateLimited,
    #[error("the handshake message does not decrypt for this peer")]
    Handshake,
    #[error("an initiation no newer than the last one (a replay)")]
    ReplayedInitiation,
    #[error("initiations faster than one per 50 ms")]
    InitiationFlood,
    #[error("a response or cookie reply to no initiation of ours in flight")]
    UnexpectedReply,
    #[error("no session with that receiver index")]
    UnknownSession,
    #[error("the session expired")]
    Expired,
    #[error("a counter already seen, or too old")]
    Replay,
    #[error("the data message does not authenticate")]
    Decrypt,
    #[error("the decrypted packet is not a whole IPv4 or IPv6 packet")]
    BadPacket,
    #[error("the output buffer is too small")]
    Buffer,
    #[error("the random source failed, or the peer's key is a low-order point")]
    Crypto,
}

/// What a step produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Nothing to send or deliver (a keepalive received, a cookie stored, a packet queued).
    Done,
    /// `dst[..n]` goes to the peer.
    Network(usize),
    /// `dst[..n]` is a packet from `IpAddr` for the host.
    Tunnel(usize, IpAddr),
}

/// A data message that may be opened: its session's keys and its counter.
pub struct OpenTicket {
    pub keys: Arc<Keys>,
    pub counter: u64,
}

/// One peer's WireGuard state machine; see the module docs.
pub struct Tunnel {
    statics: Statics,
    /// The peer's 24-bit index: the top of every local index of this peer's sessions.
    index: u32,
    next_local: u8,
    rate_limiter: Arc<RateLimiter>,
    /// Ephemeral keys and retry jitter come from here (see the module docs).
    rng: Box<dyn CryptoRngCore + Send>,
    /// Both clocks as the caller read them once: an initiation's wall time is `clock.wall`
    /// plus the monotonic time since `clock.at` (see the module docs).
    clock: Now,
    /// Our initiation in flight and when it left.
    handshake: Option<(Initiation, Instant)>,
    /// When the current round of initiations began (given up after REKEY_ATTEMPT_TIME).
    round_since: Option<Instant>,
    retry_jitter: Duration,
    /// The last TAI64N label we sent (ours only grow, even within the clock's resolution and
    /// when inputs arrive with an earlier `now` than the last, from another thread).
    last_sent_timestamp: [u8; 12],
    cookie: Option<([u8; 16], Instant)>,
    /// The newest initiation consumed from the peer, and when.
    last_timestamp: Option<[u8; 12]>,
    last_initiation_consumed: Option<Instant>,
    current: Option<Session>,
    previous: Option<Session>,
    /// The responder's session until the initiator's first data message confirms it.
    next: Option<Session>,
    /// The last session made, by either side (keys are wiped 3 x REJECT_AFTER_TIME later).
    last_handshake: Option<Instant>,
    /// Data received and nothing sent since (a keepalive is due KEEPALIVE_TIMEOUT later).
    keepalive_due_since: Option<Instant>,
    /// Data sent and nothing received since (a new handshake KEEPALIVE + REKEY_TIMEOUT later).
    reply_wanted_since: Option<Instant>,
    /// The send or receive path asked for a new handshake; the timer starts it.
    rekey_wanted: bool,
    /// Our index of the session the peer last sent data on.
    last_received_on: Option<u32>,
    queue: VecDeque<Vec<u8>>,
}

impl Tunnel {
    /// A tunnel to `peer` with no session yet. `rng`: ephemeral keys and retry jitter (the
    /// OS's CSPRNG, `rand_core::OsRng`, outside tests); `clock`: both clocks read once by the
    /// caller, from which initiations take their wall time (see the module docs).
    pub fn new(
        private: StaticSecret,
        peer: [u8; 32],
        psk: Option<[u8; 32]>,
        index: u32,
        rate_limiter: Arc<RateLimiter>,
        rng: Box<dyn CryptoRngCore + Send>,
        clock: Now,
    ) -> Self {
        Self {
            statics: Statics::new(private, peer, psk),
            index: index & 0x00ff_ffff,
            next_local: 0,
            rate_limiter,
            rng,
            clock,
            handshake: None,
            round_since: None,
            retry_jitter: Duration::ZERO,
            last_sent_timestamp: [0; 12],
            cookie: None,
            last_timestamp: None,
            last_initiation_consumed: None,
            current: None,
            previous: None,
            next: None,
            last_handshake: None,
            keepalive_due_since: None,
            reply_wanted_since: None,
            rekey_wanted: false,
            last_received_on: None,
            queue: VecDeque::new(),
        }
    }

    /// Whether a session exists that data can be sent on now.
    pub(crate) fn has_session(&self, now: Instant) -> bool {
        self.current.as_ref().is_some_and(|s| usable(s, now))
    }

    fn new_local_index(&mut self) -> u32 {
        self.next_local = self.next_local.wrapping_add(1);
        (self.index << 8) | u32::from(self.next_local)
    }

    /// A session's keys and the counter for the next message on it, with the timers the send
    /// marks; None without a usable session. `keepalive`: an empty message.
    pub(crate) fn reserve_send(
        &mut self,
        now: Instant,
        keepalive: bool,
    ) -> Option<(Arc<Keys>, u64)> {
        let s = self.current.as_mut().filter(|s| usable(s, now))?;
        let counter = s.next_send;
        s.next_send += 1;
        if s.initiator && now.saturating_duration_since(s.created) >= REKEY_AFTER_TIME
            || counter >= REKEY_AFTER_MESSAGES
        {
            self.rekey_wanted = true;
        }
        let keys = s.keys.clone();
        self.sent();
        if !keepalive {
            self.reply_wanted_since.get_or_insert(now);
        }
        Some((keys, counter))
    }

    /// Any authenticated message left: no passive keepalive is due.
    fn sent(&mut self) {
        self.keepalive_due_since = None;
    }

    /// Any authenticated message arrived.
    fn received(&mut self) {
        self.reply_wanted_since = None;
    }

    /// Encrypts `packet` (empty: a keepalive) into `dst`; without a session the packet is
    /// queued and an initiation may go out instead.
    pub fn encapsulate(
        &mut self,
        now: Instant,
        packet: &[u8],
        dst: &mut [u8],
    ) -> Result<Output, NoiseError> {
        if dst.len() < (packet.len() + DATA_MIN).max(INITIATION_LEN) {
            return Err(NoiseError::Buffer);
        }
        if let Some((keys, counter)) = self.reserve_send(now, packet.is_empty()) {
            return Ok(Output::Network(seal_data(&keys, counter, packet, dst)));
        }
        if !packet.is_empty() {
            if self.queue.len() >= MAX_QUEUED {
                self.queue.pop_front();
            }
            self.queue.push_back(packet.to_vec());
        }
        self.initiate(now, false, dst)
    }

    /// The next packet queued while there was no session, sealed into `dst`, once one exists.
    pub(crate) fn next_queued(&mut self, now: Instant, dst: &mut [u8]) -> Option<usize> {
        if !self.has_session(now) {
            return None;
        }
        let packet = self.queue.pop_front()?;
        if dst.len() < packet.len() + DATA_MIN {
            return None;
        }
        let (keys, counter) = self.reserve_send(now, false)?;
        Some(seal_data(&keys, counter, &packet, dst))
    }

    /// Writes an initiation into `dst` unless one left less than REKEY_TIMEOUT ago (a retry
    /// from the timer: unless the last is not due for a retry yet).
    fn initiate(
        &mut self,
        now: Instant,
        retry: bool,
        dst: &mut [u8],
    ) -> Result<Output, NoiseError> {
        if let Some((_, at)) = &self.handshake {
            let wait = if retry {
                REKEY_TIMEOUT + self.retry_jitter
            } else {
                REKEY_TIMEOUT
            };
            if now.saturating_duration_since(*at) < wait {
                return Ok(Output::Done);
            }
        }
        let out: &mut [u8; INITIATION_LEN] = dst
            .get_mut(..INITIATION_LEN)
            .and_then(|d| d.try_into().ok())
            .ok_or(NoiseError::Buffer)?;
        let cookie = self
            .cookie
            .filter(|(_, at)| now.saturating_duration_since(*at) < COOKIE_LIFETIME)
            .map(|(c, _)| c);
        let local = self.new_local_index();
        let timestamp = self.next_timestamp(now);
        let init = handshake::initiate(
            &self.statics,
            &mut *self.rng,
            local,
            timestamp,
            cookie.as_ref(),
            out,
        )
        .ok_or(NoiseError::Crypto)?;
        self.handshake = Some((init, now));
        self.round_since.get_or_insert(now);
        // No jitter when the source fails: the retry is only less spread, the key was fine.
        self.retry_jitter = Duration::from_millis(
            crypto::random::<2>(&mut *self.rng)
                .map_or(0, |b| u64::from(u16::from_le_bytes(b)) % RETRY_JITTER_MS),
        );
        self.rekey_wanted = false;
        self.sent();
        Ok(Output::Network(INITIATION_LEN))
    }

    /// TAI64N of the wall time at `now` (the caller's reading, `clock`, plus the monotonic
    /// time since), but always above the last one we sent.
    fn next_timestamp(&mut self, now: Instant) -> [u8; 12] {
        let last = self.last_sent_timestamp;
        // Past the end of SystemTime (never in a real run): the guard below still steps on.
        let wall = self.clock.wall_at(now).unwrap_or(self.clock.wall);
        let mut t = crypto::tai64n(wall);
        if t <= last {
            // One step of the label's resolution (2^24 ns) past the last, into the next
            // second when it runs over.
            t = last;
            match be32(&last, 8)
                .checked_add(1 << 24)
                .filter(|n| *n < 1_000_000_000)
            {
                Some(n) => t[8..].copy_from_slice(&n.to_be_bytes()),
                None => {
                    let [a, b, c, d, e, f, g, h, ..] = last;
                    let secs = u64::from_be_bytes([a, b, c, d, e, f, g, h]) + 1;
                    t[..8].copy_from_slice(&secs.to_be_bytes());
                    t[8..].copy_from_slice(&0u32.to_be_bytes());
                }
            }
        }
        self.last_sent_timestamp = t;
        t
    }

    /// Handles one datagram from the peer (`from`: its address, for cookies under load):
    /// handshake messages answered into `dst`, data decrypted into `dst`.
    pub fn decapsulate(
        &mut self,
        now: Instant,
        from: Option<IpAddr>,
        datagram: &[u8],
        dst: &mut [u8],
    ) -> Result<Output, NoiseError> {
        match (datagram.first(), datagram.len()) {
            (Some(&INITIATION), INITIATION_LEN) => self.consume_initiation(now, datagram, dst),
            (Some(&RESPONSE), RESPONSE_LEN) => self.consume_response(now, from, datagram, dst),
            (Some(&COOKIE_REPLY), handshake::COOKIE_REPLY_LEN) => {
                self.consume_cookie(now, datagram)
            }
            (Some(&DATA), n) if n >= DATA_MIN => {
                let ticket = self.open_check(now, datagram)?;
                let body = &datagram[DATA_HEADER..];
                let buf = dst.get_mut(..body.len()).ok_or(NoiseError::Buffer)?;
                buf.copy_from_slice(body);
                let n = ticket
                    .keys
                    .recv
                    .open(ticket.counter, &[], buf)
                    .ok_or(NoiseError::Decrypt)?;
                self.open_finish(now, &ticket, &dst[..n])
            }
            _ => Err(NoiseError::Malformed),
        }
    }

    fn consume_initiation(
        &mut self,
        now: Instant,
        msg: &[u8],
        dst: &mut [u8],
    ) -> Result<Output, NoiseError> {
        // The device ran the rate limiter (MAC1, and MAC2 under load) to find this peer;
        // MAC1 is checked again here so the state machine stands on its own.
        if !self.statics.mac1_is_ours(msg, 116) {
            return Err(NoiseError::Mac1);
        }
        let consumed =
            handshake::consume_initiation(&self.statics, msg).ok_or(NoiseError::Handshake)?;
        if self.last_timestamp.is_some_and(|t| consumed.timestamp <= t) {
            return Err(NoiseError::ReplayedInitiation);
        }
        if self
            .last_initiation_consumed
            .is_some_and(|at| now.saturating_duration_since(at) < MIN_INITIATION_INTERVAL)
        {
            return Err(NoiseError::InitiationFlood);
        }
        let out: &mut [u8; RESPONSE_LEN] = dst
            .get_mut(..RESPONSE_LEN)
            .and_then(|d| d.try_into().ok())
            .ok_or(NoiseError::Buffer)?;
        let local = self.new_local_index();
        let keys = handshake::respond(&self.statics, &mut *self.rng, &consumed, local, out)
            .ok_or(NoiseError::Crypto)?;
        self.last_timestamp = Some(consumed.timestamp);
        self.last_initiation_consumed = Some(now);
        self.next = Some(new_session(keys, now, false));
        self.last_handshake = Some(now);
        self.received();
        self.sent();
        Ok(Output::Network(RESPONSE_LEN))
    }

    fn consume_response(
        &mut self,
        now: Instant,
        from: Option<IpAddr>,
        msg: &[u8],
        dst: &mut [u8],
    ) -> Result<Output, NoiseError> {
        let Some((init, _)) = &self.handshake else {
            return Err(NoiseError::UnexpectedReply);
        };
        if le32(msg, 8) != init.local_index {
            return Err(NoiseError::UnexpectedReply);
        }
        if !self.statics.mac1_is_ours(msg, 60) {
            return Err(NoiseError::Mac1);
        }
        // Under load the responder's address must carry a cookie too (MAC2).
        match self.rate_limiter.verify_packet(from, msg, dst) {
            Ok(_) => {}
            Err(TunnResult::WriteToNetwork(cookie)) => return Ok(Output::Network(cookie.len())),
            Err(_) => return Err(NoiseError::RateLimited),
        }
        let keys =
            handshake::consume_response(&self.statics, init, msg).ok_or(NoiseError::Handshake)?;
        self.handshake = None;
        self.round_since = None;
        // A session we answered meanwhile (both sides initiated at once) is what the peer
        // sends on until it sees ours: keep it to receive on, in place of the current one.
        // Otherwise keep the one the peer last sent on (after simultaneous initiations that
        // is the answered one, now the previous), else the current.
        let last = self.last_received_on;
        self.previous = match self.next.take() {
            Some(answered) => Some(answered),
            None if self
                .previous
                .as_ref()
                .is_some_and(|p| Some(p.keys.local_index) == last) =>
            {
                self.previous.take()
            }
            None => self.current.take(),
        };
        self.current = Some(new_session(keys, now, true));
        // Asked for by the old session; this one is new.
        self.rekey_wanted = false;
        self.last_handshake = Some(now);
        self.received();
        // Confirm the session at once (the responder sends nothing on it before a message
        // from us); queued packets follow it.
        let (keys, counter) = self.reserve_send(now, true).ok_or(NoiseError::Crypto)?;
        if dst.len() < DATA_MIN {
            return Err(NoiseError::Buffer);
        }
        Ok(Output::Network(seal_data(&keys, counter, &[], dst)))
    }

    fn consume_cookie(&mut self, now: Instant, msg: &[u8]) -> Result<Output, NoiseError> {
        let Some((init, _)) = &self.handshake else {
            return Err(NoiseError::UnexpectedReply);
        };
        if le32(msg, 4) != init.local_index {
            return Err(NoiseError::UnexpectedReply);
        }
        let cookie = handshake::consume_cookie_reply(&self.statics, init, msg)
            .ok_or(NoiseError::Handshake)?;
        // The next initiation (the timer's retry) carries it as MAC2.
        self.cookie = Some((cookie, now));
        Ok(Output::Done)
    }

    fn session_mut(&mut self, local_index: u32) -> Option<&mut Session> {
        [&mut self.current, &mut self.previous, &mut self.next]
            .into_iter()
            .flatten()
            .find(|s| s.keys.local_index == local_index)
    }

    /// The session and counter of a data message, if it may be new: what a decryption needs.
    pub(crate) fn open_check(
        &mut self,
        now: Instant,
        datagram: &[u8],
    ) -> Result<OpenTicket, NoiseError> {
        if datagram.len() < DATA_MIN || datagram[0] != DATA {
            return Err(NoiseError::Malformed);
        }
        let receiver = le32(datagram, 4);
        let counter = le64(datagram, 8);
        let s = self
            .session_mut(receiver)
            .ok_or(NoiseError::UnknownSession)?;
        if now.saturating_duration_since(s.created) >= REJECT_AFTER_TIME {
            return Err(NoiseError::Expired);
        }
        if !s.replay.may_accept(counter) {
            return Err(NoiseError::Replay);
        }
        Ok(OpenTicket {
            keys: s.keys.clone(),
            counter,
        })
    }

    /// After `ticket`'s message opened to `plaintext`: the replay window marks it, a
    /// responder's pending session is confirmed, the timers see it. A keepalive is `Done`;
    /// a packet is `Tunnel` with its IP length (padding cut) and source.
    pub(crate) fn open_finish(
        &mut self,
        now: Instant,
        ticket: &OpenTicket,
        plaintext: &[u8],
    ) -> Result<Output, NoiseError> {
        let local = ticket.keys.local_index;
        let s = self.session_mut(local).ok_or(NoiseError::UnknownSession)?;
        if !s.replay.accept(ticket.counter) {
            return Err(NoiseError::Replay);
        }
        let (initiator, created) = (s.initiator, s.created);
        if self
            .next
            .as_ref()
            .is_some_and(|n| n.keys.local_index == local)
        {
            self.previous = self.current.take();
            self.current = self.next.take();
        }
        self.received();
        self.last_received_on = Some(local);
        // The initiator of the current session renews it before it expires (a message on an
        // older session asks nothing, nor one while a handshake is in flight).
        let is_current = self
            .current
            .as_ref()
            .is_some_and(|c| c.keys.local_index == local);
        if initiator
            && is_current
            && self.handshake.is_none()
            && now.saturating_duration_since(created)
                >= REJECT_AFTER_TIME - KEEPALIVE_TIMEOUT - REKEY_TIMEOUT
        {
            self.rekey_wanted = true;
        }
        if plaintext.is_empty() {
            return Ok(Output::Done);
        }
        let (len, src) = ip_length_and_source(plaintext).ok_or(NoiseError::BadPacket)?;
        self.keepalive_due_since.get_or_insert(now);
        Ok(Output::Tunnel(len, src))
    }

    /// The timers of the whitepaper's section 6: handshake retries and giving up, rekeying,
    /// a handshake when data went unanswered, passive keepalives, and wiping old keys. At most
    /// one message goes into `dst`. Call at least every 250 ms.
    /// Both clocks read again by the caller (the device's timer, every tick): later initiations
    /// take their wall time from this reading, so a wall clock stepped after the tunnel was
    /// built (NTP's first sync on a host without a real-time clock) is followed within a tick.
    /// Timestamps still never go backwards (`next_timestamp`).
    pub fn handle_wall_clock(&mut self, clock: Now) {
        self.clock = clock;
    }

    pub fn update_timers(&mut self, now: Instant, dst: &mut [u8]) -> Result<Output, NoiseError> {
        if self
            .last_handshake
            .is_some_and(|at| now.saturating_duration_since(at) >= REJECT_AFTER_TIME * 3)
        {
            self.current = None;
            self.previous = None;
            self.next = None;
            self.handshake = None;
            self.round_since = None;
            self.last_handshake = None;
            self.queue.clear();
        }
        for s in [&mut self.current, &mut self.previous, &mut self.next] {
            if s.as_ref()
                .is_some_and(|s| now.saturating_duration_since(s.created) >= REJECT_AFTER_TIME)
            {
                *s = None;
            }
        }
        if self.handshake.is_some() {
            if self
                .round_since
                .is_some_and(|at| now.saturating_duration_since(at) >= REKEY_ATTEMPT_TIME)
            {
                // Nobody answered for 90 s: stop trying and drop what waited for it.
                self.handshake = None;
                self.round_since = None;
                self.queue.clear();
                self.reply_wanted_since = None;
                return Ok(Output::Done);
            }
            return self.initiate(now, true, dst);
        }
        let unanswered = self.reply_wanted_since.is_some_and(|at| {
            now.saturating_duration_since(at) >= KEEPALIVE_TIMEOUT + REKEY_TIMEOUT
        });
        if unanswered || self.rekey_wanted {
            self.reply_wanted_since = None;
            self.round_since = None;
            return self.initiate(now, false, dst);
        }
        if self
            .keepalive_due_since
            .is_some_and(|at| now.saturating_duration_since(at) >= KEEPALIVE_TIMEOUT)
        {
            self.keepalive_due_since = None;
            if dst.len() >= DATA_MIN
                && let Some((keys, counter)) = self.reserve_send(now, true)
            {
                return Ok(Output::Network(seal_data(&keys, counter, &[], dst)));
            }
        }
        Ok(Output::Done)
    }
}

fn new_session(keys: Keys, now: Instant, initiator: bool) -> Session {
    Session {
        keys: Arc::new(keys),
        created: now,
        initiator,
        next_send: 0,
        replay: ReplayWindow::new(),
    }
}

fn usable(s: &Session, now: Instant) -> bool {
    now.saturating_duration_since(s.created) < REJECT_AFTER_TIME
        && s.next_send < REJECT_AFTER_MESSAGES
}

/// Writes the data message header for `keys` and `counter` into `dst`.
pub(crate) fn write_data_header(keys: &Keys, counter: u64, dst: &mut [u8]) {
    dst[0] = DATA;
    dst[1..4].fill(0);
    dst[4..8].copy_from_slice(&keys.remote_index.to_le_bytes());
    dst[8..16].copy_from_slice(&counter.to_le_bytes());
}

/// A whole data message of `packet` into `dst` (which holds `packet.len() + 32`).
pub(crate) fn seal_data(keys: &Keys, counter: u64, packet: &[u8], dst: &mut [u8]) -> usize {
    write_data_header(keys, counter, dst);
    dst[DATA_HEADER..DATA_HEADER + packet.len()].copy_from_slice(packet);
    DATA_HEADER
        + keys
            .send
            .seal(counter, &[], &mut dst[DATA_HEADER..], packet.len())
}

/// The length an IP packet's header gives (at most what arrived) and its source address.
pub(crate) fn ip_length_and_source(p: &[u8]) -> Option<(usize, IpAddr)> {
    let (len, src) = match p.first()? >> 4 {
        4 if p.len() >= 20 => {
            let src: [u8; 4] = p[12..16].try_into().ok()?;
            (usize::from(be16(p, 2)), IpAddr::V4(Ipv4Addr::from(src)))
        }
        6 if p.len() >= 40 => {
            let src: [u8; 16] = p[8..24].try_into().ok()?;
            (
                usize::from(be16(p, 4)) + 40,
                IpAddr::V6(Ipv6Addr::from(src)),
            )
        }
        _ => return None,
    };
    (len <= p.len() && len > 0).then_some((len, src))
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
