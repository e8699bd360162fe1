//! The rendered cloud-init document and Crossplane composite, pinned by checked-in files.
//! `UPDATE_GOLDEN=1 cargo test -p plexsphere-broker --test golden` accepts a reviewed change.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

mod common;

use plexsphere_broker::{Catalog, Resource, crossplane, resolve};
use serde_json::json;
use time::macros::datetime;

#[test]
fn cloud_init_document_matches_golden_and_the_example() {
    let doc = common::document();
    common::golden(
        &common::crate_dir().join("tests/golden/cloud-init.yaml"),
        doc.as_str(),
    );
    common::golden(
        &common::repo_dir().join("cloud-init/examples/user-data.yaml"),
        doc.as_str(),
    );
}

fn openstack_resource(params: serde_json::Value) -> (plexsphere_broker::Blueprint, Resource) {
    let catalog = Catalog::builtin().unwrap();
    let entry = catalog.find("openstack-instance", "v1alpha2").unwrap();
    let resolved = resolve(&entry.blueprint, &params).unwrap();
    let r = Resource::new(
        common::RESOURCE,
        common::PROJECT,
        entry.blueprint.resource_kind.clone(),
        entry.version_id,
        common::CREDENTIAL,
        resolved,
        datetime!(2026-11-30 14:31:02 UTC),
    );
    (entry.blueprint.clone(), r)
}

#[test]
fn openstack_instance_composite_matches_golden() {
    let (bp, r) = openstack_resource(json!({
        "imageName": "Ubuntu 24.04 Noble Numbat x86_64",
        "flavorName": "1C-2GB-20GB",
        "networkName": "plexsphere-project-019a0816-0000-7000-8000-000000000001",
        "availabilityZone": "nova"
    }));
    let c = crossplane::composite(&bp, &r, Some(common::document())).unwrap();
    let yaml = crossplane::to_yaml(&c).unwrap();
    common::golden(
        &common::crate_dir().join("tests/golden/openstack-instance-composite.yaml"),
        &yaml,
    );
    common::golden(
        &common::repo_dir().join("cloud-init/examples/openstack-instance-composite.yaml"),
        &yaml,
    );
    // The user data inside is the document itself, byte for byte.
    let v: serde_yaml::Value = serde_yaml::from_str(&yaml).unwrap();
    assert_eq!(
        v["spec"]["userData"].as_str(),
        Some(common::document().as_str())
    );
    assert_eq!(
        v["metadata"]["name"].as_str(),
        Some("pr-019fb9d7-fb6c-7681-a082-07407e041cc0")
    );
    assert_eq!(
        v["metadata"]["namespace"].as_str(),
        Some("plexsphere-project-019a0816-0000-7000-8000-000000000001")
    );
}

#[test]
fn the_stored_composite_matches_golden_and_holds_no_token() {
    let (bp, r) = openstack_resource(json!({
        "imageName": "Ubuntu 24.04 Noble Numbat x86_64",
        "flavorName": "1C-2GB-20GB",
        "networkName": "plexsphere-project-019a0816-0000-7000-8000-000000000001",
        "availabilityZone": "nova"
    }));
    let token = common::token();
    let stored = common::document().redacted(&token);
    let c = crossplane::composite(&bp, &r, Some(stored.clone())).unwrap();
    let yaml = crossplane::to_yaml(&c).unwrap();
    common::golden(
        &common::repo_dir().join("cloud-init/examples/openstack-instance-composite.stored.yaml"),
        &yaml,
    );
    assert!(!yaml.contains(&token.expose()), "{yaml}");
    assert!(!yaml.contains(token.secret.expose()), "{yaml}");
    assert!(
        yaml.contains(plexsphere_broker::cloudinit::REDACTED_TOKEN),
        "{yaml}"
    );
    let v: serde_yaml::Value = serde_yaml::from_str(&yaml).unwrap();
    assert_eq!(v["spec"]["userData"].as_str(), Some(stored.as_str()));
}

#[test]
fn availability_zone_is_left_out_when_not_given() {
    let (bp, r) = openstack_resource(json!({
        "imageName": "ubuntu-24.04",
        "flavorName": "m1.small",
        "networkName": "lab"
    }));
    let c = crossplane::composite(&bp, &r, Some(common::document())).unwrap();
    let yaml = crossplane::to_yaml(&c).unwrap();
    let v: serde_yaml::Value = serde_yaml::from_str(&yaml).unwrap();
    let params = v["spec"]["parameters"].as_mapping().unwrap();
    assert_eq!(params.len(), 3);
    assert!(!params.contains_key("availabilityZone"));
    assert_eq!(
        v["spec"]["providerConfigRef"]["name"].as_str(),
        Some("cloud-credential-019a0816-0000-7000-8000-0000000000cc")
    );
    // Debug of the composite never shows the token.
    let dbg = format!("{c:?}");
    assert!(!dbg.contains(&common::token().expose()), "{dbg}");
}

#[test]
fn the_composite_refuses_the_wrong_substrate_or_a_missing_document() {
    let catalog = Catalog::builtin().unwrap();
    let (bp, r) =
        openstack_resource(json!({"imageName": "i", "flavorName": "f", "networkName": "n"}));
    let e = crossplane::composite(&bp, &r, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("is a machine") && e.contains("needs a cloud-init document"),
        "{e}"
    );

    let bucket = &catalog.find("local-bucket", "v1").unwrap().blueprint;
    let e = crossplane::composite(bucket, &r, None)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "blueprint local-bucket@v1 runs on the local-directory substrate, not crossplane"
    );

    // The generic composite of a local bucket: standalone, so no user data is accepted.
    let b = Resource::new(
        common::RESOURCE,
        common::PROJECT,
        "bucket".into(),
        bucket.version_id(),
        common::CREDENTIAL,
        resolve(bucket, &json!({"region": "us-east-1"})).unwrap(),
        datetime!(2026-11-30 14:31:02 UTC),
    );
    let e = plexsphere_broker::composite::render(bucket, &b, Some(common::document()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("takes no cloud-init document"), "{e}");
    let c = plexsphere_broker::composite::render(bucket, &b, None).unwrap();
    assert_eq!(
        (c.kind.as_str(), c.metadata.name.as_str()),
        ("LocalBucket", "pr-019fb9d7-fb6c-7681-a082-07407e041cc0")
    );
    assert_eq!(c.spec.parameters["region"], "us-east-1");
    // A resource of one blueprint is never rendered with another.
    let e = plexsphere_broker::composite::render(&bp, &b, Some(common::document())).unwrap_err();
    assert!(
        e.to_string().contains("was created from blueprint version"),
        "{e}"
    );
}
