//! The relay client: one connection to one `plexsphere relay`, as a sans-IO state machine over
//! relay frames ([`plexsphere_wire::reach::relay::Frame`]). It speaks the machines' vocabulary
//! (docs/architecture.md, "One vocabulary for the sans-IO machines"):
//!
//! - inputs: [`RelayConn::handle_frame`] (a frame from the relay), [`RelayConn::handle_send`]
//!   (a datagram to relay), [`RelayConn::handle_lost`] (the transport under it broke),
//!   [`RelayConn::handle_token`] (a new relay token) and [`RelayConn::handle_timeout`] (time
//!   passed); the input first, its context (the node's [`Identity`]), `now` last;
//! - outputs: [`RelayConn::poll_transmit`] (frames to send to the relay) and
//!   [`RelayConn::poll_note`] (what changed, for the runtime), queued inside the machine by the
//!   inputs. The caller drains both after every input, frames first: one input makes its
//!   frames before its notes (the flushed sends and the ping before [`Note::Up`]), so that is
//!   the order they were made in;
//! - [`RelayConn::poll_timeout`]: when [`RelayConn::handle_timeout`] next has something to do.
//!
//! Drained after every input, the queues hold at most one input's outputs: [`MAX_QUEUED`] sends
//! and a ping on registering, one note. A caller that does not drain them loses what comes
//! beyond [`MAX_OUTPUTS`] frames or notes (the newest are dropped, and counted in
//! [`RelayConn::dropped_outputs`]).
//!
//! | state | on | does |
//! |---|---|---|
//! | idle | a timeout, with a token | `hello` -> hello sent |
//! | idle | a timeout, no token | nothing (says so once) |
//! | hello sent | `challenge` | `register` (sealed proof, token) -> registering |
//! | registering | `registered` | up (note [`Note::Up`]), queued sends flushed, `ping` |
//! | hello sent / registering | no answer in [`ANSWER_WITHIN`] | `hello` again; after [`GIVE_UP`] without any answer: down |
//! | up | [`REREGISTER_SECS`] since registered, or a new token | `hello` (re-registration with the newest token; stays up) |
//! | up | [`KEEPALIVE`] since the last ping | `ping` |
//! | up | nothing heard from the relay for [`SILENT_DOWN`] | down (a relay that died) |
//! | up | no `registered` for a whole lease | down |
//! | any | `refused` expired / bad token | down, waits for a new token ([`RelayConn::handle_token`]) |
//! | any | `refused` not registered / bad proof | `hello` again |
//! | any | `refused` busy | down, `hello` again after [`BUSY_BACKOFF`] |
//! | any | an unsealed `refused` (any code) | a hint: `hello` again, at most once per [`HINT_EVERY`]; nothing else changes |
//! | down | [`RETRY_AFTER`] later | `hello` |
//! | any | `recv`, `peer gone` | [`Note::Recv`], [`Note::PeerGone`] |
//! | any | `ping` | `pong`; `pong` to our ping: the RTT |
//!
//! `registered`, `refused`, `peer gone` and `pong` count only sealed (authenticated under the
//! node's and the relay's keys, `Frame::Sealed`) with a counter above the last one accepted;
//! unsealed or replayed ones are dropped (an unsealed `refused` is the hint above). Only they
//! prove the relay alive. `recv` is not sealed: the datagram inside authenticates itself.
//!
//! [`tcp`] carries the frames of one connection over TCP with TLS, for networks that drop UDP.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use plexsphere_wire::key::PublicKey;
use plexsphere_wire::reach::relay::{self, Frame, KeyPrefix, REREGISTER_SECS, RefuseCode};

pub mod tcp;
#[cfg(test)]
mod tests;

/// How long the relay gets to answer a `hello` or a `register`.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(1);
/// A connection whose relay never answered for this long is down.
pub const GIVE_UP: Duration = Duration::from_secs(4);
/// A down connection tries again after this long.
pub const RETRY_AFTER: Duration = Duration::from_secs(10);
/// A busy relay is asked again after this long.
pub const BUSY_BACKOFF: Duration = Duration::from_secs(30);
/// An up connection pings its relay this often (its RTT, and proof that it still lives).
pub const KEEPALIVE: Duration = Duration::from_secs(2);
/// An up connection that heard nothing from its relay for this long is down: peers on it
/// move to another relay within seconds instead of waiting out the lease.
pub const SILENT_DOWN: Duration = Duration::from_secs(7);
/// Sends waiting for the registration, per connection; more are dropped.
pub const MAX_QUEUED: usize = 32;
/// An unsealed `refused` makes the node say `hello` again at most this often.
pub const HINT_EVERY: Duration = Duration::from_secs(1);
/// Dropped unauthentic frames are logged (with how many) at most this often.
pub const UNAUTHENTIC_LOG_EVERY: Duration = Duration::from_secs(10);
/// Frames waiting for the caller's `poll_transmit`, and apart from them notes waiting for its
/// `poll_note`; more are dropped (the newest). One input makes at most [`MAX_QUEUED`] + 1
/// frames and one note, so a caller that drains after every input never comes near it.
pub const MAX_OUTPUTS: usize = 64;

/// What the node proves and shows.
#[derive(Clone)]
pub struct Identity {
    pub public: PublicKey,
    secret: [u8; 32],
}

impl Identity {
    pub fn new(secret: [u8; 32]) -> Self {
        Self {
            public: plexsphere_wire::reach::public_key(&secret),
            secret,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Idle,
    Hello {
        since: Instant,
        sent: Instant,
    },
    Registering {
        since: Instant,
        sent: Instant,
    },
    Up {
        registered: Instant,
        lease: Duration,
    },
    /// Down until then (or until a new token, when `None`).
    Down {
        until: Option<Instant>,
    },
}

/// What the connection tells the runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    Up {
        rtt: Option<Duration>,
    },
    /// `unanswered`: the relay never answered (try another transport).
    Down {
        why: String,
        unanswered: bool,
    },
    /// From the peer whose key starts with `src` (the runtime maps it to the key).
    Recv {
        src: KeyPrefix,
        payload: Vec<u8>,
    },
    PeerGone {
        dst: KeyPrefix,
    },
}

/// What the node and the relay share, derived once per connection (and again only if the
/// node's key is another): one X25519 per connection, not one per sealed frame or challenge.
struct Keys {
    /// The node key they were derived for.
    node: PublicKey,
    /// The X25519 shared secret of the node key and the relay key (the sealed proof's key).
    shared: [u8; 32],
    /// What the relay seals its answers to this node with.
    frame: relay::FrameKey,
}

impl Keys {
    fn new(id: &Identity, relay_key: &PublicKey) -> Self {
        let shared = plexsphere_wire::reach::shared_secret(&id.secret, relay_key);
        Self {
            node: id.public,
            shared,
            frame: relay::FrameKey::new(&shared),
        }
    }
}

/// The earliest of some deadlines (`None` ones never come).
fn earliest<const N: usize>(deadlines: [Option<Instant>; N]) -> Option<Instant> {
    deadlines.into_iter().flatten().min()
}

/// One relay connection; see the module docs.
pub struct RelayConn {
    pub name: String,
    relay_key: PublicKey,
    /// Derived at the first frame that needs them ([`RelayConn::keys`]).
    keys: Option<Keys>,
    state: State,
    token: Option<Vec<u8>>,
    said_no_token: bool,
    /// Sends waiting for the registration ([`MAX_QUEUED`]).
    queue: VecDeque<(PublicKey, Vec<u8>)>,
    /// Frames for the relay, until [`RelayConn::poll_transmit`] takes them ([`MAX_OUTPUTS`]).
    transmits: VecDeque<Frame>,
    /// What changed, until [`RelayConn::poll_note`] takes it ([`MAX_OUTPUTS`]).
    notes: VecDeque<Note>,
    /// Frames and notes dropped because the caller did not drain them ([`MAX_OUTPUTS`]).
    pub dropped_outputs: u64,
    ping: Option<([u8; 8], Instant)>,
    rtt: Option<Duration>,
    nonce: u64,
    /// When the re-registration `hello` of an up connection went out.
    rehello: Option<Instant>,
    /// Last time a datagram was relayed through it, either way (for closing idle ones; the
    /// connection's own pings, pongs and registrations do not count).
    pub last_used: Instant,
    /// Last time a frame came from the relay.
    last_heard: Instant,
    /// Last time a keepalive ping went out.
    last_ping: Instant,
    /// The counter of the last sealed frame accepted: older or equal ones are replays.
    counter: u64,
    /// Last time an unsealed `refused` made the node say `hello`.
    last_hint: Option<Instant>,
    /// A new token came while up: register again with it now.
    renew: bool,
    /// Sealed frames dropped (bad tag or old counter) and unsealed answers ignored.
    pub dropped_unauthentic: u64,
    /// When the last warning about them went out, and the count then.
    warned: Option<(Instant, u64)>,
}

impl RelayConn {
    pub fn new(name: String, relay_key: PublicKey, token: Option<Vec<u8>>, now: Instant) -> Self {
        Self {
            name,
            relay_key,
            keys: None,
            state: State::Idle,
            token,
            said_no_token: false,
            queue: VecDeque::new(),
            transmits: VecDeque::new(),
            notes: VecDeque::new(),
            dropped_outputs: 0,
            ping: None,
            rtt: None,
            nonce: 0,
            rehello: None,
            last_used: now,
            last_heard: now,
            last_ping: now,
            counter: 0,
            last_hint: None,
            renew: false,
            dropped_unauthentic: 0,
            warned: None,
        }
    }

    /// The keys shared with the relay under `id`, derived on first use and kept.
    fn keys(&mut self, id: &Identity) -> &Keys {
        if self.keys.as_ref().is_some_and(|k| k.node != id.public) {
            self.keys = None;
        }
        let relay_key = self.relay_key;
        self.keys.get_or_insert_with(|| Keys::new(id, &relay_key))
    }

    /// The counter of the last sealed frame accepted (a new connection to the same relay
    /// starts from it: [`RelayConn::resume_counter`]).
    pub fn counter(&self) -> u64 {
        self.counter
    }

    /// Starts from a counter an earlier connection to this relay accepted.
    pub fn resume_counter(&mut self, counter: u64) {
        self.counter = self.counter.max(counter);
    }

    pub fn is_up(&self) -> bool {
        matches!(self.state, State::Up { .. })
    }

    pub fn is_down(&self) -> bool {
        matches!(self.state, State::Down { .. })
    }

    pub fn rtt(&self) -> Option<Duration> {
        self.rtt
    }

    /// The next frame to send to the relay, in the order the inputs made them.
    pub fn poll_transmit(&mut self) -> Option<Frame> {
        self.transmits.pop_front()
    }

    /// The next thing that changed, in the order the inputs made them.
    pub fn poll_note(&mut self) -> Option<Note> {
        self.notes.pop_front()
    }

    /// Queues a frame for the relay (dropped beyond [`MAX_OUTPUTS`]).
    fn transmit(&mut self, frame: Frame) {
        if self.transmits.len() < MAX_OUTPUTS {
            self.transmits.push_back(frame);
        } else {
            self.dropped_output();
        }
    }

    /// Queues a note for the runtime (dropped beyond [`MAX_OUTPUTS`]).
    fn note(&mut self, note: Note) {
        if self.notes.len() < MAX_OUTPUTS {
            self.notes.push_back(note);
        } else {
            self.dropped_output();
        }
    }

    fn dropped_output(&mut self) {
        self.dropped_outputs += 1;
        tracing::debug!(relay = %self.name, dropped = self.dropped_outputs, "relay {}: an output dropped, {MAX_OUTPUTS} wait undrained", self.name);
    }

    /// A new relay token (JSON of the signed envelope): a connection waiting for one retries,
    /// an up one registers again with it. Queues nothing; [`Self::poll_timeout`] says when.
    pub fn handle_token(&mut self, token: Vec<u8>) {
        if self.token.as_ref() != Some(&token) && self.is_up() {
            // The relay ends a registration when its token expires: renew it now.
            self.renew = true;
        }
        self.token = Some(token);
        self.said_no_token = false;
        if self.state == (State::Down { until: None }) {
            self.state = State::Idle;
        }
    }

    /// A datagram for `dst` through this relay: its frame is queued at once, or the datagram
    /// waits until the registration completes (dropped beyond [`MAX_QUEUED`]).
    pub fn handle_send(&mut self, dst: PublicKey, payload: Vec<u8>, now: Instant) {
        self.last_used = now;
        if self.is_up() {
            self.transmit(Frame::Send {
                dst: relay::prefix(&dst),
                payload,
            });
            return;
        }
        if self.queue.len() < MAX_QUEUED {
            self.queue.push_back((dst, payload));
        }
    }

    fn hello(&mut self, id: &Identity, now: Instant, since: Instant) {
        self.transmit(Frame::Hello { node: id.public });
        self.state = State::Hello { since, sent: now };
    }

    /// The transport under the connection broke: down (a [`Note::Down`]), retried after
    /// [`RETRY_AFTER`].
    pub fn handle_lost(&mut self, why: String, now: Instant) {
        self.down(why, Some(now + RETRY_AFTER));
    }

    fn down(&mut self, why: String, until: Option<Instant>) {
        self.down_as(why, until, false);
    }

    fn down_as(&mut self, why: String, until: Option<Instant>, unanswered: bool) {
        let was_up = self.is_up();
        self.state = State::Down { until };
        self.ping = None;
        if was_up || !self.queue.is_empty() || until.is_none() {
            self.queue.clear();
        }
        self.note(Note::Down { why, unanswered });
    }

    /// Time passed: queues the frames and notes of the table's rows that are due.
    pub fn handle_timeout(&mut self, id: &Identity, now: Instant) {
        match self.state {
            State::Idle => {
                if self.token.is_some() {
                    self.hello(id, now, now);
                } else if !self.said_no_token {
                    self.said_no_token = true;
                    tracing::info!(relay = %self.name, "no relay token yet; registering with the relay once the control plane sends one");
                }
            }
            State::Hello { since, sent } | State::Registering { since, sent } => {
                if now.saturating_duration_since(since) >= GIVE_UP {
                    self.down_as(
                        format!(
                            "no answer from relay {} within {} s",
                            self.name,
                            GIVE_UP.as_secs()
                        ),
                        Some(now + RETRY_AFTER),
                        true,
                    );
                } else if now.saturating_duration_since(sent) >= ANSWER_WITHIN {
                    self.hello(id, now, since);
                }
            }
            State::Up { registered, lease } => {
                let age = now.saturating_duration_since(registered);
                let silent = now.saturating_duration_since(self.last_heard);
                if silent >= SILENT_DOWN {
                    self.down(
                        format!(
                            "relay {} stopped answering (nothing heard for {} s)",
                            self.name,
                            silent.as_secs()
                        ),
                        Some(now + RETRY_AFTER),
                    );
                } else if age >= lease {
                    self.down(
                        format!("relay {} did not renew the registration", self.name),
                        Some(now),
                    );
                } else if (age >= Duration::from_secs(REREGISTER_SECS) || self.renew)
                    && self.token.is_some()
                    && self
                        .rehello
                        .is_none_or(|t| now.saturating_duration_since(t) >= ANSWER_WITHIN)
                {
                    // Hello again while up; `registered` moves when the relay answers.
                    self.transmit(Frame::Hello { node: id.public });
                    self.rehello = Some(now);
                    self.renew = false;
                    self.send_ping(now);
                } else if now.saturating_duration_since(self.last_ping) >= KEEPALIVE {
                    self.send_ping(now);
                }
            }
            State::Down { until: Some(t) } if now >= t => {
                if self.token.is_some() {
                    self.hello(id, now, now);
                } else {
                    self.state = State::Idle;
                }
            }
            State::Down { .. } => {}
        }
    }

    /// When [`Self::handle_timeout`] next has something to do, from the table above: a retry,
    /// give-up, keepalive, re-registration, silence or lease end. `None` while only an input
    /// can move it (down waiting for a token, or idle with none that already said so). A
    /// moment already past means at once (idle with a token, a new token to register with).
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::Idle => (self.token.is_some() || !self.said_no_token).then_some(self.last_used),
            State::Hello { since, sent } | State::Registering { since, sent } => {
                earliest([since.checked_add(GIVE_UP), sent.checked_add(ANSWER_WITHIN)])
            }
            State::Up { registered, lease } => {
                let rehello = if self.token.is_none() {
                    None
                } else {
                    let due = if self.renew {
                        Some(registered)
                    } else {
                        registered.checked_add(Duration::from_secs(REREGISTER_SECS))
                    };
                    match self.rehello {
                        None => due,
                        Some(t) => t.checked_add(ANSWER_WITHIN).zip(due).map(|(a, d)| a.max(d)),
                    }
                };
                earliest([
                    self.last_heard.checked_add(SILENT_DOWN),
                    registered.checked_add(lease),
                    rehello,
                    self.last_ping.checked_add(KEEPALIVE),
                ])
            }
            State::Down { until } => until,
        }
    }

    /// Queues a ping with the next nonce and waits for its pong (the RTT).
    fn send_ping(&mut self, now: Instant) {
        self.nonce = self.nonce.wrapping_add(1);
        self.last_ping = now;
        let nonce = self.nonce.to_be_bytes();
        self.transmit(Frame::Ping { nonce });
        self.ping = Some((nonce, now));
    }

    /// A frame from the relay: queues the frames to send back and what changed. Registered,
    /// refused, peer gone and pong act only sealed (see the module docs).
    pub fn handle_frame(&mut self, frame: Frame, id: &Identity, now: Instant) {
        match frame {
            Frame::Sealed { counter, body, tag } => {
                match self.keys(id).frame.open(counter, &body, &tag) {
                    Ok(inner) if counter > self.counter => {
                        self.counter = counter;
                        self.authentic(inner, id, now);
                    }
                    Ok(_) => {
                        self.unauthentic(now);
                        tracing::debug!(relay = %self.name, counter, last = self.counter, "a replayed sealed frame from the relay's address; dropped");
                    }
                    Err(e) => {
                        self.unauthentic(now);
                        tracing::debug!(relay = %self.name, "a sealed frame that does not open ({e}); dropped");
                    }
                }
            }
            Frame::Refused { code, reason } => {
                // Unsealed: anyone who can send from the relay's address could have sent it.
                self.unauthentic(now);
                let hint_due = self
                    .last_hint
                    .is_none_or(|t| now.saturating_duration_since(t) >= HINT_EVERY);
                if hint_due && self.token.is_some() {
                    tracing::debug!(relay = %self.name, code = ?code, "an unauthenticated refusal ({reason}); saying hello again");
                    self.last_hint = Some(now);
                    match self.state {
                        State::Hello { since, .. } | State::Registering { since, .. } => {
                            self.hello(id, now, since)
                        }
                        State::Up { .. } => {
                            self.transmit(Frame::Hello { node: id.public });
                            self.rehello = Some(now);
                        }
                        State::Idle | State::Down { .. } => {}
                    }
                }
            }
            Frame::Registered { .. } | Frame::PeerGone { .. } | Frame::Pong { .. } => {
                self.unauthentic(now);
                tracing::debug!(relay = %self.name, "an unsealed answer from the relay's address (a spoofer, or a relay older than sealed answers); dropped");
            }
            Frame::Recv { src, payload } => {
                self.last_used = now;
                self.note(Note::Recv { src, payload });
            }
            other => self.authentic(other, id, now),
        }
    }

    /// Counts a dropped unauthentic frame; warns at most every [`UNAUTHENTIC_LOG_EVERY`].
    fn unauthentic(&mut self, now: Instant) {
        self.dropped_unauthentic += 1;
        let due = self
            .warned
            .is_none_or(|(t, _)| now.saturating_duration_since(t) >= UNAUTHENTIC_LOG_EVERY);
        if due {
            let since = self.warned.map_or(0, |(_, n)| n);
            let dropped = self.dropped_unauthentic - since;
            self.warned = Some((now, self.dropped_unauthentic));
            tracing::warn!(relay = %self.name, dropped, "relay {}: dropped {dropped} unauthenticated or replayed answers from its address (a spoofer, or a relay without sealed answers: upgrade it)", self.name);
        }
    }

    /// A frame that is authentic, or that needs not be (challenge, ping).
    fn authentic(&mut self, frame: Frame, id: &Identity, now: Instant) {
        // Answers keep the connection alive but are not use: `last_used` moves only with
        // datagrams relayed either way, so a relay no peer needs closes when idle.
        if !matches!(frame, Frame::Challenge { .. } | Frame::Ping { .. }) {
            self.last_heard = now;
        }
        match frame {
            Frame::Challenge { cookie } => {
                let Some(token) = self.token.clone() else {
                    return;
                };
                let since = match self.state {
                    State::Hello { since, .. } | State::Registering { since, .. } => Some(since),
                    State::Up { .. } => None,
                    _ => return,
                };
                let proof = relay::sealed_proof(&self.keys(id).shared, &cookie, &id.public);
                self.transmit(Frame::Register {
                    node: id.public,
                    cookie,
                    proof,
                    token,
                });
                if let Some(since) = since {
                    self.state = State::Registering { since, sent: now };
                }
            }
            Frame::Registered { lease_secs } => {
                let lease = Duration::from_secs(u64::from(lease_secs.max(1)));
                let was_up = self.is_up();
                if matches!(self.state, State::Registering { .. } | State::Up { .. }) {
                    self.state = State::Up {
                        registered: now,
                        lease,
                    };
                    self.rehello = None;
                    if !was_up {
                        while let Some((dst, payload)) = self.queue.pop_front() {
                            self.transmit(Frame::Send {
                                dst: relay::prefix(&dst),
                                payload,
                            });
                        }
                        self.send_ping(now);
                        self.note(Note::Up { rtt: self.rtt });
                    }
                }
            }
            Frame::Refused { code, reason } => {
                tracing::warn!(relay = %self.name, code = ?code, "relay {} refused: {reason}", self.name);
                match code {
                    RefuseCode::Expired | RefuseCode::BadToken => {
                        self.token = None;
                        self.down(
                            format!("relay {} refused the relay token ({reason}); waiting for a fresh token from the control plane", self.name),
                            None,
                        );
                    }
                    RefuseCode::NotRegistered | RefuseCode::BadProof => {
                        if self.is_up() {
                            self.down(
                                format!("relay {} lost the registration ({reason})", self.name),
                                Some(now),
                            );
                        } else {
                            let since = match self.state {
                                State::Hello { since, .. } | State::Registering { since, .. } => {
                                    since
                                }
                                _ => now,
                            };
                            self.hello(id, now, since);
                        }
                    }
                    RefuseCode::Busy | RefuseCode::Other(_) => self.down(
                        format!(
                            "relay {} is busy ({reason}); trying again in {} s",
                            self.name,
                            BUSY_BACKOFF.as_secs()
                        ),
                        Some(now + BUSY_BACKOFF),
                    ),
                }
            }
            Frame::Recv { src, payload } => self.note(Note::Recv { src, payload }),
            Frame::PeerGone { dst } => self.note(Note::PeerGone { dst }),
            Frame::Ping { nonce } => self.transmit(Frame::Pong { nonce }),
            Frame::Pong { nonce } => {
                if let Some((want, sent)) = self.ping
                    && want == nonce
                {
                    self.rtt = Some(now.saturating_duration_since(sent));
                    self.ping = None;
                }
            }
            // Frames only a node sends, or sealed twice: a confused relay; ignored.
            Frame::Hello { .. }
            | Frame::Register { .. }
            | Frame::Send { .. }
            | Frame::Sealed { .. } => {}
        }
    }
}
