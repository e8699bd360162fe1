//! Key and credential rotation: when one starts and what each answer leads to.
//!
//! | trigger                                        | starts                               |
//! |------------------------------------------------|--------------------------------------|
//! | the key is older than `rotation.key_interval` (jittered ±10 %) | a key rotation        |
//! | a pending key at start (a rotation a crash cut short) | a key rotation at once        |
//! | `plexd rotate-key` on the socket               | a key rotation at once (it answers when done) |
//! | `rotate_key` in a heartbeat answer (`plexctl node rotate-key`) | a key rotation at once |
//! | the same three for the credential              | a credential rotation                |
//!
//! | answer                                   | then                                            |
//! |------------------------------------------|-------------------------------------------------|
//! | key call ok                              | `MeshOp::SetKey` (the interface, then reach)    |
//! | key set on the interface                 | `PromoteKey`, the new relay token, answer, next due after the interval |
//! | key set failed                           | retry after [`ROTATION_RETRY`] (the repeat is answered as done) |
//! | 409 (taken by another node, or the control plane has a third key) | `DiscardPendingKey`, answer the error |
//! | 401 / `node_revoked`                     | the node is gone, as for every call             |
//! | other failures (429 with its `Retry-After`) | retry after [`ROTATION_RETRY`] or `Retry-After` |
//! | credential ok (saved and in use)         | answer, next due after the interval             |
//!
//! While a leave is in flight nothing starts. An operator's request stays in heartbeat
//! answers until the control plane has the new key: the answer to a heartbeat sent before a
//! rotation finished is not taken as a new request (it may predate the rotation).

use std::time::{Duration, Instant};

use plexsphere_wire::node::HeartbeatAck;

use super::io::KeyDone;
use super::protocol::Answer;
use super::rotation_state::Kind;
pub use super::rotation_state::{RotationStart, Rotations};
use super::{Call, ControlId, Core, DELETED, Effect, MeshOp, Now, Outcome, Pending};
use crate::exit::ExitCode;
use crate::mesh::MeshError;
use crate::node_api::CallError;

/// A failed rotation is tried again after this long (or the server's `Retry-After`).
pub const ROTATION_RETRY: Duration = Duration::from_secs(30);

impl Core {
    fn interval(&self, k: Kind) -> Option<Duration> {
        let r = &self.config.rotation;
        match k {
            Kind::Key => r.key_interval.0,
            Kind::Credential => r.credential_interval.0,
        }
    }

    /// When the next scheduled rotation of `k` is due, from the age of what it replaces.
    fn scheduled(&mut self, k: Kind, age: Duration, now: Now) -> Option<Instant> {
        let interval = self.interval(k)?;
        let unit = self.jitter.unit();
        let wait = super::schedule::jittered(interval, unit).saturating_sub(age);
        Some(now.at + wait)
    }

    /// Sets up both schedules at start.
    pub(super) fn start_rotations(&mut self, start: RotationStart, now: Now) {
        self.rotations.key.due = if start.pending_key {
            tracing::info!(
                "a WireGuard key rotation did not finish before plexd stopped; finishing it"
            );
            Some(now.at)
        } else {
            self.scheduled(Kind::Key, start.key_age.unwrap_or_default(), now)
        };
        let age = start.credential_age.unwrap_or_default();
        self.rotations.credential.due = self.scheduled(Kind::Credential, age, now);
    }

    /// Starts what is due (the tick).
    pub(super) fn rotation_tick(&mut self, now: Now) {
        if self.is_leaving() {
            return;
        }
        for k in [Kind::Key, Kind::Credential] {
            let t = self.rotations.track(k);
            if t.running || t.due.is_none_or(|d| d > now.at) {
                continue;
            }
            t.running = true;
            t.due = None;
            tracing::info!("rotating the {}", k.name());
            self.emit(Effect::Call(match k {
                Kind::Key => Call::RotateKey,
                Kind::Credential => Call::RotateCredential,
            }));
        }
    }

    /// `plexd rotate-key` / `rotate-credential`: at once; the answer waits for the end.
    pub(super) fn rotate_now(&mut self, id: ControlId, k: Kind, now: Now) {
        if self.is_leaving() {
            self.emit(Effect::Answer {
                id,
                answer: Answer::error("a leave is in progress; nothing to rotate", ExitCode::Io),
            });
            return;
        }
        let t = self.rotations.track(k);
        t.waiters.push(id);
        if !t.running {
            t.due = Some(now.at);
        }
        self.rotation_tick(now);
    }

    /// A heartbeat answer may carry an operator's request.
    pub(super) fn rotation_requested(&mut self, ack: &HeartbeatAck, now: Now) {
        let sent = self.rotations.heartbeat_sent;
        for (k, asked) in [
            (Kind::Key, ack.rotate_key),
            (Kind::Credential, ack.rotate_credential),
        ] {
            let t = self.rotations.track(k);
            // An answer to a heartbeat sent before the last rotation ended may predate it.
            let quiet = t.done_at.is_some_and(|d| sent.is_none_or(|s| s <= d));
            if asked && !t.running && !quiet && t.due.is_none_or(|d| d > now.at) {
                tracing::info!("an operator asked for a rotation of the {}", k.name());
                t.due = Some(now.at);
            }
        }
        self.rotation_tick(now);
    }

    fn answer_waiters(&mut self, k: Kind, answer: &Answer) {
        for id in std::mem::take(&mut self.rotations.track(k).waiters) {
            self.emit(Effect::Answer {
                id,
                answer: answer.clone(),
            });
        }
    }

    fn rotation_done(&mut self, k: Kind, message: String, now: Now) {
        tracing::info!("{message}");
        let next = self.scheduled(k, Duration::ZERO, now);
        let t = self.rotations.track(k);
        t.running = false;
        t.done_at = Some(now.at);
        t.due = next;
        self.answer_waiters(k, &Answer::Rotated { message });
    }

    /// Failed: the waiters hear why; it is tried again after `retry` (`None`: not again
    /// before its schedule).
    fn rotation_failed(&mut self, k: Kind, why: String, retry: Option<Duration>, now: Now) {
        let (message, code) = match retry {
            Some(d) => (
                format!(
                    "the rotation of the {} failed: {why}; plexd tries again in {} s",
                    k.name(),
                    d.as_secs()
                ),
                ExitCode::ServerRefused,
            ),
            None => (
                format!("the rotation of the {} was refused: {why}", k.name()),
                ExitCode::ServerRefused,
            ),
        };
        tracing::warn!("{message}");
        self.error_observation(message.clone(), now);
        let next = match retry {
            Some(d) => Some(now.at + d),
            None => self.scheduled(k, Duration::ZERO, now),
        };
        let t = self.rotations.track(k);
        t.running = false;
        t.due = next;
        self.answer_waiters(k, &Answer::error(message, code));
    }

    /// A rotation call failed: the node may be gone; otherwise retry.
    fn rotation_call_failed(&mut self, k: Kind, e: CallError, now: Now) {
        match e {
            CallError::Unauthorized if !self.is_leaving() => {
                self.answer_waiters(k, &Answer::error(DELETED, ExitCode::NodeGone));
                self.exit(Outcome::Gone(DELETED.to_owned()));
            }
            CallError::Revoked => {
                self.answer_waiters(k, &Answer::error(super::REVOKED, ExitCode::NodeGone));
                self.revoked(now);
            }
            CallError::Refused { status: 409, .. } if k == Kind::Key => {
                // The key is another node's, or the control plane holds a key that is neither
                // ours nor the pending one: this pending key can never be taken.
                self.emit(Effect::DiscardPendingKey);
                self.rotation_failed(k, e.to_string(), None, now);
            }
            e => {
                let retry = e
                    .retry_after()
                    .unwrap_or(ROTATION_RETRY)
                    .max(Duration::from_secs(1));
                self.rotation_failed(k, e.to_string(), Some(retry), now);
            }
        }
    }

    pub(super) fn on_key_rotated(&mut self, res: Result<KeyDone, CallError>, now: Now) {
        match res {
            Ok(done) => {
                tracing::info!(
                    old_key = %done.old_public_key,
                    new_key = %done.answer.public_key,
                    state_version = done.answer.state_version,
                    already = done.answer.already,
                    "the control plane holds the new WireGuard key; its peers were told; switching the interface"
                );
                let op = MeshOp::SetKey(done.secret.clone());
                self.ask_mesh(op, Pending::SetKey(Box::new(done)), now);
            }
            Err(e) => self.rotation_call_failed(Kind::Key, e, now),
        }
    }

    pub(super) fn on_key_set(&mut self, done: KeyDone, res: Result<(), MeshError>, now: Now) {
        match res {
            Ok(()) => {
                self.emit(Effect::PromoteKey);
                if let Some(token) = &done.answer.relay_token {
                    self.feed_relay_token(token);
                }
                let message = format!(
                    "rotated the WireGuard key: {} replaces {}; the peers switch as the event reaches them",
                    done.answer.public_key, done.old_public_key
                );
                self.rotation_done(Kind::Key, message, now);
            }
            Err(e) => self.rotation_failed(
                Kind::Key,
                format!(
                    "the control plane has the new key, but the interface could not take it: {e}"
                ),
                Some(ROTATION_RETRY),
                now,
            ),
        }
    }

    pub(super) fn on_credential_rotated(&mut self, res: Result<(), CallError>, now: Now) {
        match res {
            Ok(()) => self.rotation_done(
                Kind::Credential,
                "rotated the node credential: the new one is saved and in use; the old one stops working on the control plane shortly".to_owned(),
                now,
            ),
            Err(e) => self.rotation_call_failed(Kind::Credential, e, now),
        }
    }
}
