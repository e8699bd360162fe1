//! What reach's machines log, caught for a test: a subscriber of the calling thread's own
//! (nothing global), so tests running at once never see each other's lines.

use std::sync::{Arc, Mutex, PoisonError};

/// Runs `f` with a subscriber at `level` and answers its result and everything it logged.
pub fn capture<R>(level: tracing::Level, f: impl FnOnce() -> R) -> (R, String) {
    let journal = Journal::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(journal.clone())
        .with_ansi(false)
        .with_max_level(level)
        .finish();
    let out = tracing::subscriber::with_default(subscriber, f);
    let bytes = journal
        .0
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    (out, String::from_utf8_lossy(&bytes).into_owned())
}

#[derive(Clone, Default)]
struct Journal(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Journal {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Journal {
    type Writer = Journal;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}
