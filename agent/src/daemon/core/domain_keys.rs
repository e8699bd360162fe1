//! The Domain's signing keys as the node follows a rotation (the wire contract is
//! `plexsphere_wire::signing_keys`).
//!
//! | what happened                                           | then                               |
//! |---------------------------------------------------------|------------------------------------|
//! | a document signed by the pinned key announces a next key | trust it beside the pinned key, save it |
//! | a document signed by the next key                       | promote it (the old key is refused from now on), save; after an event, pull the full state so the cache is signed by the new key |
//! | a document from the API signed by none of the node's keys | fetch the key chain (at most once per [`KEY_CHAIN_INTERVAL`]) |
//! | the chain leads from the pinned key to newer keys        | pin the newest one already active (the one after it as next), save, pull the full state |
//! | the chain does not lead anywhere (forged, broken, too long) | an error naming why; the pinned key and the last good state stay |
//!
//! The acceptor changes only here and only in the core, the one place that verifies what the
//! state poll, the event stream and the cache bring; the identity file follows through
//! [`Effect::SaveDomainKeys`] (written by the disk thread, in order).

pub use super::domain_keys_state::{KEY_CHAIN_INTERVAL, KeyChainFetch};
use plexsphere_wire::signing_keys::{SigningKey, SigningKeyChain, follow};

use super::accept::SignedBy;
use super::schedule::Task;
use super::{Call, Core, Effect, Now};
use crate::node_api::CallError;

fn generation(g: Option<u64>) -> String {
    g.map_or_else(|| "unknown".to_owned(), |g| g.to_string())
}

impl Core {
    /// A document passed every check: what its signer and its announcement mean for the keys.
    /// `from_event`: it was an event (the state the cache holds is then still signed by the
    /// old key, so the full state is pulled after a promotion).
    pub(super) fn signed_by(
        &mut self,
        by: SignedBy,
        announced: Option<&SigningKey>,
        from_event: bool,
        now: Now,
    ) {
        let mut changed = false;
        if by == SignedBy::Next {
            let old = self.acceptor.keys().generation;
            if let Some(key) = self.acceptor.promote() {
                tracing::info!(
                    old_generation = ?old,
                    new_generation = key.generation,
                    "the Domain's signing key moved from generation {} to generation {}: a document signed by the announced key arrived; the old key is refused from now on",
                    generation(old),
                    key.generation
                );
                changed = true;
                if from_event {
                    self.full_pull = true;
                    self.schedule.run_soon(Task::StatePoll, now.at);
                }
            }
        }
        // After a promotion the document was signed by the (new) pinned key, so its
        // announcement counts too.
        if let Some(next) = announced {
            match self.acceptor.announce(next) {
                Ok(true) => {
                    tracing::info!(
                        generation = ?self.acceptor.keys().generation,
                        next_generation = next.generation,
                        active_from = next.active_from,
                        "the control plane announced the Domain's next signing key (generation {}, signing from unix time {}); documents signed by it are accepted from now on",
                        next.generation,
                        next.active_from
                    );
                    changed = true;
                }
                Ok(false) => {}
                Err(e) => tracing::warn!("{e}; keeping the keys this node has"),
            }
        }
        if changed {
            self.keys_changed();
        }
    }

    /// The acceptor's keys changed: the identity (in memory and on disk) follows.
    fn keys_changed(&mut self) {
        let keys = self.acceptor.keys().clone();
        self.id.domain_signing_public_key = keys.pinned.clone();
        self.id.domain_signing_key_generation = keys.generation;
        self.id.next_signing_key = keys.next.clone();
        self.emit(Effect::SaveDomainKeys(keys));
    }

    /// A document from the control plane is signed by none of the node's keys: perhaps the
    /// Domain's key rotated while this node was away. Ask for the key chain (rate limited).
    pub(super) fn unknown_signer(&mut self, now: Now) {
        let chain = &mut self.key_chain;
        if chain.running || chain.last.is_some_and(|t| now.at < t + KEY_CHAIN_INTERVAL) {
            return;
        }
        chain.running = true;
        chain.last = Some(now.at);
        tracing::info!(
            "a document is signed by none of this node's Domain keys; fetching the Domain's key chain in case the key rotated while this node was away"
        );
        self.emit(Effect::Call(Call::SigningKeys));
    }

    /// The key chain's answer.
    pub(super) fn on_key_chain(&mut self, res: Result<SigningKeyChain, CallError>, now: Now) {
        self.key_chain.running = false;
        let chain = match res {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(
                    "cannot fetch the Domain's key chain: {e}; keeping the last good state (asked again at most every {} s while documents are refused)",
                    KEY_CHAIN_INTERVAL.as_secs()
                );
                return;
            }
        };
        let keys = self.acceptor.keys().clone();
        let reached = match follow(self.id.domain_id, &keys.pinned, &chain) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(
                    "the Domain's key chain does not lead anywhere from the pinned key: {e}; keeping the pinned key and the last good state"
                );
                self.error_observation(format!("key chain refused: {e}"), now);
                return;
            }
        };
        // The newest key that already signs; the one after it (still in its overlap) next.
        let unix = now.unix();
        let Some(i) = reached
            .iter()
            .rposition(|k| k.active_from <= unix)
            .or_else(|| reached.len().checked_sub(1))
        else {
            tracing::warn!(
                "the Domain's key chain ends at the pinned key, so the refused document is signed by a key the Domain never vouched for; keeping the last good state"
            );
            self.error_observation(
                "a document signed by an unknown key was refused; the key chain ends at the pinned key".to_owned(),
                now,
            );
            return;
        };
        let (key, next) = (&reached[i], reached.get(i + 1));
        if let Err(e) = self.acceptor.adopt(key, next) {
            tracing::error!("cannot pin the key the chain leads to: {e}; keeping the pinned key");
            return;
        }
        tracing::info!(
            old_generation = ?keys.generation,
            new_generation = key.generation,
            next_generation = ?next.map(|k| k.generation),
            "followed the Domain's key chain from the pinned key (generation {}) to generation {}, each link signed by the key before it; pulling the state again",
            generation(keys.generation),
            key.generation
        );
        self.keys_changed();
        self.full_pull = true;
        self.schedule.run_soon(Task::StatePoll, now.at);
    }
}
