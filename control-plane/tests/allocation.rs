//! Mesh IP allocation under racing registrations, on SQLite and on Postgres: twenty clients
//! register at once into a /24 until it is exhausted. No registration may fail with a 500 (the
//! allocation race used to surface as `duplicate key value violates unique constraint
//! "nodes_live_mesh_ip"`); every host address is handed out exactly once, and 409
//! `mesh_range_exhausted` comes only once all 254 are taken.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;

use common::*;
use ipnet::IpNet;
use reqwest::StatusCode;

/// Clients registering at once.
const CLIENTS: u32 = 20;

/// `CLIENTS` clients register `each` nodes apiece into `project` at once, with the WireGuard
/// keys numbered from `first_key`; answers every status and body.
async fn race(
    srv: &Arc<TestServer>,
    project: &'static str,
    each: u32,
    first_key: u32,
) -> Vec<(StatusCode, serde_json::Value)> {
    let mut tokens = Vec::new();
    for _ in 0..CLIENTS * each {
        tokens.push(srv.issue_token(project).await.token);
    }
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        let srv = srv.clone();
        let mine: Vec<String> = tokens
            .iter()
            .skip(c as usize)
            .step_by(CLIENTS as usize)
            .cloned()
            .collect();
        clients.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            for (i, token) in mine.iter().enumerate() {
                let key = wg_key(first_key + c * each + u32::try_from(i).unwrap());
                answers.push(srv.register(&register_body(token, &key)).await);
            }
            answers
        }));
    }
    let mut answers = Vec::new();
    for client in clients {
        answers.extend(client.await.unwrap());
    }
    answers
}

/// Twenty clients register 400 nodes into the Domain's /16 at once, then exhaust the /24 of
/// another Project (260 registrations for its 254 hosts).
async fn twenty_clients_race_and_exhaust_a_sub_range(srv: TestServer) {
    let srv = Arc::new(srv);
    let mut handed_out = HashSet::<IpAddr>::new();
    for (status, body) in race(&srv, LAB_NODES, 20, 0).await {
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let ip: IpAddr = body["mesh_ip"].as_str().unwrap().parse().unwrap();
        assert!(handed_out.insert(ip), "{ip} handed out twice");
    }
    assert_eq!(handed_out.len(), 400);

    let sub: IpNet = "10.64.1.0/24".parse().unwrap();
    let each = 13; // 20 x 13 = 260 for the 254 hosts of the /24
    let (mut handed_out, mut exhausted) = (HashSet::<IpAddr>::new(), 0);
    for (status, body) in race(&srv, OPENSTACK, each, 10_000).await {
        match status {
            StatusCode::CREATED => {
                let ip: IpAddr = body["mesh_ip"].as_str().unwrap().parse().unwrap();
                assert!(sub.contains(&ip), "{ip} outside {sub}");
                assert!(handed_out.insert(ip), "{ip} handed out twice");
            }
            _ => {
                assert_code(status, &body, 409, "mesh_range_exhausted");
                exhausted += 1;
            }
        }
    }
    assert_eq!(handed_out.len(), 254, "every host of {sub} is handed out");
    assert_eq!(exhausted, CLIENTS * each - 254);
    Arc::into_inner(srv).unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_registrations_never_collide_on_sqlite() {
    twenty_clients_race_and_exhaust_a_sub_range(TestServer::start().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_registrations_never_collide_on_postgres() {
    let Some(srv) = common::postgres::server().await else {
        return;
    };
    twenty_clients_race_and_exhaust_a_sub_range(srv).await;
}

/// How long [`twenty_clients_register_continuously_on_postgres`] runs:
/// `PLEXSPHERE_LOAD_SECS` (the two-minute run in docs/benchmarks.md sets 120), else 5 s.
fn load_duration() -> std::time::Duration {
    let secs = std::env::var("PLEXSPHERE_LOAD_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    std::time::Duration::from_secs(secs)
}

/// Twenty clients each issue a token and register with it, again and again, for the load
/// duration: every registration must be created (the Domain's /16 has room for all of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_clients_register_continuously_on_postgres() {
    let Some(srv) = common::postgres::server().await else {
        return;
    };
    let srv = Arc::new(srv);
    let until = std::time::Instant::now() + load_duration();
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        let srv = srv.clone();
        clients.push(tokio::spawn(async move {
            let mut n = 0u32;
            let mut refused = Vec::new();
            while std::time::Instant::now() < until {
                let token = srv.issue_token(LAB_NODES).await.token;
                let (status, body) = srv
                    .register(&register_body(&token, &wg_key(c * 1_000_000 + n)))
                    .await;
                if status != StatusCode::CREATED {
                    refused.push((status, body));
                }
                n += 1;
            }
            (n, refused)
        }));
    }
    let (mut total, mut refused) = (0, Vec::new());
    for client in clients {
        let (n, r) = client.await.unwrap();
        total += n;
        refused.extend(r);
    }
    eprintln!(
        "{CLIENTS} clients, {:?}: {total} registrations, {} not created",
        load_duration(),
        refused.len()
    );
    assert!(
        refused.is_empty(),
        "{} of {total}: {:?}",
        refused.len(),
        refused.first()
    );
    Arc::into_inner(srv).unwrap().stop().await;
}
