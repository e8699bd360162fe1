//! The embedded default on an operator's worst day: its data directory on a 2 MiB tmpfs that
//! fills up while nodes register, and a start on a full or read-only disk. Real `plexsphere dev`
//! processes; the database is read back after a clean stop.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;

mod common;

use common::process::{DevProcess, Tmpfs, join_all, read_back};

/// Longer than any answer may take, full disk or not: past it a registration counts as a hang.
const ANSWER_WITHIN: Duration = Duration::from_secs(20);

/// The node ids `GET /v1/nodes` lists, and how many tokens of the lab Project are consumed.
async fn view(dev: &DevProcess) -> (BTreeSet<String>, usize) {
    let ids = dev.node_ids().await;
    let (status, tokens) = dev
        .op_get(&format!(
            "/v1/projects/{}/bootstrap-tokens",
            common::LAB_NODES
        ))
        .await;
    assert_eq!(status, 200, "{tokens}");
    let consumed = tokens["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["status"] == "consumed")
        .count();
    (ids, consumed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_disk_never_loses_an_acknowledged_registration() {
    let Some(fs) = Tmpfs::mount("2m") else { return };
    let data = fs.path().join("data");
    let dev = std::sync::Arc::new(DevProcess::start(&data, &[]));
    let tokens = dev.issue_tokens(100).await;

    let filler = fs.fill();
    let answers = register_all(&dev, &tokens, 0).await;
    let mut acknowledged = BTreeSet::new();
    let mut refused = Vec::new();
    for ((status, body), token) in answers.iter().zip(&tokens) {
        match status {
            201 => {
                acknowledged.insert(body["node_id"].as_str().unwrap().to_owned());
            }
            507 => {
                assert_eq!(body["code"], "storage_full", "{body}");
                let msg = body["message"].as_str().unwrap();
                assert!(msg.contains("full"), "{msg}");
                refused.push(token.clone());
            }
            _ => panic!("while the disk is full a registration answered {status}: {body}"),
        }
    }
    assert!(
        !refused.is_empty(),
        "the disk never filled up: every registration was stored"
    );

    // Every read agrees with every other and with what was acknowledged.
    let first = view(&dev).await;
    for _ in 0..5 {
        assert_eq!(
            view(&dev).await,
            first,
            "two reads of a full store disagree"
        );
    }
    assert_eq!(
        first.0, acknowledged,
        "the nodes listed are not the nodes acknowledged"
    );
    assert_eq!(
        first.1,
        acknowledged.len(),
        "consumed tokens do not match the nodes"
    );

    // Space comes back: the server recovers without a restart, at the first try.
    std::fs::remove_file(&filler).unwrap();
    let retried = register_all(&dev, &refused, 1000).await;
    for (status, body) in &retried {
        assert_eq!(
            *status,
            201,
            "after the space came back: {body}\n{}",
            dev.log()
        );
        acknowledged.insert(body["node_id"].as_str().unwrap().to_owned());
    }
    assert_eq!(view(&dev).await, (acknowledged.clone(), tokens.len()));
    assert!(data.join("plexsphere.db").exists());

    let dev = std::sync::Arc::try_unwrap(dev).ok().unwrap();
    dev.stop();
    let stored = read_back(&plexsphere::store::Store::sqlite_url(&data)).await;
    let (stored, consumed, integrity) = (stored.nodes, stored.consumed_tokens, stored.integrity);
    assert_eq!(integrity, "ok");
    assert_eq!(
        stored, acknowledged,
        "after a clean stop the database lost acknowledged nodes"
    );
    assert_eq!(consumed, tokens.len());
}

/// Registers with every token, ten at a time; answers each token's outcome in order. A call
/// without an answer in [`ANSWER_WITHIN`] fails the test (a hang).
async fn register_all(
    dev: &std::sync::Arc<DevProcess>,
    tokens: &[String],
    first_key: u32,
) -> Vec<(u16, Value)> {
    let mut out = Vec::with_capacity(tokens.len());
    for (chunk_no, chunk) in tokens.chunks(10).enumerate() {
        let calls = chunk.iter().enumerate().map(|(i, t)| {
            let n = first_key + u32::try_from(chunk_no * 10 + i).unwrap();
            let dev = dev.clone();
            let t = t.clone();
            async move { dev.register(&t, n, ANSWER_WITHIN).await }
        });
        for (i, answer) in join_all(calls).await.into_iter().enumerate() {
            let Some(answer) = answer else {
                panic!(
                    "registration {} got no answer within {ANSWER_WITHIN:?}: {}",
                    chunk_no * 10 + i,
                    dev.log()
                );
            };
            out.push(answer);
        }
    }
    out
}

/// How long a start on a broken disk may take to give up: it must not wait out a pool timeout.
const GIVE_UP_WITHIN: Duration = Duration::from_secs(10);

/// The one line a failed start prints: exit code 1 and the cause, naming `path`.
fn assert_one_clear_line(code: Option<i32>, stderr: &str, cause: &str, path: &std::path::Path) {
    assert_eq!(code, Some(1), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("plexsphere: "))
        .unwrap_or_else(|| panic!("no plexsphere: line in {stderr}"));
    assert!(line.contains(cause), "{line}");
    assert!(line.contains(&path.display().to_string()), "{line}");
    assert_eq!(
        stderr.matches(cause).count(),
        1,
        "the cause is said once, not retried: {stderr}"
    );
}

#[tokio::test]
async fn a_start_on_a_full_disk_fails_at_once_naming_the_cause_and_the_path() {
    let Some(fs) = Tmpfs::mount("2m") else { return };
    let data = fs.path().join("data");
    DevProcess::start(&data, &[]).stop();
    fs.fill();
    let (code, stderr) = DevProcess::start_expecting_exit(&data, GIVE_UP_WITHIN);
    assert_one_clear_line(code, &stderr, "the disk is full", &data);
    assert!(stderr.contains("free space"), "{stderr}");
}

#[tokio::test]
async fn a_start_on_a_read_only_data_dir_fails_at_once_naming_the_cause_and_the_path() {
    let Some(fs) = Tmpfs::mount("2m") else { return };
    let data = fs.path().join("data");
    DevProcess::start(&data, &[]).stop();
    fs.remount_read_only();
    let (code, stderr) = DevProcess::start_expecting_exit(&data, GIVE_UP_WITHIN);
    assert_one_clear_line(code, &stderr, "read-only", &data);
}
