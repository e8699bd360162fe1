//! The registration rate limit over the real server: burst, Retry-After, trusted proxies.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use std::time::Duration;

use common::*;
use plexsphere::ratelimit::RateLimit;
use reqwest::StatusCode;

fn lab_limit() -> RateLimit {
    RateLimit {
        burst: 10,
        refill: Duration::from_secs(3),
    }
}

/// Sends `n` registration attempts (unknown tokens: cheap, and never 429 on their own).
async fn burst(srv: &TestServer, n: usize, xff: Option<&str>) -> Vec<(StatusCode, Option<String>)> {
    let body = register_body("pxbt_lab_node_0123456789abcdef_nope", &wg_key(1));
    let mut out = Vec::new();
    for _ in 0..n {
        let (s, retry, b) = srv.register_raw(&body, xff).await;
        if s == StatusCode::TOO_MANY_REQUESTS {
            assert_code(s, &b, 429, "rate_limited");
        }
        out.push((s, retry));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifteen_in_a_burst_get_ten_through_then_429_with_retry_after() {
    let srv = TestServer::start_with(Options {
        rate_limit: lab_limit(),
        trusted_proxies: Vec::new(),
        ..Options::default()
    })
    .await;
    let answers = burst(&srv, 15, None).await;
    for (s, _) in &answers[..10] {
        assert_ne!(*s, StatusCode::TOO_MANY_REQUESTS);
    }
    let (s, retry) = &answers[14];
    assert_eq!(*s, StatusCode::TOO_MANY_REQUESTS);
    let secs: u64 = retry.as_deref().expect("Retry-After").parse().unwrap();
    assert!((1..=3).contains(&secs), "Retry-After {secs}");

    // A spoofed X-Forwarded-For from an untrusted peer buys no new budget.
    let spoofed = burst(&srv, 1, Some("198.51.100.77")).await;
    assert_eq!(spoofed[0].0, StatusCode::TOO_MANY_REQUESTS);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_each_forwarded_client_has_its_own_budget() {
    let srv = TestServer::start_with(Options {
        rate_limit: lab_limit(),
        trusted_proxies: vec!["127.0.0.1/32".parse().unwrap()],
        ..Options::default()
    })
    .await;
    let a = burst(&srv, 11, Some("198.51.100.1")).await;
    assert!(
        a[..10]
            .iter()
            .all(|(s, _)| *s != StatusCode::TOO_MANY_REQUESTS)
    );
    assert_eq!(a[10].0, StatusCode::TOO_MANY_REQUESTS);
    // A second client behind the same proxy still has its full budget.
    let b = burst(&srv, 10, Some("203.0.113.5, 198.51.100.2")).await;
    assert!(
        b.iter().all(|(s, _)| *s != StatusCode::TOO_MANY_REQUESTS),
        "{b:?}"
    );
    // The rightmost untrusted hop is the client: a forged left part changes nothing.
    let forged = burst(&srv, 1, Some("192.0.2.99, 198.51.100.1")).await;
    assert_eq!(forged[0].0, StatusCode::TOO_MANY_REQUESTS);
    srv.stop().await;
}
