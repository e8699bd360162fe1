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
/// verify with the Domain key the node got at registration. Answers the state's version.
async fn node_works(dev: &DevProcess, reg: &RegisterResponse) -> u64 {
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
    // dev's key-encryption key goes with its backup (the Domain keys are sealed under it).
    assert_eq!(
        std::fs::metadata(out.join("key-encryption-key"))
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
            .unwrap(),
        0o600
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
    // The newest state a node can have applied from the old server: every registration after
    // the backup raised it.
    let mut seen = 0;
    for reg in &during {
        seen = seen.max(node_works(&dev, reg).await);
    }
    Arc::into_inner(dev).unwrap().stop();

    let back = DevProcess::start(&restored, &[]);
    let nodes = back.node_ids().await;
    for reg in &before {
        assert!(nodes.contains(&reg.node_id.to_string()));
        // Nodes refuse any state at or below the newest they applied: the restored server's
        // must be newer than everything the old one handed out after the backup.
        let version = node_works(&back, reg).await;
        assert!(
            version > seen,
            "the restored server signs version {version}, not above the {seen} nodes already applied: they would refuse it"
        );
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
    let key = out.join("key-encryption-key");
    // Another key of the same form: the first base64 character changed to another letter
    // (flipping a bit could make it no base64 at all, 6 characters in 64, which is refused
    // as malformed before any comparison).
    let mut kek = std::fs::read(&key).unwrap();
    kek[0] = if kek[0] == b'A' { b'B' } else { b'A' };
    std::fs::write(&key, kek).unwrap();
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

/// Runs a Postgres client tool (`pg_dump`, `pg_restore`) to its end; it must succeed.
fn pg_tool(tool: &str, args: &[&str]) {
    let out = Command::new(tool).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{tool} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_postgres_restore_brings_the_keys_back_and_the_nodes_keep_working() {
    let Some(live_db) = common::postgres::scratch_database().await else {
        return;
    };
    let Some(restored_db) = common::postgres::scratch_database().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (live, keys, restored, dump) = (
        dir.path().join("live"),
        dir.path().join("keys"),
        dir.path().join("restored"),
        dir.path().join("plexsphere.dump"),
    );
    let dev = Arc::new(DevProcess::start(&live, &["--database-url", &live_db]));
    let before = enrol(dev.clone(), dev.issue_tokens(3).await, 0).await;

    // The backup the docs describe: pg_dump (the Domain keys are in it, sealed), and a copy
    // of the key-encryption key they are sealed under (dev keeps it in its data directory).
    pg_tool(
        "pg_dump",
        &["--format=custom", "--file", path(&dump), &live_db],
    );
    std::fs::create_dir_all(&keys).unwrap();
    std::fs::copy(
        live.join("key-encryption-key"),
        keys.join("key-encryption-key"),
    )
    .unwrap();
    // The old server goes on after the backup; the nodes apply newer states.
    let after = enrol(dev.clone(), dev.issue_tokens(3).await, 100).await;
    let mut seen = 0;
    for reg in &after {
        seen = seen.max(node_works(&dev, reg).await);
    }
    Arc::into_inner(dev).unwrap().stop();

    pg_tool(
        "pg_restore",
        &["--no-owner", "--dbname", &restored_db, path(&dump)],
    );
    // Without the key-encryption key, or with another one, restore refuses: the keys in the
    // dump would not open, and the nodes trust only their Domain's key.
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let (code, _, stderr) = plexsphere(&[
        "restore",
        "--database-url",
        &restored_db,
        "--from",
        path(&empty),
        "--data-dir",
        path(&restored),
    ]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("none is at hand"), "{stderr}");
    let other = dir.path().join("other-kek");
    let (code, _, stderr) = plexsphere(&["kek", "generate", "--out", path(&other)]);
    assert_eq!(code, Some(0), "{stderr}");
    let (code, _, stderr) = plexsphere(&[
        "restore",
        "--database-url",
        &restored_db,
        "--from",
        path(&empty),
        "--data-dir",
        path(&restored),
        "--key-encryption-key-file",
        path(&other),
    ]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains("did not seal the Domain key of Domain"),
        "{stderr}"
    );

    let (code, stdout, stderr) = plexsphere(&[
        "restore",
        "--database-url",
        &restored_db,
        "--from",
        path(&keys),
        "--data-dir",
        path(&restored),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("event log moved"), "{stdout}");

    let back = DevProcess::start(&restored, &["--database-url", &restored_db]);
    let nodes = back.node_ids().await;
    for reg in &before {
        assert!(nodes.contains(&reg.node_id.to_string()));
        let version = node_works(&back, reg).await;
        assert!(
            version > seen,
            "the restored server signs version {version}, not above the {seen} nodes already applied"
        );
    }
    for reg in &after {
        assert!(!nodes.contains(&reg.node_id.to_string()));
    }
    back.stop();
}
