//! The Domain keys in the database, sealed under the KEK, on SQLite and on Postgres: replicas
//! that race to make a Domain's first key all end up with the one stored; a Domain with nodes
//! and no key is refused instead of getting a new key; an older seed file is imported; another
//! KEK, or a damaged row, is a clear error. Postgres needs `PLEXSPHERE_TEST_POSTGRES_URL`
//! (scripts/test sets it; under `CI` its absence fails).
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use plexsphere::keys::{Kek, KeyError, Keyring};
use plexsphere::store::domains::{self, Domain};
use plexsphere::store::{Store, domain_keys};
use plexsphere_wire::signed::DomainSigner;

async fn seeded(url: &str) -> (Store, Domain) {
    let store = common::store::seeded(url).await;
    let mut conn = store.acquire().await.unwrap();
    let lab = domains::by_slug(&mut conn, "lab").await.unwrap().unwrap();
    (store, lab)
}

/// A node row in the Domain, as a registration would leave it.
async fn add_node(store: &Store, domain: &Domain) {
    add_node_n(store, domain, 0).await
}

/// The `n`th such node (its own mesh IP and key).
async fn add_node_n(store: &Store, domain: &Domain, n: u8) {
    let project: String = sqlx::query_scalar("SELECT id FROM projects WHERE domain_id = $1")
        .bind(domain.id.to_string())
        .fetch_one(store.pool())
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO nodes (id, domain_id, project_id, hostname, arch, plexd_version, mesh_ip, \
         wireguard_public_key, credential_sha256, registered_at) \
         VALUES ($1, $2, $3, 'ky-node', 'x86_64', '0', $4, $5, 'digest', 1)",
    )
    .bind(uuid::Uuid::now_v7().to_string())
    .bind(domain.id.to_string())
    .bind(project)
    .bind(format!("10.0.{n}.9"))
    .bind(format!("pk{n}"))
    .execute(store.pool())
    .await
    .unwrap();
}

async fn forget_keys(store: &Store) {
    sqlx::query("DELETE FROM domain_keys")
        .execute(store.pool())
        .await
        .unwrap();
}

/// Everything, on the database at `url` (`dir` stands for each replica's data directory).
async fn the_domain_key_is_one_sealed_row(url: &str) {
    let (store, lab) = seeded(url).await;
    let kek = Kek::from_bytes([11; 32], "test KEK");

    // Eight "replicas", each with its own pool and data directory, make the key at once, and
    // each registers a node as soon as it has it: a replica that found no key before the
    // first was stored, and then sees another's node, must take that key, not refuse (a
    // registration on a fresh Domain answered 500 so, now and then, under load).
    let mut racers = Vec::new();
    for n in 0..8u8 {
        let (url, kek, lab) = (url.to_owned(), kek.clone(), lab.clone());
        racers.push(tokio::spawn(async move {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::connect(&url).await.unwrap();
            let keys = Keyring::new(store.clone(), kek, dir.path());
            let key = keys.signer(&lab).await.unwrap().public_key_b64();
            add_node_n(&store, &lab, n + 1).await;
            key
        }));
    }
    let mut made = Vec::new();
    for r in racers {
        made.push(r.await.unwrap());
    }
    assert!(made.iter().all(|k| *k == made[0]), "{made:?}");
    let mut conn = store.acquire().await.unwrap();
    let rows = domain_keys::list(&mut conn, lab.id).await.unwrap();
    drop(conn);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].public_key, made[0]);
    assert!(rows[0].sealed_seed.starts_with("v1:"));
    // The seed itself is nowhere in the row.
    assert!(!rows[0].sealed_seed.contains(&rows[0].public_key));

    // Another KEK does not open it, and says so.
    let dir = tempfile::tempdir().unwrap();
    let other = Keyring::new(
        store.clone(),
        Kek::from_bytes([12; 32], "/etc/other-kek"),
        dir.path(),
    );
    let err = other.signer(&lab).await.err().unwrap();
    assert!(
        err.to_string()
            .contains("this KEK (/etc/other-kek) did not seal the Domain key of Domain"),
        "{err}"
    );

    // A damaged row is refused, not replaced.
    sqlx::query("UPDATE domain_keys SET public_key = $1")
        .bind(DomainSigner::from_seed(&[1; 32]).unwrap().public_key_b64())
        .execute(store.pool())
        .await
        .unwrap();
    let fresh = Keyring::new(store.clone(), kek.clone(), dir.path());
    assert!(matches!(fresh.signer(&lab).await, Err(KeyError::Seal(_))));
    forget_keys(&store).await;

    // A Domain with nodes and no key anywhere: a clear error, never a new key.
    add_node(&store, &lab).await;
    let keys = Keyring::new(store.clone(), kek.clone(), dir.path());
    let err = keys.prepare_all().await.err().unwrap();
    assert!(matches!(err, KeyError::NoKey { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("the Domain lab has nodes but no signing key"),
        "{err}"
    );
    let mut conn = store.acquire().await.unwrap();
    assert!(
        domain_keys::list(&mut conn, lab.id)
            .await
            .unwrap()
            .is_empty()
    );
    drop(conn);

    // The upgrade path: the seed file an older version left is imported, sealed.
    let old = plexsphere::keys::seed_path(dir.path(), "lab");
    std::fs::create_dir_all(old.parent().unwrap()).unwrap();
    std::fs::write(&old, [5u8; 32]).unwrap();
    let want = DomainSigner::from_seed(&[5; 32]).unwrap().public_key_b64();
    assert_eq!(keys.prepare_all().await.unwrap(), 1);
    assert_eq!(keys.signer(&lab).await.unwrap().public_key_b64(), want);
    // From then on the database holds it: another replica without the file signs the same.
    let elsewhere = tempfile::tempdir().unwrap();
    let replica = Keyring::new(store.clone(), kek.clone(), elsewhere.path());
    assert_eq!(replica.signer(&lab).await.unwrap().public_key_b64(), want);
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = Store::sqlite_url(dir.path());
    the_domain_key_is_one_sealed_row(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_postgres() {
    let Some(url) = common::postgres::scratch_database().await else {
        return;
    };
    the_domain_key_is_one_sealed_row(&url).await;
}
