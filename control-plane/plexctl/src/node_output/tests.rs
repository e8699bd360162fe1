use plexsphere_wire::admin::{CandidateView, NodeStatus};
use time::macros::datetime;
use uuid::uuid;

use super::*;
use crate::output::{Format, render};

const PROJECT: uuid::Uuid = uuid!("019a0816-0000-7000-8000-000000000002");
const DOMAIN: uuid::Uuid = uuid!("019a0816-0000-7000-8000-000000000000");
const NODE: uuid::Uuid = uuid!("019a0816-0000-7000-8000-0000000000aa");

fn node_view() -> NodeView {
    NodeView {
        id: NODE,
        domain_id: DOMAIN,
        project_id: PROJECT,
        hostname: "edge-1".to_owned(),
        name: Some("edge-1".to_owned()),
        arch: "amd64".to_owned(),
        plexd_version: "0.1.0".to_owned(),
        mesh_ip: "10.64.1.1".parse().unwrap(),
        wireguard_public_key: "x25519pubkeybase64xxxxxxxxxxxxxxxxxxxxxxxxx=".to_owned(),
        resource_handle: None,
        status: NodeStatus::Online,
        registered_at: datetime!(2026-11-30 10:05:00 UTC),
        // Not UTC and with a fraction: shown in UTC to the second.
        last_seen_at: Some(datetime!(2026-11-30 12:06:07.89 +02:00)),
        endpoints: vec![
            "192.0.2.10:51820".to_owned(),
            "198.51.100.7:40000".to_owned(),
        ],
        last_heartbeat_at: Some(datetime!(2026-11-30 10:05:30 UTC)),
        uptime_secs: Some(93_784),
        applied_state_version: Some(7),
        peers_configured: Some(3),
        peers_connected: Some(2),
        observations_dropped: 0,
        candidates: vec![
            CandidateView {
                kind: CandidateKind::Local,
                address: "192.0.2.10:51820".parse().unwrap(),
            },
            CandidateView {
                kind: CandidateKind::Local,
                address: "[2001:db8::10]:51820".parse().unwrap(),
            },
            CandidateView {
                kind: CandidateKind::Reflexive,
                address: "198.51.100.7:40000".parse().unwrap(),
            },
        ],
        home_relay: Some("r1".to_owned()),
        key_rotated_at: None,
        credential_rotated_at: None,
        nat: Some(NatView {
            mapping: NatMapping::EndpointIndependent,
            udp_blocked: false,
        }),
        clone: None,
        ephemeral_offline_secs: None,
        udp_offload: None,
        tags: Vec::new(),
    }
}

#[test]
fn node_list_and_node_get() {
    let mut never_seen = node_view();
    never_seen.id = uuid!("019a0816-0000-7000-8000-0000000000bb");
    never_seen.hostname = "db".to_owned();
    never_seen.mesh_ip = "10.64.1.2".parse().unwrap();
    never_seen.status = NodeStatus::Registered;
    never_seen.last_seen_at = None;
    never_seen.endpoints = Vec::new();
    // A broker node, ephemeral; its DNS name is the NAME column.
    never_seen.resource_handle = Some("db-main".to_owned());
    never_seen.name = Some("db-main".to_owned());
    never_seen.ephemeral_offline_secs = Some(1_800);
    never_seen.tags = vec!["db".to_owned(), "prod".to_owned()];
    assert!(node(&never_seen).contains("\ntags:             tag:db,tag:prod\n"));
    assert_eq!(
        nodes(&[node_view(), never_seen]),
        "\
ID                                    NAME     HOSTNAME  MESH IP    STATUS                LAST SEEN             ENDPOINTS                            VERSION  PROJECT                               TAGS
019a0816-0000-7000-8000-0000000000aa  edge-1   edge-1    10.64.1.1  online                2026-11-30T10:06:07Z  192.0.2.10:51820,198.51.100.7:40000  0.1.0    019a0816-0000-7000-8000-000000000002  -
019a0816-0000-7000-8000-0000000000bb  db-main  db        10.64.1.2  registered+ephemeral  -                     -                                    0.1.0    019a0816-0000-7000-8000-000000000002  tag:db,tag:prod
"
    );
    assert_eq!(
        node(&node_view()),
        "\
id:               019a0816-0000-7000-8000-0000000000aa
name:             edge-1
hostname:         edge-1
mesh ip:          10.64.1.1
status:           online
last seen:        2026-11-30T10:06:07Z
last heartbeat:   2026-11-30T10:05:30Z
uptime:           1d 2h 3m 4s
state applied:    7
peers:            2 of 3 connected
registered:       2026-11-30T10:05:00Z
version:          0.1.0
arch:             amd64
project:          019a0816-0000-7000-8000-000000000002
domain:           019a0816-0000-7000-8000-000000000000
resource handle:  -
wireguard key:    x25519pubkeybase64xxxxxxxxxxxxxxxxxxxxxxxxx=
endpoints:        192.0.2.10:51820, 198.51.100.7:40000
local:            192.0.2.10:51820, [2001:db8::10]:51820
reflexive:        198.51.100.7:40000
observed:         -
home relay:       r1
nat:              endpoint-independent mapping (direct paths can be punched)
"
    );
}

#[test]
fn node_get_before_a_heartbeat_and_with_dropped_observations() {
    let mut quiet = node_view();
    quiet.status = NodeStatus::Registered;
    quiet.last_seen_at = None;
    quiet.last_heartbeat_at = None;
    quiet.uptime_secs = None;
    quiet.applied_state_version = None;
    quiet.peers_configured = None;
    quiet.peers_connected = None;
    let text = node(&quiet);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[4..10],
        [
            "status:           registered",
            "last seen:        -",
            "last heartbeat:   -",
            "uptime:           -",
            "state applied:    -",
            "peers:            -",
        ]
    );
    assert!(!text.contains("observations dropped"), "{text}");

    let mut dropping = node_view();
    dropping.observations_dropped = 12;
    dropping.peers_connected = Some(0);
    let text = node(&dropping);
    assert!(
        text.contains(
            "\npeers:                 0 of 3 connected\nobservations dropped:  12\nregistered:  "
        ),
        "{text}"
    );
}

#[test]
fn node_get_shows_reach_before_a_report_and_every_nat_kind() {
    let mut silent = node_view();
    silent.candidates = Vec::new();
    silent.home_relay = None;
    silent.nat = None;
    let text = node(&silent);
    assert!(
        text.ends_with(
            "local:            -\nreflexive:        -\nobserved:         -\nhome relay:       -\nnat:              -\n"
        ),
        "{text}"
    );
    let shown = |mapping, udp_blocked| {
        nat(&NatView {
            mapping,
            udp_blocked,
        })
    };
    assert_eq!(
        shown(NatMapping::EndpointDependent, false),
        "endpoint-dependent mapping (peers behind NAT reach it through a relay)"
    );
    assert_eq!(
        shown(NatMapping::None, false),
        "none (its address is its own)"
    );
    assert_eq!(
        shown(NatMapping::Unknown, true),
        "unknown (fewer than two STUN servers answered); UDP blocked (no STUN server answered: relayed over TCP)"
    );
}

#[test]
fn node_get_json_carries_the_reach_fields() {
    let text = render(Format::Json, &node_view(), node).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        v["candidates"],
        serde_json::json!([
            {"kind": "local", "address": "192.0.2.10:51820"},
            {"kind": "local", "address": "[2001:db8::10]:51820"},
            {"kind": "reflexive", "address": "198.51.100.7:40000"},
        ])
    );
    assert_eq!(v["home_relay"], "r1");
    assert_eq!(
        v["nat"],
        serde_json::json!({"mapping": "endpoint_independent", "udp_blocked": false})
    );
}

#[test]
fn uptimes_skip_zero_parts() {
    assert_eq!(uptime(0), "0s");
    assert_eq!(uptime(59), "59s");
    assert_eq!(uptime(3_600), "1h");
    assert_eq!(uptime(3_723), "1h 2m 3s");
    assert_eq!(uptime(86_400 * 3 + 5), "3d 5s");
    assert_eq!(uptime(u64::MAX), "213503982334601d 7h 15s");
}

#[test]
fn a_suspected_clone_is_flagged_in_node_list_and_spelled_out_in_node_get() {
    let mut n = node_view();
    n.clone = Some(CloneView {
        first_seen_at: datetime!(2026-11-30 11:00:00 UTC),
        last_seen_at: datetime!(2026-11-30 11:02:03 UTC),
        requests: 4,
        last_addr: "198.51.100.9".to_owned(),
        last_fingerprint: None,
    });
    let list = nodes(std::slice::from_ref(&n));
    assert!(list.contains(" online+clone "), "{list}");
    assert!(!nodes(&[node_view()]).contains("+clone"));
    let get = node(&n);
    assert!(
        get.contains(
            "\nstatus:           online\nclone suspected:  2026-11-30T11:00:00Z, 4 requests from 198.51.100.9 (last 2026-11-30T11:02:03Z); they were refused"
        ),
        "{get}"
    );
    assert!(!node(&node_view()).contains("clone"));
}
