//! When the node tells systemd READY=1: once the mesh has applied the first signed state and,
//! when that state came from the API, once it is in the cache (a node that says it is ready
//! restarts into the same peers without the API). The cache writes are counted here because
//! READY=1 waits on one of them.

/// READY=1 and what it still waits for; the core asks it and does what it answers.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    ready: bool,
    /// READY=1 waits for the mesh to answer the apply of the first state...
    after_apply: bool,
    /// ...and for that state's cache write (its id), when it came from the API.
    after_save: Option<u64>,
    /// The id of the last cache write asked for, and of the last the disk thread finished.
    last_save: u64,
    saved: u64,
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// A state was installed: before READY=1, wait for the mesh to apply it.
    pub fn state_installed(&mut self) {
        if !self.ready {
            self.after_apply = true;
        }
    }

    /// A cache write is asked for: its id.
    pub fn next_save(&mut self) -> u64 {
        self.last_save += 1;
        self.last_save
    }

    /// The installed state came from the API and its cache write was asked for: before
    /// READY=1, wait for that write too.
    pub fn wait_for_last_save(&mut self) {
        if !self.ready {
            self.after_save = Some(self.last_save);
        }
    }

    /// The mesh answered an apply: whether READY=1 was waiting for one (it waits no more).
    pub fn apply_answered(&mut self) -> bool {
        std::mem::take(&mut self.after_apply)
    }

    /// The disk finished cache write `id`: whether READY=1 stopped waiting for a write now.
    pub fn saved(&mut self, id: u64) -> bool {
        self.saved = self.saved.max(id);
        if self.after_save.is_some_and(|want| self.saved >= want) {
            self.after_save = None;
            true
        } else {
            false
        }
    }

    /// Nothing is left to wait for.
    pub fn settled(&self) -> bool {
        !self.after_apply && self.after_save.is_none()
    }

    /// Marks the node ready: `false` when it already was (READY=1 is sent once).
    pub fn become_ready(&mut self) -> bool {
        !std::mem::replace(&mut self.ready, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_waits_for_the_apply_and_the_api_states_cache_write() {
        let mut r = Readiness::default();
        r.state_installed();
        let first = r.next_save();
        r.wait_for_last_save();
        assert!(!r.settled());
        assert!(r.apply_answered());
        assert!(!r.apply_answered(), "one apply answers the wait once");
        assert!(!r.settled(), "the cache write is still outstanding");
        let second = r.next_save();
        assert!(!r.saved(first - 1), "an older write does not count");
        assert!(r.saved(second), "a later write covers the one waited for");
        assert!(r.settled());
        assert!(r.become_ready());
        assert!(!r.become_ready(), "READY=1 once");
        // Once ready, nothing waits again.
        r.state_installed();
        r.next_save();
        r.wait_for_last_save();
        assert!(r.settled() && r.is_ready());
    }
}
