//! The operator's UDP GSO/GRO switch against the real server: `PUT /v1/nodes/{id}/udp-offload`
//! puts `udp_offload` into that node's signed state only, tells that node with a `resync`
//! event addressed to it, changes nothing when set again, and refuses bad input clearly.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use common::nodes::pull;
use common::*;
use plexsphere::api::Verb;
use plexsphere::node::settings::UDP_OFFLOAD_RESYNC;
use plexsphere_wire::RegisterResponse;
use plexsphere_wire::node::{EventKind, NodeState, UdpOffload};
use plexsphere_wire::signed::{DomainVerifier, SignContext};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The node's signed state, verified, and the payload as JSON text.
async fn state(srv: &TestServer, reg: &RegisterResponse) -> NodeState {
    let (status, _, env) = pull(srv, reg, None).await;
    assert_eq!(status, StatusCode::OK);
    let verifier = DomainVerifier::from_b64(&reg.domain_signing_public_key).unwrap();
    verifier
        .open(SignContext::NodeState, &env.unwrap())
        .unwrap()
}

async fn set(srv: &TestServer, node: uuid::Uuid, body: Value) -> (StatusCode, Value) {
    let path = format!("/v1/nodes/{node}/udp-offload");
    operators::call(srv, Verb::Put, &path, &srv.operator_token, Some(body)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_switch_reaches_only_that_nodes_signed_state_with_a_resync_to_it() {
    let srv = TestServer::start().await;
    let (a, b) = srv.enrol_pair().await;
    assert_eq!(state(&srv, &a).await.udp_offload, None, "unset by default");
    let mut events = srv.open_events(&a, None).await;

    let (s, view) = set(&srv, a.node_id, json!({"udp_offload": "off"})).await;
    assert_eq!(s, StatusCode::OK, "{view}");
    assert_eq!(view["udp_offload"], "off", "{view}");
    let ev = events.next_event().await.unwrap();
    assert_eq!(
        ev.kind,
        EventKind::Resync {
            reason: UDP_OFFLOAD_RESYNC.into()
        }
    );
    let sa = state(&srv, &a).await;
    assert_eq!(sa.udp_offload, Some(UdpOffload::Off));
    assert_eq!(sa.version, ev.seq, "the state is as new as the event");
    assert_eq!(
        state(&srv, &b).await.udp_offload,
        None,
        "the peer is unchanged"
    );
    let (_, got) = srv.op_get(&format!("/v1/nodes/{}", a.node_id)).await;
    assert_eq!(got["udp_offload"], "off");

    // The same setting again: no new event, the same state version.
    let (s, _) = set(&srv, a.node_id, json!({"udp_offload": "off"})).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(state(&srv, &a).await.version, sa.version);

    // null: back to the default; the field leaves the document.
    let (s, view) = set(&srv, a.node_id, json!({"udp_offload": null})).await;
    assert_eq!(s, StatusCode::OK, "{view}");
    assert!(view.get("udp_offload").is_none(), "{view}");
    let ev = events.next_event().await.unwrap();
    assert!(matches!(ev.kind, EventKind::Resync { .. }), "{ev:?}");
    assert_eq!(state(&srv, &a).await.udp_offload, None);

    // Bad input and unknown nodes.
    let (s, body) = set(&srv, a.node_id, json!({"udp_offload": "maybe"})).await;
    assert_code(s, &body, 400, "invalid_json");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("expected `on` or `off`"),
        "{body}"
    );
    let (s, body) = set(&srv, a.node_id, json!({"udp_offload": "off", "x": 1})).await;
    assert_code(s, &body, 400, "invalid_json");
    let unknown = "019a0816-0000-7000-8000-0000000000ff".parse().unwrap();
    let (s, body) = set(&srv, unknown, json!({"udp_offload": "off"})).await;
    assert_code(s, &body, 404, "not_found");
    // A revoked node has no state to carry it.
    let (s, _) = srv
        .op_post(&format!("/v1/nodes/{}/revoke", b.node_id), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, body) = set(&srv, b.node_id, json!({"udp_offload": "off"})).await;
    assert_code(s, &body, 404, "not_found");
}
