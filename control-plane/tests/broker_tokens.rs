//! A machine's bootstrap token through the broker over the real router, real TLS and a real
//! SQLite file: bound to its resource and revoked on delete, never stored in clear, and minted
//! again only when no machine was handed its document.
#![allow(clippy::unwrap_used)]

mod common;

use common::broker::{credential, credential_key, history, phase, wait_for};
use common::{LAB_NODES, OPENSTACK, TestServer, cells_holding};
use plexsphere_broker::blueprint::version_id;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::Row as _;
use uuid::Uuid;

#[tokio::test]
async fn a_machine_gets_a_bound_token_and_a_rendered_composite_and_delete_revokes_it() {
    let srv = TestServer::start().await;
    let cred = credential(&srv, "openstack").await;
    let (status, created) = srv
        .op_post(
            &format!("/v1/projects/{OPENSTACK}/resources"),
            json!({
                "kind": "node",
                "blueprint_version_id": version_id("openstack-instance", "v1alpha2"),
                "cloud_credential_id": cred,
                "parameters": {"imageName": "debian-12", "flavorName": "m1.small", "networkName": "lab"},
            }),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let r = wait_for(&srv, &id, "Provisioning", |r| phase(r) == "Provisioning").await;
    assert_eq!(history(&r), ["Pending", "Provisioning"]);

    let tokens = srv.tokens(OPENSTACK).await;
    let bound: Vec<_> = tokens
        .iter()
        .filter(|t| t.resource_id.map(|u| u.to_string()) == Some(id.clone()))
        .collect();
    assert_eq!(bound.len(), 1, "{tokens:?}");
    let token_id = bound[0].id.clone();

    let mut conn = srv.store.pool().acquire().await.unwrap();
    let composite: String = sqlx::query("SELECT composite FROM resources WHERE id = $1")
        .bind(id.clone())
        .fetch_one(&mut *conn)
        .await
        .unwrap()
        .get("composite");
    drop(conn);
    assert!(
        composite.contains("kind: XOpenStackInstance"),
        "{composite}"
    );
    assert!(composite.contains(&format!("name: pr-{id}")), "{composite}");
    assert!(
        composite.contains(&format!("namespace: plexsphere-project-{OPENSTACK}")),
        "{composite}"
    );
    assert!(composite.contains(&format!("cloud-credential-{cred}")));
    assert!(composite.contains("#cloud-config"), "{composite}");
    assert!(composite.contains(&format!("resource_handle: pr-{id}")));

    let (status, _) = srv.op_delete(&format!("/v1/resources/{id}")).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    wait_for(&srv, &id, "Deleted", |r| phase(r) == "Deleted").await;
    let tokens = srv.tokens(OPENSTACK).await;
    let t = tokens.iter().find(|t| t.id == token_id).unwrap();
    assert!(t.revoked_at.is_some(), "{t:?}");
    srv.stop().await;
}

#[tokio::test]
async fn no_table_holds_a_machine_token_in_clear() {
    let srv = TestServer::start().await;
    let cred = credential(&srv, "openstack").await;
    let (status, created) = srv
        .op_post(
            &format!("/v1/projects/{OPENSTACK}/resources"),
            json!({
                "kind": "node",
                "blueprint_version_id": version_id("openstack-instance", "v1alpha2"),
                "cloud_credential_id": cred,
                "parameters": {"imageName": "debian-12", "flavorName": "m1.small", "networkName": "lab"},
            }),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    wait_for(&srv, &id, "Provisioning", |r| phase(r) == "Provisioning").await;
    let tokens = srv.tokens(OPENSTACK).await;
    let bound: Vec<_> = tokens
        .iter()
        .filter(|t| t.resource_id.map(|u| u.to_string()) == Some(id.clone()))
        .collect();
    assert_eq!(bound.len(), 1, "{tokens:?}");
    let token_id = bound[0].id.clone();

    let pool = srv.store.pool();
    // The scan sees the token's public id where it belongs (it would see the text too).
    let with_id = cells_holding(pool, &token_id).await;
    assert!(
        with_id.contains(&"bootstrap_tokens.id".to_owned())
            && with_id.contains(&"resources.token_id".to_owned()),
        "{with_id:?}"
    );
    // The token's text is pxbt_lab_node_<id>_<secret>: neither it nor any token text is stored.
    assert_eq!(
        cells_holding(pool, &format!("_{token_id}_")).await,
        Vec::<String>::new()
    );
    assert_eq!(cells_holding(pool, "pxbt_").await, Vec::<String>::new());
    // The stored composite holds the document with the marker where the token was.
    assert_eq!(
        cells_holding(pool, "<bootstrap token: redacted>").await,
        ["resources.composite"]
    );
    assert_eq!(
        cells_holding(pool, "resource_handle: pr-").await,
        ["resources.composite"]
    );

    // A pass that finds it Pending with its composite stored (as after a restart) sees the
    // substrate holding it: nothing is handed over again and no second token is minted.
    let mut conn = srv.store.pool().acquire().await.unwrap();
    let row = sqlx::query("SELECT provisioning FROM resources WHERE id = $1")
        .bind(id.clone())
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    let mut provisioning: Value = serde_json::from_str(row.get("provisioning")).unwrap();
    provisioning["phase"] = json!("Pending");
    sqlx::query("UPDATE resources SET provisioning = $1, phase = 'Pending' WHERE id = $2")
        .bind(provisioning.to_string())
        .bind(id.clone())
        .execute(&mut *conn)
        .await
        .unwrap();
    drop(conn);
    plexsphere::broker::reconcile::pass(&srv.state)
        .await
        .unwrap();
    wait_for(&srv, &id, "Provisioning again", |r| {
        phase(r) == "Provisioning"
    })
    .await;
    let again: Vec<_> = srv
        .tokens(OPENSTACK)
        .await
        .into_iter()
        .filter(|t| t.resource_id.map(|u| u.to_string()) == Some(id.clone()))
        .collect();
    assert_eq!(again.len(), 1, "{again:?}");
    assert!(again[0].revoked_at.is_none(), "{again:?}");
    srv.stop().await;
}

/// A machine-class blueprint on the local-directory substrate: the directory stands in for the
/// machine, so a test can take the "machine" away as a server that stopped before handing the
/// document over would have left it.
const DIR_MACHINE: &str = "name: dir-machine\nversion: v1\nresource_kind: node\nclass: machine\nsubstrate: local-directory\ncomposite: {api_version: test.plexsphere.com/v1, kind: DirMachine}\nparameters: {}\n";

/// A machine-class blueprint on the local-machine substrate, which the outage test replaces
/// with a cloud it can take down and bring back.
const FLAKY_MACHINE: &str = "name: flaky-machine\nversion: v1\nresource_kind: node\nclass: machine\nsubstrate: local-machine\ncomposite: {api_version: test.plexsphere.com/v1, kind: FlakyMachine}\nparameters: {}\n";

/// The broker's state over a fresh SQLite store with the lab seed and one Pending resource of
/// the blueprint `yaml` (added to the built-in catalog), made with a `local` credential sealed
/// as the API would; `local_machine` serves the `local-machine` substrate. Passes are run by
/// the test (`reconcile_one`), not by a loop.
struct PendingLab {
    dir: tempfile::TempDir,
    store: plexsphere::store::Store,
    st: plexsphere::api::AppState,
    project: Uuid,
    id: Uuid,
    now: time::OffsetDateTime,
}

impl PendingLab {
    async fn start(
        yaml: &str,
        local_machine: Option<std::sync::Arc<dyn plexsphere::broker::openstack::Substrate>>,
    ) -> Self {
        use plexsphere::api::{ApiConfig, AppState};
        use plexsphere::broker::BrokerConfig;
        use plexsphere::store::{Store, credentials, resources};

        let dir = tempfile::tempdir().unwrap();
        let certs = plexsphere::tls::ensure_dev_certs(&dir.path().join("tls"), &[]).unwrap();
        let store = common::store::seeded(&Store::sqlite_url(dir.path())).await;
        let now = time::OffsetDateTime::now_utc();
        let mut catalog = plexsphere_broker::Catalog::builtin().unwrap();
        let version = catalog.add_text("test:machine.yaml", yaml).unwrap();
        let mut broker = BrokerConfig::new(catalog);
        broker.public_url = Some("https://localhost:8443".into());
        broker.ca_pem = Some(certs.ca_pem.clone());
        if let Some(substrate) = local_machine {
            broker.local_machine = Ok(substrate);
        }
        let st =
            AppState::with_broker_config(store.clone(), dir.path(), ApiConfig::default(), broker);

        let project: Uuid = LAB_NODES.parse().unwrap();
        let cred = Uuid::now_v7();
        let resource = plexsphere_broker::Resource::new(
            Uuid::now_v7(),
            project,
            "node".into(),
            version,
            cred,
            serde_json::Map::new(),
            now,
        );
        let id = resource.id;
        let mut conn = store.pool().acquire().await.unwrap();
        let c = credentials::CredentialRow {
            id: cred,
            name: "local-cred".into(),
            provider: "local".into(),
            // Sealed as the API would (every pass opens the resource's credential).
            sealed_payload: {
                use base64::Engine as _;
                let kek = plexsphere::keys::Kek::dev(dir.path()).unwrap();
                let key = credential_key(&kek);
                let payload =
                    plexsphere_broker::credentials::CredentialPayload::new(b"{}".to_vec());
                let blob = plexsphere_broker::credentials::seal(&key, cred, &payload).unwrap();
                base64::engine::general_purpose::STANDARD.encode(blob)
            },
            created_at: plexsphere::store::unix(now),
            revoked_at: None,
        };
        credentials::insert(&mut conn, &c).await.unwrap();
        let row = resources::ResourceRow {
            resource,
            token_id: None,
            composite: None,
            provisioned_at: None,
            version: 1,
            updated_at: plexsphere::store::unix(now),
        };
        resources::insert(&mut conn, &row).await.unwrap();
        drop(conn);
        Self {
            dir,
            store,
            st,
            project,
            id,
            now,
        }
    }

    async fn row(&self) -> plexsphere::store::resources::ResourceRow {
        let mut conn = self.store.pool().acquire().await.unwrap();
        plexsphere::store::resources::get(&mut conn, self.id)
            .await
            .unwrap()
            .unwrap()
    }

    /// One reconcile pass over the resource.
    async fn pass(&self) -> Result<(), plexsphere::error::Error> {
        plexsphere::broker::reconcile::reconcile_one(&self.st, self.row().await).await
    }

    /// The tokens bound to the resource, revoked or not.
    async fn bound(&self) -> Vec<plexsphere::store::tokens::TokenRow> {
        let mut conn = self.store.pool().acquire().await.unwrap();
        plexsphere::store::tokens::list_for_project(&mut conn, self.project)
            .await
            .unwrap()
            .into_iter()
            .filter(|t| t.resource_id == Some(self.id))
            .collect()
    }

    /// Back to Pending with everything else kept, as a server that stopped before observing.
    async fn back_to_pending(&self) {
        let mut conn = self.store.pool().acquire().await.unwrap();
        let mut r = plexsphere::store::resources::get(&mut conn, self.id)
            .await
            .unwrap()
            .unwrap();
        r.resource.provisioning.phase = plexsphere_broker::Phase::Pending;
        assert!(
            plexsphere::store::resources::update(
                &mut conn,
                &mut r,
                plexsphere::store::unix(self.now)
            )
            .await
            .unwrap()
        );
    }
}

#[tokio::test]
async fn a_token_is_reminted_only_when_no_machine_was_handed_its_document() {
    let lab = PendingLab::start(DIR_MACHINE, None).await;
    let machine = lab
        .dir
        .path()
        .join("buckets")
        .join(lab.row().await.resource.composed_name());

    // First pass: one token, stored redacted, the "machine" made.
    lab.pass().await.unwrap();
    let first = lab.bound().await;
    assert_eq!(first.len(), 1);
    assert!(machine.is_dir());
    let r = lab.row().await;
    assert_eq!(r.resource.provisioning.phase.as_str(), "Provisioning");
    assert_eq!(r.token_id.as_deref(), Some(first[0].id.as_str()));
    assert!(
        r.composite
            .as_deref()
            .unwrap()
            .contains("<bootstrap token: redacted>")
    );

    // Pending again while the machine exists: it was handed its document; nothing is minted.
    lab.back_to_pending().await;
    lab.pass().await.unwrap();
    let same = lab.bound().await;
    assert_eq!(same.len(), 1, "{same:?}");
    assert!(same[0].revoked_at.is_none());
    assert_eq!(
        lab.row().await.resource.provisioning.phase.as_str(),
        "Provisioning"
    );

    // Pending again and no machine: the old token is revoked, a new one minted and handed over.
    lab.back_to_pending().await;
    std::fs::remove_dir(&machine).unwrap();
    lab.pass().await.unwrap();
    let after = lab.bound().await;
    assert_eq!(after.len(), 2, "{after:?}");
    // Both may be minted in the same second: tell them apart by id, not order.
    let (old, new): (Vec<_>, Vec<_>) = after.iter().partition(|t| t.id == first[0].id);
    assert_eq!((old.len(), new.len()), (1, 1), "{after:?}");
    assert!(old[0].revoked_at.is_some(), "{after:?}");
    assert!(new[0].revoked_at.is_none(), "{after:?}");
    assert!(machine.is_dir());
    let r = lab.row().await;
    assert_eq!(r.token_id.as_deref(), Some(new[0].id.as_str()));
    assert_eq!(r.resource.provisioning.phase.as_str(), "Provisioning");
    assert_eq!(
        cells_holding(lab.store.pool(), "pxbt_").await,
        Vec::<String>::new()
    );
    assert_eq!(
        cells_holding(lab.store.pool(), &format!("_{}_", new[0].id)).await,
        Vec::<String>::new()
    );
}

/// A cloud the test takes down and brings back: while down every call is unreachable; up, it
/// holds the machines it was handed. It counts the provision calls, answered or not.
#[derive(Default)]
struct FlakyCloud {
    down: std::sync::atomic::AtomicBool,
    machines: std::sync::Mutex<std::collections::HashSet<Uuid>>,
    provisions: std::sync::atomic::AtomicUsize,
}

impl FlakyCloud {
    fn set_down(&self, down: bool) {
        self.down.store(down, std::sync::atomic::Ordering::SeqCst);
    }

    fn provisions(&self) -> usize {
        self.provisions.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn up(&self) -> Result<(), plexsphere::broker::openstack::SubstrateError> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(plexsphere::broker::openstack::SubstrateError::Unreachable(
                "the test cloud is down".into(),
            ));
        }
        Ok(())
    }

    fn holds(&self, id: Uuid) -> bool {
        self.machines.lock().unwrap().contains(&id)
    }
}

impl plexsphere::broker::openstack::Substrate for FlakyCloud {
    fn name(&self) -> &'static str {
        "local-machine"
    }

    fn provision(
        &self,
        target: &plexsphere::broker::openstack::Target,
        _composite: &plexsphere_broker::composite::Composite,
    ) -> Result<(), plexsphere::broker::openstack::SubstrateError> {
        self.provisions
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.up()?;
        self.machines.lock().unwrap().insert(target.resource.id);
        Ok(())
    }

    fn observe(
        &self,
        target: &plexsphere::broker::openstack::Target,
    ) -> Result<Vec<plexsphere_broker::Observation>, plexsphere::broker::openstack::SubstrateError>
    {
        self.up()?;
        Ok(if self.holds(target.resource.id) {
            vec![plexsphere_broker::Observation::SubstrateAccepted]
        } else {
            Vec::new()
        })
    }

    fn deprovision(
        &self,
        target: &plexsphere::broker::openstack::Target,
    ) -> Result<(), plexsphere::broker::openstack::SubstrateError> {
        self.up()?;
        self.machines.lock().unwrap().remove(&target.resource.id);
        Ok(())
    }

    fn gone(
        &self,
        target: &plexsphere::broker::openstack::Target,
    ) -> Result<bool, plexsphere::broker::openstack::SubstrateError> {
        self.up()?;
        Ok(!self.holds(target.resource.id))
    }
}

#[tokio::test]
async fn a_cloud_down_for_many_passes_costs_one_remint_and_never_two_live_tokens() {
    let cloud = std::sync::Arc::new(FlakyCloud::default());
    cloud.set_down(true);
    let lab = PendingLab::start(FLAKY_MACHINE, Some(cloud.clone())).await;
    let live = |tokens: &[plexsphere::store::tokens::TokenRow]| {
        tokens.iter().filter(|t| t.revoked_at.is_none()).count()
    };

    // Down for several passes: the first mints the machine's token and tries to hand its
    // document over; the others cannot ask whether the cloud holds the machine, so they mint
    // nothing. The phase stays Pending throughout.
    for pass in 0..5 {
        let e = lab.pass().await.unwrap_err().to_string();
        assert!(e.contains("the test cloud is down"), "pass {pass}: {e}");
        let tokens = lab.bound().await;
        assert_eq!(tokens.len(), 1, "pass {pass}: {tokens:?}");
        assert_eq!(live(&tokens), 1, "pass {pass}: {tokens:?}");
        assert_eq!(
            lab.row().await.resource.provisioning.phase.as_str(),
            "Pending"
        );
    }
    assert_eq!(cloud.provisions(), 1);
    let first = lab.bound().await.remove(0);

    // Back, and holding no machine: the first token is revoked, one new one minted and its
    // document handed over.
    cloud.set_down(false);
    lab.pass().await.unwrap();
    let tokens = lab.bound().await;
    assert_eq!(tokens.len(), 2, "{tokens:?}");
    assert_eq!(live(&tokens), 1, "{tokens:?}");
    let (old, new): (Vec<_>, Vec<_>) = tokens.iter().partition(|t| t.id == first.id);
    assert_eq!((old.len(), new.len()), (1, 1), "{tokens:?}");
    assert!(old[0].revoked_at.is_some(), "{tokens:?}");
    let r = lab.row().await;
    assert_eq!(r.token_id.as_deref(), Some(new[0].id.as_str()));
    assert_eq!(r.resource.provisioning.phase.as_str(), "Provisioning");
    assert_eq!(cloud.provisions(), 2);
    assert!(cloud.holds(lab.id));

    // Up: later passes mint nothing. A second outage, even with the resource Pending again
    // (a server that stopped before observing), mints nothing either: the cloud cannot say
    // the machine is gone, and it is not.
    lab.pass().await.unwrap();
    lab.back_to_pending().await;
    cloud.set_down(true);
    for _ in 0..3 {
        lab.pass().await.unwrap_err();
    }
    cloud.set_down(false);
    lab.pass().await.unwrap();
    let tokens = lab.bound().await;
    assert_eq!(tokens.len(), 2, "{tokens:?}");
    assert_eq!(live(&tokens), 1, "{tokens:?}");
    assert_eq!(cloud.provisions(), 2);
    assert_eq!(
        lab.row().await.resource.provisioning.phase.as_str(),
        "Provisioning"
    );
}
