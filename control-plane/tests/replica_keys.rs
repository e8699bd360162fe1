//! Two `plexsphere serve` processes on one Postgres, each with its own data directory and the
//! same key-encryption key file, sign with the same Domain key (no seed file copied or made);
//! a replica without a KEK, or with another KEK, refuses to start and says why. Needs
//! `PLEXSPHERE_TEST_POSTGRES_URL` (scripts/test sets it; under `CI` its absence fails).
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use std::io::{BufRead as _, BufReader, Read as _};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::dev::BIN;
use plexsphere_wire::signed::{DomainVerifier, SignContext, SignedEnvelope};
use serde_json::Value;

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A `serve` replica; killed on drop.
struct Replica {
    child: Child,
    base: String,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `serve` and waits for its `listening on` line; Err(exit code, stderr) when it exits
/// instead.
fn serve(dir: &Path, db: &str, kek: Option<&Path>) -> Result<Replica, (Option<i32>, String)> {
    let seed = dir.join("lab.yaml");
    std::fs::write(&seed, plexsphere::seed::LAB_SEED).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--database-url", db, "--data-dir", path(dir)])
        .args(["--seed", path(&seed), "--tls-terminated-by-proxy"])
        .args(["--listen", "127.0.0.1:0", "--no-local-machines"])
        .env_remove("CREDENTIALS_DIRECTORY")
        .env_remove("PLEXSPHERE_KEY_ENCRYPTION_KEY_FILE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(k) = kek {
        cmd.args(["--key-encryption-key-file", path(k)]);
    }
    let mut child = cmd.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if let Some(base) = line.strip_prefix("listening on ") {
            return Ok(Replica {
                child,
                base: base.to_owned(),
            });
        }
    }
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    Err((status.code(), stderr))
}

/// A plain-HTTP client (the replicas serve behind a TLS-terminating proxy).
fn client() -> reqwest::Client {
    plexsphere::tls::install_ring_provider();
    reqwest::Client::new()
}

fn plexsphere(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "plexsphere {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The lab Domain's signing key as the replica answers it.
async fn lab_key(replica: &Replica, token: &str) -> String {
    let v: Value = client()
        .get(format!("{}/v1/domains", replica.base))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let lab = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["slug"] == "lab")
        .unwrap();
    lab["signing_public_key"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_with_one_kek_sign_with_one_domain_key() {
    let Some(db) = common::postgres::scratch_database().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (a_dir, b_dir, c_dir) = (
        dir.path().join("ky-a"),
        dir.path().join("ky-b"),
        dir.path().join("ky-c"),
    );
    for d in [&a_dir, &b_dir, &c_dir] {
        std::fs::create_dir_all(d).unwrap();
    }
    let kek = dir.path().join("kek");
    plexsphere(&["kek", "generate", "--out", path(&kek)]);
    let token = plexsphere(&[
        "operator-token",
        "create",
        "--database-url",
        &db,
        "--data-dir",
        path(&c_dir),
        "--name",
        "ky",
        "--scope",
        "admin",
    ]);
    let token = token.trim();

    let a = serve(&a_dir, &db, Some(&kek)).unwrap();
    let b = serve(&b_dir, &db, Some(&kek)).unwrap();
    let key = lab_key(&a, token).await;
    assert_eq!(lab_key(&b, token).await, key);
    // Neither replica made a key file of its own.
    assert!(!a_dir.join("domain-keys").exists());
    assert!(!b_dir.join("domain-keys").exists());

    let printed = plexsphere(&[
        "domain-key",
        "--database-url",
        &db,
        "--data-dir",
        path(&c_dir),
    ]);
    assert_eq!(printed.trim(), key, "domain-key prints the stored key");
    // A node registered through replica A gets a state from replica B signed by that key.
    let client = client();
    let issued: Value = client
        .post(format!(
            "{}/v1/projects/{}/bootstrap-tokens",
            a.base,
            common::LAB_NODES
        ))
        .bearer_auth(token)
        .json(&serde_json::json!({"kind": "node", "env_prefix": "lab", "ttl_secs": 3600}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let body = common::prove::prove_body(
        &client,
        &a.base,
        &common::register_body(issued["token"].as_str().unwrap(), &common::wg_key(1)),
    )
    .await;
    let reg: Value = client
        .post(format!("{}{}", a.base, plexsphere_wire::REGISTER_PATH))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(reg["domain_signing_public_key"], key.as_str(), "{reg}");
    let env: SignedEnvelope = client
        .get(format!(
            "{}/v1/nodes/{}/state",
            b.base,
            reg["node_id"].as_str().unwrap()
        ))
        .bearer_auth(reg["node_credential"].as_str().unwrap())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let verifier = DomainVerifier::from_b64(&key).unwrap();
    let _: plexsphere_wire::node::NodeState = verifier.open(SignContext::NodeState, &env).unwrap();

    // Without a KEK, or with another one, a replica does not start (exit 64) and says why.
    let (code, stderr) = serve(&c_dir, &db, None).err().unwrap();
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("no key-encryption key"), "{stderr}");
    let other = dir.path().join("other-kek");
    plexsphere(&["kek", "generate", "--out", path(&other)]);
    let (code, stderr) = serve(&c_dir, &db, Some(&other)).err().unwrap();
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("did not seal the Domain key"), "{stderr}");
    // A KEK of the wrong size.
    let short = dir.path().join("short-kek");
    std::fs::write(&short, "c2hvcnQ=\n").unwrap();
    let (code, stderr) = serve(&c_dir, &db, Some(&short)).err().unwrap();
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("not 32"), "{stderr}");
    drop((a, b));
}
