//! What the relay counts: every dropped frame has a counter, so an operator (and a test) can
//! tell a limit from a bug.

use std::sync::atomic::{AtomicU64, Ordering};

/// One counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.add(1);
    }

    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// The live counters, shared by the UDP thread, the TCP tasks and the core.
        #[derive(Debug, Default)]
        pub struct Counters {
            $($(#[$doc])* pub $name: Counter,)*
        }

        /// A snapshot of [`Counters`].
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct Stats {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl Counters {
            pub fn snapshot(&self) -> Stats {
                Stats { $($name: self.$name.get(),)* }
            }
        }
    };
}

counters! {
    /// STUN Binding requests answered.
    stun_answered,
    /// Answers to an unregistered source (STUN, `challenge`, `refused`) left unsent because its
    /// /24 or /48 was over `--prefix-answers-per-sec`.
    dropped_prefix_rate,
    /// Frames from a peer that has not registered and gets no answer to them (`ping`, and over
    /// TCP everything but `hello` and `register`).
    dropped_unregistered,
    /// Datagrams that were neither STUN nor a relay frame, or did not decode.
    dropped_unknown,
    /// Relay frames a node never sends (`recv`, `challenge`...).
    dropped_unexpected,
    /// Successful registrations (renewals included).
    registrations,
    /// `refused` that were due (sent or, over the refusal rate, not).
    refused,
    /// `send` to a key with no live registration.
    peer_gone,
    /// Frames forwarded, and their payload bytes.
    forwarded_frames,
    forwarded_bytes,
    /// `send` over the sending node's frame or byte budget.
    dropped_budget,
    /// Frames for a TCP connection whose writer queue was full.
    dropped_queue_full,
    /// `recv` frames too long for a TCP connection.
    dropped_too_long,
    /// Outputs of the core dropped because [`crate::core::MAX_OUTPUTS`] waited undrained (a
    /// shell that does not poll after every input; 0 in a working relay).
    dropped_outputs,
    /// Times a limit was hit.
    limit_hits,
    /// TCP connections accepted, and closed for a TLS, framing or idle reason.
    tcp_accepted,
    tcp_closed_error,
    /// TCP connections closed at accept: their source address (or /64) held
    /// `--max-tcp-per-source` already.
    tcp_refused_per_source,
    /// TCP connections closed because they had not registered within
    /// `--tcp-register-within-secs` of their accept.
    tcp_closed_unregistered,
}
