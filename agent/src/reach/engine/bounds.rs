//! Every bound and interval of the reach engine, in one place (the engine re-exports them).

use std::time::Duration;

use plexsphere_wire::node::MAX_CANDIDATES;

/// The most direct candidates a peer's state contributes (the bound of one endpoint report).
pub const MAX_STATE_CANDIDATES: usize = MAX_CANDIDATES;
/// The most learned (peer-reflexive or call-me-maybe) candidates per peer; the oldest goes.
pub const MAX_LEARNED_CANDIDATES: usize = 8;
/// A learned candidate without a pong for this long (since it was learned, or since its last
/// pong) is forgotten, unless it is the path: a peer that names it again gets it probed anew.
/// Past [`CANDIDATE_FRESH`], so a candidate that stops answering is first left, then dropped.
pub const LEARNED_LIFETIME: Duration = Duration::from_secs(40);
/// Disco stamps remembered per peer (each is accepted once): more than a peer sends in two
/// seconds at its full budgets, so probes reordered between a relay and a direct path pass.
pub const DISCO_REPLAY_WINDOW: usize = 128;
/// A disco message whose stamp is this much older than the newest one accepted from the same
/// peer is refused (the sender's clock on both sides, so the nodes' clocks need not agree).
pub const DISCO_MAX_AGE: Duration = Duration::from_secs(10);
/// Pongs sent (and pings answered with a ping back, or call-me-maybes punched) per peer and
/// source address or relay per second, at most: one probe round's pings from one address fit,
/// and a flood from one source leaves the rest of [`MAX_PONGS_PER_SEC`] to the others.
pub const MAX_ANSWERS_PER_SOURCE_PER_SEC: u32 = 8;
/// Sources (addresses and relays) with a budget per peer; a new one past it is refused until
/// one has been quiet for a second.
pub const MAX_PING_SOURCES: usize = 16;
/// The most pings in flight per peer (tx ids kept); past it the oldest is forgotten.
pub const MAX_OUTSTANDING_TX: usize = 64;
/// A pong counts only this long after its ping.
pub const TX_LIFETIME: Duration = Duration::from_secs(5);
/// Pings and call-me-maybes sent to one peer per second, at most (one full probe round fits).
pub const MAX_PINGS_PER_SEC: u32 = 48;
/// Pongs sent to one peer per second, at most (a flood of pings costs no more than this).
pub const MAX_PONGS_PER_SEC: u32 = 16;
/// While a peer has no direct path: a probe round this often (so relayed pairs upgrade).
pub const PROBE_INTERVAL: Duration = Duration::from_secs(5);
/// While direct: a full probe round this often (a faster candidate may have appeared).
pub const DIRECT_PROBE_INTERVAL: Duration = Duration::from_secs(30);
/// The heartbeat ping on a working direct path.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(2);
/// After an unanswered heartbeat, the next ping this soon.
pub const RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// A direct path with this many pings unanswered in a row ...
pub const MISSED_PINGS: u32 = 3;
/// ... the last of them this old ...
pub const PING_TIMEOUT: Duration = Duration::from_secs(1);
/// ... and no pong for this long is dead: the peer falls back to a relay (with the
/// heartbeat and retry intervals: about 5 s after the last pong).
pub const DIRECT_DEAD_AFTER: Duration = Duration::from_secs(4);
/// A candidate counts as confirmed while its last pong is this recent.
pub const CANDIDATE_FRESH: Duration = Duration::from_secs(35);
/// A relay that carried a pong from a peer counts as answering for it this long.
pub const RELAY_FRESH: Duration = Duration::from_secs(15);
/// A relay that said a peer is not registered with it is not used for that peer this long
/// (unless a pong comes through it).
pub const GONE_HOLD: Duration = Duration::from_secs(30);
/// How long a peer that every usable relay said is not registered (it has not started, or
/// has not reached a relay yet) waits before its cold candidates are pinged untimed: a peer
/// that starts within it reaches us through a relay first, and the punch is timed then
/// (`punch`). A peer that runs but reaches no relay is pinged cold after it, as before.
pub const GONE_WAIT: Duration = Duration::from_secs(10);
/// Call-me-maybes a pair exchanges (either side's, each counted by both) without a direct
/// candidate answering, after which neither pings the other's cold candidates for
/// [`PUNCH_QUIET`] (`punch`): about two probe rounds of each side.
pub const PUNCHES_BEFORE_QUIET: u32 = 4;
/// How long a pair whose punches all failed stays quiet towards each other's cold candidates,
/// counted from the last call-me-maybe either side sent: Linux's `nf_conntrack_udp_timeout`
/// (30 s, an unreplied UDP entry), plus half the longest relay round trip a punch waits
/// (`TX_LIFETIME / 2`, 2.5 s) and a margin. So every entry a lost punch left on a router whose
/// own input accepts (and the moved mapping of its host) expires before the next punch.
pub const PUNCH_QUIET: Duration = Duration::from_secs(35);
/// Another direct candidate replaces a working one only when it is this much faster.
pub const RTT_HYSTERESIS: Duration = Duration::from_millis(10);
