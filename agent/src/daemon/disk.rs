//! The thread that writes for the daemon: the state cache (only the latest write matters, so
//! the queue holds one and a newer write replaces a waiting one) and the leave's removal of the
//! node's files, in the order asked. After a removal, cache writes are ignored: the node is
//! leaving and a late write must not bring `state.json` back. The loop never waits for it; a
//! finished cache write is answered with `CacheSaved` (READY=1 waits for the first one).

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::{self, JoinHandle};

use tokio::sync::mpsc::Sender;

use super::cache;
use super::core::accept::DomainKeys;
use super::core::io::{self, CacheWrite};
use super::input::Input;
use super::leave;
use crate::paths::StatePaths;

#[derive(Default)]
struct Queue {
    save: Option<CacheWrite>,
    /// The Domain keys to write into the identity file (the latest replaces a waiting one);
    /// written before a cache write taken at the same time.
    keys: Option<DomainKeys>,
    remove: bool,
    removed: bool,
    stop: bool,
}

type Shared = Arc<(Mutex<Queue>, Condvar)>;

pub struct DiskThread {
    shared: Shared,
    thread: Option<JoinHandle<()>>,
}

impl DiskThread {
    pub fn start(paths: StatePaths, answers: Sender<Input>) -> std::io::Result<Self> {
        let shared: Shared = Arc::default();
        let s = shared.clone();
        let thread = thread::Builder::new()
            .name("plexd-disk".into())
            .spawn(move || work(&s, &paths, &answers))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    fn with(&self, f: impl FnOnce(&mut Queue)) {
        let (lock, cv) = &*self.shared;
        f(&mut lock.lock().unwrap_or_else(PoisonError::into_inner));
        cv.notify_one();
    }

    /// Writes the cache (replacing a write still waiting).
    pub fn save(&self, w: CacheWrite) {
        self.with(|q| {
            if !q.remove && !q.removed {
                q.save = Some(w);
            }
        });
    }

    /// Writes the Domain keys into the identity file (replacing a write still waiting).
    pub fn save_keys(&self, keys: DomainKeys) {
        self.with(|q| {
            if !q.remove && !q.removed {
                q.keys = Some(keys);
            }
        });
    }

    /// Removes the node's files; answered with `NodeFilesRemoved`.
    pub fn remove_node_files(&self) {
        self.with(|q| q.remove = true);
    }

    /// Writes what waits, then ends the thread.
    pub fn stop(&mut self) {
        self.with(|q| q.stop = true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for DiskThread {
    fn drop(&mut self) {
        self.stop();
    }
}

fn work(shared: &Shared, paths: &StatePaths, answers: &Sender<Input>) {
    let (lock, cv) = &**shared;
    loop {
        let (keys, save, remove, stop) = {
            let mut q = lock.lock().unwrap_or_else(PoisonError::into_inner);
            while q.save.is_none() && q.keys.is_none() && !q.remove && !q.stop {
                q = cv.wait(q).unwrap_or_else(PoisonError::into_inner);
            }
            let remove = std::mem::take(&mut q.remove);
            if remove {
                q.removed = true;
            }
            (q.keys.take(), q.save.take(), remove, q.stop)
        };
        if let Some(k) = keys {
            save_keys(&paths.identity_file(), k);
        }
        if let Some(w) = save {
            let path: PathBuf = paths.dir.join(cache::STATE_FILE_NAME);
            if let Err(e) = cache::save(&path, &w.envelope, &w.events, w.last_seq) {
                tracing::warn!(
                    "cannot save the state cache: {e}; a restart without the API would start without peers"
                );
            }
            let _ = answers.blocking_send(Input::Core(io::Input::CacheSaved(w.id)));
        }
        if remove {
            let files = leave::remove_files(paths);
            let _ = answers.blocking_send(Input::Core(io::Input::NodeFilesRemoved(files)));
        }
        if stop {
            return;
        }
    }
}

/// The Domain keys into the identity file, under its writers' lock.
fn save_keys(path: &std::path::Path, k: DomainKeys) {
    let r = crate::identity::Identity::update(path, |id| {
        id.domain_signing_public_key = k.pinned.clone();
        id.domain_signing_key_generation = k.generation;
        id.next_signing_key = k.next.clone();
    });
    match r {
        Ok(_) => {
            tracing::debug!(path = %path.display(), generation = ?k.generation, "saved the Domain keys")
        }
        Err(e) => tracing::error!(
            "cannot save the Domain's signing keys in the identity file: {e}; this run uses them, but after a restart the node checks documents against the keys the file still has"
        ),
    }
}
