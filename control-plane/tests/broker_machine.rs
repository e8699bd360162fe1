//! A real local machine through the broker (root, systemd-nspawn): the real `plexsphere dev`
//! on its own bridge creates a `local-machine` resource, the machine boots with the broker's
//! cloud-init document, installs the plexd this workspace built from the server's downloads,
//! registers with the resource's token, and the resource reaches Ready; deleting it destroys
//! the machine and removes its node. The token the machine was handed is in no table. Skipped (with a line saying why) where machines cannot
//! run, unless CI is set.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use plexsphere_nspawn::testing::host_ready;
use plexsphere_test_support::machines::Leftovers;
use reqwest::StatusCode;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_plexsphere");
const BRIDGE: &str = "plexbrb0";
const BRIDGE_CIDR: &str = "172.30.233.1/24";
const HOST: &str = "172.30.233.1";

/// Stops dev, then (its field's drop) destroys what it left and removes the bridge, even when
/// the test failed.
struct Cleanup {
    child: Option<Child>,
    _leftovers: Leftovers,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }
}

fn phase(r: &Value) -> String {
    r["provisioning"]["phase"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_local_machine_enrols_and_is_deleted() {
    if !host_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let mut child = Command::new(BIN)
        .args(["dev", "--listen", &format!("{HOST}:0"), "--san", HOST])
        .args([
            "--machine-bridge",
            BRIDGE,
            "--machine-bridge-address",
            BRIDGE_CIDR,
        ])
        .args(["--reconcile-secs", "1", "--data-dir"])
        .arg(data)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut cleanup = Cleanup {
        child: Some(child),
        _leftovers: Leftovers::new(data.join("nspawn"), BRIDGE),
    };
    let mut lines = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        let done = line.starts_with("listening on ");
        lines.push(line);
        if done {
            break;
        }
    }
    let text = lines.join("\n");
    assert!(
        text.contains(&format!("local machines: on (bridge {BRIDGE}")),
        "{text}"
    );
    assert!(
        text.contains("plexd artifact: "),
        "dev found no sibling plexd to serve: {text}"
    );
    let base = lines
        .last()
        .unwrap()
        .strip_prefix("listening on ")
        .unwrap()
        .to_owned();
    let ca = std::fs::read_to_string(data.join("tls/ca.crt")).unwrap();
    let token = std::fs::read_to_string(data.join("operator-token")).unwrap();
    let token = token.trim().to_owned();
    let client = common::client_for(&ca);
    let post = |path: String, body: Value| {
        let (client, token, base) = (client.clone(), token.clone(), base.clone());
        async move {
            let r = client
                .post(format!("{base}{path}"))
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .unwrap();
            (r.status(), r.json::<Value>().await.unwrap())
        }
    };
    let get = |path: String| {
        let (client, token, base) = (client.clone(), token.clone(), base.clone());
        async move {
            let r = client
                .get(format!("{base}{path}"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap();
            (r.status(), r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };

    let (status, cred) = post(
        "/v1/cloud-credentials".into(),
        json!({"name": "host", "provider": "local", "payload": {}}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{cred}");
    let (status, created) = post(
        format!("/v1/projects/{}/resources", common::LAB_NODES),
        json!({
            "kind": "node",
            "blueprint_version_id": plexsphere_broker::blueprint::version_id("local-machine", "v1"),
            "cloud_credential_id": cred["id"],
            "parameters": {"release": "bookworm"},
        }),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();

    // The first machine may build the base image (about a minute) before it boots.
    let deadline = Instant::now() + Duration::from_secs(900);
    let mut seen = Vec::new();
    let ready = loop {
        let (_, r) = get(format!("/v1/resources/{id}")).await;
        let p = phase(&r);
        if seen.last() != Some(&p) {
            eprintln!(
                "phase: {p} ({})",
                r["provisioning"]["history"]
                    .as_array()
                    .and_then(|h| h.last())
                    .map(|h| h["observed"].to_string())
                    .unwrap_or_default()
            );
            seen.push(p.clone());
        }
        if p == "Ready" || p == "Failed" {
            break r;
        }
        assert!(Instant::now() < deadline, "no Ready in time: {r}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let hex = id.replace('-', "");
    let machine = format!("pr-{}", &hex[hex.len() - 9..]);
    let machine_dir = data.join("nspawn/machines").join(&machine);
    if phase(&ready) != "Ready" {
        let console = std::fs::read_to_string(machine_dir.join("console.log")).unwrap_or_default();
        let tail: String = console
            .lines()
            .rev()
            .take(60)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        panic!("the resource failed: {ready}\nconsole:\n{tail}");
    }
    let history: Vec<String> = ready["provisioning"]["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["phase"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(history, ["Pending", "Provisioning", "Enrolling", "Ready"]);
    let node_id = ready["node_id"].as_str().unwrap().to_owned();
    let (status, node) = get(format!("/v1/nodes/{node_id}")).await;
    assert_eq!(status, StatusCode::OK, "{node}");
    assert_eq!(node["resource_handle"], format!("pr-{id}"), "{node}");
    assert!(machine_dir.is_dir());

    // The machine was handed the real token (in its NoCloud seed); no table holds it.
    let user_data =
        std::fs::read_to_string(machine_dir.join("upper/var/lib/cloud/seed/nocloud/user-data"))
            .unwrap();
    let handed = user_data
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("pxbt_"))
        .expect("the machine's document holds its token");
    let handed = plexsphere_wire::secret::BootstrapToken::parse(handed).unwrap();
    let store = plexsphere::store::Store::connect(&plexsphere::store::Store::sqlite_url(data))
        .await
        .unwrap();
    assert_eq!(
        common::cells_holding(store.pool(), &handed.expose()).await,
        Vec::<String>::new()
    );
    assert_eq!(
        common::cells_holding(store.pool(), handed.secret.expose()).await,
        Vec::<String>::new()
    );
    let with_id = common::cells_holding(store.pool(), &handed.id).await;
    assert!(
        with_id.contains(&"resources.token_id".to_owned()),
        "{with_id:?}"
    );
    assert_eq!(
        common::cells_holding(store.pool(), "<bootstrap token: redacted>").await,
        ["resources.composite"]
    );

    let r = client
        .delete(format!("{base}/v1/resources/{id}"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (_, r) = get(format!("/v1/resources/{id}")).await;
        if phase(&r) == "Deleted" {
            break;
        }
        assert!(Instant::now() < deadline, "no Deleted in time: {r}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        !Path::new(&machine_dir).exists(),
        "the machine is still there"
    );
    let (status, _) = get(format!("/v1/nodes/{node_id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // SIGTERM ends dev cleanly.
    let mut c = cleanup.child.take().unwrap();
    let sent = Command::new("kill")
        .args(["-TERM", &c.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    assert!(c.wait().unwrap().success());
}
