//! `kill -9` of a real `plexsphere dev` under registration load, five times, on the embedded
//! SQLite default and on Postgres. After each kill the server starts again on the same data,
//! and every registration that got no answer is sent again with its token and key (a node
//! does exactly that): a node the server had stored comes back as a replay (200), one it had
//! not is created (201). In the end every 2xx answer is a node row, every row is a node some
//! answer named, no two live nodes share a mesh IP, and consumed tokens match nodes.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

mod common;

use common::process::{DevProcess, join_all, read_back};

const ROUNDS: usize = 5;
/// Registrations started per round, all at once.
const PER_ROUND: usize = 24;
/// An answer that takes longer than this counts as none (the server was killed under it).
const ANSWER_WITHIN: Duration = Duration::from_secs(20);

/// One registration attempt: the token, the key number it goes with, and the node id of a 2xx.
struct Attempt {
    token: String,
    key: u32,
    node_id: Option<String>,
}

/// Registers `attempt`; a 2xx records its node id, anything else must be a failure to answer.
async fn register(dev: &DevProcess, attempt: &mut Attempt) {
    if let Some((status, body)) = dev
        .register(&attempt.token, attempt.key, ANSWER_WITHIN)
        .await
    {
        assert!(
            status == 200 || status == 201,
            "registration answered {status}: {body}"
        );
        let id = body["node_id"].as_str().unwrap().to_owned();
        if let Some(before) = &attempt.node_id {
            assert_eq!(before, &id, "a replay named another node");
        }
        attempt.node_id = Some(id);
    }
}

async fn kill_under_load(database_url: Option<String>, backend: &str) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let extra: Vec<&str> = match &database_url {
        Some(url) => vec!["--database-url", url.as_str()],
        None => Vec::new(),
    };
    let mut attempts: Vec<Attempt> = Vec::new();
    let mut resent = 0;
    for round in 0..ROUNDS {
        let dev = Arc::new(DevProcess::start(&data, &extra));
        resent += settle(&dev, &mut attempts).await;
        let tokens = dev.issue_tokens(PER_ROUND).await;
        let first_key = u32::try_from(attempts.len()).unwrap();
        // Kill after a different number of answers each round, with the rest in flight.
        let kill_after = 2 + round * 4;
        let answered = Arc::new(AtomicUsize::new(0));
        let notify = Arc::new(tokio::sync::Notify::new());
        let calls = tokens.into_iter().enumerate().map(|(i, token)| {
            let (dev, answered, notify) = (dev.clone(), answered.clone(), notify.clone());
            let mut attempt = Attempt {
                token,
                key: first_key + u32::try_from(i).unwrap(),
                node_id: None,
            };
            async move {
                register(&dev, &mut attempt).await;
                if attempt.node_id.is_some() {
                    answered.fetch_add(1, Ordering::SeqCst);
                    notify.notify_one();
                }
                attempt
            }
        });
        let handles: Vec<_> = calls.map(tokio::spawn).collect();
        while answered.load(Ordering::SeqCst) < kill_after {
            tokio::time::timeout(ANSWER_WITHIN, notify.notified())
                .await
                .unwrap_or_else(|_| panic!("{backend}: no registration answered: {}", dev.log()));
        }
        dev.kill();
        for h in handles {
            attempts.push(h.await.unwrap());
        }
        drop(dev);
    }
    let dev = Arc::new(DevProcess::start(&data, &extra));
    resent += settle(&dev, &mut attempts).await;
    Arc::try_unwrap(dev).ok().unwrap().stop();
    assert!(
        resent > 0,
        "{backend}: no kill ever caught a registration in flight"
    );
    eprintln!(
        "{backend}: {} registrations, {resent} sent again after a kill",
        attempts.len()
    );

    let url = database_url.unwrap_or_else(|| plexsphere::store::Store::sqlite_url(&data));
    let stored = read_back(&url).await;
    let answered: BTreeSet<String> = attempts.iter().filter_map(|a| a.node_id.clone()).collect();
    assert_eq!(
        answered.len(),
        attempts.len(),
        "{backend}: every token got its node"
    );
    assert_eq!(stored.nodes, answered, "{backend}: rows and answers differ");
    assert_eq!(stored.duplicate_mesh_ips, Vec::<String>::new(), "{backend}");
    assert_eq!(stored.consumed_tokens, stored.nodes.len(), "{backend}");
    if backend == "sqlite" {
        assert_eq!(stored.integrity, "ok");
    }
}

/// Sends every registration that got no answer again, with its own token and key; answers
/// how many there were.
async fn settle(dev: &Arc<DevProcess>, attempts: &mut [Attempt]) -> usize {
    let open: Vec<usize> = (0..attempts.len())
        .filter(|&i| attempts[i].node_id.is_none())
        .collect();
    let calls = open.iter().map(|&i| {
        let dev = dev.clone();
        let mut attempt = Attempt {
            token: attempts[i].token.clone(),
            key: attempts[i].key,
            node_id: None,
        };
        async move {
            register(&dev, &mut attempt).await;
            attempt.node_id
        }
    });
    for (i, node_id) in open.iter().zip(join_all(calls).await) {
        assert!(
            node_id.is_some(),
            "a registration sent again after a restart got no answer: {}",
            dev.log()
        );
        attempts[*i].node_id = node_id;
    }
    open.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_under_registration_load_loses_nothing_on_sqlite() {
    kill_under_load(None, "sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_under_registration_load_loses_nothing_on_postgres() {
    let Some(url) = common::postgres::scratch_database().await else {
        return;
    };
    kill_under_load(Some(url), "postgres").await;
}
