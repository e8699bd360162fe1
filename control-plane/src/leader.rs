//! Which replica leads: exactly one `plexsphere serve` of those sharing a database runs the
//! broker's reconcile loop and the maintenance task, the holder of the `broker` lease
//! (`store::lease`, a row in the database).
//!
//! Why a row and not a Postgres advisory lock: it works the same on SQLite and Postgres (one
//! code path, tested on both), it survives a connection pooler in front of Postgres, and it
//! can fence writes: the broker's phase writes carry `AND EXISTS (lease held by me, not
//! expired)` in the same statement (`store::resources::update_as`), so an old leader that was
//! paused past its lease writes nothing once another replica holds it. An advisory lock is
//! tied to one session and is not visible to the other connections of the pool that write.
//!
//! The timing (`--leader-lease-secs`, [`LEASE_TTL`] by default), for a lease of `ttl`:
//! - every replica tries to take or renew the lease every `ttl / 3` ([`LeaseTiming::renew_every`]);
//! - a holder acts only until `2/3 ttl` after the start of its last successful renewal
//!   ([`LeaseTiming::act_for`]): a holder that cannot reach the database stops acting a third
//!   of the lease before the lease can have expired, which is the margin for clock skew
//!   between replicas (their clocks must agree well within `ttl / 3`; use NTP);
//! - a holder killed with SIGKILL is replaced once its lease expired: within `ttl + ttl / 3`
//!   of its last renewal (the lease runs out, the next try of another replica takes it);
//! - a holder that stops cleanly gives the lease up, so another takes over within `ttl / 3`.
//!
//! The decisions are plain functions of the renewal's outcome and the time (`Instant`), so
//! the tests step time; [`spawn`] is the thin loop that feeds them.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::store::{Store, StoreError, lease};

/// How long a lease lasts after each renewal by default.
pub(crate) const LEASE_TTL: Duration = Duration::from_secs(15);

/// The lease's timing (module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    pub ttl: Duration,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        Self { ttl: LEASE_TTL }
    }
}

impl LeaseTiming {
    /// How often every replica tries to take or renew the lease.
    pub(crate) fn renew_every(&self) -> Duration {
        self.ttl / 3
    }

    /// How long after the start of a successful renewal the holder may act.
    pub(crate) fn act_for(&self) -> Duration {
        self.ttl - self.ttl / 3
    }
}

/// What a write of the leader proves: who writes. `None` for a process that owns its
/// database alone ([`Leadership::single`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fence {
    pub holder: Option<String>,
}

impl Fence {
    /// The lease condition of a write made now: the holder and the wall clock in unix ms.
    pub(crate) fn at_now(&self) -> Option<(&str, i64)> {
        self.holder.as_deref().map(|h| (h, wall_ms()))
    }
}

/// What one try to take or renew the lease found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// This replica holds the lease (taken or renewed).
    Held,
    /// Another replica holds it.
    HeldBy(String),
    /// The database did not answer: nothing is known.
    Unknown,
}

/// A change worth a log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// This replica started to lead.
    Leading,
    /// This replica stopped leading (another holds the lease, or it could not renew in time).
    Stopped,
    /// Another replica is seen leading (as a follower).
    Follows(String),
}

#[derive(Debug, Default)]
struct State {
    /// This replica may act until then (None: it does not lead).
    acting_until: Option<Instant>,
    /// Whether the last answer of [`Leadership::acting`] was yes (to log a stop once).
    was_acting: bool,
    /// The other holder last seen.
    seen: Option<String>,
}

#[derive(Debug)]
enum Mode {
    Single,
    Lease(LeaseTiming),
}

/// This replica's part in the lease: its holder id, the timing and what it last learnt.
#[derive(Debug)]
pub struct Leadership {
    holder: String,
    mode: Mode,
    state: Mutex<State>,
}

impl Leadership {
    /// A process that owns its database alone (the in-process test servers): it always acts
    /// and its writes are not fenced.
    pub(crate) fn single() -> Self {
        Self {
            holder: "single".to_owned(),
            mode: Mode::Single,
            state: Mutex::new(State::default()),
        }
    }

    /// A replica that takes part in the lease as `holder` (unique per process).
    pub fn lease(holder: String, timing: LeaseTiming) -> Self {
        Self {
            holder,
            mode: Mode::Lease(timing),
            state: Mutex::new(State::default()),
        }
    }

    /// A holder id unique to this process: the host name, the pid and a random part.
    pub(crate) fn new_holder_id() -> String {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "host".to_owned());
        let id = uuid::Uuid::new_v4().simple().to_string();
        format!("{host}-{}-{}", std::process::id(), &id[..8])
    }

    pub(crate) fn holder(&self) -> &str {
        &self.holder
    }

    pub(crate) fn timing(&self) -> Option<LeaseTiming> {
        match self.mode {
            Mode::Single => None,
            Mode::Lease(t) => Some(t),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The fence of this replica's writes when it may act at `now`, or None: then it must not
    /// run a reconcile pass or a maintenance round.
    pub(crate) fn acting(&self, now: Instant) -> Option<Fence> {
        let Mode::Lease(_) = self.mode else {
            return Some(Fence { holder: None });
        };
        let mut st = self.state();
        let acting = st.acting_until.is_some_and(|until| now < until);
        if st.was_acting && !acting {
            tracing::warn!(holder = %self.holder, "this replica stopped leading the broker and maintenance: its lease could not be renewed in time");
        }
        st.was_acting = acting;
        acting.then(|| Fence {
            holder: Some(self.holder.clone()),
        })
    }

    /// Whether this replica may act at `now` (what `/metrics` shows); unlike [`Self::acting`]
    /// it only reads.
    pub(crate) fn leads_now(&self, now: Instant) -> bool {
        match self.mode {
            Mode::Single => true,
            Mode::Lease(_) => self.state().acting_until.is_some_and(|until| now < until),
        }
    }

    /// Takes in one try's outcome (started at `started`); answers the change to log, if any.
    /// Pure but for the state it updates.
    pub(crate) fn observe(&self, renewal: Renewal, started: Instant) -> Option<Change> {
        let Mode::Lease(timing) = self.mode else {
            return None;
        };
        let mut st = self.state();
        let was = st.acting_until.is_some_and(|until| started < until);
        match renewal {
            Renewal::Held => {
                st.acting_until = Some(started + timing.act_for());
                st.seen = None;
                (!was).then_some(Change::Leading)
            }
            Renewal::HeldBy(other) => {
                st.acting_until = None;
                let new_other = st.seen.as_deref() != Some(other.as_str());
                st.seen = Some(other.clone());
                if was {
                    Some(Change::Stopped)
                } else {
                    new_other.then_some(Change::Follows(other))
                }
            }
            // Keep acting until the deadline the last renewal set: it expires by itself.
            Renewal::Unknown => None,
        }
    }
}

/// Unix milliseconds of the wall clock (the lease's clock; see the module doc on skew).
pub fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// One try to take or renew the lease.
pub(crate) async fn renew(store: &Store, leadership: &Leadership) -> Result<Renewal, StoreError> {
    let Some(timing) = leadership.timing() else {
        return Ok(Renewal::Held);
    };
    let ttl_ms = i64::try_from(timing.ttl.as_millis()).unwrap_or(i64::MAX);
    let mut conn = store.acquire().await?;
    if lease::acquire(
        &mut conn,
        lease::BROKER,
        leadership.holder(),
        wall_ms(),
        ttl_ms,
    )
    .await?
    {
        return Ok(Renewal::Held);
    }
    let holder = lease::get(&mut conn, lease::BROKER)
        .await?
        .map_or_else(|| "nobody".to_owned(), |l| l.holder);
    Ok(Renewal::HeldBy(holder))
}

/// Starts the lease loop of a [`Leadership::lease`] replica (nothing for a single one); it
/// ends when `stop` fires, giving the lease up if this replica holds it.
pub fn spawn(
    store: Store,
    leadership: Arc<Leadership>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Option<tokio::task::JoinHandle<()>> {
    let timing = leadership.timing()?;
    Some(tokio::spawn(async move {
        tracing::info!(holder = %leadership.holder(), lease_secs = timing.ttl.as_secs_f64(), "taking part in the broker lease (one replica runs the broker and maintenance)");
        let mut tick = tokio::time::interval(timing.renew_every());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {},
                _ = stop.changed() => break,
            }
            let started = Instant::now();
            let renewal = match renew(&store, &leadership).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, holder = %leadership.holder(), "cannot renew the broker lease; retrying at the next round");
                    Renewal::Unknown
                }
            };
            match leadership.observe(renewal, started) {
                Some(Change::Leading) => {
                    tracing::info!(holder = %leadership.holder(), "this replica now leads the broker's reconcile loop and maintenance")
                }
                Some(Change::Stopped) => {
                    tracing::warn!(holder = %leadership.holder(), "this replica stopped leading the broker and maintenance: another replica holds the lease")
                }
                Some(Change::Follows(other)) => {
                    tracing::info!(holder = %leadership.holder(), leader = %other, "another replica leads the broker and maintenance")
                }
                None => {}
            }
        }
        if leadership.acting(Instant::now()).is_some() {
            let released = match store.acquire().await {
                Ok(mut conn) => lease::release(&mut conn, lease::BROKER, leadership.holder()).await,
                Err(e) => Err(e),
            };
            match released {
                Ok(_) => {
                    tracing::info!(holder = %leadership.holder(), "gave up the broker lease (shutting down)")
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot give up the broker lease; another replica takes over once it expires")
                }
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(ttl: u64) -> Leadership {
        Leadership::lease(
            "me".into(),
            LeaseTiming {
                ttl: Duration::from_secs(ttl),
            },
        )
    }

    #[test]
    fn a_holder_acts_until_two_thirds_of_the_lease_after_its_last_renewal() {
        let l = lease(15);
        let t0 = Instant::now();
        assert!(
            l.acting(t0).is_none(),
            "nobody leads before the first renewal"
        );
        assert_eq!(l.observe(Renewal::Held, t0), Some(Change::Leading));
        let fence = l.acting(t0).unwrap();
        assert_eq!(fence.holder.as_deref(), Some("me"));
        // Renewals keep it acting without a new log line.
        assert_eq!(l.observe(Renewal::Held, t0 + Duration::from_secs(5)), None);
        assert!(l.acting(t0 + Duration::from_secs(14)).is_some());
        // The database stops answering: it acts until 10 s after the last good renewal, then
        // stops on its own, 5 s before that renewal's lease can have expired.
        assert_eq!(
            l.observe(Renewal::Unknown, t0 + Duration::from_secs(10)),
            None
        );
        assert!(l.acting(t0 + Duration::from_millis(14_999)).is_some());
        assert!(l.acting(t0 + Duration::from_secs(15)).is_none());
        // Back: it leads again.
        assert_eq!(
            l.observe(Renewal::Held, t0 + Duration::from_secs(20)),
            Some(Change::Leading)
        );
    }

    #[test]
    fn another_holder_stops_this_one_at_once_and_is_logged_once() {
        let l = lease(15);
        let t0 = Instant::now();
        l.observe(Renewal::Held, t0);
        assert_eq!(
            l.observe(Renewal::HeldBy("other".into()), t0 + Duration::from_secs(1)),
            Some(Change::Stopped)
        );
        assert!(l.acting(t0 + Duration::from_secs(1)).is_none());
        assert_eq!(
            l.observe(Renewal::HeldBy("other".into()), t0 + Duration::from_secs(6)),
            None
        );
        assert_eq!(
            l.observe(
                Renewal::HeldBy("third".into()),
                t0 + Duration::from_secs(11)
            ),
            Some(Change::Follows("third".into()))
        );
    }

    #[test]
    fn a_single_process_always_acts_unfenced() {
        let l = Leadership::single();
        assert_eq!(l.acting(Instant::now()), Some(Fence { holder: None }));
        assert_eq!(l.observe(Renewal::HeldBy("x".into()), Instant::now()), None);
    }

    #[test]
    fn the_timing_keeps_a_third_of_the_lease_as_margin() {
        let t = LeaseTiming::default();
        assert_eq!(t.renew_every(), Duration::from_secs(5));
        assert_eq!(t.act_for(), Duration::from_secs(10));
    }
}
