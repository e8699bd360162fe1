//! The policy store (schema version 17): every Domain has a current document (version 1 =
//! the default allow-all, by the migration for existing Domains and at creation for new
//! ones), versions append only when the writer saw the current one, tags on nodes and
//! tokens, and the inventory the compiler sees. SQLite, and Postgres when
//! `PLEXSPHERE_TEST_POSTGRES_URL` is set.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use common::*;
use plexsphere::store::policies::{self, Inserted, NewVersion};
use plexsphere::store::{Store, nodes, tokens};
use plexsphere_policy::document::DEFAULT_DOCUMENT;
use plexsphere_wire::secret::{BootstrapToken, TokenKind};
use sqlx::Row as _;
use uuid::Uuid;

async fn lab_domain(store: &Store) -> Uuid {
    let id: String = sqlx::query("SELECT domain_id FROM projects WHERE id = $1")
        .bind(LAB_NODES)
        .fetch_one(store.pool())
        .await
        .unwrap()
        .try_get("domain_id")
        .unwrap();
    id.parse().unwrap()
}

/// A Domain that existed before version 17 gets the default document as version 1, in
/// force since the Domain was created, byte for byte the policy crate's constant.
async fn upgrading_gives_every_domain_the_default_document(url: String) {
    let store = Store::connect(&url).await.unwrap();
    plexsphere::store::migrator()
        .run_to(16, store.pool())
        .await
        .unwrap();
    let domain = Uuid::now_v7();
    sqlx::query("INSERT INTO domains (id, slug, mesh_cidr, created_at) VALUES ($1, 'old', '10.70.0.0/16', 1234)")
        .bind(domain.to_string())
        .execute(store.pool())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let mut conn = store.acquire().await.unwrap();
    let row = policies::current(&mut conn, domain).await.unwrap().unwrap();
    assert_eq!(row.version, 1);
    assert_eq!(row.document, DEFAULT_DOCUMENT);
    assert_eq!(row.author, policies::DEFAULT_AUTHOR);
    assert_eq!(row.summary, policies::DEFAULT_SUMMARY);
    let created: i64 = sqlx::query("SELECT created_at FROM domains WHERE id = $1")
        .bind(domain.to_string())
        .fetch_one(&mut *conn)
        .await
        .unwrap()
        .try_get("created_at")
        .unwrap();
    assert_eq!(row.created_at, created);
    // The parsed default is the allow-all.
    plexsphere_policy::parse(&row.document).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrading_to_version_17_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    upgrading_gives_every_domain_the_default_document(Store::sqlite_url(dir.path())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrading_to_version_17_on_postgres() {
    let Some(url) = postgres::scratch_database().await else {
        return;
    };
    upgrading_gives_every_domain_the_default_document(url).await;
}

/// A Domain created now starts at version 1 = the default; a write that read an older
/// version stores nothing; history is newest first and paged.
async fn versions_append_only_from_the_version_read(url: String) {
    let store = common::store::seeded(&url).await;
    let domain = lab_domain(&store).await;
    let mut conn = store.acquire().await.unwrap();
    let first = policies::current(&mut conn, domain).await.unwrap().unwrap();
    assert_eq!(
        (first.version, first.document.as_str()),
        (1, DEFAULT_DOCUMENT)
    );
    let new = |doc: &'static str, now| NewVersion {
        document: doc,
        author: "test (op_1)",
        summary: "a -> b: loses any",
        now,
    };
    let got = policies::insert(&mut conn, domain, 1, new("rules: []\n", 10))
        .await
        .unwrap();
    let Inserted::Stored(row) = got else {
        panic!("{got:?}")
    };
    assert_eq!((row.version, row.created_at), (2, 10));
    // A second writer that also read version 1 loses and learns the current version.
    let lost = policies::insert(&mut conn, domain, 1, new("rules: []\n", 11))
        .await
        .unwrap();
    assert_eq!(lost, Inserted::Conflict { current: 2 });
    // Racing past the check, the primary key refuses the same version twice.
    let raced = sqlx::query(
        "INSERT INTO policies (domain_id, version, document, author, created_at, summary) VALUES ($1, 2, 'x', 'y', 0, '')",
    )
    .bind(domain.to_string())
    .execute(&mut *conn)
    .await
    .map_err(plexsphere::store::StoreError::from)
    .unwrap_err();
    assert!(raced.is_unique_violation(), "{raced}");
    assert!(matches!(
        policies::insert(&mut conn, domain, 2, new(DEFAULT_DOCUMENT, 12))
            .await
            .unwrap(),
        Inserted::Stored(r) if r.version == 3
    ));
    let current = policies::current(&mut conn, domain).await.unwrap().unwrap();
    assert_eq!(current.version, 3);
    let h = policies::history(&mut conn, domain, 2, None).await.unwrap();
    assert_eq!(h.iter().map(|r| r.version).collect::<Vec<_>>(), vec![3, 2]);
    let h = policies::history(&mut conn, domain, 2, Some(2))
        .await
        .unwrap();
    assert_eq!(h.iter().map(|r| r.version).collect::<Vec<_>>(), vec![1]);
    assert_eq!(
        policies::get(&mut conn, domain, 2)
            .await
            .unwrap()
            .unwrap()
            .document,
        "rules: []\n"
    );
    assert_eq!(policies::get(&mut conn, domain, 9).await.unwrap(), None);
    // A Domain without a stored version runs the default as version 0.
    let other = Uuid::now_v7();
    let implicit = policies::current_or_default(&mut conn, other)
        .await
        .unwrap();
    assert_eq!(
        (implicit.version, implicit.document.as_str()),
        (0, DEFAULT_DOCUMENT)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_versions_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    versions_append_only_from_the_version_read(Store::sqlite_url(dir.path())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_versions_on_postgres() {
    let Some(url) = postgres::scratch_database().await else {
        return;
    };
    versions_append_only_from_the_version_read(url).await;
}

/// Tags on nodes come back with every node query; the inventory holds the live nodes with
/// their tags and Project slugs, and the tags of tokens that can still make a node.
async fn tags_reach_the_inventory(url: String) {
    let store = common::store::seeded(&url).await;
    let domain = lab_domain(&store).await;
    let mut conn = store.acquire().await.unwrap();
    let node = |n: u32, ip: &str| {
        let (domain, ip) = (domain.to_string(), ip.to_owned());
        sqlx::query(
            "INSERT INTO nodes (id, domain_id, project_id, hostname, arch, plexd_version, mesh_ip, wireguard_public_key, credential_sha256, registered_at) \
             VALUES ($1, $2, $3, $4, 'amd64', '0.1.0', $5, $6, 'x', $7)",
        )
        .bind(format!("019a0816-0000-7000-8000-{n:012x}"))
        .bind(domain)
        .bind(LAB_NODES)
        .bind(format!("host-{n}"))
        .bind(ip)
        .bind(wg_key(n))
        .bind(i64::from(n))
    };
    node(1, "10.64.0.10").execute(&mut *conn).await.unwrap();
    node(2, "10.64.0.11").execute(&mut *conn).await.unwrap();
    let id1: Uuid = "019a0816-0000-7000-8000-000000000001".parse().unwrap();
    let tags = plexsphere::tags::normalize(&["tag:web", "prod"]).unwrap();
    assert!(nodes::set_tags(&mut conn, id1, &tags).await.unwrap());
    assert_eq!(
        nodes::get(&mut conn, id1).await.unwrap().unwrap().tags,
        vec!["prod", "web"]
    );
    let live = nodes::live_in_domain(&mut conn, domain).await.unwrap();
    assert_eq!(
        live.iter().map(|n| n.tags.clone()).collect::<Vec<_>>(),
        vec![vec!["prod".to_owned(), "web".to_owned()], vec![]]
    );
    // Tokens: a usable one's tags are known; an expired one's are not.
    let now = time::OffsetDateTime::now_utc();
    let issue = |ttl: u64, tags: &[&str]| {
        let t = BootstrapToken::generate("lab", TokenKind::Node).unwrap();
        tokens::TokenRow::issued(&t, LAB_NODES.parse().unwrap(), now, ttl, None)
            .with_tags(plexsphere::tags::normalize(tags).unwrap())
    };
    let live_token = issue(3600, &["ci"]);
    tokens::insert(&mut conn, &live_token).await.unwrap();
    let old = issue(3600, &["gone"]);
    tokens::insert(&mut conn, &old).await.unwrap();
    tokens::set_expires_at(&mut conn, &old.id, 1).await.unwrap();
    assert_eq!(
        tokens::get(&mut conn, &live_token.id)
            .await
            .unwrap()
            .unwrap()
            .tags,
        vec!["ci"]
    );
    let inv = policies::inventory(&mut conn, domain, now.unix_timestamp())
        .await
        .unwrap();
    assert_eq!(inv.nodes.len(), 2);
    assert_eq!(inv.nodes[0].name, "host-1");
    assert_eq!(inv.nodes[0].project_slug, "lab-nodes");
    assert_eq!(inv.nodes[0].ipv4, Some("10.64.0.10".parse().unwrap()));
    assert_eq!(inv.nodes[0].tags, vec!["prod", "web"]);
    assert_eq!(inv.tags, vec!["ci"]);
    assert!(inv.projects.iter().any(|p| p.slug == "lab-nodes"));
    assert!(inv.knows_tag("web") && inv.knows_tag("ci") && !inv.knows_tag("gone"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tags_and_inventory_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    tags_reach_the_inventory(Store::sqlite_url(dir.path())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tags_and_inventory_on_postgres() {
    let Some(url) = postgres::scratch_database().await else {
        return;
    };
    tags_reach_the_inventory(url).await;
}
