//! Logging: journald when stderr is the journal (plexd under systemd), a compact stderr
//! format otherwise. Tokens, keys and credentials are never logged.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry, reload};

/// Where log lines go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogTarget {
    Journald,
    Stderr,
}

/// Whether `JOURNAL_STREAM` (`<device>:<inode>`) names the stream stderr is connected to.
pub(crate) fn journal_stream_matches(journal_stream: &str, dev: u64, ino: u64) -> bool {
    let Some((d, i)) = journal_stream.trim().split_once(':') else {
        return false;
    };
    d.parse::<u64>().ok() == Some(dev) && i.parse::<u64>().ok() == Some(ino)
}

fn stderr_is_journal() -> bool {
    let Ok(js) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    match nix::sys::stat::fstat(std::io::stderr()) {
        Ok(st) => journal_stream_matches(&js, st.st_dev, st.st_ino),
        Err(_) => false,
    }
}

/// The handle that changes the level of the installed subscriber (SIGHUP).
static RELOAD: Mutex<Option<reload::Handle<EnvFilter, Registry>>> = Mutex::new(None);

/// Set when `--log-level`/`PLEXD_LOG` chose the level: `log.level` in the config then yields.
static LEVEL_FROM_FLAG: AtomicBool = AtomicBool::new(false);

/// Records that the level came from `--log-level` or `PLEXD_LOG`.
pub(crate) fn pin_level() {
    LEVEL_FROM_FLAG.store(true, Ordering::Relaxed);
}

/// Whether `--log-level` or `PLEXD_LOG` chose the level (a reloaded `log.level` must not win).
pub(crate) fn level_pinned() -> bool {
    LEVEL_FROM_FLAG.load(Ordering::Relaxed)
}

/// `level` as a tracing filter. Directives are ASCII (targets, levels, `=`, `,`, spans in
/// `[...]`): anything else is refused here, because tracing-subscriber 0.3's directive parser
/// panics on some non-ASCII text (it slices inside a character; found by the config fuzz target).
pub fn filter(level: &str) -> Result<EnvFilter, String> {
    if !level.is_ascii() {
        return Err(
            "a log filter is ASCII: error, warn, info, debug, trace or target=level".into(),
        );
    }
    EnvFilter::try_new(level).map_err(|e| e.to_string())
}

/// Changes the log level of the running process (`plexd run` on SIGHUP).
pub(crate) fn set_level(level: &str) -> Result<(), String> {
    let filter = filter(level)?;
    let guard = RELOAD
        .lock()
        .map_err(|_| "the log level lock is poisoned".to_owned())?;
    match guard.as_ref() {
        Some(handle) => handle.reload(filter).map_err(|e| e.to_string()),
        None => Err("logging is not initialised".to_owned()),
    }
}

/// Installs the global subscriber. `level` is a tracing filter (`info`, `plexd=debug`).
/// Returns where the logs go; a journald socket that cannot be opened falls back to stderr.
pub fn init(level: &str) -> LogTarget {
    let filter = || {
        let f = filter(level).unwrap_or_else(|_| EnvFilter::new("info"));
        let (layer, handle) = reload::Layer::new(f);
        if let Ok(mut slot) = RELOAD.lock() {
            *slot = Some(handle);
        }
        layer
    };
    if stderr_is_journal() {
        match tracing_journald::layer() {
            Ok(layer) => {
                let layer = layer
                    .with_field_prefix(None)
                    .with_syslog_identifier("plexd".to_owned());
                if tracing_subscriber::registry()
                    .with(filter())
                    .with(layer)
                    .try_init()
                    .is_ok()
                {
                    return LogTarget::Journald;
                }
            }
            Err(e) => {
                eprintln!("plexd: cannot open the journald socket ({e}); logging to stderr");
            }
        }
    }
    let fmt = tracing_subscriber::fmt::layer()
        .compact()
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = tracing_subscriber::registry()
        .with(filter())
        .with(fmt)
        .try_init();
    LogTarget::Stderr
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_stream_parsing() {
        assert!(journal_stream_matches("8:12345", 8, 12345));
        assert!(!journal_stream_matches("8:12345", 8, 1));
        assert!(!journal_stream_matches("garbage", 8, 12345));
        assert!(!journal_stream_matches("", 0, 0));
    }
}
