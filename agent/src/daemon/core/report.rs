//! What the core builds from the live peers: the heartbeat, the observations for ingest (a
//! handshake or traffic the interface did not show before), and the `plexd status` report.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use plexsphere_wire::node::{Heartbeat, Observation, ObservationKind, PeerSummary};

use super::protocol::Answer;
use super::schedule::Task;
use super::status::{
    ApiStatus, DomainKeyStatus, IngestStatus, PeerStatus, StatusReport, UdpOffloadStatus,
};
use super::wanted;
use super::{Call, Core, Effect, LiveFor, Now};
use crate::mesh::LivePeer;

/// A handshake counts as "connected" this long.
pub const CONNECTED_WINDOW: Duration = Duration::from_secs(180);

fn age_of(t: Option<SystemTime>, wall: SystemTime) -> Option<Duration> {
    t.and_then(|t| wall.duration_since(t).ok())
}

impl Core {
    pub(super) fn on_live(&mut self, why: LiveFor, live: &[LivePeer], now: Now) {
        match why {
            LiveFor::Heartbeat => {
                let hb = self.heartbeat(live, now);
                self.rotations.heartbeat_sent = Some(now.at);
                self.emit(Effect::Call(Call::Heartbeat(hb)));
            }
            LiveFor::Observe => {
                self.observe(live, now);
                let id = uuid::Builder::from_random_bytes(self.random_bytes()).into_uuid();
                match self.ingest.take_batch(id) {
                    Some(batch) => self.emit(Effect::Call(Call::Ingest(batch))),
                    None => {
                        let unit = self.jitter.unit();
                        self.schedule.done(Task::IngestFlush, now.at, unit);
                    }
                }
            }
            LiveFor::Status(id) => {
                let report = self.report(live, now);
                self.emit(Effect::Answer {
                    id,
                    answer: Answer::Status(Box::new(report)),
                });
            }
            LiveFor::Probe => {}
        }
    }

    fn random_bytes(&mut self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.jitter.next_u64().to_le_bytes());
        b[8..].copy_from_slice(&self.jitter.next_u64().to_le_bytes());
        b
    }

    fn heartbeat(&self, live: &[LivePeer], now: Now) -> Heartbeat {
        let connected = live
            .iter()
            .filter(|p| age_of(p.last_handshake, now.wall).is_some_and(|e| e < CONNECTED_WINDOW))
            .count();
        Heartbeat {
            uptime_secs: now.at.duration_since(self.started).as_secs(),
            plexd_version: env!("CARGO_PKG_VERSION").to_owned(),
            state_version: self.state_version,
            peers: PeerSummary {
                configured: u32::try_from(live.len()).unwrap_or(u32::MAX),
                connected: u32::try_from(connected).unwrap_or(u32::MAX),
            },
        }
    }

    /// Turns changes on the interface (handshakes, bytes) into observations.
    fn observe(&mut self, live: &[LivePeer], now: Now) {
        let by_key: HashMap<&str, uuid::Uuid> = self
            .wanted
            .iter()
            .map(|p| (p.public_key.as_str(), p.node_id))
            .collect();
        let mut obs = vec![];
        for p in live {
            let Some(peer) = by_key.get(p.public_key.as_str()).copied() else {
                continue;
            };
            let prev = self.seen.insert(
                p.public_key.clone(),
                (p.last_handshake, p.rx_bytes, p.tx_bytes),
            );
            if p.last_handshake.is_some() && prev.map(|x| x.0) != Some(p.last_handshake) {
                obs.push(ObservationKind::Handshake {
                    peer_node_id: peer,
                    endpoint: p.endpoint,
                });
            }
            if prev.map(|x| (x.1, x.2)) != Some((p.rx_bytes, p.tx_bytes))
                && (p.rx_bytes, p.tx_bytes) != (0, 0)
            {
                obs.push(ObservationKind::Traffic {
                    peer_node_id: peer,
                    rx_bytes: p.rx_bytes,
                    tx_bytes: p.tx_bytes,
                });
            }
        }
        let at = now.unix();
        for kind in obs {
            self.ingest.push(Observation { at, kind });
        }
    }

    pub(super) fn report(&self, live: &[LivePeer], now: Now) -> StatusReport {
        let age = |t: Option<std::time::Instant>| {
            t.map(|t| now.at.saturating_duration_since(t).as_secs())
        };
        let peers = self
            .wanted
            .iter()
            .map(|p| {
                let l = live.iter().find(|l| l.public_key == p.public_key);
                let (path, rtt_ms, reason) =
                    super::reach::peer_path(&p.public_key, l, self.reach.paths());
                let handshake =
                    age_of(l.and_then(|l| l.last_handshake), now.wall).map(|d| d.as_secs());
                PeerStatus {
                    public_key: p.public_key.clone(),
                    path,
                    rtt_ms,
                    last_handshake_secs_ago: handshake,
                    reason,
                    node_id: p.node_id,
                    endpoint: l
                        .and_then(|l| l.endpoint)
                        .or_else(|| wanted::first_endpoint(p)),
                    last_handshake_age_secs: handshake,
                    rx_bytes: l.map_or(0, |l| l.rx_bytes),
                    tx_bytes: l.map_or(0, |l| l.tx_bytes),
                    hostname: p.hostname.clone(),
                    mesh_ip: p.mesh_ip,
                }
            })
            .collect();
        StatusReport {
            node_id: self.id.node_id,
            mesh_ip: self.id.mesh_ip,
            mesh_cidr: self.id.mesh_cidr.to_string(),
            domain_id: self.id.domain_id,
            project_id: self.id.project_id,
            plexd_version: env!("CARGO_PKG_VERSION").to_owned(),
            uptime_secs: now.at.duration_since(self.started).as_secs(),
            api: ApiStatus {
                url: self.id.api_url.clone(),
                reachable: self.api.reachable(),
                last_success_age_secs: age(self.api.last_ok()),
                last_error: self.api.last_error().map(|(_, e)| e.clone()),
                last_error_age_secs: age(self.api.last_error().map(|(t, _)| *t)),
            },
            last_heartbeat_age_secs: age(self.last_heartbeat),
            last_event_age_secs: age(self.last_event),
            event_stream_connected: self.stream.is_connected(),
            event_stream_disconnects: self.stream.disconnects(),
            last_event_id: self.last_seq,
            state_version: self.state_version,
            backend: self.backend.to_owned(),
            interface: self.config.wireguard.interface.clone(),
            ingest: IngestStatus {
                waiting: self.ingest.waiting(),
                dropped_unreported: self.ingest.dropped(),
            },
            peers,
            udp_offload: UdpOffloadStatus {
                setting: self
                    .udp_offload
                    .map_or("default", plexsphere_wire::node::UdpOffload::as_str)
                    .to_owned(),
                ..UdpOffloadStatus::default()
            },
            domain_key: DomainKeyStatus {
                public_key: self.acceptor.keys().pinned.clone(),
                generation: self.acceptor.keys().generation,
                next: self.acceptor.keys().next.clone(),
            },
            gso_probe: None,
            dns: None,
            policy: Some(self.policy_status()),
            routes: None,
        }
    }

    pub(super) fn become_ready(&mut self) {
        if !self.readiness.become_ready() {
            return;
        }
        self.status_line = self.current_status_line();
        tracing::info!(peers = self.wanted.len(), state_version = ?self.state_version, "ready: {} peers, state version {}", self.wanted.len(), self.state_version.map_or_else(|| "none".to_owned(), |v| v.to_string()));
        let line = self.status_line.clone();
        self.emit(Effect::Notify(vec![
            ("READY", "1".to_owned()),
            ("STATUS", line),
        ]));
    }

    fn current_status_line(&self) -> String {
        super::status::status_line(
            &self.id.node_id.to_string(),
            &self.id.mesh_ip.to_string(),
            self.wanted.len(),
            self.stream.is_connected(),
        )
    }

    pub(super) fn update_status(&mut self) {
        let line = self.current_status_line();
        if self.readiness.is_ready() && line != self.status_line {
            self.emit(Effect::Notify(vec![("STATUS", line.clone())]));
        }
        self.status_line = line;
    }
}
