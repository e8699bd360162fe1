//! The path report's shell: one task that samples the reach runtime's paths every
//! [`SAMPLE_EVERY`] (the runtime keeps them in a view it refreshes after each step; reading
//! it is a copy under a lock), hands them to the [`PathReporter`] and sends what it decides,
//! one call at a time. Nothing here decides anything.

use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use plexsphere_wire::paths::{PathKind, PathTransport, PeerPath};
use tokio::sync::mpsc;

use super::decide::{Answer, PathReporter};
use crate::node_api::{CallError, NodeApi};
use crate::reach::io::{Path, PeerPathView, ReachHandle, Transport};

/// How often the reach runtime's paths are read.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// The running task; dropping the handle stops it.
pub struct PathsHandle {
    task: tokio::task::JoinHandle<()>,
}

impl PathsHandle {
    pub fn start(api: NodeApi, reach: Arc<dyn ReachHandle>) -> Self {
        Self {
            task: tokio::spawn(run(api, reach)),
        }
    }

    pub fn stop(self) {
        self.task.abort();
    }
}

impl Drop for PathsHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One peer of the runtime's view as the report carries it.
pub(crate) fn peer_path(v: &PeerPathView) -> PeerPath {
    PeerPath {
        peer_node_id: v.node_id,
        path: match &v.path {
            Path::None => PathKind::None,
            Path::Direct { endpoint } => PathKind::Direct {
                endpoint: *endpoint,
            },
            Path::Relay { relay, transport } => PathKind::Relay {
                relay: relay.clone(),
                transport: match transport {
                    Transport::Udp => PathTransport::Udp,
                    Transport::Tcp => PathTransport::Tcp,
                },
            },
        },
        // Whole milliseconds are what the engine keeps.
        #[allow(clippy::cast_precision_loss)]
        rtt_ms: v.rtt_ms.map(|ms| ms as f64),
        last_handshake_at: v
            .last_handshake
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .and_then(|d| i64::try_from(d.as_secs()).ok())
            .filter(|s| *s > 0),
    }
}

fn answer(r: Result<plexsphere_wire::paths::PathsAck, CallError>) -> Answer {
    match r {
        Ok(_) => Answer::Stored,
        Err(CallError::Refused { status: 404, .. }) => Answer::NotSupported,
        Err(CallError::Refused {
            status: 429,
            retry_after,
            ..
        }) => Answer::TooSoon(retry_after.unwrap_or(super::decide::MIN_GAP)),
        Err(e) => Answer::Failed(e.to_string()),
    }
}

async fn run(api: NodeApi, reach: Arc<dyn ReachHandle>) {
    let mut r = PathReporter::default();
    let (tx, mut rx) = mpsc::channel::<Answer>(1);
    let mut sample = tokio::time::interval(SAMPLE_EVERY);
    sample.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if let Some(report) = r.poll_report(Instant::now()) {
            let (api, tx) = (api.clone(), tx.clone());
            tokio::spawn(async move {
                let _ = tx.send(answer(api.paths(&report).await)).await;
            });
        }
        if r.stopped {
            return;
        }
        let wake = r.poll_timeout().map_or(
            tokio::time::Instant::now() + Duration::from_secs(3600),
            tokio::time::Instant::from_std,
        );
        tokio::select! {
            _ = sample.tick() => {
                let peers = reach.paths().iter().map(peer_path).collect();
                r.handle_sample(peers, Instant::now());
            }
            Some(a) = rx.recv() => r.handle_answer(a, Instant::now()),
            () = tokio::time::sleep_until(wake) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtimes_view_maps_onto_the_report() {
        let id = uuid::Uuid::from_u128(7);
        let v = PeerPathView {
            public_key: String::new(),
            hostname: "b".into(),
            path: Path::Relay {
                relay: "r1".into(),
                transport: Transport::Tcp,
            },
            rtt_ms: Some(12),
            reason: String::new(),
            node_id: id,
            last_handshake: Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
        };
        let p = peer_path(&v);
        assert_eq!(p.peer_node_id, id);
        assert_eq!(
            p.path,
            PathKind::Relay {
                relay: "r1".into(),
                transport: PathTransport::Tcp
            }
        );
        assert_eq!(
            (p.rtt_ms, p.last_handshake_at),
            (Some(12.0), Some(1_700_000_000))
        );
        let none = PeerPathView {
            path: Path::None,
            rtt_ms: None,
            last_handshake: Some(UNIX_EPOCH),
            ..v
        };
        let p = peer_path(&none);
        assert_eq!(
            (p.path, p.rtt_ms, p.last_handshake_at),
            (PathKind::None, None, None)
        );
    }

    #[test]
    fn answers_map_onto_the_reporters() {
        let refused = |status| CallError::Refused {
            status,
            error: plexsphere_wire::ApiError::new("x", "y"),
            retry_after: Some(Duration::from_secs(3)),
        };
        assert_eq!(answer(Err(refused(404))), Answer::NotSupported);
        assert_eq!(
            answer(Err(refused(429))),
            Answer::TooSoon(Duration::from_secs(3))
        );
        assert!(matches!(answer(Err(refused(500))), Answer::Failed(_)));
    }
}
