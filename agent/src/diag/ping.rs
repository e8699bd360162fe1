//! `plexd ping`: which peer is meant (from the daemon's status), the ICMP echo packets, and
//! the summary. Pure; `icmp.rs` carries the packets.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use serde::Serialize;
use uuid::Uuid;

use crate::daemon::status::{PeerPath, PeerStatus};
pub use crate::echo::{PAYLOAD_LEN, Reply, checksum, echo_reply_seq, echo_request};

/// The shortest node id prefix `plexd ping` accepts (shorter ones match too many nodes).
pub(crate) const MIN_ID_PREFIX: usize = 4;

/// How many peer names an "unknown peer" message lists.
const LISTED_PEERS: usize = 10;

/// Finds the peer `query` names: its mesh IP, its node id, its name (hostname or resource
/// handle, case-insensitive), or a unique node id prefix of at least [`MIN_ID_PREFIX`].
pub fn resolve<'a>(peers: &'a [PeerStatus], query: &str) -> Result<&'a PeerStatus, String> {
    let q = query.trim();
    if let Ok(ip) = q.parse::<IpAddr>() {
        return peers
            .iter()
            .find(|p| p.mesh_ip == ip)
            .ok_or_else(|| format!("no peer has mesh IP {ip}; known peers: {}", names(peers)));
    }
    if let Ok(id) = q.parse::<Uuid>() {
        return peers
            .iter()
            .find(|p| p.node_id == id)
            .ok_or_else(|| format!("no peer is node {id}; known peers: {}", names(peers)));
    }
    let by_name: Vec<&PeerStatus> = peers
        .iter()
        .filter(|p| p.hostname.eq_ignore_ascii_case(q))
        .collect();
    match by_name.as_slice() {
        [one] => return Ok(one),
        [] => {}
        many => {
            let ids: Vec<String> = many.iter().map(|p| p.node_id.to_string()).collect();
            return Err(format!(
                "{} peers are named {q}: {}; ping one by its node id or mesh IP",
                many.len(),
                ids.join(", ")
            ));
        }
    }
    let lower = q.to_ascii_lowercase();
    let by_prefix: Vec<&PeerStatus> = if lower.len() >= MIN_ID_PREFIX {
        peers
            .iter()
            .filter(|p| p.node_id.to_string().starts_with(&lower))
            .collect()
    } else {
        Vec::new()
    };
    match by_prefix.as_slice() {
        [one] => Ok(one),
        [] => Err(format!(
            "no peer is named {q} (nor has a node id starting with it); known peers: {}",
            names(peers)
        )),
        many => Err(format!(
            "{} peers have a node id starting with {q}; give more of it",
            many.len()
        )),
    }
}

fn names(peers: &[PeerStatus]) -> String {
    if peers.is_empty() {
        return "none (the daemon has no peers yet)".to_owned();
    }
    let mut list: Vec<String> = peers
        .iter()
        .take(LISTED_PEERS)
        .map(|p| format!("{} ({})", p.hostname, p.mesh_ip))
        .collect();
    if peers.len() > LISTED_PEERS {
        list.push(format!("and {} more", peers.len() - LISTED_PEERS));
    }
    list.join(", ")
}

/// What `plexd ping` found (`--output json` prints it).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct PingReport {
    pub node_id: Uuid,
    pub name: String,
    pub mesh_ip: IpAddr,
    /// The path the daemon uses for the peer.
    pub path: PeerPath,
    pub endpoint: Option<SocketAddr>,
    pub last_handshake_age_secs: Option<u64>,
    /// `ping socket` (unprivileged) or `raw socket`.
    pub socket: String,
    pub replies: Vec<Reply>,
    pub sent: usize,
    pub received: usize,
    pub loss_percent: f64,
    pub rtt_min_ms: Option<f64>,
    pub rtt_avg_ms: Option<f64>,
    pub rtt_max_ms: Option<f64>,
}

impl PingReport {
    pub fn new(peer: &PeerStatus, socket: &str, replies: Vec<Reply>) -> Self {
        let rtts: Vec<f64> = replies.iter().filter_map(|r| r.rtt_ms).collect();
        let sent = replies.len();
        let received = rtts.len();
        let loss_percent = if sent == 0 {
            0.0
        } else {
            round3(100.0 * (sent - received) as f64 / sent as f64)
        };
        let (min, max, avg) = if rtts.is_empty() {
            (None, None, None)
        } else {
            let min = rtts.iter().copied().fold(f64::INFINITY, f64::min);
            let max = rtts.iter().copied().fold(0.0, f64::max);
            let avg = rtts.iter().sum::<f64>() / rtts.len() as f64;
            (Some(round3(min)), Some(round3(max)), Some(round3(avg)))
        };
        Self {
            node_id: peer.node_id,
            name: peer.hostname.clone(),
            mesh_ip: peer.mesh_ip,
            path: peer.path.clone(),
            endpoint: peer.endpoint,
            last_handshake_age_secs: peer.last_handshake_age_secs,
            socket: socket.to_owned(),
            replies,
            sent,
            received,
            loss_percent,
            rtt_min_ms: min,
            rtt_avg_ms: avg,
            rtt_max_ms: max,
        }
    }

    /// The lines for people.
    pub fn render(&self) -> String {
        let mut out = self.header();
        for r in &self.replies {
            match r.rtt_ms {
                Some(ms) => {
                    let _ = writeln!(
                        out,
                        "reply from {}: seq={} time={ms:.3} ms",
                        self.mesh_ip, r.seq
                    );
                }
                None => {
                    let _ = writeln!(
                        out,
                        "no reply from {}: seq={} (timed out)",
                        self.mesh_ip, r.seq
                    );
                }
            }
        }
        let _ = writeln!(
            out,
            "--- {} ping: {} sent, {} received, {}% loss",
            self.name, self.sent, self.received, self.loss_percent
        );
        if let (Some(min), Some(avg), Some(max)) =
            (self.rtt_min_ms, self.rtt_avg_ms, self.rtt_max_ms)
        {
            let _ = writeln!(out, "rtt min/avg/max = {min:.3}/{avg:.3}/{max:.3} ms");
        }
        out
    }

    /// The peer and its path, before the replies.
    pub fn header(&self) -> String {
        let endpoint = self
            .endpoint
            .map_or_else(|| "none".to_owned(), |e| e.to_string());
        let handshake = self
            .last_handshake_age_secs
            .map_or_else(|| "never".to_owned(), |s| format!("{s} s ago"));
        format!(
            "PING {} ({}) node {}\npath {}, endpoint {endpoint}, last handshake {handshake}, {} bytes of ICMP data over the mesh ({})\n",
            self.name, self.mesh_ip, self.node_id, self.path, PAYLOAD_LEN, self.socket
        )
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(id: &str, name: &str, ip: &str) -> PeerStatus {
        PeerStatus {
            node_id: Uuid::parse_str(id).unwrap(),
            hostname: name.into(),
            public_key: String::new(),
            mesh_ip: ip.parse().unwrap(),
            endpoint: Some("192.0.2.3:51820".parse().unwrap()),
            path: PeerPath::Direct {
                endpoint: "192.0.2.3:51820".parse().unwrap(),
            },
            rtt_ms: None,
            last_handshake_age_secs: Some(3),
            last_handshake_secs_ago: Some(3),
            reason: String::new(),
            rx_bytes: 0,
            tx_bytes: 0,
        }
    }

    fn peers() -> Vec<PeerStatus> {
        vec![
            peer("019a0816-0000-7000-8000-000000000003", "web-3", "10.64.1.3"),
            peer("019a0817-0000-7000-8000-000000000004", "db-1", "10.64.1.4"),
            peer("019a0817-0000-7000-8000-000000000005", "twin", "10.64.1.5"),
            peer("019a0818-0000-7000-8000-000000000006", "twin", "10.64.1.6"),
        ]
    }

    #[test]
    fn a_peer_is_found_by_ip_id_name_or_unique_prefix() {
        let ps = peers();
        assert_eq!(resolve(&ps, "10.64.1.4").unwrap().hostname, "db-1");
        assert_eq!(
            resolve(&ps, "019a0816-0000-7000-8000-000000000003")
                .unwrap()
                .hostname,
            "web-3"
        );
        assert_eq!(
            resolve(&ps, "WEB-3").unwrap().mesh_ip.to_string(),
            "10.64.1.3"
        );
        assert_eq!(resolve(&ps, "019a0816").unwrap().hostname, "web-3");
        let e = resolve(&ps, "019a0817").unwrap_err();
        assert!(
            e.contains("2 peers have a node id starting with 019a0817"),
            "{e}"
        );
        let e = resolve(&ps, "twin").unwrap_err();
        assert!(
            e.contains("2 peers are named twin") && e.contains("000000000006"),
            "{e}"
        );
        let e = resolve(&ps, "10.64.9.9").unwrap_err();
        assert!(
            e.contains("no peer has mesh IP 10.64.9.9") && e.contains("db-1 (10.64.1.4)"),
            "{e}"
        );
        // Too short to be a prefix.
        assert!(resolve(&ps, "019").is_err());
        assert!(resolve(&[], "x").unwrap_err().contains("no peers yet"));
    }

    #[test]
    fn echo_packets_round_trip_and_strangers_are_ignored() {
        let token = [1, 2, 3, 4, 5, 6, 7, 8];
        let req = echo_request(false, 0x1234, 7, token);
        assert_eq!(req.len(), 8 + PAYLOAD_LEN);
        assert_eq!(&req[..2], &[8, 0]);
        // A correct checksum sums (with itself) to zero.
        assert_eq!(checksum(&req), 0);
        // The peer's reply: type 0, same id, seq and payload.
        let mut reply = req.clone();
        reply[0] = 0;
        assert_eq!(echo_reply_seq(&reply, false, false, token), Some(7));
        // Behind a 20-byte IPv4 header (a raw socket's view).
        let mut raw = vec![0x45u8];
        raw.extend([0u8; 19]);
        raw.extend(&reply);
        assert_eq!(echo_reply_seq(&raw, false, true, token), Some(7));
        // Our own request, another run's token, a truncated packet: not a reply.
        assert_eq!(echo_reply_seq(&req, false, false, token), None);
        assert_eq!(echo_reply_seq(&reply, false, false, [9; 8]), None);
        assert_eq!(echo_reply_seq(&reply[..12], false, false, token), None);
        let v6 = echo_request(true, 1, 2, token);
        assert_eq!(v6[0], 128);
        let mut v6_reply = v6.clone();
        v6_reply[0] = 129;
        assert_eq!(echo_reply_seq(&v6_reply, true, false, token), Some(2));
        assert_eq!(checksum(&[0x00, 0x01, 0xf2]), !0xf201);
    }

    #[test]
    fn the_summary_counts_loss_and_rtts() {
        let p = peer("019a0816-0000-7000-8000-000000000003", "web-3", "10.64.1.3");
        let r = PingReport::new(
            &p,
            "ping socket",
            vec![
                Reply {
                    seq: 1,
                    rtt_ms: Some(1.5),
                },
                Reply {
                    seq: 2,
                    rtt_ms: None,
                },
                Reply {
                    seq: 3,
                    rtt_ms: Some(0.5),
                },
            ],
        );
        assert_eq!((r.sent, r.received), (3, 2));
        assert_eq!(r.loss_percent, 33.333);
        assert_eq!(
            (r.rtt_min_ms, r.rtt_avg_ms, r.rtt_max_ms),
            (Some(0.5), Some(1.0), Some(1.5))
        );
        let text = r.render();
        assert!(text.starts_with("PING web-3 (10.64.1.3) node 019a0816-0000-7000-8000-000000000003\npath direct 192.0.2.3:51820, endpoint 192.0.2.3:51820"), "{text}");
        assert!(
            text.contains("no reply from 10.64.1.3: seq=2 (timed out)"),
            "{text}"
        );
        assert!(
            text.ends_with("rtt min/avg/max = 0.500/1.000/1.500 ms\n"),
            "{text}"
        );
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["path"]["kind"], "direct");
        assert_eq!(v["replies"][1]["rtt_ms"], serde_json::Value::Null);
        let none = PingReport::new(
            &p,
            "raw socket",
            vec![Reply {
                seq: 1,
                rtt_ms: None,
            }],
        );
        assert_eq!(none.loss_percent, 100.0);
        assert!(!none.render().contains("rtt min"));
    }
}
