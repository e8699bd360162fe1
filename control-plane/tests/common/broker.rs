//! What the broker's tests share: a cloud credential, the key credentials are sealed under, a
//! bucket request, waiting on a resource's phase, and its phase and history as the API shows
//! them.

use std::time::{Duration, Instant};

use plexsphere::keys::Kek;
use plexsphere_broker::blueprint::version_id;
use plexsphere_broker::credentials::CredentialKey;
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::TestServer;

pub async fn credential(srv: &TestServer, provider: &str) -> String {
    let (status, body) = srv
        .op_post(
            "/v1/cloud-credentials",
            json!({"name": format!("{provider}-cred"), "provider": provider, "payload": payload_for(provider)}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["id"].as_str().unwrap().to_owned()
}

/// A payload the provider takes: an OpenStack one names a Keystone and an application
/// credential (nothing answers there; the tests using it never reach the cloud).
fn payload_for(provider: &str) -> Value {
    match provider {
        "openstack" => json!({"auth_url": "http://127.0.0.1:9/v3",
            "application_credential_id": "id", "application_credential_secret": "secret"}),
        _ => json!({"user": "u"}),
    }
}

/// The key the server seals cloud credentials under with `kek`: 32 bytes derived from the KEK
/// with HKDF-SHA256. The label is written out here, not taken from the server's constant, so a
/// change to it (which would leave every stored credential unopenable) fails the tests.
pub fn credential_key(kek: &Kek) -> CredentialKey {
    CredentialKey::from_bytes(&kek.derive_key_bytes(b"plexsphere cloud credential sealing key v1"))
        .unwrap()
}

pub fn bucket_request(cred: &str, parameters: Value) -> Value {
    json!({
        "kind": "bucket",
        "blueprint_version_id": version_id("local-bucket", "v1"),
        "cloud_credential_id": cred,
        "parameters": parameters,
    })
}

/// Polls the resource until `done` holds on it (bounded), answering it.
pub async fn wait_for(
    srv: &TestServer,
    id: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = srv.op_get(&format!("/v1/resources/{id}")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        if done(&body) {
            return body;
        }
        assert!(Instant::now() < deadline, "resource never {what}: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn phase(r: &Value) -> &str {
    r["provisioning"]["phase"].as_str().unwrap()
}

pub fn history(r: &Value) -> Vec<String> {
    r["provisioning"]["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["phase"].as_str().unwrap().to_owned())
        .collect()
}
