use plexsphere_wire::admin::{CandidateView, NodeStatus, TokenStatus};
use plexsphere_wire::secret::TokenKind;
use time::macros::datetime;
use uuid::uuid;

use super::*;

const PROJECT: uuid::Uuid = uuid!("019a0816-0000-7000-8000-000000000002");
const DOMAIN: uuid::Uuid = uuid!("019a0816-0000-7000-8000-000000000000");
const NODE: uuid::Uuid = uuid!("019a0816-0000-7000-8000-0000000000aa");

fn token(id: &str, status: TokenStatus, consumed_by: Option<uuid::Uuid>) -> TokenView {
    TokenView {
        id: id.to_owned(),
        project_id: PROJECT,
        kind: TokenKind::Node,
        env_prefix: "lab".to_owned(),
        status,
        created_at: datetime!(2026-11-30 10:00:00 UTC),
        expires_at: datetime!(2026-11-30 11:00:00 UTC),
        consumed_at: consumed_by.map(|_| datetime!(2026-11-30 10:05:00 UTC)),
        consumed_by_node: consumed_by,
        revoked_at: None,
        resource_id: None,
        uses: u32::from(consumed_by.is_some()),
        max_uses: 1,
        ephemeral_offline_secs: None,
        nodes: consumed_by.into_iter().collect(),
        tags: Vec::new(),
    }
}

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
fn tables_align_columns_without_trailing_spaces() {
    let text = table(
        &["A", "LONGER"],
        &[
            vec!["wide-cell".into(), "x".into()],
            vec!["y".into(), "-".into()],
        ],
    );
    assert_eq!(text, "A          LONGER\nwide-cell  x\ny          -\n");
    assert_eq!(table(&["ID", "NAME"], &[]), "ID  NAME\n");
}

#[test]
fn issued_token_starts_with_the_bare_token() {
    let issued = IssuedToken {
        id: "0123456789abcdef".to_owned(),
        token: "pxbt_lab_node_0123456789abcdef_c2VjcmV0".to_owned(),
        project_id: PROJECT,
        kind: TokenKind::Node,
        env_prefix: "lab".to_owned(),
        created_at: datetime!(2026-11-30 10:00:00 UTC),
        expires_at: datetime!(2026-11-30 11:00:00 UTC),
        max_uses: 1,
        ephemeral_offline_secs: None,
        tags: Vec::new(),
    };
    assert_eq!(
        issued_token(&issued),
        "pxbt_lab_node_0123456789abcdef_c2VjcmV0
id:          0123456789abcdef
project:     019a0816-0000-7000-8000-000000000002
kind:        node
env prefix:  lab
expires at:  2026-11-30T11:00:00Z
uses:        1 node (single use)
ephemeral:   no
note: the token is shown only once; store it now (on the node: /etc/plexd/bootstrap-token, mode 0600)
"
    );
    let reusable = IssuedToken {
        max_uses: 3,
        ephemeral_offline_secs: Some(5_400),
        ..issued
    };
    let text = issued_token(&reusable);
    let tagged = issued_token(&IssuedToken {
        tags: vec!["ci".to_owned(), "web".to_owned()],
        ..reusable.clone()
    });
    assert!(
        tagged.contains("\nephemeral:   yes: its nodes are removed after 1h30m offline\ntags:        tag:ci,tag:web\nnote:"),
        "{tagged}"
    );
    assert!(
        text.contains("\nuses:        up to 3 nodes\nephemeral:   yes: its nodes are removed after 1h30m offline\n"),
        "{text}"
    );
}

#[test]
fn token_list_shows_status_uses_and_the_nodes_made() {
    let mut reusable = token("00000000000000aa", TokenStatus::Active, None);
    reusable.max_uses = 3;
    reusable.uses = 2;
    reusable.ephemeral_offline_secs = Some(1_800);
    reusable.nodes = vec![NODE, uuid!("019a0816-0000-7000-8000-0000000000bb")];
    reusable.tags = vec!["ci".to_owned()];
    // An older server names only the consumer of a single-use token (and sends no uses).
    let mut old = token("00000000000000bb", TokenStatus::Consumed, Some(NODE));
    old.nodes = Vec::new();
    old.uses = 0;
    // Every node it made is gone (ephemeral nodes removed): none listed, not the last consumer.
    let mut emptied = token("00000000000000cc", TokenStatus::Consumed, Some(NODE));
    emptied.nodes = Vec::new();
    let items = [
        token("0123456789abcdef", TokenStatus::Consumed, Some(NODE)),
        token("fedcba9876543210", TokenStatus::Active, None),
        reusable,
        old,
        emptied,
    ];
    assert_eq!(
        tokens(&items),
        "\
ID                KIND  ENV  STATUS    USES  EPHEMERAL  CREATED               EXPIRES               NODES                                                                      TAGS
0123456789abcdef  node  lab  consumed  1/1   -          2026-11-30T10:00:00Z  2026-11-30T11:00:00Z  019a0816-0000-7000-8000-0000000000aa                                       -
fedcba9876543210  node  lab  active    0/1   -          2026-11-30T10:00:00Z  2026-11-30T11:00:00Z  -                                                                          -
00000000000000aa  node  lab  active    2/3   30m        2026-11-30T10:00:00Z  2026-11-30T11:00:00Z  019a0816-0000-7000-8000-0000000000aa,019a0816-0000-7000-8000-0000000000bb  tag:ci
00000000000000bb  node  lab  consumed  0/1   -          2026-11-30T10:00:00Z  2026-11-30T11:00:00Z  019a0816-0000-7000-8000-0000000000aa                                       -
00000000000000cc  node  lab  consumed  1/1   -          2026-11-30T10:00:00Z  2026-11-30T11:00:00Z  -                                                                          -
"
    );
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
    // A broker node: named by its resource handle, and ephemeral.
    never_seen.resource_handle = Some("db-main".to_owned());
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
fn project_and_domain_lists() {
    let p = [
        ProjectView {
            id: PROJECT,
            domain_id: DOMAIN,
            slug: "lab-nodes".to_owned(),
            display_name: Some("Lab nodes".to_owned()),
            sub_range_cidr: Some("10.64.1.0/24".parse().unwrap()),
        },
        ProjectView {
            id: uuid!("019a0816-0000-7000-8000-000000000001"),
            domain_id: DOMAIN,
            slug: "openstack".to_owned(),
            display_name: None,
            sub_range_cidr: None,
        },
    ];
    assert_eq!(
        projects(&p),
        "\
ID                                    SLUG       NAME       SUB-RANGE     DOMAIN
019a0816-0000-7000-8000-000000000002  lab-nodes  Lab nodes  10.64.1.0/24  019a0816-0000-7000-8000-000000000000
019a0816-0000-7000-8000-000000000001  openstack  -          -             019a0816-0000-7000-8000-000000000000
"
    );
    let d = [DomainView {
        id: DOMAIN,
        slug: "lab".to_owned(),
        mesh_cidr: "10.64.0.0/16".parse().unwrap(),
        signing_public_key: "MCowBQYDK2VwAyEA".to_owned(),
    }];
    assert_eq!(
        domains(&d),
        "\
ID                                    SLUG  MESH CIDR     SIGNING KEY
019a0816-0000-7000-8000-000000000000  lab   10.64.0.0/16  MCowBQYDK2VwAyEA
"
    );
}

#[test]
fn versions_table_and_json() {
    let client = VersionInfo {
        name: "plexctl".into(),
        version: "0.1.0".into(),
    };
    let server = VersionInfo {
        name: "plexsphere".into(),
        version: "0.1.0".into(),
    };
    let both = Versions {
        client: client.clone(),
        server: Some(server),
    };
    assert_eq!(
        versions(&both),
        "client:  plexctl 0.1.0\nserver:  plexsphere 0.1.0\n"
    );
    let only = Versions {
        client,
        server: None,
    };
    assert_eq!(
        versions(&only),
        "client:  plexctl 0.1.0\nserver:  - (no server configured)\n"
    );
    let v: serde_json::Value = serde_json::from_str(&json(&both).unwrap()).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"client":{"name":"plexctl","version":"0.1.0"},"server":{"name":"plexsphere","version":"0.1.0"}})
    );
}

#[test]
fn json_lists_are_bare_arrays_of_the_wire_objects() {
    let items = vec![token("0123456789abcdef", TokenStatus::Consumed, Some(NODE))];
    let text = json(items.as_slice()).unwrap();
    assert!(text.ends_with("]\n"));
    // Exactly one document, which reads back as the wire type.
    let back: Vec<TokenView> = serde_json::from_str(&text).unwrap();
    assert_eq!(back, items);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        v[0]["consumed_by_node"],
        "019a0816-0000-7000-8000-0000000000aa"
    );
    assert_eq!(v[0]["status"], "consumed");
    assert_eq!(v[0]["expires_at"], "2026-11-30T11:00:00Z");
}

#[test]
fn times_are_utc_to_the_second() {
    assert_eq!(
        time(datetime!(2026-01-02 03:04:05.999 -01:30)),
        "2026-01-02T04:34:05Z"
    );
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

#[test]
fn signing_keys_table() {
    use plexsphere_wire::signing_keys_admin::{SigningKeyStatus, SigningKeyView};
    let at = |s| time::OffsetDateTime::from_unix_timestamp(s).unwrap();
    let keys = [
        SigningKeyView {
            generation: 1,
            public_key: "AAAA".into(),
            active_from: at(0),
            created_at: at(1_800_000_000),
            status: SigningKeyStatus::Current,
        },
        SigningKeyView {
            generation: 2,
            public_key: "BBBB".into(),
            active_from: at(1_800_086_400),
            created_at: at(1_800_000_000),
            status: SigningKeyStatus::Next,
        },
    ];
    let t = signing_keys(&keys);
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines.len(), 3, "{t}");
    assert!(lines[0].starts_with("GENERATION"), "{t}");
    assert!(
        lines[1].contains("current") && lines[1].contains("1970-01-01T00:00:00Z"),
        "{t}"
    );
    assert!(
        lines[2].contains("next") && lines[2].contains("2027-01-16T08:00:00Z"),
        "{t}"
    );
}
