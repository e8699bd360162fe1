//! What the backup tests share: `plexsphere` run to its end, nodes enrolled through a dev
//! process, a node's calls checked against the Domain key it got, a directory listed.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use plexsphere_wire::RegisterResponse;
use plexsphere_wire::node::NodeState;
use plexsphere_wire::signed::{DomainVerifier, SignContext, SignedEnvelope};

use super::dev::BIN;
use super::process::{DevProcess, join_all};

pub const ANSWER_WITHIN: Duration = Duration::from_secs(20);

/// Runs `plexsphere <args>` to its end: exit code, stdout and stderr.
pub fn plexsphere(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Registers one node per token (key numbers from `first_key`); answers their registrations.
pub async fn enrol(
    dev: Arc<DevProcess>,
    tokens: Vec<String>,
    first_key: u32,
) -> Vec<RegisterResponse> {
    let calls = tokens.into_iter().enumerate().map(|(i, token)| {
        let dev = dev.clone();
        async move {
            let key = first_key + u32::try_from(i).unwrap();
            let (status, body) = dev.register(&token, key, ANSWER_WITHIN).await.unwrap();
            assert_eq!(status, 201, "{body}");
            serde_json::from_value::<RegisterResponse>(body).unwrap()
        }
    });
    join_all(calls).await
}

/// A node's heartbeat and signed state against `dev`, with its own credential: the state must
/// verify with the Domain key the node got at registration. Answers the state's version.
pub async fn node_works(dev: &DevProcess, reg: &RegisterResponse) -> u64 {
    let heartbeat = serde_json::json!({
        "uptime_secs": 1,
        "plexd_version": "0.1.0",
        "state_version": null,
        "peers": {"configured": 0, "connected": 0},
    });
    let r = dev
        .client
        .post(dev.url(&format!("/v1/nodes/{}/heartbeat", reg.node_id)))
        .bearer_auth(&reg.node_credential)
        .json(&heartbeat)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let r = dev
        .client
        .get(dev.url(&format!("/v1/nodes/{}/state", reg.node_id)))
        .bearer_auth(&reg.node_credential)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let env: SignedEnvelope = r.json().await.unwrap();
    let verifier = DomainVerifier::from_b64(&reg.domain_signing_public_key).unwrap();
    let state: NodeState = verifier.open(SignContext::NodeState, &env).unwrap();
    assert_eq!(state.mesh_ip, reg.mesh_ip);
    state.version
}

/// Every file below `dir`, as paths relative to it ("tls/ca.crt").
pub fn list_files(dir: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                pending.push(entry.path());
            } else {
                let rel = entry.path().strip_prefix(dir).unwrap().to_owned();
                out.insert(rel.to_str().unwrap().to_owned());
            }
        }
    }
    out
}
