//! The event bus between replicas on NATS JetStream (`plexsphere serve --nats-url ...`).
//!
//! A replica's commit is announced twice: at once to this replica's own streams (the local
//! watch channels of [`InProcessBus`], no round trip), and on NATS as the message
//! `plexsphere.events.<domain id>` = `<seq>` into the JetStream stream [`STREAM`]. Every
//! replica runs an ordered consumer of that stream (starting from the newest message per
//! Domain, so a replica that starts or reconnects catches up at once) and moves its local
//! watch channels to what it hears. Streams then read what they have not sent from the
//! `events` table, which stays the source of truth: a lost, late or repeated notice costs a
//! later wake-up, never an event, and the poller ([`super::poll`]) covers any time NATS is away.
//!
//! `notify` never blocks: notices go through a bounded outbox to one publisher task, which
//! coalesces them per Domain; a full outbox drops the notice (the poller brings it).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use futures_util::StreamExt as _;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::bus::poll::Link;
use crate::bus::{EventBus, InProcessBus};

/// The JetStream stream of notices.
pub(crate) const STREAM: &str = "PLEXSPHERE_EVENTS";
/// Notices are `<SUBJECT_PREFIX>.<domain id>`.
pub(crate) const SUBJECT_PREFIX: &str = "plexsphere.events";
/// How long the stream keeps notices: the replay window of the sources (24 h).
pub(crate) const REPLAY_WINDOW: Duration = Duration::from_secs(24 * 3600);
/// Notices kept per Domain (only the newest matters to a replica that catches up).
pub(crate) const NOTICES_PER_DOMAIN: i64 = 64;
/// Notices waiting for the publisher; past it a notice is dropped and the poller brings it.
pub(crate) const OUTBOX_CAPACITY: usize = 4096;
/// How long the publisher waits for JetStream to acknowledge one batch of notices.
pub(crate) const PUBLISH_ACK_TIMEOUT: Duration = Duration::from_secs(5);
/// How long connecting to one server may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Reconnect backoff: 100 ms doubling up to this.
pub(crate) const RECONNECT_MAX_DELAY: Duration = Duration::from_secs(2);
/// Restarting the consumer after a failure: 250 ms doubling up to this.
pub(crate) const CONSUMER_RETRY_MAX_DELAY: Duration = Duration::from_secs(5);

/// The NATS side of `plexsphere serve`.
#[derive(Debug, Clone)]
pub struct NatsConfig {
    /// `nats://host:port`, one or more servers of one cluster.
    pub urls: Vec<String>,
    /// JetStream replicas of [`STREAM`] (1 on a single server, 3 on a three-node cluster).
    pub stream_replicas: usize,
    /// This replica's name on the NATS connection (shows in `nats-server`'s monitoring).
    pub client_name: String,
}

/// The NATS connection as the bus's tasks see it: up or not, and how many times it came up
/// (a consumer from an earlier connection is not trusted to still be served).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Conn {
    up: bool,
    epoch: u64,
}

/// What the bus's tasks share: the connection, whether the consumer runs, and the link the
/// poller reads (up only when both hold).
struct Status {
    conn: watch::Sender<Conn>,
    consuming: AtomicBool,
    link: watch::Sender<Link>,
}

impl Status {
    fn new() -> (Self, watch::Receiver<Link>) {
        let (link, rx) = watch::channel(Link::Down);
        let status = Self {
            conn: watch::channel(Conn::default()).0,
            consuming: AtomicBool::new(false),
            link,
        };
        (status, rx)
    }

    fn connected(&self) -> bool {
        self.conn.borrow().up
    }

    fn refresh_link(&self) {
        let link = if self.connected() && self.consuming.load(Ordering::Relaxed) {
            Link::Up
        } else {
            Link::Down
        };
        self.link
            .send_if_modified(|l| std::mem::replace(l, link) != link);
    }

    fn set_connected(&self, up: bool) {
        self.conn.send_modify(|c| {
            if up && !c.up {
                c.epoch += 1;
            }
            c.up = up;
        });
        self.refresh_link();
    }

    fn set_consuming(&self, consuming: bool) {
        self.consuming.store(consuming, Ordering::Relaxed);
        self.refresh_link();
    }
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

fn subject(domain_id: Uuid) -> String {
    format!("{SUBJECT_PREFIX}.{domain_id}")
}

/// A notice as it arrives: its Domain from the subject, its seq from the payload.
pub(crate) fn parse_notice(subject: &str, payload: &[u8]) -> Option<(Uuid, u64)> {
    let domain = subject
        .strip_prefix(SUBJECT_PREFIX)?
        .strip_prefix('.')?
        .parse()
        .ok()?;
    let seq = std::str::from_utf8(payload).ok()?.trim().parse().ok()?;
    Some((domain, seq))
}

/// Sends the outbox's notices, newest per Domain, and waits for their acknowledgements.
async fn publish_loop(js: jetstream::Context, mut queue: mpsc::Receiver<(Uuid, u64)>) {
    let mut failing = false;
    while let Some((domain, seq)) = queue.recv().await {
        let mut batch = HashMap::from([(domain, seq)]);
        while let Ok((d, s)) = queue.try_recv() {
            let newest = batch.entry(d).or_insert(s);
            *newest = (*newest).max(s);
        }
        let sent = tokio::time::timeout(PUBLISH_ACK_TIMEOUT, publish_batch(&js, &batch)).await;
        match sent {
            Ok(Ok(())) if failing => {
                tracing::info!("bus: publishing notices to NATS again");
                failing = false;
            }
            Ok(Err(e)) if !failing => {
                tracing::warn!(error = %e, "bus: cannot publish notices to NATS; other replicas get them by polling");
                failing = true;
            }
            Err(_) if !failing => {
                tracing::warn!(
                    "bus: NATS did not acknowledge notices within {} s; other replicas get them by polling",
                    PUBLISH_ACK_TIMEOUT.as_secs()
                );
                failing = true;
            }
            _ => {}
        }
    }
}

async fn publish_batch(js: &jetstream::Context, batch: &HashMap<Uuid, u64>) -> Result<(), String> {
    let mut acks = Vec::with_capacity(batch.len());
    for (domain, seq) in batch {
        let ack = js
            .publish(subject(*domain), seq.to_string().into())
            .await
            .map_err(|e| e.to_string())?;
        acks.push(ack.into_future());
    }
    for result in futures_util::future::join_all(acks).await {
        result.map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The stream's configuration; every replica asks for the same, so creating or updating it
/// from whichever replica starts first is idempotent.
fn stream_config(replicas: usize) -> stream::Config {
    stream::Config {
        name: STREAM.to_owned(),
        description: Some("plexsphere: Domain D reached event seq N".to_owned()),
        subjects: vec![format!("{SUBJECT_PREFIX}.>")],
        max_age: REPLAY_WINDOW,
        max_messages_per_subject: NOTICES_PER_DOMAIN,
        storage: stream::StorageType::File,
        num_replicas: replicas,
        discard: stream::DiscardPolicy::Old,
        ..stream::Config::default()
    }
}

/// Runs the consumer, restarting it with backoff whenever it fails (NATS away, a stream
/// without a leader while a cluster node is down, ...).
async fn consume_loop(
    js: jetstream::Context,
    replicas: usize,
    local: Arc<InProcessBus>,
    status: Arc<Status>,
) {
    let mut attempt: u32 = 0;
    let mut conn = status.conn.subscribe();
    loop {
        // Nothing to try before NATS is connected.
        if conn.wait_for(|c| c.up).await.is_err() {
            return;
        }
        let outcome = consume(&js, replicas, &local, &status, conn.clone()).await;
        let was_consuming = status.consuming.load(Ordering::Relaxed);
        status.set_consuming(false);
        if was_consuming {
            attempt = 0;
        }
        match outcome {
            Err(e) if attempt == 0 => {
                tracing::warn!(error = %e, "bus: the NATS consumer stopped; restarting it (polling the database meanwhile)")
            }
            Err(e) => {
                tracing::debug!(error = %e, attempt, "bus: the NATS consumer cannot start yet")
            }
            Ok(()) => tracing::warn!("bus: the NATS consumer ended; restarting it"),
        }
        let delay = Duration::from_millis(250u64.saturating_mul(1 << attempt.min(8)))
            .min(CONSUMER_RETRY_MAX_DELAY);
        attempt = attempt.saturating_add(1);
        // A new connection retries at once.
        conn.borrow_and_update();
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = conn.changed() => {}
        }
    }
}

async fn consume(
    js: &jetstream::Context,
    replicas: usize,
    local: &InProcessBus,
    status: &Status,
    mut conn: watch::Receiver<Conn>,
) -> Result<(), String> {
    let epoch = conn.borrow_and_update().epoch;
    js.create_or_update_stream(stream_config(replicas))
        .await
        .map_err(|e| format!("cannot create or update the JetStream stream {STREAM}: {e}"))?;
    let stream = js
        .get_stream(STREAM)
        .await
        .map_err(|e| format!("cannot open the JetStream stream {STREAM}: {e}"))?;
    let consumer = stream
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject: format!("{SUBJECT_PREFIX}.>"),
            deliver_policy: consumer::DeliverPolicy::LastPerSubject,
            ..consumer::pull::OrderedConfig::default()
        })
        .await
        .map_err(|e| format!("cannot create the consumer on {STREAM}: {e}"))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| format!("cannot read {STREAM}: {e}"))?;
    tracing::info!(
        stream = STREAM,
        "bus: consuming notices from NATS JetStream"
    );
    status.set_consuming(true);
    loop {
        let message = tokio::select! {
            next = messages.next() => match next {
                Some(m) => m.map_err(|e| format!("reading {STREAM}: {e}"))?,
                None => return Ok(()),
            },
            // The connection dropped or was replaced: start over on the new one (and catch up
            // from the newest notice per Domain) instead of waiting for missed heartbeats.
            _ = conn.wait_for(|c| !c.up || c.epoch != epoch) => {
                return Err("the NATS connection was lost".into());
            }
        };
        match parse_notice(message.subject.as_str(), &message.payload) {
            Some((domain, seq)) => {
                local.advance(domain, seq);
            }
            None => {
                tracing::debug!(subject = %message.subject, "bus: ignoring a message that is not a notice")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_parse_from_subject_and_payload_and_junk_is_ignored() {
        let d = Uuid::from_u128(7);
        assert_eq!(parse_notice(&subject(d), b"42"), Some((d, 42)));
        assert_eq!(parse_notice(&subject(d), b"-1"), None);
        assert_eq!(parse_notice(&subject(d), b"\xff"), None);
        assert_eq!(parse_notice("plexsphere.eventsX.1", b"1"), None);
        assert_eq!(parse_notice("plexsphere.events.not-a-uuid", b"1"), None);
    }

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
