//! `plexsphere backup` while nodes register, `plexsphere restore` into another data directory,
//! and the nodes keep working with the restored server: the same credentials, the same CA and
//! the same Domain key. Real `plexsphere` processes.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt as _;
use std::process::Command;
use std::sync::Arc;

mod common;

use common::backup::{enrol, list_files, node_works, path, plexsphere};
use common::process::DevProcess;

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
    // Every file of the backup is 0600 (the database is sensitive); dev's key-encryption key
    // is a secret and stays out (backup_integrity.rs checks the whole list).
    for rel in list_files(&out) {
        let mode = std::fs::metadata(out.join(&rel))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{rel}");
    }
    assert!(!out.join("key-encryption-key").exists());

    // The KEK kept apart is given to restore; dev's lab TLS keys, secrets too, are copied
    // from the old data directory as docs/upgrade-and-backup.md says.
    let kek = live.join("key-encryption-key");
    let (code, stdout, stderr) = plexsphere(&[
        "restore",
        "--from",
        path(&out),
        "--data-dir",
        path(&restored),
        "--key-encryption-key-file",
        path(&kek),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("restored"), "{stdout}");
    for key in ["ca.key", "server.key"] {
        assert!(stderr.contains(&format!("tls/{key}")), "{stderr}");
        std::fs::copy(live.join("tls").join(key), restored.join("tls").join(key)).unwrap();
    }
    // The newest state a node can have applied from the old server: every registration after
    // the backup raised it.
    let mut seen = 0;
    for reg in &during {
        seen = seen.max(node_works(&dev, reg).await);
    }
    Arc::into_inner(dev).unwrap().stop();

    let back = DevProcess::start(&restored, &[]);
    // The same lab CA the nodes trust.
    assert_eq!(
        std::fs::read(restored.join("tls/ca.crt")).unwrap(),
        std::fs::read(live.join("tls/ca.crt")).unwrap()
    );
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
    // Another key of the same form: the first base64 character changed to another letter
    // (flipping a bit could make it no base64 at all, 6 characters in 64, which is refused
    // as malformed before any comparison). The manifest's MAC does not verify under it.
    let other_kek = dir.path().join("other-kek");
    let mut text = std::fs::read(&kek).unwrap();
    text[0] = if text[0] == b'A' { b'B' } else { b'A' };
    std::fs::write(&other_kek, text).unwrap();
    let elsewhere = dir.path().join("elsewhere");
    let (code, _, stderr) = plexsphere(&[
        "restore",
        "--from",
        path(&out),
        "--data-dir",
        path(&elsewhere),
        "--key-encryption-key-file",
        path(&other_kek),
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("does not verify"), "{stderr}");
    assert!(!elsewhere.exists());
    // A file changed and its manifest line left: damage.
    let cert = out.join("tls").join("ca.crt");
    let mut pem = std::fs::read(&cert).unwrap();
    let at = pem.len() / 2;
    pem[at] = if pem[at] == b'A' { b'B' } else { b'A' };
    std::fs::write(&cert, pem).unwrap();
    let (code, _, stderr) = plexsphere(&[
        "restore",
        "--from",
        path(&out),
        "--data-dir",
        path(&elsewhere),
        "--key-encryption-key-file",
        path(&kek),
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("does not match the backup's manifest"),
        "{stderr}"
    );
    assert!(!elsewhere.exists());
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
