//! Seed manifests against a real SQLite file: idempotence and all-or-nothing refusals.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use plexsphere::seed::{self, ManifestError, SeedError};
use plexsphere::store::{Store, domains, projects};

async fn store(dir: &std::path::Path) -> Store {
    let s = Store::connect(&Store::sqlite_url(dir)).await.unwrap();
    s.migrate().await.unwrap();
    s
}

fn now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}

async fn snapshot(s: &Store) -> (Vec<domains::Domain>, Vec<projects::Project>) {
    let mut c = s.pool().acquire().await.unwrap();
    (
        domains::list(&mut c).await.unwrap(),
        projects::list(&mut c).await.unwrap(),
    )
}

#[tokio::test]
async fn applying_twice_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path()).await;
    let m = seed::parse(seed::LAB_SEED, "lab").unwrap();
    let first = seed::apply(&s, &m, "lab", now()).await.unwrap();
    assert!(first.changed());
    assert_eq!(first.projects_created, vec!["lab-nodes", "openstack"]);
    let before = snapshot(&s).await;
    let second = seed::apply(&s, &m, "lab", now()).await.unwrap();
    assert!(!second.changed(), "{second:?}");
    assert_eq!(snapshot(&s).await, before);
    assert_eq!(first.ids, second.ids);
    // Migrating again is harmless too.
    s.migrate().await.unwrap();
}

#[tokio::test]
async fn a_changed_mesh_cidr_is_refused_and_nothing_is_applied() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path()).await;
    seed::apply(
        &s,
        &seed::parse(seed::LAB_SEED, "lab").unwrap(),
        "lab",
        now(),
    )
    .await
    .unwrap();
    let before = snapshot(&s).await;
    // A new Domain first (would be created), then the changed lab range (refused).
    let text = "domains:\n  - slug: aaa\n    mesh_cidr: 10.80.0.0/16\n  - slug: lab\n    mesh_cidr: 10.65.0.0/16\n";
    let m = seed::parse(text, "changed.yaml").unwrap();
    let err = seed::apply(&s, &m, "changed.yaml", now())
        .await
        .unwrap_err();
    assert!(matches!(err, SeedError::Refused { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("10.64.0.0/16")
            && msg.contains("10.65.0.0/16")
            && msg.contains("nothing was applied"),
        "{msg}"
    );
    assert_eq!(
        snapshot(&s).await,
        before,
        "the refused manifest left no trace"
    );
}

#[tokio::test]
async fn sub_ranges_must_sit_inside_and_apart_and_bad_yaml_names_the_line() {
    let outside = "domains:\n  - slug: lab\n    mesh_cidr: 10.64.0.0/16\n    projects:\n      - slug: p\n        sub_range_cidr: 10.99.1.0/24\n";
    let err = seed::parse(outside, "outside.yaml").unwrap_err();
    assert!(
        matches!(
            &err,
            SeedError::Invalid {
                problem: ManifestError::SubRangeOutside { .. },
                ..
            }
        ),
        "{err:?}"
    );
    let err = err.to_string();
    assert!(
        err.contains("not inside") && err.contains("outside.yaml"),
        "{err}"
    );

    let bad_yaml = "domains:\n  - slug: lab\n    mesh_cidr: [oops\n";
    let err = seed::parse(bad_yaml, "bad.yaml").unwrap_err().to_string();
    assert!(err.contains("bad.yaml") && err.contains("line"), "{err}");

    // A new Project overlapping an existing Project's sub-range (declared in another run).
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path()).await;
    seed::apply(
        &s,
        &seed::parse(seed::LAB_SEED, "lab").unwrap(),
        "lab",
        now(),
    )
    .await
    .unwrap();
    let before = snapshot(&s).await;
    let clash = "domains:\n  - slug: lab\n    mesh_cidr: 10.64.0.0/16\n    projects:\n      - slug: other\n        sub_range_cidr: 10.64.1.128/25\n";
    let err = seed::apply(
        &s,
        &seed::parse(clash, "clash.yaml").unwrap(),
        "clash.yaml",
        now(),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("overlaps"), "{err}");
    assert_eq!(snapshot(&s).await, before);
}
