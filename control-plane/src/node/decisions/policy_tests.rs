//! The policy in a node's state and on its stream, by table (web, db, ci).

use plexsphere_wire::node::{EventKind, NodeState};
use plexsphere_wire::signed::SignedEnvelope;
use uuid::Uuid;

use super::{Extras, Reach, node_state, peer_spec};
use crate::policy::view::*;
use crate::store::domains::Domain;
use crate::store::nodes::NodeRow;

const WEB_TO_DB: &str = "rules:\n  - {src: 'node:web', dst: 'node:db', proto: tcp, ports: 5432}\n";

fn named(n: u128, name: &str) -> NodeRow {
    NodeRow {
        hostname: name.into(),
        ..NodeRow::for_test(n, &format!("10.64.0.{n}"))
    }
}

fn fleet() -> Vec<NodeRow> {
    vec![named(1, "web"), named(2, "db"), named(3, "ci")]
}

fn compile(doc: Option<&str>, live: &[NodeRow], version: u64) -> CompiledPolicy {
    let policy = match doc {
        Some(text) => plexsphere_policy::parse(text).unwrap(),
        None => plexsphere_policy::default_document(),
    };
    CompiledPolicy::new(version, &policy, &inventory(live, &[]), 10)
}

fn state(me: &NodeRow, live: &[NodeRow], policy: &CompiledPolicy) -> NodeState {
    let domain = Domain {
        id: Uuid::from_u128(100),
        slug: "lab".into(),
        mesh_cidr: "10.64.0.0/16".parse().unwrap(),
        created_at: 0,
    };
    let token = SignedEnvelope {
        payload: "cA==".into(),
        signature: "c2ln".into(),
    };
    let reach = Reach {
        relays: &[],
        stun: &[],
        relay_token: &token,
    };
    node_state(
        me,
        &domain,
        live,
        7,
        99,
        reach,
        None,
        policy,
        &Extras::default(),
    )
}

fn peer_names(s: &NodeState) -> Vec<String> {
    s.peers.iter().map(|p| p.hostname.clone()).collect()
}

#[test]
fn a_state_lists_exactly_the_peers_the_policy_connects_and_carries_the_view() {
    let live = fleet();
    // (document, node, its peers)
    let table: &[(Option<&str>, usize, &[&str])] = &[
        (Some(WEB_TO_DB), 0, &["db"]),
        (Some(WEB_TO_DB), 1, &["web"]),
        (Some(WEB_TO_DB), 2, &[]),
        (None, 0, &["db", "ci"]),
        (None, 2, &["web", "db"]),
        (Some("rules: []\n"), 0, &[]),
    ];
    for (doc, me, want) in table {
        let policy = compile(*doc, &live, 4);
        let s = state(&live[*me], &live, &policy);
        assert_eq!(peer_names(&s), *want, "{doc:?} node {me}");
        let p = s.policy.as_ref().expect("a policy in every state");
        assert_eq!(p.version, 4);
        assert_eq!(p.view.node, live[*me].id);
        let in_view: Vec<Uuid> = p.view.peer_ids().collect();
        let in_state: Vec<Uuid> = s.peers.iter().map(|p| p.node_id).collect();
        assert_eq!(in_view, in_state, "the view and the peers agree");
        // The node can build its filter from it.
        plexsphere_policy::NodeFilter::new(&p.view).unwrap();
    }
    // ci's state carries no key or endpoint of another node.
    let ci = state(&live[2], &live, &compile(Some(WEB_TO_DB), &live, 4));
    let text = serde_json::to_string(&ci).unwrap();
    assert!(!text.contains("key-1") && !text.contains("key-2"), "{text}");
}

#[test]
fn a_node_the_compile_does_not_know_gets_no_peer() {
    let live = fleet();
    let policy = compile(None, &live, 1);
    let stranger = named(9, "new");
    let mut with = live.clone();
    with.push(stranger.clone());
    let s = state(&stranger, &with, &policy);
    assert!(s.peers.is_empty());
    let view = &s.policy.unwrap().view;
    assert!(view.peers.is_empty() && view.node == stranger.id);
}

#[test]
fn the_key_is_the_version_and_the_inventory_not_the_endpoints() {
    let live = fleet();
    let policy = compile(None, &live, 3);
    assert!(policy.is_for(3, &live, &[]));
    assert!(!policy.is_for(4, &live, &[]), "another version");
    let mut moved = live.clone();
    moved[0].endpoints = vec!["198.51.100.7:4000".parse().unwrap()];
    moved[0].wireguard_public_key = "rotated".into();
    moved[0].last_seen_at = Some(55);
    assert!(policy.is_for(3, &moved, &[]), "endpoints, keys, reports");
    let mut renamed = live.clone();
    renamed[1].hostname = "db2".into();
    assert!(!policy.is_for(3, &renamed, &[]));
    let mut readdressed = live.clone();
    readdressed[1].mesh_ip = "10.64.0.99".parse().unwrap();
    assert!(!policy.is_for(3, &readdressed, &[]));
    let mut grown = live.clone();
    grown.push(named(4, "new"));
    assert!(!policy.is_for(3, &grown, &[]));
    assert!(!policy.is_for(3, &live[..2], &[]));
    let mut revoked = live.clone();
    revoked[2].revoked_at = Some(1);
    assert!(!policy.is_for(3, &revoked, &[]), "a revoked node leaves");
    let mut other_project = live.clone();
    other_project[0].project_id = Uuid::from_u128(201);
    assert!(!policy.is_for(3, &other_project, &[]));
    let project = crate::store::projects::Project {
        id: Uuid::from_u128(200),
        domain_id: Uuid::from_u128(100),
        slug: "p".into(),
        display_name: None,
        sub_range_cidr: None,
        created_at: 0,
    };
    assert!(!policy.is_for(3, &live, std::slice::from_ref(&project)));
}

#[test]
fn peer_events_go_only_where_the_policy_connects() {
    let live = fleet();
    let policy = compile(Some(WEB_TO_DB), &live, 1);
    let (web, db, ci) = (live[0].id, live[1].id, live[2].id);
    let added = |n: &NodeRow| EventKind::PeerAdded { peer: peer_spec(n) };
    let moved = |id| EventKind::EndpointChanged {
        peer_node_id: id,
        endpoints: vec![],
        home_relay: None,
    };
    let removed = |id| EventKind::PeerRemoved {
        peer_node_id: id,
        public_key: "k".into(),
    };
    let updated = |n: &NodeRow| EventKind::PeerUpdated { peer: peer_spec(n) };
    let resync = EventKind::Resync {
        reason: "policy".into(),
    };
    let stranger = named(9, "new");
    let table: Vec<(Uuid, EventKind, Verdict)> = vec![
        (web, added(&live[1]), Verdict::Send),
        (db, added(&live[0]), Verdict::Send),
        (ci, added(&live[0]), Verdict::Hide),
        (ci, moved(db), Verdict::Hide),
        (web, moved(db), Verdict::Send),
        (ci, removed(web), Verdict::Hide),
        (db, removed(web), Verdict::Send),
        (ci, updated(&live[1]), Verdict::Hide),
        (web, updated(&live[1]), Verdict::Send),
        (ci, resync.clone(), Verdict::Send),
        (ci, EventKind::NodeRevoked, Verdict::Send),
        // Never "allow because unknown": ask a newer compile.
        (web, added(&stranger), Verdict::Unknown),
        (stranger.id, added(&live[0]), Verdict::Unknown),
        (web, removed(stranger.id), Verdict::Unknown),
    ];
    for (me, kind, want) in table {
        assert_eq!(verdict(&policy, me, &kind), want, "{me} {kind:?}");
    }
    assert_eq!(unknown_verdict(&removed(web)), Verdict::Send);
    assert_eq!(unknown_verdict(&added(&stranger)), Verdict::Hide);
    assert_eq!(unknown_verdict(&moved(web)), Verdict::Hide);
}
