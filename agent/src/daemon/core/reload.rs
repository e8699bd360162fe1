//! SIGHUP: the config read again; what can change at run time changes, what cannot is named.
//! What waits for a restart keeps its running value in the core's config, so nothing reads a
//! value the data plane does not use yet (the endpoint report's port, the status's
//! interface), and the next SIGHUP names it again while it is still pending.

use std::path::Path;

use super::{Core, Effect, Now};
use crate::config::{Config, ConfigError};

/// Why a SIGHUP did not bring a new config: the core keeps the running one and says why.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The file could not be read or is not a config plexd can use.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The task reading it did not finish (it panicked or was cancelled): its own words.
    #[error("{0}")]
    Reader(String),
}

impl Core {
    pub(super) fn reload(
        &mut self,
        path: &Path,
        loaded: Result<Box<Config>, ReloadError>,
        log_level_pinned: bool,
        now: Now,
    ) {
        let mut new = match loaded {
            Ok(c) => *c,
            Err(e) => {
                tracing::warn!(
                    "SIGHUP: the config was not reloaded: {e}; keeping the running config"
                );
                return;
            }
        };
        let old = self.config.clone();
        let mut changed = vec![];
        if old.log.level != new.log.level {
            let level = new
                .log
                .level
                .as_ref()
                .map_or("info", |l| l.as_str())
                .to_owned();
            if log_level_pinned {
                tracing::info!(
                    "SIGHUP: log.level changed to {level}, but PLEXD_LOG/--log-level overrides it"
                );
            } else {
                self.emit(Effect::SetLogLevel(level.clone()));
            }
            changed.push(format!("log.level -> {level}"));
        }
        if old.daemon != new.daemon {
            let merged = new.daemon.intervals.apply(self.server_intervals);
            let unit = self.jitter.unit();
            self.schedule.set_intervals(merged, now.at, unit);
            changed.push("daemon (intervals and stall timeout apply now; the backoff and ingest sizes after a restart)".to_owned());
        }
        if old.routes != new.routes {
            self.emit(Effect::Routes(crate::routes::RoutesOp::Config(
                new.routes.clone(),
            )));
            changed.push("routes (reported now)".to_owned());
        }
        if old.api_url != new.api_url {
            // An enrolled node keeps the origin saved in its identity, also across restarts.
            let to = new.api_url.as_ref().map_or("(none)", |u| u.as_str());
            tracing::warn!(
                "SIGHUP: api_url changed to {to}, but this node stays with {} where it registered (saved in {}), also after a restart; a new api_url is used when the node enrols again (plexd leave, then start plexd with a fresh bootstrap token)",
                self.id.api_url,
                self.paths.identity_file().display()
            );
            changed.push("api_url (used when the node enrols again)".to_owned());
        }
        for (key, differs) in [
            ("tls", old.tls != new.tls),
            ("wireguard", old.wireguard != new.wireguard),
            ("state_dir", old.state_dir != new.state_dir),
            ("metrics", old.metrics != new.metrics),
            ("dns", old.dns != new.dns),
        ] {
            if differs {
                tracing::warn!("SIGHUP: {key} changed; it takes effect when plexd restarts");
                changed.push(format!("{key} (after a restart)"));
            }
        }
        new.api_url = old.api_url;
        new.tls = old.tls;
        new.wireguard = old.wireguard;
        new.state_dir = old.state_dir;
        new.metrics = old.metrics;
        new.dns = old.dns;
        self.config = new;
        if changed.is_empty() {
            tracing::info!(config = %path.display(), "SIGHUP: config reloaded; nothing changed");
        } else {
            tracing::info!(config = %path.display(), "SIGHUP: config reloaded: {}", changed.join(", "));
        }
    }
}
