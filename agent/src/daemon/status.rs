//! What `plexd status` shows people: the table rendered from the report the core builds
//! (`core/status.rs` holds the report's types).

use std::fmt::Write as _;

pub use super::core::status::{
    ApiStatus, DomainKeyStatus, GsoProbePeer, GsoProbeStatus, IngestStatus, PathTransport,
    PeerPath, PeerStatus, StatusReport, UdpOffloadStatus,
};

/// `generation 2 (AbCdEfGh…), next generation 3 from unix time 1700000000`; `None` for an
/// older daemon's answer without the keys.
fn domain_key_line(k: &DomainKeyStatus) -> Option<String> {
    if k.public_key.is_empty() {
        return None;
    }
    let short: String = k.public_key.chars().take(8).collect();
    let generation = k.generation.map_or_else(
        || "pinned at registration".to_owned(),
        |g| format!("generation {g}"),
    );
    let next = k.next.as_ref().map_or_else(String::new, |n| {
        format!(
            ", next generation {} from unix time {}",
            n.generation, n.active_from
        )
    });
    Some(format!("{generation} ({short}…){next}"))
}

fn age(secs: Option<u64>) -> String {
    match secs {
        None => "never".to_owned(),
        Some(s) if s < 120 => format!("{s} s ago"),
        Some(s) if s < 7200 => format!("{} min ago", s / 60),
        Some(s) => format!("{} h ago", s / 3600),
    }
}

/// `setting off: socket GSO off, GRO off`; `None` when there is nothing to say (no embedded
/// data plane and no setting).
fn udp_offload_line(u: &UdpOffloadStatus) -> Option<String> {
    let on = |b: bool| if b { "on" } else { "off" };
    let setting = if u.setting.is_empty() {
        "default"
    } else {
        &u.setting
    };
    match (u.gso, u.gro) {
        (Some(gso), Some(gro)) => Some(format!(
            "setting {setting}: socket GSO {}, GRO {}{}",
            on(gso),
            on(gro),
            if u.applied == Some(false) {
                " (applying)"
            } else {
                ""
            }
        )),
        _ if setting != "default" => {
            Some(format!("setting {setting} (this backend has no switch)"))
        }
        _ => None,
    }
}

/// The `plexd status` lines, one per peer probed.
pub fn gso_probe_lines(s: &GsoProbeStatus) -> Vec<String> {
    s.peers
        .iter()
        .map(|p| {
            format!(
                "peer {} ({}): {}, {}/{} segmented and {}/{} single replies, {} s ago",
                p.public_key,
                p.mesh_ip,
                p.verdict,
                p.segmented_replies,
                p.sent,
                p.single_replies,
                p.sent,
                p.age_secs
            )
        })
        .collect()
}

/// The human table.
pub fn render(r: &StatusReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "node        {} (mesh ip {}, range {})",
        r.node_id, r.mesh_ip, r.mesh_cidr
    );
    let _ = writeln!(out, "domain      {}  project {}", r.domain_id, r.project_id);
    let _ = writeln!(
        out,
        "plexd       {} up {} s",
        r.plexd_version, r.uptime_secs
    );
    let reach = if r.api.reachable {
        "reachable"
    } else {
        "NOT reachable"
    };
    let _ = writeln!(
        out,
        "api         {} {reach}, last success {}",
        r.api.url,
        age(r.api.last_success_age_secs)
    );
    if let Some(e) = &r.api.last_error {
        let _ = writeln!(
            out,
            "last error  {} ({})",
            e,
            age(r.api.last_error_age_secs)
        );
    }
    let _ = writeln!(out, "heartbeat   {}", age(r.last_heartbeat_age_secs));
    let stream = if r.event_stream_connected {
        "connected"
    } else {
        "disconnected"
    };
    let _ = writeln!(
        out,
        "events      stream {stream}, last event {}, last id {}",
        age(r.last_event_age_secs),
        r.last_event_id
    );
    let version = r
        .state_version
        .map_or_else(|| "none applied".to_owned(), |v| v.to_string());
    let _ = writeln!(out, "state       version {version}");
    if let Some(line) = domain_key_line(&r.domain_key) {
        let _ = writeln!(out, "domain key  {line}");
    }
    let _ = writeln!(out, "backend     {} (interface {})", r.backend, r.interface);
    if let Some(line) = udp_offload_line(&r.udp_offload) {
        let _ = writeln!(out, "udp offload {line}");
    }
    if let Some(probe) = &r.gso_probe {
        for line in gso_probe_lines(probe) {
            let _ = writeln!(out, "gso probe   {line}");
        }
    }
    if let Some(policy) = &r.policy {
        for line in super::policy_status::status_lines(policy) {
            let _ = writeln!(out, "policy      {line}");
        }
    }
    if let Some(dns) = &r.dns {
        let _ = writeln!(out, "dns         {}", dns.line());
    }
    if let Some(routes) = &r.routes {
        for line in routes.lines() {
            let _ = writeln!(out, "routes      {line}");
        }
    }
    let _ = writeln!(
        out,
        "ingest      {} observations waiting, {} dropped and not yet reported",
        r.ingest.waiting, r.ingest.dropped_unreported
    );
    let _ = writeln!(out, "peers       {}", r.peers.len());
    if r.peers.is_empty() {
        return out;
    }
    let rows: Vec<[String; 10]> = r
        .peers
        .iter()
        .map(|p| {
            [
                p.node_id.to_string(),
                p.hostname.clone(),
                p.mesh_ip.to_string(),
                p.endpoint.map_or_else(|| "-".to_owned(), |e| e.to_string()),
                p.path.to_string(),
                p.rtt_ms
                    .map_or_else(|| "-".to_owned(), |ms| format!("{ms} ms")),
                age(p.last_handshake_age_secs),
                p.rx_bytes.to_string(),
                p.tx_bytes.to_string(),
                p.reason.clone(),
            ]
        })
        .collect();
    let head = [
        "PEER",
        "HOSTNAME",
        "MESH IP",
        "ENDPOINT",
        "PATH",
        "RTT",
        "HANDSHAKE",
        "RX",
        "TX",
        "REASON",
    ];
    let mut widths = head.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    out.push('\n');
    let line = |cells: Vec<&str>| {
        let mut l = String::new();
        for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                l.push_str(c);
            } else {
                let _ = write!(l, "{c:<w$}  ");
            }
        }
        l.trim_end().to_owned() + "\n"
    };
    out.push_str(&line(head.to_vec()));
    for row in &rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use uuid::Uuid;

    use super::*;

    /// A report with one relayed peer (also what the metrics tests render).
    pub(crate) fn report() -> StatusReport {
        StatusReport {
            node_id: Uuid::parse_str("019a0816-0000-7000-8000-0000000000aa").unwrap(),
            mesh_ip: "10.64.1.2".parse().unwrap(),
            mesh_cidr: "10.64.0.0/16".into(),
            domain_id: Uuid::parse_str("019a0816-0000-7000-8000-000000000001").unwrap(),
            project_id: Uuid::parse_str("019a0816-0000-7000-8000-000000000002").unwrap(),
            plexd_version: "0.1.0".into(),
            uptime_secs: 75,
            api: ApiStatus {
                url: "https://cp.example".into(),
                reachable: false,
                last_success_age_secs: Some(300),
                last_error: Some("connection refused".into()),
                last_error_age_secs: Some(4),
            },
            last_heartbeat_age_secs: Some(300),
            last_event_age_secs: None,
            event_stream_connected: false,
            event_stream_disconnects: 0,
            last_event_id: 9,
            state_version: Some(7),
            backend: "none".into(),
            interface: "plexd0".into(),
            ingest: IngestStatus {
                waiting: 3,
                dropped_unreported: 1,
            },
            peers: vec![PeerStatus {
                node_id: Uuid::parse_str("019a0816-0000-7000-8000-000000000003").unwrap(),
                hostname: "web-3".into(),
                mesh_ip: "10.64.1.3".parse().unwrap(),
                public_key: "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=".into(),
                endpoint: Some("192.0.2.3:51820".parse().unwrap()),
                path: PeerPath::Relay {
                    relay: "r1".into(),
                    transport: PathTransport::Udp,
                },
                rtt_ms: Some(21),
                last_handshake_age_secs: None,
                last_handshake_secs_ago: None,
                reason: "3 pings unanswered".into(),
                rx_bytes: 0,
                tx_bytes: 1200,
            }],
            udp_offload: UdpOffloadStatus {
                setting: "off".into(),
                gso: Some(false),
                gro: Some(false),
                applied: Some(true),
            },
            domain_key: DomainKeyStatus {
                public_key: "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789ABCDEFG=".into(),
                generation: Some(2),
                next: Some(plexsphere_wire::signing_keys::SigningKey {
                    generation: 3,
                    public_key: "BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB=".into(),
                    active_from: 1_700_000_000,
                }),
            },
            gso_probe: None,
            dns: None,
            policy: None,
            routes: None,
        }
    }

    #[test]
    fn table_is_pinned() {
        let expected = "\
node        019a0816-0000-7000-8000-0000000000aa (mesh ip 10.64.1.2, range 10.64.0.0/16)
domain      019a0816-0000-7000-8000-000000000001  project 019a0816-0000-7000-8000-000000000002
plexd       0.1.0 up 75 s
api         https://cp.example NOT reachable, last success 5 min ago
last error  connection refused (4 s ago)
heartbeat   5 min ago
events      stream disconnected, last event never, last id 9
state       version 7
domain key  generation 2 (AbCdEfGh…), next generation 3 from unix time 1700000000
backend     none (interface plexd0)
udp offload setting off: socket GSO off, GRO off
ingest      3 observations waiting, 1 dropped and not yet reported
peers       1

PEER                                  HOSTNAME  MESH IP    ENDPOINT         PATH               RTT    HANDSHAKE  RX  TX    REASON
019a0816-0000-7000-8000-000000000003  web-3     10.64.1.3  192.0.2.3:51820  relay r1 over udp  21 ms  never      0   1200  3 pings unanswered
";
        assert_eq!(render(&report()), expected);
    }

    #[test]
    fn peer_paths_in_json_are_pinned() {
        let v = serde_json::to_value(report()).unwrap();
        let peer = &v["peers"][0];
        assert_eq!(
            peer["path"],
            serde_json::json!({"kind": "relay", "relay": "r1", "transport": "udp"})
        );
        assert_eq!(peer["hostname"], "web-3");
        assert_eq!(
            peer["public_key"],
            "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
        );
        assert_eq!(peer["rtt_ms"], 21);
        assert_eq!(peer["reason"], "3 pings unanswered");
        assert!(peer["last_handshake_secs_ago"].is_null());
        let direct = PeerPath::Direct {
            endpoint: "192.0.2.7:51820".parse().unwrap(),
        };
        assert_eq!(
            serde_json::to_value(&direct).unwrap(),
            serde_json::json!({"kind": "direct", "endpoint": "192.0.2.7:51820"})
        );
        let tcp = serde_json::json!({"kind": "relay", "relay": "r2", "transport": "tcp"});
        let tcp: PeerPath = serde_json::from_value(tcp).unwrap();
        assert_eq!(tcp.to_string(), "relay r2 over tcp");
        assert_eq!(
            serde_json::to_value(PeerPath::None).unwrap(),
            serde_json::json!({"kind": "none"})
        );
        // A daemon from before reach answers without the new fields: the CLI still reads it.
        let mut old = peer.clone();
        for k in [
            "public_key",
            "path",
            "rtt_ms",
            "last_handshake_secs_ago",
            "reason",
        ] {
            old.as_object_mut().unwrap().remove(k);
        }
        let old: PeerStatus = serde_json::from_value(old).unwrap();
        assert_eq!(old.path, PeerPath::None);
    }

    #[test]
    fn no_peers_no_table_and_json_round_trips() {
        let mut r = report();
        r.peers.clear();
        r.api.last_error = None;
        r.api.reachable = true;
        let t = render(&r);
        assert!(t.ends_with("peers       0\n"), "{t}");
        assert!(!t.contains("last error"), "{t}");
        assert!(t.contains("https://cp.example reachable"), "{t}");
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<StatusReport>(&json).unwrap(), r);
        assert!(json.contains(r#""event_stream_connected":false"#), "{json}");
        assert_eq!(age(Some(7300)), "2 h ago");
        assert!(
            json.contains(
                r#""udp_offload":{"setting":"off","gso":false,"gro":false,"applied":true}"#
            ),
            "{json}"
        );
    }

    #[test]
    fn domain_key_line_without_generation_or_next_and_from_an_older_daemon() {
        let mut k = DomainKeyStatus {
            public_key: "AbCdEfGhIjKl".into(),
            generation: None,
            next: None,
        };
        assert_eq!(
            domain_key_line(&k).as_deref(),
            Some("pinned at registration (AbCdEfGh…)")
        );
        k.public_key.clear();
        assert_eq!(domain_key_line(&k), None);
        let mut v = serde_json::to_value(report()).unwrap();
        v.as_object_mut().unwrap().remove("domain_key");
        let old: StatusReport = serde_json::from_value(v).unwrap();
        assert_eq!(old.domain_key, DomainKeyStatus::default());
    }

    #[test]
    fn udp_offload_line_says_the_setting_and_what_the_socket_does() {
        let mut u = UdpOffloadStatus::default();
        assert_eq!(
            udp_offload_line(&u),
            None,
            "no plane, no setting: nothing to say"
        );
        u.setting = "off".into();
        assert_eq!(
            udp_offload_line(&u).as_deref(),
            Some("setting off (this backend has no switch)")
        );
        u = UdpOffloadStatus {
            setting: "default".into(),
            gso: Some(true),
            gro: Some(true),
            applied: Some(false),
        };
        assert_eq!(
            udp_offload_line(&u).as_deref(),
            Some("setting default: socket GSO on, GRO on (applying)")
        );
    }
}
