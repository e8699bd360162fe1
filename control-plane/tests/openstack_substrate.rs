//! The `openstack` substrate against a real cloud: the lab of `scripts/openstack-lab up`
//! (Keystone, Glance, Nova with its fake compute driver, Neutron; docs/openstack-lab.md). The
//! substrate is driven directly, as the reconcile loop drives it: a server `pr-<id>` goes
//! ACTIVE with its metadata and the user data sent, a second provision makes no second server,
//! and deprovision leaves nothing; an unknown image, a wrong secret and a 70 kB document fail
//! the resource with a reason an operator can act on, and a flavor no host can take ends in
//! ERROR with Nova's "No valid host" (a private flavor the test makes with the admin cloud). The
//! lab's admin signs in with a password to show that form works too.
//!
//! Needs the lab: without its env file (`$PLEXSPHERE_OPENSTACK_LAB_DIR/env`, default
//! `/var/lib/plexsphere-openstack-lab/env`) every test here FAILS saying to run
//! `scripts/openstack-lab up`. The admin checks use the `openstack` CLI with the lab's
//! `clouds.yaml`. Only servers named after this test's random resource ids are ever deleted.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use plexsphere::broker::openstack::{OpenStack, Substrate, SubstrateError, Target};
use plexsphere_broker::composite::{Composite, CompositeSpec, Metadata};
use plexsphere_broker::credentials::CredentialPayload;
use plexsphere_broker::{Observation, Phase, Resource};
use serde_json::{Map, Value, json};
use uuid::Uuid;

/// How long a server may take to reach ACTIVE, or to disappear after its delete (the lab's
/// `check` measured 23-49 s and 12-20 s; the lab is shared with builds and other tests).
const BOUND: Duration = Duration::from_secs(180);
const POLL: Duration = Duration::from_secs(2);

fn lab_dir() -> PathBuf {
    std::env::var_os("PLEXSPHERE_OPENSTACK_LAB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/plexsphere-openstack-lab"))
}

/// The lab's variables (`export K=V` lines); panics when the lab is not up.
fn lab() -> BTreeMap<String, String> {
    let path = lab_dir().join("env");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "the OpenStack lab's env file {} cannot be read ({e}): these tests need a real cloud; run `sudo scripts/openstack-lab up` first (docs/openstack-lab.md)",
            path.display()
        )
    });
    let vars: BTreeMap<String, String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("export "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.trim_matches('"').to_owned()))
        .collect();
    for k in [
        "PLEXLAB_AUTH_URL",
        "PLEXLAB_APPLICATION_CREDENTIAL_ID",
        "PLEXLAB_APPLICATION_CREDENTIAL_SECRET",
        "PLEXLAB_FLAVOR",
        "PLEXLAB_IMAGE",
        "PLEXLAB_NETWORK",
    ] {
        assert!(vars.contains_key(k), "{} lacks {k}", path.display());
    }
    vars
}

fn credential(lab: &BTreeMap<String, String>, secret: &str) -> CredentialPayload {
    let mut c = json!({
        "auth_url": lab["PLEXLAB_AUTH_URL"],
        "application_credential_id": lab["PLEXLAB_APPLICATION_CREDENTIAL_ID"],
        "application_credential_secret": secret,
    });
    if let Some(region) = lab.get("PLEXLAB_REGION") {
        c["region"] = json!(region);
    }
    CredentialPayload::new(serde_json::to_vec(&c).unwrap())
}

fn parameters(lab: &BTreeMap<String, String>) -> Map<String, Value> {
    json!({
        "imageName": lab["PLEXLAB_IMAGE"],
        "flavorName": lab["PLEXLAB_FLAVOR"],
        "networkName": lab["PLEXLAB_NETWORK"],
        "configDrive": false,
    })
    .as_object()
    .unwrap()
    .clone()
}

/// A fresh resource and its composite carrying `document` as user data.
fn resource(parameters: Map<String, Value>, document: &str) -> (Resource, Composite) {
    let version = plexsphere_broker::blueprint::version_id("openstack-instance", "v1beta1");
    let r = Resource::new(
        Uuid::new_v4(),
        Uuid::new_v4(),
        "node".into(),
        version,
        Uuid::new_v4(),
        parameters.clone(),
        time::OffsetDateTime::now_utc(),
    );
    let composite = Composite {
        api_version: "openstack.plexsphere.com/v1beta1".into(),
        kind: "OpenStackServer".into(),
        metadata: Metadata {
            name: r.composed_name(),
            namespace: plexsphere_broker::resource::project_namespace(r.project_id),
            labels: BTreeMap::new(),
        },
        spec: CompositeSpec {
            parameters,
            user_data: Some(serde_json::from_value(json!(document)).unwrap()),
            provider_config_ref: None,
        },
    };
    (r, composite)
}

/// `openstack` of the lab's `clouds.yaml` as `cloud`; its stdout.
fn cli(cloud: &str, args: &[&str]) -> String {
    let out = Command::new("openstack")
        .env("OS_CLIENT_CONFIG_FILE", lab_dir().join("clouds.yaml"))
        .env("OS_CLOUD", cloud)
        .args(args)
        .output()
        .expect("the openstack CLI runs (python3-openstackclient, installed by the lab)");
    assert!(
        out.status.success(),
        "openstack {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The ids of the servers named `name` the project sees.
fn server_ids(name: &str) -> Vec<String> {
    let regex = format!("^{name}$");
    cli(
        "plexlab",
        &[
            "server", "list", "--name", &regex, "-f", "value", "-c", "ID",
        ],
    )
    .lines()
    .map(str::trim)
    .filter(|l| !l.is_empty())
    .map(str::to_owned)
    .collect()
}

/// Deletes, by id, every server named after this test's resource, whatever happened.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let regex = format!("^{}$", self.0);
        let Ok(out) = Command::new("openstack")
            .env("OS_CLIENT_CONFIG_FILE", lab_dir().join("clouds.yaml"))
            .env("OS_CLOUD", "plexlab")
            .args([
                "server", "list", "--name", &regex, "-f", "value", "-c", "ID",
            ])
            .output()
        else {
            return;
        };
        for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            eprintln!("cleanup: deleting server {id} ({})", self.0);
            let _ = Command::new("openstack")
                .env("OS_CLIENT_CONFIG_FILE", lab_dir().join("clouds.yaml"))
                .env("OS_CLOUD", "plexlab")
                .args(["server", "delete", id])
                .status();
        }
    }
}

/// Runs a substrate call on a blocking thread, as the reconcile loop does.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, SubstrateError> + Send + 'static,
) -> Result<T, SubstrateError> {
    tokio::task::spawn_blocking(f).await.unwrap()
}

async fn observe_until(
    s: &Arc<OpenStack>,
    t: &Arc<Target>,
    done: impl Fn(&[Observation]) -> bool,
) -> Vec<Observation> {
    let start = Instant::now();
    loop {
        let (s2, t2) = (s.clone(), t.clone());
        let seen = blocking(move || s2.observe(&t2)).await.unwrap();
        if done(&seen) {
            return seen;
        }
        assert!(
            start.elapsed() < BOUND,
            "no wanted observation within {BOUND:?}; last {seen:?}"
        );
        tokio::time::sleep(POLL).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_goes_active_once_and_is_deleted_again() {
    let lab = lab();
    let document =
        "#cloud-config\n# plexsphere openstack_substrate test\nruncmd:\n  - [echo, hello]\n";
    let (r, composite) = resource(parameters(&lab), document);
    let name = r.composed_name();
    let _cleanup = Cleanup(name.clone());
    let s = Arc::new(OpenStack::new());
    let t = Arc::new(Target {
        resource: r.clone(),
        credential: credential(&lab, &lab["PLEXLAB_APPLICATION_CREDENTIAL_SECRET"]),
    });

    let (s2, t2) = (s.clone(), t.clone());
    assert!(blocking(move || s2.gone(&t2)).await.unwrap());
    let (s2, t2, c2) = (s.clone(), t.clone(), composite.clone());
    blocking(move || s2.provision(&t2, &c2)).await.unwrap();
    let seen = observe_until(&s, &t, |o| o.contains(&Observation::MachineBooted)).await;
    assert_eq!(
        seen,
        vec![Observation::SubstrateAccepted, Observation::MachineBooted]
    );

    // One server, named and tagged after the resource, holding the document as user data.
    let ids = server_ids(&name);
    assert_eq!(ids.len(), 1, "{ids:?}");
    let shown: Value = serde_json::from_str(&cli(
        "plexlab-admin",
        &[
            "--os-compute-api-version",
            "2.3",
            "server",
            "show",
            &ids[0],
            "-f",
            "json",
        ],
    ))
    .unwrap();
    assert_eq!(shown["name"], name.as_str());
    assert_eq!(shown["status"], "ACTIVE");
    let properties = shown["properties"].to_string();
    for (key, value) in [
        ("plexsphere-resource-id", r.id.to_string()),
        ("plexsphere-project-id", r.project_id.to_string()),
        (
            "plexsphere-blueprint-version-id",
            r.blueprint_version_id.to_string(),
        ),
    ] {
        assert!(
            properties.contains(key) && properties.contains(&value),
            "{key}={value} not in {properties}"
        );
    }
    let stored = shown["OS-EXT-SRV-ATTR:user_data"]
        .as_str()
        .unwrap_or_else(|| panic!("no user_data in {shown}"));
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(stored)
        .unwrap();
    assert_eq!(String::from_utf8(decoded).unwrap(), document);

    // A second provision (a broker that restarted before its write) finds it and makes none.
    let (s2, t2, c2) = (s.clone(), t.clone(), composite.clone());
    blocking(move || s2.provision(&t2, &c2)).await.unwrap();
    assert_eq!(server_ids(&name), ids);

    // Delete: asked twice (idempotent), then gone, and Nova lists nothing of that name.
    let mut deleting = r.clone();
    deleting.provisioning.phase = Phase::Deprovisioning;
    let t = Arc::new(Target {
        resource: deleting,
        credential: t.credential.clone(),
    });
    for _ in 0..2 {
        let (s2, t2) = (s.clone(), t.clone());
        blocking(move || s2.deprovision(&t2)).await.unwrap();
    }
    let start = Instant::now();
    loop {
        let (s2, t2) = (s.clone(), t.clone());
        if blocking(move || s2.gone(&t2)).await.unwrap() {
            break;
        }
        let (s2, t2) = (s.clone(), t.clone());
        assert_eq!(blocking(move || s2.observe(&t2)).await.unwrap(), vec![]);
        assert!(start.elapsed() < BOUND, "{name} not gone within {BOUND:?}");
        tokio::time::sleep(POLL).await;
    }
    assert_eq!(server_ids(&name), Vec::<String>::new());
    let (s2, t2) = (s.clone(), t.clone());
    blocking(move || s2.deprovision(&t2)).await.unwrap();
}

/// Provisions and expects `Failed`; checks that no server of that name exists.
async fn provision_fails(target: Target, composite: Composite) -> String {
    let name = target.resource.composed_name();
    let _cleanup = Cleanup(name.clone());
    let s = Arc::new(OpenStack::new());
    let t = Arc::new(target);
    let (s2, t2) = (s.clone(), t.clone());
    let reason = match blocking(move || s2.provision(&t2, &composite)).await {
        Err(SubstrateError::Failed(reason)) => reason,
        other => panic!("expected Failed, got {other:?}"),
    };
    assert_eq!(server_ids(&name), Vec::<String>::new(), "{reason}");
    reason
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_image_fails_naming_it_and_what_there_is() {
    let lab = lab();
    let mut params = parameters(&lab);
    let wanted = format!("no-such-image-{}", Uuid::new_v4());
    params.insert("imageName".into(), json!(wanted));
    let (r, composite) = resource(params, "#cloud-config\n");
    let target = Target {
        resource: r,
        credential: credential(&lab, &lab["PLEXLAB_APPLICATION_CREDENTIAL_SECRET"]),
    };
    let reason = provision_fails(target, composite).await;
    assert!(
        reason.starts_with(&format!(
            "no image named {wanted} in the cloud (images visible to the project: "
        )),
        "{reason}"
    );
    assert!(reason.contains(&lab["PLEXLAB_IMAGE"]), "{reason}");
    assert!(reason.contains(&lab["PLEXLAB_AUTH_URL"]), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_secret_fails_with_keystones_message() {
    let lab = lab();
    let (r, composite) = resource(parameters(&lab), "#cloud-config\n");
    let target = Target {
        resource: r,
        credential: credential(&lab, "not-the-secret"),
    };
    let reason = provision_fails(target, composite).await;
    assert_eq!(
        reason,
        format!(
            "Keystone refused the cloud credential {} (cloud {}): The request you have made requires authentication.; create a new application credential and rotate it with `plexctl cloud-credential rotate`",
            lab["PLEXLAB_APPLICATION_CREDENTIAL_ID"], lab["PLEXLAB_AUTH_URL"]
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_70_kb_document_fails_before_any_call() {
    let lab = lab();
    let (r, composite) = resource(parameters(&lab), &"#".repeat(70_000));
    // A cloud nothing listens at: any call would answer Unreachable, not Failed.
    let dead = json!({
        "auth_url": "http://127.0.0.1:9/v3",
        "application_credential_id": "x",
        "application_credential_secret": "y",
    });
    let target = Target {
        resource: r,
        credential: CredentialPayload::new(serde_json::to_vec(&dead).unwrap()),
    };
    let reason = provision_fails(target, composite).await;
    assert_eq!(
        reason,
        "the machine's cloud-init document is 70000 bytes, 93336 bytes as base64, more than the 65535 bytes Nova accepts as user_data; shorten it (fewer packages or files in the blueprint)"
    );
}

/// Deletes, by id, the flavor a test made with the admin cloud.
struct FlavorCleanup(String);

impl Drop for FlavorCleanup {
    fn drop(&mut self) {
        let _ = Command::new("openstack")
            .env("OS_CLIENT_CONFIG_FILE", lab_dir().join("clouds.yaml"))
            .env("OS_CLOUD", "plexlab-admin")
            .args(["flavor", "delete", &self.0])
            .status();
    }
}

/// A private flavor of the test's own, visible to the lab's project; deleted when dropped.
fn private_flavor(ram_mb: &str, disk_gb: &str) -> (String, FlavorCleanup) {
    let name = format!(
        "plexsphere-test-{}",
        &Uuid::new_v4().simple().to_string()[..8]
    );
    let id = cli(
        "plexlab-admin",
        &[
            "flavor",
            "create",
            "--private",
            "--project",
            "plexlab",
            "--ram",
            ram_mb,
            "--disk",
            disk_gb,
            "--vcpus",
            "1",
            &name,
            "-f",
            "value",
            "-c",
            "id",
        ],
    )
    .trim()
    .to_owned();
    (name, FlavorCleanup(id))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flavor_over_the_projects_quota_fails_with_novas_quota_message() {
    let lab = lab();
    // 4,000,000 MB of RAM: over the project's RAM quota (Nova's default 51,200 MB).
    let (flavor, _flavor) = private_flavor("4000000", "1");
    let mut params = parameters(&lab);
    params.insert("flavorName".into(), json!(flavor));
    let (r, composite) = resource(params, "#cloud-config\n");
    let target = Target {
        resource: r,
        credential: credential(&lab, &lab["PLEXLAB_APPLICATION_CREDENTIAL_SECRET"]),
    };
    let reason = provision_fails(target, composite).await;
    assert!(
        reason.contains("(403: Quota exceeded for ram: Requested 4000000"),
        "{reason}"
    );
    assert!(
        reason.contains("the project's quota is used up"),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flavor_no_host_can_take_ends_in_novas_no_valid_host() {
    let lab = lab();
    // 700,000 GB of disk: more than the fake compute host offers (600,000 GB), within quota.
    let (flavor, _flavor) = private_flavor("512", "700000");
    let mut params = parameters(&lab);
    params.insert("flavorName".into(), json!(flavor));
    let (r, composite) = resource(params, "#cloud-config\n");
    let name = r.composed_name();
    let _cleanup = Cleanup(name.clone());
    let s = Arc::new(OpenStack::new());
    let t = Arc::new(Target {
        resource: r.clone(),
        credential: credential(&lab, &lab["PLEXLAB_APPLICATION_CREDENTIAL_SECRET"]),
    });
    let (s2, t2, c2) = (s.clone(), t.clone(), composite.clone());
    blocking(move || s2.provision(&t2, &c2)).await.unwrap();
    let seen = observe_until(&s, &t, |o| {
        o.iter()
            .any(|o| matches!(o, Observation::SubstrateFailed { .. }))
    })
    .await;
    let [Observation::SubstrateFailed { reason }] = seen.as_slice() else {
        panic!("{seen:?}");
    };
    assert!(
        reason.starts_with(&format!(
            "Nova of the cloud {} put the server {name} (",
            lab["PLEXLAB_AUTH_URL"]
        )),
        "{reason}"
    );
    assert!(
        reason.contains("in ERROR: No valid host was found"),
        "{reason}"
    );
    assert!(reason.contains("pick a smaller flavor"), "{reason}");

    // A failed resource is still deleted: the server in ERROR goes.
    let mut deleting = r.clone();
    deleting.provisioning.phase = Phase::Deprovisioning;
    let t = Arc::new(Target {
        resource: deleting,
        credential: t.credential.clone(),
    });
    let (s2, t2) = (s.clone(), t.clone());
    blocking(move || s2.deprovision(&t2)).await.unwrap();
    let start = Instant::now();
    loop {
        let (s2, t2) = (s.clone(), t.clone());
        if blocking(move || s2.gone(&t2)).await.unwrap() {
            break;
        }
        assert!(start.elapsed() < BOUND, "{name} not gone within {BOUND:?}");
        tokio::time::sleep(POLL).await;
    }
    assert_eq!(server_ids(&name), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_sign_in_works_too() {
    let lab = lab();
    // The lab's admin (cloud `plexlab-admin` of clouds.yaml) signs in with a password.
    let path = lab_dir().join("clouds.yaml");
    let clouds: Value = serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let auth = &clouds["clouds"]["plexlab-admin"]["auth"];
    let payload = json!({
        "auth_url": auth["auth_url"],
        "username": auth["username"],
        "password": auth["password"],
        "user_domain_name": auth["user_domain_name"],
        "project_name": auth["project_name"],
        "project_domain_name": auth["project_domain_name"],
        "region": clouds["clouds"]["plexlab-admin"]["region_name"],
    });
    let (r, _) = resource(parameters(&lab), "#cloud-config\n");
    let s = Arc::new(OpenStack::new());
    let t = Arc::new(Target {
        resource: r,
        credential: CredentialPayload::new(serde_json::to_vec(&payload).unwrap()),
    });
    let (s2, t2) = (s.clone(), t.clone());
    assert_eq!(blocking(move || s2.gone(&t2)).await, Ok(true));
    let (s2, t2) = (s.clone(), t.clone());
    assert_eq!(blocking(move || s2.observe(&t2)).await, Ok(vec![]));
}
