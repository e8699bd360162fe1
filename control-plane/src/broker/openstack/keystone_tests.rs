//! Keystone: the sign-in bodies and the endpoint choice, over a catalog recorded from the lab.

use super::*;
use crate::broker::openstack::credential::parse;

const LAB_TOKEN: &[u8] = include_bytes!("testdata/keystone_token.json");

#[test]
fn the_tokens_url_gets_v3_when_it_lacks_it() {
    assert_eq!(
        tokens_url("http://127.0.0.1:5000/v3"),
        "http://127.0.0.1:5000/v3/auth/tokens"
    );
    assert_eq!(
        tokens_url("https://k.example/v3/"),
        "https://k.example/v3/auth/tokens"
    );
    assert_eq!(
        tokens_url("https://k.example:5000"),
        "https://k.example:5000/v3/auth/tokens"
    );
}

#[test]
fn sign_in_bodies_follow_keystone_v3() {
    let app = parse(br#"{"auth_url":"https://k/v3","application_credential_id":"i","application_credential_secret":"s"}"#).unwrap();
    assert_eq!(
        auth_body(&app),
        serde_json::json!({"auth":{"identity":{"methods":["application_credential"],"application_credential":{"id":"i","secret":"s"}}}})
    );
    let named = parse(br#"{"auth_url":"https://k/v3","application_credential_name":"n","username":"u","user_domain_name":"D","application_credential_secret":"s"}"#).unwrap();
    assert_eq!(
        auth_body(&named)["auth"]["identity"]["application_credential"],
        serde_json::json!({"name":"n","secret":"s","user":{"name":"u","domain":{"name":"D"}}})
    );
    let password = parse(
        br#"{"auth_url":"https://k/v3","username":"u","password":"p","project_name":"proj"}"#,
    )
    .unwrap();
    assert_eq!(
        auth_body(&password),
        serde_json::json!({"auth":{
            "identity":{"methods":["password"],"password":{"user":{"name":"u","domain":{"name":"Default"},"password":"p"}}},
            "scope":{"project":{"name":"proj","domain":{"name":"Default"}}}
        }})
    );
}

#[test]
fn the_lab_catalog_gives_the_three_endpoints() {
    let issued = parse_issued(LAB_TOKEN, None, "public").unwrap();
    assert_eq!(
        issued.endpoints,
        Endpoints {
            compute: "http://127.0.0.1:8774/v2.1".into(),
            image: "http://127.0.0.1:9292".into(),
            network: "http://127.0.0.1:9696".into(),
        }
    );
    assert_eq!(issued.expires_at.year(), 2026);
    assert!(issued.project_id.is_some());
    let same = parse_issued(LAB_TOKEN, Some("RegionOne"), "internal").unwrap();
    assert_eq!(same.endpoints.compute, "http://127.0.0.1:8774/v2.1");
    let e = parse_issued(LAB_TOKEN, Some("RegionTwo"), "public").unwrap_err();
    assert_eq!(
        e,
        "the cloud's catalog has no public compute endpoint in region RegionTwo; it has regions RegionOne; set `region` in the credential to one of them"
    );
}

fn two_regions() -> Vec<Service> {
    serde_json::from_value(serde_json::json!([
        {"type": "compute", "endpoints": [
            {"interface": "public", "region_id": "east", "region": "east", "url": "https://nova.east/v2.1/"},
            {"interface": "internal", "region_id": "east", "region": "east", "url": "http://nova.east.internal/v2.1"},
            {"interface": "public", "region_id": "west", "region": "west", "url": "https://nova.west/v2.1"}
        ]},
        {"type": "image", "endpoints": [
            {"interface": "public", "region_id": "west", "url": "https://glance.west/v2"}
        ]}
    ]))
    .unwrap()
}

#[test]
fn several_regions_need_the_credentials_region() {
    let catalog = two_regions();
    let e = endpoint(&catalog, "compute", "public", None).unwrap_err();
    assert_eq!(
        e,
        "the cloud's catalog has compute in several regions (east, west); set `region` in the credential to one of them"
    );
    assert_eq!(
        endpoint(&catalog, "compute", "public", Some("west")).unwrap(),
        "https://nova.west/v2.1"
    );
    assert_eq!(
        endpoint(&catalog, "compute", "public", Some("east")).unwrap(),
        "https://nova.east/v2.1"
    );
    assert_eq!(
        endpoint(&catalog, "compute", "internal", None).unwrap(),
        "http://nova.east.internal/v2.1"
    );
    // One region for the image service: no region needed.
    assert_eq!(
        endpoint(&catalog, "image", "public", None).unwrap(),
        "https://glance.west/v2"
    );
    let e = endpoint(&catalog, "network", "public", None).unwrap_err();
    assert!(e.contains("no public endpoint of type network"), "{e}");
}
