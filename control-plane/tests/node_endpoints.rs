//! Endpoint reports against the real server: the reported addresses reach peers in their
//! signed state, the observed address is added unless it is loopback (as here, where the test
//! client talks to the server over 127.0.0.1), behind a trusted proxy the client is taken from
//! X-Forwarded-For; and addresses peers must not be sent to are refused.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use common::nodes::pull;
use common::*;
use plexsphere_wire::node::{EndpointAck, NodeState};
use plexsphere_wire::signed::{DomainVerifier, SignContext};
use reqwest::{Method, StatusCode};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_report_adds_the_reflexive_address_and_peers_see_it() {
    let srv = TestServer::start().await;
    let (a, b) = srv.enrol_pair().await;
    let report = json!({"listen_port": 51999, "addresses": ["192.0.2.10", "2001:db8::10"]});
    let r = srv
        .node_req(Method::POST, &a, "/endpoints")
        .json(&report)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let ack: EndpointAck = r.json().await.unwrap();
    // The server saw the report come from loopback: it says so, and advertises none of it.
    assert_eq!(ack.observed.to_string(), "127.0.0.1:51999");
    let shown: Vec<String> = ack.endpoints.iter().map(ToString::to_string).collect();
    assert_eq!(shown, vec!["192.0.2.10:51999", "[2001:db8::10]:51999"]);
    let view = srv.node_view(a.node_id).await;
    assert_eq!(view["endpoints"], json!(shown));

    // b's state carries a's endpoints, best first.
    let (_, etag, env) = pull(&srv, &b, None).await;
    let verifier = DomainVerifier::from_b64(&b.domain_signing_public_key).unwrap();
    let state: NodeState = verifier
        .open(SignContext::NodeState, &env.unwrap())
        .unwrap();
    assert_eq!(state.peers[0].endpoints, ack.endpoints);
    // a's own state carries its listen port.
    let (_, _, env) = pull(&srv, &a, None).await;
    let mine: NodeState = verifier
        .open(SignContext::NodeState, &env.unwrap())
        .unwrap();
    assert_eq!(mine.listen_port, 51999);

    // The same report again changes nothing: no new event, b's state is unchanged.
    let r = srv
        .node_req(Method::POST, &a, "/endpoints")
        .json(&report)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let (s, _, _) = pull(&srv, &b, etag.as_deref()).await;
    assert_eq!(s, StatusCode::NOT_MODIFIED);

    // Refusals.
    for bad in [
        json!({"listen_port": 0, "addresses": []}),
        json!({"listen_port": 1, "addresses": ["0.0.0.0"]}),
    ] {
        let r = srv
            .node_req(Method::POST, &a, "/endpoints")
            .json(&bad)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_report_behind_a_trusted_proxy_uses_x_forwarded_for() {
    let srv = TestServer::start_with(Options {
        trusted_proxies: vec!["127.0.0.0/8".parse().unwrap()],
        ..Options::default()
    })
    .await;
    let a = srv.enrol(LAB_NODES).await;
    let r = srv
        .node_req(Method::POST, &a, "/endpoints")
        .header("x-forwarded-for", "198.51.100.7")
        .json(&json!({"listen_port": 51820, "addresses": []}))
        .send()
        .await
        .unwrap();
    let ack: EndpointAck = r.json().await.unwrap();
    assert_eq!(ack.observed.to_string(), "198.51.100.7:51820");
    assert_eq!(ack.endpoints, vec![ack.observed]);
    srv.stop().await;
}

/// A node must not be able to point its peers' handshakes at their own loopback or at the
/// cloud metadata service (169.254.169.254), on any port: such a report is refused, and no
/// peer's state carries those addresses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_of_loopback_or_metadata_addresses_is_refused_and_reaches_no_peer() {
    let srv = TestServer::start().await;
    let (a, b) = srv.enrol_pair().await;
    let verifier = DomainVerifier::from_b64(&b.domain_signing_public_key).unwrap();
    for (report, field) in [
        (
            json!({"listen_port": 80, "addresses": ["192.0.2.10", "169.254.169.254"]}),
            "addresses[1] 169.254.169.254",
        ),
        (
            json!({"listen_port": 22, "addresses": ["127.0.0.1"]}),
            "addresses[0] 127.0.0.1",
        ),
        (
            json!({"listen_port": 51820, "addresses": ["::ffff:169.254.169.254"]}),
            "addresses[0] ::ffff:169.254.169.254",
        ),
    ] {
        let r = srv
            .node_req(Method::POST, &a, "/endpoints")
            .json(&report)
            .send()
            .await
            .unwrap();
        let status = r.status();
        let body: serde_json::Value = r.json().await.unwrap();
        assert_code(status, &body, 422, "endpoint_refused");
        let message = body["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{message}");
        let (_, _, env) = pull(&srv, &b, None).await;
        let state: NodeState = verifier
            .open(SignContext::NodeState, &env.unwrap())
            .unwrap();
        let peer = state.peers.iter().find(|p| p.node_id == a.node_id).unwrap();
        assert!(
            peer.endpoints.iter().all(|e| {
                let ip = e.ip().to_canonical();
                !ip.is_loopback() && ip.to_string() != "169.254.169.254"
            }),
            "{:?}",
            peer.endpoints
        );
    }
    srv.stop().await;
}
