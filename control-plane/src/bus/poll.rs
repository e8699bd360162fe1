//! The poller: the bus's safety net. Every so often it reads each Domain's newest seq from
//! the database (the source of truth) and moves this replica's watch channels there, so a
//! notice the bus lost, or never carried because NATS was unreachable, only comes late.
//!
//! How often depends on the link ([`poll_interval`]): fast while there is no bus between
//! replicas or it is down, slow while it is up. A change of the link polls at once, so a
//! replica whose bus comes back catches up without waiting a period.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::bus::InProcessBus;
use crate::store::{Store, events};

/// Between polls while NATS carries the notices: the slow safety net for a lost notice.
pub(crate) const POLL_WHILE_BUS_UP: Duration = Duration::from_secs(10);
/// Between polls while the configured NATS is unreachable (or its JetStream consumer is not
/// running): streams of other replicas' events wake at most this late.
pub(crate) const POLL_WHILE_BUS_DOWN: Duration = Duration::from_secs(1);
/// Between polls on a shared Postgres without `--nats-url`: the only way other replicas'
/// events reach this replica's streams.
pub(crate) const POLL_WITHOUT_BUS: Duration = Duration::from_secs(1);

/// What carries notices between replicas, as the poller sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// No bus is configured: polling is the only path between replicas.
    None,
    /// NATS delivers notices.
    Up,
    /// NATS is configured but not delivering (disconnected, or no consumer yet).
    Down,
}

/// How long to wait before the next poll over `link`.
pub(crate) fn poll_interval(link: Link) -> Duration {
    match link {
        Link::None => POLL_WITHOUT_BUS,
        Link::Up => POLL_WHILE_BUS_UP,
        Link::Down => POLL_WHILE_BUS_DOWN,
    }
}

/// Starts the poller over `store`, feeding `local`; `link` tells it how often (a receiver of
/// a constant `Link::None` when there is no bus).
pub fn spawn(
    store: Store,
    local: Arc<InProcessBus>,
    link: watch::Receiver<Link>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(store, local, link))
}

async fn run(store: Store, local: Arc<InProcessBus>, link: watch::Receiver<Link>) {
    let mut failing = false;
    // `None` once the bus is gone (shutdown): the safety net keeps its fast pace.
    let mut link = Some(link);
    loop {
        let now = link.as_mut().map_or(Link::Down, |l| *l.borrow_and_update());
        match poll_once(&store, &local).await {
            Ok(woken) => {
                if failing {
                    tracing::info!("bus poller: the database answers again");
                    failing = false;
                }
                if woken > 0 && now == Link::Up {
                    // The bus should have brought these: a lost notice, now delivered.
                    tracing::debug!(domains = woken, "bus poller: woke streams the bus had not");
                }
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "bus poller: cannot read the Domains' event heads; retrying every {} s", POLL_WHILE_BUS_DOWN.as_secs());
                    failing = true;
                }
            }
        }
        let wait = if failing {
            POLL_WHILE_BUS_DOWN
        } else {
            poll_interval(now)
        };
        match link.as_mut() {
            Some(l) => tokio::select! {
                () = tokio::time::sleep(wait) => {}
                changed = l.changed() => {
                    if changed.is_err() {
                        link = None;
                    }
                }
            },
            None => tokio::time::sleep(wait).await,
        }
    }
}

/// One poll: moves every Domain's watch to its stored head; answers how many moved.
pub async fn poll_once(
    store: &Store,
    local: &InProcessBus,
) -> Result<usize, crate::store::StoreError> {
    let mut conn = store.acquire().await?;
    let heads = events::heads(&mut conn).await?;
    drop(conn);
    Ok(heads
        .into_iter()
        .filter(|(domain, seq)| local.advance(*domain, *seq))
        .count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_poll_is_fast_without_a_working_bus_and_slow_with_one() {
        assert_eq!(poll_interval(Link::None), POLL_WITHOUT_BUS);
        assert_eq!(poll_interval(Link::Down), POLL_WHILE_BUS_DOWN);
        assert_eq!(poll_interval(Link::Up), POLL_WHILE_BUS_UP);
        assert!(POLL_WHILE_BUS_DOWN < POLL_WHILE_BUS_UP);
    }
}
