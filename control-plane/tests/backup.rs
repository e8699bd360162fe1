//! `plexsphere backup` while nodes register, `plexsphere restore` into another data directory,
//! and the nodes keep working with the restored server: the same credentials, the same CA and
//! the same Domain key. Real `plexsphere` processes.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use plexsphere_wire::RegisterResponse;
use plexsphere_wire::node::NodeState;
use plexsphere_wire::signed::{DomainVerifier, SignContext, SignedEnvelope};

mod common;

use common::dev::BIN;
use common::process::{DevProcess, join_all};

const ANSWER_WITHIN: Duration = Duration::from_secs(20);

/// Runs `plexsphere <args>` to its end: exit code, stdout and stderr.
fn plexsphere(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Registers one node per token (key numbers from `first_key`); answers their registrations.
async fn enrol(dev: Arc<DevProcess>, tokens: Vec<String>, first_key: u32) -> Vec<RegisterResponse> {
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
/// verify with the Domain key the node got at registration.
async fn node_works(dev: &DevProcess, reg: &RegisterResponse) {
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_under_load_restores_into_a_server_the_nodes_keep_working_with() {
    let dir = tempfile::tempdir().unwrap();
    let (live, out, restored) = (
        dir.path().join("live"),
        dir.path().join("backup"),
        dir.path().join("restored"),
    );
    let dev = Arc::new(DevProcess::start(&live, &[]));
    let before = enrol(dev.clone(), dev.issue_tokens(20).await, 0).await;

    // Registrations go on, four at a time, from before the backup starts until it is done.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let loads: Vec<_> = (0..4u32)
        .map(|l| {
            let (dev, done) = (dev.clone(), done.clone());
            tokio::spawn(async move {
                let mut regs = Vec::new();
                for n in 0.. {
                    if done.load(std::sync::atomic::Ordering::SeqCst) && n > 0 {
                        break;
                    }
                    let token = dev.issue_tokens(1).await;
                    regs.extend(enrol(dev.clone(), token, 1000 + l * 100_000 + n).await);
                }
                regs
            })
        })
        .collect();
    let (code, stdout, stderr) = tokio::task::spawn_blocking({
        let (live, out) = (live.clone(), out.clone());
        move || plexsphere(&["backup", "--data-dir", path(&live), "--out", path(&out)])
    })
    .await
    .unwrap();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("backed up"), "{stdout}");
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut during = Vec::new();
    for load in loads {
        during.extend(load.await.unwrap());
    }
    let acknowledged: BTreeSet<String> = before
        .iter()
        .chain(&during)
        .map(|r| r.node_id.to_string())
        .collect();
    assert_eq!(
        std::fs::metadata(out.join("domain-keys"))
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
            .unwrap(),
        0o700
    );

    let (code, stdout, stderr) = plexsphere(&[
        "restore",
        "--from",
        path(&out),
        "--data-dir",
        path(&restored),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("restored"), "{stdout}");
    Arc::into_inner(dev).unwrap().stop();

    let back = DevProcess::start(&restored, &[]);
    let nodes = back.node_ids().await;
    for reg in &before {
        assert!(nodes.contains(&reg.node_id.to_string()));
        node_works(&back, reg).await;
    }
    // A consistent snapshot: whatever it holds of the registrations in flight, it holds
    // whole, and nothing that was never acknowledged.
    assert!(nodes.is_subset(&acknowledged), "{nodes:?}");
    for reg in during
        .iter()
        .filter(|r| nodes.contains(&r.node_id.to_string()))
    {
        node_works(&back, reg).await;
    }
    back.stop();

    // Restoring over a database, or from a backup that was changed, is refused.
    let (code, _, stderr) = plexsphere(&[
        "restore",
        "--from",
        path(&out),
        "--data-dir",
        path(&restored),
    ]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("already holds a database"), "{stderr}");
    let key = out.join("domain-keys").join("lab.seed");
    let mut seed = std::fs::read(&key).unwrap();
    seed[0] ^= 1;
    std::fs::write(&key, seed).unwrap();
    let elsewhere = dir.path().join("elsewhere");
    let (code, _, stderr) = plexsphere(&[
        "restore",
        "--from",
        path(&out),
        "--data-dir",
        path(&elsewhere),
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("does not match the backup's manifest"),
        "{stderr}"
    );
    assert!(!elsewhere.join("plexsphere.db").exists());
}
