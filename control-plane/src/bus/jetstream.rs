//! The JetStream side of the NATS bus ([`super::nats`]): the stream of notices and its
//! config, the publisher task that coalesces the outbox per Domain, the ordered consumer that
//! moves this replica's watch channels to what it hears, and the link state both share with
//! the connection's events.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use futures_util::StreamExt as _;
use tokio::sync::{mpsc, watch};
use uuid::Uuid;

use crate::bus::InProcessBus;
use crate::bus::poll::Link;

/// The JetStream stream of notices.
pub(crate) const STREAM: &str = "PLEXSPHERE_EVENTS";
/// Notices are `<SUBJECT_PREFIX>.<domain id>`.
pub(crate) const SUBJECT_PREFIX: &str = "plexsphere.events";
/// How long the stream keeps notices: the replay window of the sources (24 h).
pub(crate) const REPLAY_WINDOW: Duration = Duration::from_secs(24 * 3600);
/// Notices kept per Domain (only the newest matters to a replica that catches up).
pub(crate) const NOTICES_PER_DOMAIN: i64 = 64;
/// How long the publisher waits for JetStream to acknowledge one batch of notices.
pub(crate) const PUBLISH_ACK_TIMEOUT: Duration = Duration::from_secs(5);
/// Restarting the consumer after a failure: 250 ms doubling up to this.
pub(crate) const CONSUMER_RETRY_MAX_DELAY: Duration = Duration::from_secs(5);

/// The NATS connection as the bus's tasks see it: up or not, and how many times it came up
/// (a consumer from an earlier connection is not trusted to still be served).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Conn {
    up: bool,
    epoch: u64,
}

/// What the bus's tasks share: the connection, whether the consumer runs, and the link the
/// poller reads (up only when both hold).
pub(super) struct Status {
    conn: watch::Sender<Conn>,
    consuming: AtomicBool,
    link: watch::Sender<Link>,
}

impl Status {
    pub(super) fn new() -> (Self, watch::Receiver<Link>) {
        let (link, rx) = watch::channel(Link::Down);
        let status = Self {
            conn: watch::channel(Conn::default()).0,
            consuming: AtomicBool::new(false),
            link,
        };
        (status, rx)
    }

    pub(super) fn connected(&self) -> bool {
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

    pub(super) fn set_connected(&self, up: bool) {
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
pub(super) async fn publish_loop(js: jetstream::Context, mut queue: mpsc::Receiver<(Uuid, u64)>) {
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
pub(super) async fn consume_loop(
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
}
