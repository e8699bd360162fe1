//! A store as most tests start from: the current schema with the lab seed (Domain `lab`,
//! Projects `lab-nodes` and `openstack`) applied.

use plexsphere::seed;
use plexsphere::store::Store;

/// Connects to `url`, applies every migration and the lab seed.
pub async fn seeded(url: &str) -> Store {
    let store = Store::connect(url).await.unwrap();
    store.migrate().await.unwrap();
    apply_lab_seed(&store).await;
    store
}

/// Applies the lab seed now, to a store at the current schema or (for an upgrade test) an
/// older one that already has Domains and Projects.
pub async fn apply_lab_seed(store: &Store) {
    let manifest = seed::parse(seed::LAB_SEED, "lab").unwrap();
    seed::apply(store, &manifest, "lab", time::OffsetDateTime::now_utc())
        .await
        .unwrap();
}
