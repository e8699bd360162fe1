//! `plexsphere dev --relay ... --stun-advertise ...`: a node registered with the real process
//! finds the relays and STUN servers in its signed state, with its relay token.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use std::time::Duration;

use common::process::DevProcess;
use plexsphere_wire::RegisterResponse;
use plexsphere_wire::node::NodeState;
use plexsphere_wire::reach::relay::RelayToken;
use plexsphere_wire::signed::{DomainVerifier, SignContext, SignedEnvelope};

const KEY: &str = "AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_lists_its_relay_and_stun_flags_in_every_state() {
    let dir = tempfile::tempdir().unwrap();
    let relay =
        format!("name=r1,key={KEY},udp=203.0.113.5:3479,tls=203.0.113.5:443,sni=relay1.example");
    let dev = DevProcess::start(
        dir.path(),
        &["--relay", &relay, "--stun-advertise", "203.0.113.5:3478"],
    );
    let token = dev.issue_tokens(1).await.remove(0);
    let (status, body) = dev
        .register(&token, 77, Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(status, 201, "{body}");
    let reg: RegisterResponse = serde_json::from_value(body).unwrap();
    let r = dev
        .client
        .get(dev.url(&format!("/v1/nodes/{}/state", reg.node_id)))
        .bearer_auth(&reg.node_credential)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let env: SignedEnvelope = r.json().await.unwrap();
    let verifier = DomainVerifier::from_b64(&reg.domain_signing_public_key).unwrap();
    let state: NodeState = verifier.open(SignContext::NodeState, &env).unwrap();
    // (Other relays may be listed besides, e.g. one dev runs itself.)
    let r1 = state.relays.iter().find(|r| r.name == "r1").unwrap();
    assert_eq!(r1.public_key, KEY);
    assert_eq!(r1.udp, Some("203.0.113.5:3479".parse().unwrap()));
    assert_eq!(r1.tls, Some("203.0.113.5:443".parse().unwrap()));
    assert_eq!(r1.tls_server_name.as_deref(), Some("relay1.example"));
    assert!(
        state.stun.contains(&"203.0.113.5:3478".parse().unwrap()),
        "{:?}",
        state.stun
    );
    let token: RelayToken = verifier
        .open(SignContext::RelayToken, state.relay_token.as_ref().unwrap())
        .unwrap();
    assert_eq!(token.node_id, reg.node_id);
    dev.stop();
}
