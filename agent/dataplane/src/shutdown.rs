//! The signal that stops the data plane's threads: the runner's and the UAPI server's. Its own
//! module so both use it without importing each other.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

/// A shutdown signal shared by every thread; cloning shares it.
#[derive(Clone, Default)]
pub struct Shutdown(Arc<(Mutex<bool>, Condvar)>);

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn trigger(&self) {
        *self.0.0.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.0.1.notify_all();
    }

    pub(crate) fn is_triggered(&self) -> bool {
        *self.0.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits up to `timeout`; answers whether shutdown was triggered.
    pub(crate) fn wait_timeout(&self, timeout: Duration) -> bool {
        let guard = self.0.0.lock().unwrap_or_else(PoisonError::into_inner);
        let (guard, _) = self
            .0
            .1
            .wait_timeout_while(guard, timeout, |stop| !*stop)
            .unwrap_or_else(PoisonError::into_inner);
        *guard
    }
}
