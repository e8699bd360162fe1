//! The broker's `openstack` substrate against a real OpenStack (`scripts/openstack-lab`: Debian
//! 12's Keystone, Glance, Placement, Nova API, conductor, scheduler and Neutron, with Nova's own
//! `fake` compute driver), driven the way an operator would: `plexctl cloud-credential create
//! --clouds-yaml`, `plexctl resource create` on `openstack-instance`, `plexctl resource delete`,
//! checked with the admin's `openstack` CLI.
//!
//! With Nova's fake driver (CI) no guest boots, so the test boots the server itself: a
//! systemd-nspawn machine seeded with the user data Nova stored for the server (read back as the
//! admin), on the control plane's bridge. Everything after Nova (cloud-init, `plexd join`, the
//! resource going Ready, the mesh) is the real thing. With `scripts/openstack-lab e2e` (libvirt
//! and qemu) Nova boots the guest itself from the lab's Debian image and config drive, and the
//! same test reads the guest's console through Nova and pings it from the host node.
//!
//! Root only, and the lab must be up (scripts/test brings it up); both fail, never skip.
//! The tests share the lab's project (one quota), so nextest runs them one at a time
//! (.config/nextest.toml, group `openstack`).

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::Path;
use std::time::{Duration, Instant};

use plexsphere_e2e::broker::{BrokerLab, blueprint_version, create_node, delete_resource, json};
use plexsphere_e2e::machines::preflight;
use plexsphere_e2e::openstack::{OpenStackLab, QuotaReset};
use plexsphere_e2e::{ControlPlane, wait_until};
use serde_json::Value;

const BOUND: Duration = Duration::from_secs(240);
/// How long a guest Nova boots under qemu's software emulation may take to enrol (about 80 s to
/// cloud-init's end when measured; 2-core machines shared with builds are slower).
const GUEST_BOUND: Duration = Duration::from_secs(900);

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

/// `plexctl cloud-credential create --provider openstack` from a cloud of the lab's clouds.yaml.
fn credential(cp: &ControlPlane, lab: &OpenStackLab, cloud: &str) -> String {
    let out = cp
        .plexctl_ok(&[
            "cloud-credential",
            "create",
            "--name",
            cloud,
            "--provider",
            "openstack",
            "--clouds-yaml",
            &lab.clouds_yaml().to_string_lossy(),
            "--cloud",
            cloud,
            "--output",
            "json",
        ])
        .unwrap();
    json(&out).unwrap()["id"].as_str().unwrap().to_owned()
}

/// `plexctl cloud-credential create --provider openstack --payload-file` of `payload`.
fn credential_from(cp: &ControlPlane, dir: &Path, name: &str, payload: Value) -> String {
    let file = dir.join(format!("{name}.json"));
    std::fs::write(&file, payload.to_string()).unwrap();
    let out = cp
        .plexctl_ok(&[
            "cloud-credential",
            "create",
            "--name",
            name,
            "--provider",
            "openstack",
            "--payload-file",
            &file.to_string_lossy(),
            "--output",
            "json",
        ])
        .unwrap();
    json(&out).unwrap()["id"].as_str().unwrap().to_owned()
}

/// The lab's image, flavor and network, with `over` replacing some.
fn parameters(lab: &OpenStackLab, over: Value) -> String {
    let mut p = serde_json::json!({
        "imageName": lab.var("PLEXLAB_IMAGE").unwrap(),
        "flavorName": lab.var("PLEXLAB_FLAVOR").unwrap(),
        "networkName": lab.var("PLEXLAB_NETWORK").unwrap(),
    });
    for (k, v) in over.as_object().unwrap() {
        p[k] = v.clone();
    }
    p.to_string()
}

/// `resource create` (no wait): the resource's id.
fn create(cp: &ControlPlane, version: &str, cred: &str, params: &str) -> String {
    let out = create_node(cp, version, cred, params, &[]).unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "resource create: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    json(&stdout).unwrap()["id"].as_str().unwrap().to_owned()
}

fn get(cp: &ControlPlane, id: &str) -> Value {
    json(
        &cp.plexctl_ok(&["resource", "get", id, "--output", "json"])
            .unwrap(),
    )
    .unwrap()
}

fn phase(r: &Value) -> &str {
    r["provisioning"]["phase"].as_str().unwrap_or("?")
}

fn history(r: &Value) -> Vec<String> {
    r["provisioning"]["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["phase"].as_str().unwrap().to_owned())
        .collect()
}

/// Waits until the resource is in `want`; a resource that fails meanwhile fails the test with
/// its reason (unless `want` is Failed).
fn wait_phase(cp: &ControlPlane, id: &str, want: &str) -> Value {
    wait_phase_within(cp, id, want, BOUND)
}

fn wait_phase_within(cp: &ControlPlane, id: &str, want: &str, bound: Duration) -> Value {
    wait_until(bound, &format!("resource {id} in {want}"), || {
        let r = get(cp, id);
        if phase(&r) == want {
            return Ok(Some(r));
        }
        anyhow::ensure!(
            phase(&r) != "Failed",
            "resource {id} failed: {}",
            r["provisioning"]["reason"]
        );
        Ok(None)
    })
    .unwrap()
}

/// `resource delete --wait` (Deprovisioning, Deleted), then Nova lists no server of that name.
fn delete_and_check_gone(cp: &ControlPlane, lab: &OpenStackLab, id: &str) {
    delete_resource(cp, id, "4m").unwrap();
    assert_eq!(
        lab.servers_named(&format!("pr-{id}")).unwrap(),
        Vec::<Value>::new(),
        "Nova still lists the server of {id}"
    );
}

/// Waits until the resource is Ready (through Pending, Provisioning and Enrolling) and the
/// guest's console, as `console` reads it, shows plexd join's `node_id:` (of the resource's
/// node) and `mesh_ip:` lines; the node's id.
fn ready_with_join_lines(
    cp: &ControlPlane,
    id: &str,
    bound: Duration,
    console: impl Fn() -> anyhow::Result<String>,
) -> String {
    let ready = wait_phase_within(cp, id, "Ready", bound);
    assert_eq!(
        history(&ready),
        ["Pending", "Provisioning", "Enrolling", "Ready"],
        "{ready}"
    );
    let node_id = ready["node_id"].as_str().unwrap().to_owned();
    let text = wait_until(BOUND, "plexd join's lines in the console log", || {
        let c = console()?;
        Ok(c.contains("mesh_ip: ").then_some(c))
    })
    .unwrap();
    assert!(text.contains(&format!("node_id: {node_id}")), "{text}");
    node_id
}

/// Destroys the machine that played the Nova server, however the test ends.
struct Guest(plexsphere_nspawn::Machine);

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.0.destroy();
    }
}

/// Boots the server Nova recorded: a machine on the lab's bridge seeded with the user data
/// Nova stored for it (the fake driver boots nothing itself).
fn boot_as_nova_would(
    state: &Path,
    bridge: &str,
    host_ip: std::net::Ipv4Addr,
    server_id: &str,
    user_data: String,
) -> Guest {
    let image =
        plexsphere_nspawn::BaseImage::ensure(Path::new(plexsphere_nspawn::DEFAULT_IMAGE_CACHE))
            .unwrap();
    let net = ipnet::Ipv4Net::new(host_ip, 24).unwrap();
    let address = plexsphere_nspawn::machine_address(net.trunc(), 200).unwrap();
    let m = plexsphere_nspawn::Machine::create(
        state,
        plexsphere_nspawn::MachineSpec {
            name: "nova-guest".into(),
            image,
            bridge: bridge.to_owned(),
            address,
            gateway: host_ip,
            seed: plexsphere_nspawn::NoCloudSeed {
                instance_id: server_id.to_owned(),
                user_data,
            },
            files: Vec::new(),
        },
    )
    .unwrap();
    Guest(m)
}

/// Starts Keystone again (`scripts/openstack-lab up`) however the test ends.
struct KeystoneBack<'a>(&'a OpenStackLab);

impl Drop for KeystoneBack<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.0.up(repo()) {
            eprintln!("cannot start Keystone again: {e}");
        }
    }
}

#[test]
fn a_nova_server_made_by_the_broker_enrols_meshes_and_is_deleted() {
    preflight().unwrap();
    let lab = OpenStackLab::open().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let bridge = format!("plxos{}", std::process::id() % 10000);
    let host_ip: std::net::Ipv4Addr = "172.30.243.1".parse().unwrap();
    let blab = BrokerLab::start(&tmp.path().join("cp"), &bridge, &host_ip.to_string()).unwrap();
    let cp = &blab.cp;
    let cred = credential(cp, &lab, "plexlab");
    let version = blueprint_version(cp, "openstack-instance", "openstack").unwrap();

    // A host node to reach over the mesh: a local machine through the same broker.
    let host = json(&String::from_utf8_lossy(
        &blab
            .create(r#"{"release":"bookworm"}"#, &[])
            .unwrap()
            .stdout,
    ))
    .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();

    let id = create(
        cp,
        &version,
        &cred,
        &parameters(&lab, serde_json::json!({})),
    );
    let enrolling = wait_phase(cp, &id, "Enrolling");
    assert_eq!(
        history(&enrolling),
        ["Pending", "Provisioning", "Enrolling"],
        "{enrolling}"
    );

    // Nova holds one server named after the resource, tied to it by metadata, ACTIVE, with
    // the broker's cloud-init document as its user data.
    let servers = lab.servers_named(&format!("pr-{id}")).unwrap();
    assert_eq!(servers.len(), 1, "{servers:?}");
    let server = &servers[0];
    assert_eq!(server["status"], "ACTIVE", "{server}");
    let meta = server["properties"].to_string();
    assert!(meta.contains(&id), "metadata names the resource: {meta}");
    let user_data = lab.user_data(server).unwrap();
    assert!(user_data.starts_with("#cloud-config"), "{user_data}");
    assert!(
        user_data.contains(&cp.url),
        "the document names the API: {user_data}"
    );
    let stored = cp
        .plexctl_ok(&["resource", "get", &id, "--output", "json"])
        .unwrap();
    assert!(!stored.contains("pxbt_"), "no token in the API's answer");

    let host_ready = wait_phase(cp, &host, "Ready");
    let host_ip_mesh = cp.node(host_ready["node_id"].as_str().unwrap()).unwrap()["mesh_ip"]
        .as_str()
        .unwrap()
        .to_owned();
    let server_id = server["id"].as_str().unwrap().to_owned();
    if lab.boots_guests() {
        // Nova booted the guest itself (libvirt, qemu): it enrols, its console (read through
        // Nova, as an operator would) shows plexd join's lines, and the host node reaches it
        // over the mesh.
        let node_id = ready_with_join_lines(cp, &id, GUEST_BOUND, || lab.console_log(&server_id));
        let guest_mesh_ip = cp.node(&node_id).unwrap()["mesh_ip"]
            .as_str()
            .unwrap()
            .to_owned();
        let host_machine = blab.machine(&host).unwrap();
        wait_until(BOUND, "a ping over the mesh to the Nova guest", || {
            let out = host_machine.exec(&["ping", "-c", "1", "-W", "2", &guest_mesh_ip])?;
            Ok(out.status.success().then_some(()))
        })
        .unwrap();
    } else {
        // The machine Nova would have booted, from what Nova stored: it enrols, and the
        // resource goes Ready with its node.
        let guest = boot_as_nova_would(
            &tmp.path().join("guest"),
            &bridge,
            host_ip,
            &server_id,
            user_data,
        );
        ready_with_join_lines(cp, &id, BOUND, || {
            Ok(std::fs::read_to_string(guest.0.console_path()).unwrap_or_default())
        });
        // It reaches the host node over the mesh.
        wait_until(BOUND, "a ping over the mesh from the Nova server", || {
            let out = guest
                .0
                .exec(&["ping", "-c", "1", "-W", "2", &host_ip_mesh])?;
            Ok(out.status.success().then_some(()))
        })
        .unwrap();
    }

    // Delete: Deprovisioning, Deleted, and Nova lists nothing.
    delete_and_check_gone(cp, &lab, &id);
    let _ = blab.delete(&host);
}

/// The faults an operator meets, each ending in the phase and message docs/broker.md promises,
/// with no server left behind once the resource is deleted.
#[test]
fn openstack_faults_end_in_the_promised_phase_and_leave_no_server() {
    preflight().unwrap();
    let lab = OpenStackLab::open().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("cp");
    let cp = ControlPlane::start_dev_with(&data, &["--reconcile-secs", "1"]).unwrap();
    let good = credential(&cp, &lab, "plexlab");
    let version = blueprint_version(&cp, "openstack-instance", "openstack").unwrap();
    let failed = |id: &str, text: &str| {
        let r = wait_phase(&cp, id, "Failed");
        let reason = r["provisioning"]["reason"].as_str().unwrap_or_default();
        assert!(reason.contains(text), "{id}: {reason}");
        eprintln!("--- {id} failed as promised: {reason}");
    };
    let failed_with = |id: &str, text: &str| {
        failed(id, text);
        delete_and_check_gone(&cp, &lab, id);
    };

    // An image that does not exist: Failed naming it, no server.
    let id = create(
        &cp,
        &version,
        &good,
        &parameters(&lab, serde_json::json!({"imageName": "no-such-image"})),
    );
    failed_with(&id, "no image named no-such-image");

    // A flavor whose disk is smaller than the image needs: Nova's 400, as Failed.
    lab.ensure_image_needing_disk("plexlab-needs-5g", 5)
        .unwrap();
    let id = create(
        &cp,
        &version,
        &good,
        &parameters(&lab, serde_json::json!({"imageName": "plexlab-needs-5g"})),
    );
    failed_with(&id, "too small");

    // Nova puts the server in ERROR (the fake host has 600 TB of disk, the flavor wants 700 TB,
    // and disk is not under quota): Failed with Nova's fault; the delete removes the server.
    lab.ensure_flavor("plexlab-700tb-disk", 512, 700_000)
        .unwrap();
    let id = create(
        &cp,
        &version,
        &good,
        &parameters(
            &lab,
            serde_json::json!({"flavorName": "plexlab-700tb-disk"}),
        ),
    );
    failed_with(&id, "No valid host");

    // A quota with room for one more server: the second fails with Nova's quota message.
    {
        let _reset = QuotaReset(&lab);
        // One more than the project holds now (a run that stopped midway may have left one).
        let quota = lab.servers_in_project().unwrap() + 1;
        lab.set_instance_quota(u32::try_from(quota).unwrap())
            .unwrap();
        let first = create(
            &cp,
            &version,
            &good,
            &parameters(&lab, serde_json::json!({})),
        );
        wait_phase(&cp, &first, "Enrolling");
        let second = create(
            &cp,
            &version,
            &good,
            &parameters(&lab, serde_json::json!({})),
        );
        failed_with(&second, "uota");
        delete_and_check_gone(&cp, &lab, &first);
    }

    // A credential Keystone refuses: Failed with Keystone's answer, and what to do.
    let wrong = credential_from(
        &cp,
        tmp.path(),
        "wrong",
        serde_json::json!({
            "auth_url": lab.var("PLEXLAB_AUTH_URL").unwrap(),
            "region": lab.var("PLEXLAB_REGION").unwrap(),
            "application_credential_id": lab.var("PLEXLAB_APPLICATION_CREDENTIAL_ID").unwrap(),
            "application_credential_secret": "not-the-secret",
        }),
    );
    let id = create(
        &cp,
        &version,
        &wrong,
        &parameters(&lab, serde_json::json!({})),
    );
    failed(&id, "Keystone refused");
    // Deleting asks the cloud too (the credential may have made a server before Keystone
    // stopped taking it): refused the same way, so nothing is called Deleted that may still
    // run. Rotated to a credential Keystone takes, the delete goes through.
    let out = cp
        .plexctl(&[
            "resource",
            "delete",
            &id,
            "--yes",
            "--wait",
            "--timeout",
            "2m",
        ])
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Keystone refused"), "{err}");
    assert!(err.contains("cloud-credential rotate"), "{err}");
    cp.plexctl_ok(&[
        "cloud-credential",
        "rotate",
        &wrong,
        "--clouds-yaml",
        &lab.clouds_yaml().to_string_lossy(),
        "--cloud",
        "plexlab",
    ])
    .unwrap();
    delete_and_check_gone(&cp, &lab, &id);

    // Keystone down: the resource waits in Pending (nothing is concluded from an unreachable
    // cloud), and goes on once Keystone is back. The broker keeps a token per payload, so this
    // credential's payload differs from the others' (no region: the catalog's only one) and
    // the broker has to sign in while Keystone is down.
    let fresh = credential_from(
        &cp,
        tmp.path(),
        "fresh",
        serde_json::json!({
            "auth_url": lab.var("PLEXLAB_AUTH_URL").unwrap(),
            "application_credential_id": lab.var("PLEXLAB_APPLICATION_CREDENTIAL_ID").unwrap(),
            "application_credential_secret":
                lab.var("PLEXLAB_APPLICATION_CREDENTIAL_SECRET").unwrap(),
        }),
    );
    let keystone_back = KeystoneBack(&lab);
    lab.stop_keystone().unwrap();
    let id = create(
        &cp,
        &version,
        &fresh,
        &parameters(&lab, serde_json::json!({})),
    );
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        let r = get(&cp, &id);
        assert_eq!(phase(&r), "Pending", "while Keystone is down: {r}");
        std::thread::sleep(Duration::from_secs(2));
    }
    drop(keystone_back);
    wait_phase(&cp, &id, "Enrolling");
    delete_and_check_gone(&cp, &lab, &id);

    // The broker killed right after Nova accepted the server: the restarted broker finds the
    // server again by its name and metadata and never makes a second one.
    let id = create(
        &cp,
        &version,
        &good,
        &parameters(&lab, serde_json::json!({})),
    );
    wait_until(BOUND, "Nova lists the new server", || {
        Ok((!lab.servers_named(&format!("pr-{id}"))?.is_empty()).then_some(()))
    })
    .unwrap();
    drop(cp); // SIGKILL (Proc's drop)
    let cp = ControlPlane::start_dev_with(&data, &["--reconcile-secs", "1"]).unwrap();
    wait_phase(&cp, &id, "Enrolling");
    std::thread::sleep(Duration::from_secs(3)); // a few more passes
    assert_eq!(lab.servers_named(&format!("pr-{id}")).unwrap().len(), 1);
    delete_and_check_gone(&cp, &lab, &id);
}
