//! The event bus between replicas on NATS JetStream (`plexsphere serve --nats-url ...`).
//!
//! A replica's commit is announced twice: at once to this replica's own streams (the local
//! watch channels of [`InProcessBus`], no round trip), and on NATS as the message
//! `plexsphere.events.<domain id>` = `<seq>` into the JetStream stream `STREAM`
//! (`bus::jetstream`). Every replica runs an ordered consumer of that stream (starting from
//! the newest message per Domain, so a replica that starts or reconnects catches up at once)
//! and moves its local watch channels to what it hears. Streams then read what they have not sent from the
//! `events` table, which stays the source of truth: a lost, late or repeated notice costs a
//! later wake-up, never an event, and the poller ([`super::poll`]) covers any time NATS is away.
//!
//! `notify` never blocks: notices go through a bounded outbox to one publisher task, which
//! coalesces them per Domain; a full outbox drops the notice (the poller brings it).
//!
//! This file holds the connection and the bus's face; the stream, the publisher and the
//! consumer are in `bus::jetstream`.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::bus::jetstream::{Status, consume_loop, publish_loop};
use crate::bus::poll::Link;
use crate::bus::{EventBus, InProcessBus};

/// Notices waiting for the publisher; past it a notice is dropped and the poller brings it.
pub(crate) const OUTBOX_CAPACITY: usize = 4096;
/// How long connecting to one server may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Reconnect backoff: 100 ms doubling up to this.
pub(crate) const RECONNECT_MAX_DELAY: Duration = Duration::from_secs(2);

/// The NATS side of `plexsphere serve`.
#[derive(Debug, Clone)]
pub struct NatsConfig {
    /// `nats://host:port`, one or more servers of one cluster.
    pub urls: Vec<String>,
    /// JetStream replicas of the stream of notices (`bus::jetstream::STREAM`): 1 on a single
    /// server, 3 on a three-node cluster.
    pub stream_replicas: usize,
    /// This replica's name on the NATS connection (shows in `nats-server`'s monitoring).
    pub client_name: String,
}

/// The bus over NATS JetStream; see the module docs.
pub struct NatsBus {
    local: Arc<InProcessBus>,
    outbox: mpsc::Sender<(Uuid, u64)>,
    status: Arc<Status>,
    urls: String,
}

/// The bus's background tasks; aborted on drop.
pub struct NatsTasks {
    tasks: Vec<JoinHandle<()>>,
    /// The link's state for the poller.
    pub link: watch::Receiver<Link>,
}

impl Drop for NatsTasks {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// A `--nats-url` that is not one.
#[derive(Debug, thiserror::Error)]
pub enum NatsConfigError {
    #[error("--nats-url needs at least one server, like nats://127.0.0.1:4222")]
    NoUrl,
    #[error("--nats-url {url:?} is not a NATS server address ({reason}); write nats://host:port")]
    BadUrl { url: String, reason: String },
    #[error("--nats-stream-replicas must be 1 to 5 (JetStream's limit), not {0}")]
    Replicas(usize),
}

impl NatsConfig {
    /// Checks the addresses and the replica count before anything connects.
    pub fn check(&self) -> Result<Vec<async_nats::ServerAddr>, NatsConfigError> {
        if self.urls.is_empty() {
            return Err(NatsConfigError::NoUrl);
        }
        if !(1..=5).contains(&self.stream_replicas) {
            return Err(NatsConfigError::Replicas(self.stream_replicas));
        }
        self.urls
            .iter()
            .map(|u| {
                if !u.starts_with("nats://") && !u.starts_with("tls://") {
                    return Err(NatsConfigError::BadUrl {
                        url: u.clone(),
                        reason: "it must start with nats:// or tls://".into(),
                    });
                }
                u.parse::<async_nats::ServerAddr>()
                    .map_err(|e| NatsConfigError::BadUrl {
                        url: u.clone(),
                        reason: e.to_string(),
                    })
            })
            .collect()
    }
}

impl NatsBus {
    /// Connects in the background (an unreachable NATS at start is an outage like any other:
    /// the bus reports it and the poller carries the events) and starts the publisher and the
    /// consumer. `local` is this replica's watch channels, shared with the poller.
    pub async fn start(
        config: &NatsConfig,
        local: Arc<InProcessBus>,
    ) -> Result<(Self, NatsTasks), NatsConfigError> {
        let addrs = config.check()?;
        let (status, link_rx) = Status::new();
        let status = Arc::new(status);
        let urls = config.urls.join(",");
        let on_event = status.clone();
        let at = urls.clone();
        let connecting = async_nats::ConnectOptions::new()
            .name(&config.client_name)
            .retry_on_initial_connect()
            .max_reconnects(None)
            .connection_timeout(CONNECT_TIMEOUT)
            .reconnect_delay_callback(reconnect_delay)
            .event_callback(move |event| {
                let status = on_event.clone();
                let at = at.clone();
                async move { on_nats_event(&status, &at, event) }
            })
            .connect(addrs)
            .await;
        // With retry_on_initial_connect the connection is made in the background; an error
        // here is a bad option, not an unreachable server.
        let client = connecting.map_err(|e| NatsConfigError::BadUrl {
            url: urls.clone(),
            reason: e.to_string(),
        })?;
        let js = jetstream::new(client);
        let (outbox, queue) = mpsc::channel(OUTBOX_CAPACITY);
        let tasks = vec![
            tokio::spawn(publish_loop(js.clone(), queue)),
            tokio::spawn(consume_loop(
                js,
                config.stream_replicas,
                local.clone(),
                status.clone(),
            )),
        ];
        let bus = Self {
            local,
            outbox,
            status,
            urls,
        };
        Ok((
            bus,
            NatsTasks {
                tasks,
                link: link_rx,
            },
        ))
    }
}

impl EventBus for NatsBus {
    fn notify(&self, domain_id: Uuid, seq: u64) {
        self.local.advance(domain_id, seq);
        if let Err(mpsc::error::TrySendError::Full(_)) = self.outbox.try_send((domain_id, seq)) {
            tracing::debug!(domain_id = %domain_id, seq, "bus: the NATS outbox is full; the poller brings this notice to the other replicas");
        }
    }

    fn subscribe(&self, domain_id: Uuid) -> watch::Receiver<u64> {
        self.local.subscribe(domain_id)
    }

    fn check(&self) -> Result<(), String> {
        if self.status.connected() {
            Ok(())
        } else {
            Err(format!(
                "the NATS bus ({}) is not connected; this replica's streams hear of other replicas' events by polling the database every {} s until it is; check that nats-server runs and --nats-url",
                self.urls,
                crate::bus::poll::POLL_WHILE_BUS_DOWN.as_secs()
            ))
        }
    }
}

fn reconnect_delay(attempt: usize) -> Duration {
    let shift = u32::try_from(attempt.min(16)).unwrap_or(16);
    Duration::from_millis(100u64.saturating_mul(1 << shift)).min(RECONNECT_MAX_DELAY)
}

fn on_nats_event(status: &Status, urls: &str, event: async_nats::Event) {
    match event {
        async_nats::Event::Connected => {
            tracing::info!(nats = urls, "bus: connected to NATS");
            status.set_connected(true);
        }
        async_nats::Event::Disconnected => {
            tracing::warn!(
                nats = urls,
                "bus: lost NATS; reconnecting, and polling the database every {} s meanwhile",
                crate::bus::poll::POLL_WHILE_BUS_DOWN.as_secs()
            );
            status.set_connected(false);
        }
        other => tracing::debug!(nats = urls, event = %other, "bus: NATS event"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_urls_and_replica_counts_are_named() {
        let config = |urls: &[&str], replicas| NatsConfig {
            urls: urls.iter().map(|u| (*u).to_owned()).collect(),
            stream_replicas: replicas,
            client_name: "t".into(),
        };
        assert!(
            config(&["nats://127.0.0.1:4222", "nats://b:4223"], 3)
                .check()
                .is_ok()
        );
        let e = config(&[], 1).check().unwrap_err().to_string();
        assert!(e.contains("at least one server"), "{e}");
        let e = config(&["http://x:1"], 1).check().unwrap_err().to_string();
        assert!(e.contains("\"http://x:1\"") && e.contains("nats://"), "{e}");
        let e = config(&["nats://x:1"], 0).check().unwrap_err().to_string();
        assert!(e.contains("--nats-stream-replicas"), "{e}");
    }

    #[test]
    fn reconnects_back_off_to_a_bound() {
        assert_eq!(reconnect_delay(0), Duration::from_millis(100));
        assert_eq!(reconnect_delay(1), Duration::from_millis(200));
        assert_eq!(reconnect_delay(50), RECONNECT_MAX_DELAY);
    }
}
