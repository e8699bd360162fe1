//! What the end-to-end tests wait on and check: a condition within a bound, a file's mode.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// The mode bits of a file (permissions only).
pub fn mode(path: &Path) -> Result<u32> {
    use std::os::unix::fs::PermissionsExt;
    Ok(std::fs::metadata(path)
        .with_context(|| format!("stat {}", path.display()))?
        .permissions()
        .mode()
        & 0o7777)
}

/// Polls `check` every 100 ms until it yields a value, for at most `bound`; the error names
/// `what` and the last reason `check` gave.
pub fn wait_until<T>(
    bound: Duration,
    what: &str,
    mut check: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let deadline = Instant::now() + bound;
    loop {
        let last = match check() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => "not yet".to_owned(),
            Err(e) => format!("{e:#}"),
        };
        if Instant::now() > deadline {
            bail!("{what}: not within {bound:?} (last: {last})");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
