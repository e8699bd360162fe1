//! The event stream's lifecycle: open (resuming after the last applied seq), connected,
//! frames verified and applied, stalled or ended, then a backoff before the next attempt.

use plexsphere_wire::node::EventKind;

use super::cache::CachedEvent;
use super::schedule::Task;
use super::wanted::Delta;
use super::{Core, DELETED, Effect, MAX_CACHED_EVENTS, Now, Outcome, StreamMsg};
use crate::backoff;
use crate::node_api::CallError;

impl Core {
    pub(super) fn open_stream(&mut self, now: Now) {
        let conn = self.stream.open(now.at);
        let resume = (self.last_seq > 0).then_some(self.last_seq);
        tracing::debug!(conn, last_event_id = ?resume, "opening the event stream");
        self.emit(Effect::OpenStream { conn, resume });
    }

    pub(super) fn stream_ended(
        &mut self,
        reason: String,
        retry_after: Option<std::time::Duration>,
        now: Now,
    ) {
        let unit = self.jitter.unit();
        let delay = self.stream.ended(now.at, unit, retry_after);
        tracing::warn!(
            "event stream disconnected ({reason}), retrying in {} s",
            backoff::secs_text(delay)
        );
        self.api.error(now.at, format!("event stream: {reason}"));
        self.update_status();
    }

    pub(super) fn on_stream(&mut self, msg: StreamMsg, now: Now) {
        self.stream.activity(now.at);
        match msg {
            StreamMsg::Connected => {
                self.stream.connected(now.at);
                self.api.answered(now.at);
                tracing::info!(
                    last_event_id = self.last_seq,
                    "event stream connected (resuming after event {})",
                    self.last_seq
                );
                self.update_status();
            }
            StreamMsg::Activity => {}
            StreamMsg::Frame { id, event, data } => {
                self.last_event = Some(now.at);
                self.on_frame(id, &event, data, now);
            }
            StreamMsg::Ended {
                fatal: Some(CallError::Revoked),
                ..
            } if !self.is_leaving() => self.revoked(now),
            StreamMsg::Ended {
                fatal: Some(CallError::CloneRefused),
                ..
            } => self.cloned(),
            StreamMsg::Ended { fatal: Some(_), .. } if !self.is_leaving() => {
                self.exit(Outcome::Gone(DELETED.to_owned()));
            }
            // While leaving, a stream the server ends for good is expected: the leave's own
            // answer ends the daemon.
            StreamMsg::Ended {
                reason,
                retry_after,
                ..
            } => self.stream_ended(reason, retry_after, now),
        }
    }

    fn on_frame(&mut self, id: Option<String>, event: &str, data: String, now: Now) {
        let ev = match self.acceptor.event(id.as_deref(), &data) {
            Ok((ev, by)) => {
                self.signed_by(by, None, true, now);
                ev
            }
            Err(refusal) => {
                if super::accept::is_unknown_signer(&refusal) {
                    self.unknown_signer(now);
                }
                tracing::warn!(
                    event,
                    "refused an event from the stream: {refusal}; keeping the last good state"
                );
                self.error_observation(format!("event refused: {refusal}"), now);
                return;
            }
        };
        if let EventKind::Resync { reason } = &ev.kind {
            // Signed state never goes backwards: a resync moves the position forward (the
            // next pull is a full one) but never lowers what was applied, so a replayed resync
            // cannot open the door to an older state or older events.
            let floor = self.floor();
            if ev.seq <= floor {
                tracing::warn!(
                    seq = ev.seq,
                    applied = floor,
                    "refused a resync at seq {} ({reason}): this node already applied seq {floor}; either the stream replays old messages or the control plane was restored from an older backup (then re-enrol this node: plexd leave, plexd join)",
                    ev.seq
                );
                self.error_observation(
                    format!("resync at seq {} refused: applied seq {floor}", ev.seq),
                    now,
                );
                return;
            }
            tracing::info!(
                seq = ev.seq,
                last_event_id = self.last_seq,
                "the control plane asked for a resync ({reason}); pulling the full state"
            );
            self.last_seq = ev.seq;
            // Events before the resync may be lost: only a state at least this new has them.
            self.state_floor = self.state_floor.max(ev.seq);
            self.full_pull = true;
            self.schedule.run_soon(Task::StatePoll, now.at);
            return;
        }
        if ev.seq <= self.last_seq {
            tracing::debug!(
                seq = ev.seq,
                last_event_id = self.last_seq,
                "event already applied"
            );
            return;
        }
        tracing::debug!(seq = ev.seq, event, "event");
        let delta = self.wanted.apply(&ev.kind);
        self.last_seq = ev.seq;
        let frame = CachedEvent { id: ev.seq, data };
        match delta {
            Delta::Revoked if self.is_leaving() => {
                // The server ends a leaving node's stream this way; the leave's answer ends the
                // daemon.
                tracing::debug!("the control plane closed this node's stream for its leave");
            }
            Delta::Revoked => return self.revoked(now),
            Delta::Resync(reason) => {
                self.state_floor = self.state_floor.max(ev.seq);
                tracing::info!(
                    seq = ev.seq,
                    "the control plane asked for a resync ({reason}); pulling the full state"
                );
                self.schedule.run_soon(Task::StatePoll, now.at);
            }
            Delta::UnknownPeer(peer) => {
                tracing::info!(%peer, "an endpoint change for an unknown peer; pulling the full state");
                self.events.push((ev, frame));
                self.schedule.run_soon(Task::StatePoll, now.at);
            }
            Delta::Changed => {
                let outside = self.names_peer_outside_view(&ev.kind);
                self.events.push((ev, frame));
                self.owed.apply = Some(now);
                if let Some(peer) = outside {
                    tracing::info!(%peer, "the control plane sent a peer this node's policy view does not name yet (it registered after this node's last state); pulling the full state for the new view");
                    self.schedule.run_soon(Task::StatePoll, now.at);
                }
            }
            Delta::Unchanged => self.events.push((ev, frame)),
        }
        if self.events.len() > MAX_CACHED_EVENTS {
            self.schedule.run_soon(Task::StatePoll, now.at);
        }
        self.owed.save = true;
    }
}
