//! Reach against the real server: the relays and STUN servers of the settings and a
//! Domain-signed relay token in every state (and a fresh token in every heartbeat answer); an
//! endpoint report's candidates, home relay and NAT report stored (SQLite and Postgres),
//! advertised to peers in their state and on their event stream, and shown to operators; and
//! the refusal table answered with 422 `endpoint_refused`.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use common::nodes::pull;
use common::*;
use plexsphere_wire::node::{EndpointAck, EventKind, HeartbeatAck, NodeState, RelaySpec};
use plexsphere_wire::reach::relay::{RelayToken, TOKEN_TTL_SECS};
use plexsphere_wire::signed::{DomainVerifier, SignContext, SignedEnvelope};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const RELAY_KEY: &str = "AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=";

fn relay(name: &str) -> RelaySpec {
    RelaySpec {
        name: name.to_owned(),
        public_key: RELAY_KEY.to_owned(),
        udp: Some("203.0.113.5:3479".parse().unwrap()),
        tls: Some("203.0.113.5:443".parse().unwrap()),
        tls_server_name: Some("relay1.example".to_owned()),
    }
}

/// A server with two relays and one STUN server, whose clients come through a trusted proxy
/// (so the observed address is the `X-Forwarded-For` the test sends, not loopback).
fn options() -> Options {
    Options {
        relays: vec![relay("r1"), relay("r2")],
        stun_advertise: vec!["203.0.113.5:3478".parse().unwrap()],
        trusted_proxies: vec!["127.0.0.0/8".parse().unwrap()],
        ..Options::default()
    }
}

fn open_token(verifier: &DomainVerifier, env: &SignedEnvelope) -> RelayToken {
    verifier.open(SignContext::RelayToken, env).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn states_list_the_relays_and_carry_a_relay_token_signed_by_the_domain() {
    let srv = TestServer::start_with(options()).await;
    let (a, _b) = srv.enrol_pair().await;
    let verifier = DomainVerifier::from_b64(&a.domain_signing_public_key).unwrap();
    let before = time::OffsetDateTime::now_utc().unix_timestamp();

    let (s, etag, env) = pull(&srv, &a, None).await;
    assert_eq!(s, StatusCode::OK);
    let state: NodeState = verifier
        .open(SignContext::NodeState, &env.unwrap())
        .unwrap();
    assert_eq!(state.relays, vec![relay("r1"), relay("r2")]);
    assert_eq!(state.stun, vec!["203.0.113.5:3478".parse().unwrap()]);
    let token = open_token(&verifier, state.relay_token.as_ref().unwrap());
    assert_eq!(token.node_id, a.node_id);
    assert_eq!(token.domain_id, a.domain_id);
    let key = srv.node_view(a.node_id).await["wireguard_public_key"].clone();
    assert_eq!(json!(token.public_key), key);
    let after = time::OffsetDateTime::now_utc().unix_timestamp();
    assert!(
        (before + TOKEN_TTL_SECS..=after + TOKEN_TTL_SECS).contains(&token.expires_at),
        "{token:?}"
    );
    // Signed as a relay token, it is not a node state or an event.
    let raw = state.relay_token.clone().unwrap();
    assert!(
        verifier
            .open::<RelayToken>(SignContext::Event, &raw)
            .is_err()
    );
    assert!(
        verifier
            .open::<RelayToken>(SignContext::NodeState, &raw)
            .is_err()
    );

    // The state does not change: 304, and the heartbeat answer carries a fresh token.
    let (s, _, _) = pull(&srv, &a, etag.as_deref()).await;
    assert_eq!(s, StatusCode::NOT_MODIFIED);
    let (s, ack) = srv.heartbeat(&a).await;
    assert_eq!(s, StatusCode::OK, "{ack}");
    let ack: HeartbeatAck = serde_json::from_value(ack).unwrap();
    let fresh = open_token(&verifier, ack.relay_token.as_ref().unwrap());
    assert_eq!(
        (fresh.node_id, &fresh.public_key),
        (a.node_id, &token.public_key)
    );
    assert!(fresh.expires_at >= token.expires_at);
    // Minutes, not a day: a revoked node's last token runs out soon.
    assert!(
        fresh.expires_at <= after + 10 * 60 + 5,
        "a relay token lives 10 minutes: {fresh:?}"
    );
    assert!(fresh.key_generation > 0, "{fresh:?}");
    assert_eq!(fresh.key_generation, token.key_generation, "same key");
    // A revoked node gets no fresh token: relays drop it when the one it has expires.
    let (s, view) = srv
        .op_post(&format!("/v1/nodes/{}/revoke", a.node_id), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{view}");
    let (s, ack) = srv.heartbeat(&a).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{ack}");
    assert!(ack.get("relay_token").is_none(), "{ack}");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn candidates_and_home_relay_reach_peers_and_operators_on_sqlite() {
    let srv = TestServer::start_with(options()).await;
    reported_reach(&srv).await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn candidates_and_home_relay_reach_peers_and_operators_on_postgres() {
    let Some(srv) = postgres::server_with(options()).await else {
        return;
    };
    reported_reach(&srv).await;
    srv.stop().await;
}

async fn report(
    srv: &TestServer,
    a: &plexsphere_wire::RegisterResponse,
    body: &Value,
) -> EndpointAck {
    let r = srv
        .node_req(Method::POST, a, "/endpoints")
        .header("x-forwarded-for", "198.51.100.7")
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    serde_json::from_value(body).unwrap()
}

/// a reports candidates of every kind and a home relay; b hears of it on its stream and in its
/// state; the same report again appends no event; the operator sees it by kind.
async fn reported_reach(srv: &TestServer) {
    let (a, b) = srv.enrol_pair().await;
    let verifier = DomainVerifier::from_b64(&b.domain_signing_public_key).unwrap();
    let mut stream = srv.open_events(&b, None).await;
    srv.wait_for("b's stream to open", async || {
        srv.state.streams.open_for(b.node_id) == 1
    })
    .await;

    let body = json!({
        "listen_port": 51820,
        "addresses": ["192.168.1.20", "192.168.1.20", "2001:db8::20"],
        "reflexive": ["198.51.100.7:40001", "198.51.100.7:40001"],
        "home_relay": "r2",
        "nat": {"mapping": "endpoint_independent", "udp_blocked": false},
    });
    let ack = report(srv, &a, &body).await;
    let want: Vec<std::net::SocketAddr> = [
        "192.168.1.20:51820",
        "[2001:db8::20]:51820",
        "198.51.100.7:40001",
        "198.51.100.7:51820",
    ]
    .iter()
    .map(|s| s.parse().unwrap())
    .collect();
    assert_eq!(ack.endpoints, want);
    assert_eq!(ack.observed.to_string(), "198.51.100.7:51820");

    let ev = stream.next_event().await.unwrap();
    let EventKind::EndpointChanged {
        peer_node_id,
        endpoints,
        home_relay,
    } = &ev.kind
    else {
        panic!("{ev:?}")
    };
    assert_eq!(*peer_node_id, a.node_id);
    assert_eq!(endpoints, &want);
    assert_eq!(home_relay.as_deref(), Some("r2"));

    let (_, etag, env) = pull(srv, &b, None).await;
    let state: NodeState = verifier
        .open(SignContext::NodeState, &env.unwrap())
        .unwrap();
    let peer = state.peers.iter().find(|p| p.node_id == a.node_id).unwrap();
    assert_eq!(peer.endpoints, want);
    assert_eq!(peer.home_relay.as_deref(), Some("r2"));

    // The same report, at a heartbeat's rate: nothing changes, no event, b's state is 304.
    for _ in 0..3 {
        report(srv, &a, &body).await;
    }
    let (s, _, _) = pull(srv, &b, etag.as_deref()).await;
    assert_eq!(s, StatusCode::NOT_MODIFIED);

    // A NAT report that changes alone is stored without telling peers.
    let mut dependent = body.clone();
    dependent["nat"] = json!({"mapping": "endpoint_dependent", "udp_blocked": true});
    report(srv, &a, &dependent).await;
    let (s, _, _) = pull(srv, &b, etag.as_deref()).await;
    assert_eq!(s, StatusCode::NOT_MODIFIED);
    let view = srv.node_view(a.node_id).await;
    assert_eq!(
        view["candidates"],
        json!([
            {"kind": "local", "address": "192.168.1.20:51820"},
            {"kind": "local", "address": "[2001:db8::20]:51820"},
            {"kind": "reflexive", "address": "198.51.100.7:40001"},
            {"kind": "observed", "address": "198.51.100.7:51820"},
        ]),
        "{view}"
    );
    assert_eq!(view["home_relay"], "r2");
    assert_eq!(
        view["nat"],
        json!({"mapping": "endpoint_dependent", "udp_blocked": true})
    );
    assert_eq!(view["endpoints"], json!(want));

    // Only the home relay changes: peers hear of it.
    let mut moved = dependent.clone();
    moved["home_relay"] = json!("r1");
    report(srv, &a, &moved).await;
    let ev2 = stream.next_event().await.unwrap();
    assert!(ev2.seq > ev.seq);
    assert!(
        matches!(&ev2.kind, EventKind::EndpointChanged { home_relay: Some(r), endpoints, .. } if r == "r1" && endpoints == &want),
        "{ev2:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refused_kind_is_a_422_endpoint_refused_naming_the_address() {
    let srv = TestServer::start_with(options()).await;
    let (a, b) = srv.enrol_pair().await;
    let many: Vec<String> = (1..=17).map(|i| format!("192.0.2.{i}")).collect();
    let cases = [
        (json!({"listen_port": 0, "addresses": []}), "listen_port 0"),
        (
            json!({"listen_port": 1, "addresses": ["0.0.0.0"]}),
            "addresses[0] 0.0.0.0 is unspecified",
        ),
        (
            json!({"listen_port": 1, "addresses": ["::"]}),
            "addresses[0] :: is unspecified",
        ),
        (
            json!({"listen_port": 1, "addresses": ["::1"]}),
            "addresses[0] ::1 is a loopback",
        ),
        (
            json!({"listen_port": 1, "addresses": ["fe80::1"]}),
            "addresses[0] fe80::1 is link-local",
        ),
        (
            json!({"listen_port": 1, "addresses": ["224.0.0.1"]}),
            "addresses[0] 224.0.0.1 is multicast",
        ),
        (
            json!({"listen_port": 1, "addresses": ["255.255.255.255"]}),
            "addresses[0] 255.255.255.255 is the broadcast",
        ),
        // The lab Domain's mesh range is 10.64.0.0/16 (inside a node's own mesh IP's range).
        (
            json!({"listen_port": 1, "addresses": [a.mesh_ip]}),
            "inside the Domain's mesh range",
        ),
        (
            json!({"listen_port": 1, "addresses": [], "reflexive": ["[::ffff:127.0.0.1]:4000"]}),
            "reflexive[0] [::ffff:127.0.0.1]:4000 is a loopback",
        ),
        (
            json!({"listen_port": 1, "addresses": [], "reflexive": ["198.51.100.7:0"]}),
            "reflexive[0] 198.51.100.7:0 has port 0",
        ),
        (
            json!({"listen_port": 1, "addresses": many}),
            "at most 16 addresses",
        ),
        (
            json!({"listen_port": 1, "addresses": [], "home_relay": "r9"}),
            "home_relay \"r9\" is not a relay",
        ),
    ];
    for (body, says) in cases {
        let r = srv
            .node_req(Method::POST, &a, "/endpoints")
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status();
        let answer: Value = r.json().await.unwrap();
        assert_code(status, &answer, 422, "endpoint_refused");
        let message = answer["message"].as_str().unwrap();
        assert!(message.contains(says), "{body}: {message}");
    }
    // None of it was stored or advertised.
    assert_eq!(srv.node_view(a.node_id).await["candidates"], json!([]));
    let (_, _, env) = pull(&srv, &b, None).await;
    let verifier = DomainVerifier::from_b64(&b.domain_signing_public_key).unwrap();
    let state: NodeState = verifier
        .open(SignContext::NodeState, &env.unwrap())
        .unwrap();
    assert!(state.peers[0].endpoints.is_empty(), "{:?}", state.peers[0]);
    srv.stop().await;
}
