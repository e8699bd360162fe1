//! The event stream's connection as the core keeps it ([`super::stream`] decides on its
//! messages): waiting to (re)connect or one connection open, the ids that tell a stale
//! connection's messages apart, the disconnects `plexd status` counts, and the reconnect
//! backoff.

use std::time::{Duration, Instant};

use crate::backoff::Backoff;

/// The event stream: waiting to (re)connect, or one connection open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Waiting {
        until: Instant,
    },
    Open {
        conn: u64,
        connected_at: Option<Instant>,
        last_activity: Instant,
    },
}

/// What a deadline means for the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamDue {
    /// The wait is over: open the next connection.
    Open,
    /// Connection `conn` sent no byte for the stall timeout: close it.
    Stalled {
        conn: u64,
    },
    Nothing,
}

/// The event stream's state, owned here and changed only through these methods.
#[derive(Debug, Clone)]
pub struct EventStream {
    state: Stream,
    next_conn: u64,
    /// Times the stream ended (each is followed by a reconnect after a backoff).
    disconnects: u64,
    backoff: Backoff,
}

impl EventStream {
    /// Waiting, with the first attempt due at `now`.
    pub fn new(backoff: Backoff, now: Instant) -> Self {
        Self {
            state: Stream::Waiting { until: now },
            next_conn: 0,
            disconnects: 0,
            backoff,
        }
    }

    pub fn state(&self) -> Stream {
        self.state
    }

    /// A new connection is opened at `now`: its id.
    pub fn open(&mut self, now: Instant) -> u64 {
        self.next_conn += 1;
        self.state = Stream::Open {
            conn: self.next_conn,
            connected_at: None,
            last_activity: now,
        };
        self.next_conn
    }

    /// Whether `conn` is the open connection (messages of older ones are ignored).
    pub fn is_current(&self, conn: u64) -> bool {
        matches!(self.state, Stream::Open { conn: c, .. } if c == conn)
    }

    /// Something arrived on the open connection.
    pub fn activity(&mut self, now: Instant) {
        if let Stream::Open { last_activity, .. } = &mut self.state {
            *last_activity = now;
        }
    }

    /// The server answered the open connection.
    pub fn connected(&mut self, now: Instant) {
        if let Stream::Open { connected_at, .. } = &mut self.state {
            *connected_at = Some(now);
        }
    }

    pub fn is_connected(&self) -> bool {
        matches!(
            self.state,
            Stream::Open {
                connected_at: Some(_),
                ..
            }
        )
    }

    /// The connection ended at `now`: it is counted, and the next attempt waits the backoff's
    /// next delay (`retry_after` at least; `unit` is the jitter). Returns that delay.
    pub fn ended(&mut self, now: Instant, unit: f64, retry_after: Option<Duration>) -> Duration {
        if let Stream::Open {
            connected_at: Some(t),
            ..
        } = self.state
        {
            self.backoff.connection_lasted(now.duration_since(t));
        }
        self.disconnects += 1;
        let delay = self.backoff.next_delay(unit, retry_after);
        self.state = Stream::Waiting { until: now + delay };
        delay
    }

    pub fn disconnects(&self) -> u64 {
        self.disconnects
    }

    /// When the stream needs the core next: the end of the wait, or the stall deadline (with
    /// `stall` as the stall timeout).
    pub fn poll_timeout(&self, stall: Duration) -> Instant {
        match self.state {
            Stream::Waiting { until } => until,
            Stream::Open { last_activity, .. } => last_activity + stall,
        }
    }

    /// What is due at `now`, with `stall` as the stall timeout.
    pub fn due(&self, now: Instant, stall: Duration) -> StreamDue {
        match self.state {
            Stream::Waiting { until } if until <= now => StreamDue::Open,
            Stream::Open {
                conn,
                last_activity,
                ..
            } if last_activity + stall <= now => StreamDue::Stalled { conn },
            _ => StreamDue::Nothing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_opens_stalls_ends_and_the_next_waits_at_least_retry_after() {
        let t0 = Instant::now();
        let stall = Duration::from_secs(90);
        let backoff = Backoff::new(
            Duration::from_secs(1),
            Duration::from_secs(60),
            Duration::from_secs(30),
        );
        let mut s = EventStream::new(backoff, t0);
        assert_eq!(s.due(t0, stall), StreamDue::Open);
        let c1 = s.open(t0);
        assert!(s.is_current(c1) && !s.is_connected());
        s.connected(t0);
        assert!(s.is_connected());
        assert_eq!(s.poll_timeout(stall), t0 + stall);
        assert_eq!(
            s.due(t0 + stall - Duration::from_secs(1), stall),
            StreamDue::Nothing
        );
        assert_eq!(s.due(t0 + stall, stall), StreamDue::Stalled { conn: c1 });
        let delay = s.ended(t0 + stall, 0.5, Some(Duration::from_secs(9)));
        assert!(delay >= Duration::from_secs(9), "{delay:?}");
        assert_eq!(s.disconnects(), 1);
        assert!(!s.is_current(c1) && !s.is_connected());
        assert_eq!(s.poll_timeout(stall), t0 + stall + delay);
        let c2 = s.open(t0 + stall + delay);
        assert!(
            s.is_current(c2) && !s.is_current(c1),
            "a stale connection is ignored"
        );
    }
}
