//! What the core may answer: the per-prefix rate of answers to strangers, the global rate of
//! refusals, and the rate-limited log line of a limit hit.

use std::time::Instant;

use plexsphere_wire::reach::relay::{Frame, RefuseCode};

use super::{Core, Limit, Out, Peer};
use crate::limits::LIMIT_LOG_EVERY;

impl Core {
    /// Logs a limit at most every [`LIMIT_LOG_EVERY`], with how often it was hit meanwhile.
    pub(super) fn hit(&mut self, limit: Limit, now: Instant) {
        self.counters.limit_hits.inc();
        let entry = self
            .logged
            .entry(limit)
            .or_insert((now - LIMIT_LOG_EVERY * 2, 0));
        entry.1 += 1;
        if now.saturating_duration_since(entry.0) < LIMIT_LOG_EVERY {
            return;
        }
        let times = std::mem::take(&mut entry.1);
        entry.0 = now;
        let l = &self.limits;
        match limit {
            Limit::MaxNodes => tracing::warn!(
                times,
                max = l.max_nodes,
                "the relay is at its limit of registered nodes; new nodes are refused as busy (raise --max-nodes)"
            ),
            Limit::MaxTcp => tracing::warn!(
                times,
                max = l.max_tcp_connections,
                "the relay is at its limit of TCP connections; new ones are closed (raise --max-tcp-connections)"
            ),
            Limit::TcpPerSource => tracing::warn!(
                times,
                max = l.tcp_per_source(),
                "a source address (or IPv6 /64) holds as many TCP connections as it may; new ones from it are closed (raise --max-tcp-per-source)"
            ),
            Limit::PrefixAnswers => tracing::warn!(
                times,
                rate = l.prefix_answers.per_sec,
                burst = l.prefix_answers.burst,
                "a source /24 or /48 with no registration asked for more answers than it gets; the rest go unanswered (--prefix-answers-per-sec, --prefix-answers-burst)"
            ),
            Limit::NodeBudget => tracing::warn!(
                times,
                frames = l.node_frames_per_sec,
                bytes = l.node_bytes_per_sec,
                "a node sent more than its budget; frames over it are dropped (--node-frames-per-sec, --node-bytes-per-sec)"
            ),
            Limit::Refusals => tracing::warn!(
                times,
                rate = l.refusals_per_sec,
                "more refusals than --refusals-per-sec are due; the rest go unanswered"
            ),
        }
    }

    /// Whether `peer` may be answered now: always when it is registered or a TCP connection,
    /// else when its source /24 or /48 has an answer left (a drop is counted and logged).
    pub fn may_answer(&mut self, peer: Peer, now: Instant) -> bool {
        let Peer::Udp(addr) = peer else { return true };
        if self.by_peer.contains_key(&peer) || self.strangers.take(addr.ip(), now) {
            return true;
        }
        self.counters.dropped_prefix_rate.inc();
        self.hit(Limit::PrefixAnswers, now);
        false
    }

    /// A `refused` for a peer, if its prefix's rate and the global refusal rate allow one now.
    pub(super) fn refuse(
        &mut self,
        peer: Peer,
        code: RefuseCode,
        reason: &str,
        now: Instant,
    ) -> Option<Out> {
        self.counters.refused.inc();
        if !self.may_answer(peer, now) {
            return None;
        }
        if !self.refusals.take(1, now) {
            self.hit(Limit::Refusals, now);
            return None;
        }
        let to = self.to(peer)?;
        Some(Out {
            to,
            frame: Frame::Refused {
                code,
                reason: reason.to_owned(),
            },
        })
    }
}
