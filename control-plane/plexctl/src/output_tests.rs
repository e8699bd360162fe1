use plexsphere_wire::admin::TokenStatus;
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
