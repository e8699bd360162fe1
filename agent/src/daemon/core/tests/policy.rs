//! The access policy in the daemon: the signed state's policy goes with every apply, its
//! filter is installed before the peers (also from the cache at start), a filter that cannot
//! be installed leaves the interface without peers and is said in status and `plexd policy`.

use std::sync::Arc;

use plexsphere_policy::view::{NodeView, PeerView};
use plexsphere_wire::node::{PeerSpec, PolicyState};

use super::super::accept_fixtures::{peer, peer_id};
use super::*;
use crate::daemon::core::cache::Cached;
use crate::daemon::core::mesh_apply::{InstalledPolicy, run_apply};
use crate::daemon::core::policy_status::FilterState;
use crate::daemon::core::protocol::{Answer, Request};
use crate::daemon::core::schedule::Task;
use crate::mesh::diff::MeshChange;
use crate::mesh::{LivePeer, Mesh, MeshError};

fn policy(version: u64) -> PolicyState {
    PolicyState {
        version,
        view: NodeView {
            node: super::super::accept_fixtures::own(),
            addrs: vec!["10.64.1.2".parse().unwrap()],
            grants: vec![],
            peers: vec![view_peer(3)],
        },
    }
}

/// A mesh that writes down what it was asked, in order; `fail` refuses every policy.
#[derive(Default)]
struct Recorder {
    calls: Vec<String>,
    fail: bool,
}

impl Mesh for Recorder {
    fn backend(&self) -> &'static str {
        "test"
    }
    fn apply(&mut self, desired: Arc<Vec<PeerSpec>>) -> Result<Vec<MeshChange>, MeshError> {
        self.calls.push(format!("apply {} peers", desired.len()));
        Ok(vec![])
    }
    fn live_peers(&self) -> Result<Vec<LivePeer>, MeshError> {
        Ok(vec![])
    }
    fn teardown(&mut self) -> Result<(), MeshError> {
        Ok(())
    }
    fn set_policy(&mut self, policy: Option<&PolicyState>) -> Result<(), MeshError> {
        self.calls
            .push(format!("policy {:?}", policy.map(|p| p.version)));
        if self.fail {
            return Err(MeshError {
                backend: "test",
                interface: "plexd0".into(),
                what: "cannot install".into(),
            });
        }
        Ok(())
    }
}

fn cached(s: &NodeState) -> Input {
    let envelope = signer().sign(SignContext::NodeState, s).unwrap();
    Input::CacheLoaded(Ok(Some(Box::new(Cached {
        promoted: false,
        state: s.clone(),
        envelope,
        events: vec![],
        last_seq: s.version,
    }))))
}

/// The mesh jobs the effects ask for, run through the mesh thread's apply on `mesh`.
fn run(effects: &[Effect], mesh: &mut Recorder, installed: &mut InstalledPolicy) {
    for e in effects {
        if let Effect::Mesh {
            op: MeshOp::Apply(set, policy),
            ..
        } = e
        {
            run_apply(mesh, installed, set.clone(), policy.clone());
        }
    }
}

#[test]
fn a_starting_node_installs_the_cached_filter_before_its_first_peer() {
    let mut h = harness();
    h.auto_mesh = false;
    let mut s = one_state(7, 2);
    s.policy = Some(policy(3));
    let e = h.step(cached(&s));
    let applies: Vec<_> = e
        .iter()
        .filter_map(|e| match e {
            Effect::Mesh {
                op: MeshOp::Apply(set, p),
                ..
            } => Some((set.len(), p.as_ref().map(|p| p.version))),
            _ => None,
        })
        .collect();
    // The view names peer 3 only: peer 4 stays off the interface (see below).
    assert_eq!(
        applies,
        vec![(1, Some(3))],
        "the cached policy goes with the first apply"
    );
    let (mut mesh, mut installed) = (Recorder::default(), InstalledPolicy::default());
    run(&e, &mut mesh, &mut installed);
    assert_eq!(mesh.calls, vec!["policy Some(3)", "apply 1 peers"]);
}

#[test]
fn the_filter_goes_in_before_the_peers_and_only_when_it_changes() {
    let (mut mesh, mut installed) = (Recorder::default(), InstalledPolicy::default());
    let peers = Arc::new(one_state(1, 2).peers);
    let p3 = Some(Arc::new(policy(3)));
    run_apply(&mut mesh, &mut installed, peers.clone(), p3.clone());
    run_apply(&mut mesh, &mut installed, peers.clone(), p3.clone());
    // The same policy in a new Arc (a new state with the same view) is no change either.
    run_apply(
        &mut mesh,
        &mut installed,
        peers.clone(),
        Some(Arc::new(policy(3))),
    );
    run_apply(
        &mut mesh,
        &mut installed,
        peers.clone(),
        Some(Arc::new(policy(4))),
    );
    // A server older than policies: the filter is removed.
    run_apply(&mut mesh, &mut installed, peers.clone(), None);
    assert_eq!(
        mesh.calls,
        vec![
            "policy Some(3)",
            "apply 2 peers",
            "apply 2 peers",
            "apply 2 peers",
            "policy Some(4)",
            "apply 2 peers",
            "policy None",
            "apply 2 peers",
        ]
    );
}

#[test]
fn a_filter_that_cannot_be_installed_leaves_no_peer_and_is_tried_again() {
    let mut mesh = Recorder {
        fail: true,
        ..Recorder::default()
    };
    let mut installed = InstalledPolicy::default();
    let peers = Arc::new(one_state(1, 2).peers);
    let p3 = Some(Arc::new(policy(3)));
    let answer = run_apply(&mut mesh, &mut installed, peers.clone(), p3.clone());
    assert!(matches!(answer, MeshAnswer::Applied(Ok(_), Some(Err(_)))));
    mesh.fail = false;
    run_apply(&mut mesh, &mut installed, peers.clone(), p3.clone());
    assert_eq!(
        mesh.calls,
        vec![
            "policy Some(3)",
            "apply 0 peers",
            "policy Some(3)",
            "apply 2 peers"
        ],
        "no peer while the filter is not installed"
    );
}

#[test]
fn status_and_plexd_policy_say_whether_the_filter_is_installed_or_closed_and_why() {
    let mut h = harness();
    h.auto_mesh = false;
    let mut s = one_state(7, 1);
    s.policy = Some(policy(3));
    h.step(cached(&s));
    let (id, _) = h.held.remove(0);
    let closed = MeshError {
        backend: "userspace",
        interface: "plexd0".into(),
        what: "the view is corrupt".into(),
    };
    h.step(Input::Mesh {
        id,
        answer: MeshAnswer::Applied(Ok(vec![]), Some(Err(Box::new(closed)))),
    });
    let e = h.step(Input::Control {
        id: 1,
        request: Request::Policy,
    });
    let report = e
        .iter()
        .find_map(|e| match e {
            Effect::Answer {
                answer: Answer::Policy(r),
                ..
            } => Some(r.clone()),
            _ => None,
        })
        .expect("a policy answer");
    assert_eq!(report.status.filter, FilterState::Closed);
    assert_eq!(report.status.version, Some(3));
    assert!(
        report
            .status
            .why
            .as_deref()
            .unwrap()
            .contains("the view is corrupt"),
        "{report:?}"
    );
    assert_eq!(
        report.lines,
        vec!["no peers: no rule connects this node to another"]
    );

    // The next state installs it: status says so.
    let mut s = one_state(8, 1);
    s.policy = Some(policy(4));
    h.auto_mesh = true;
    h.state_answer(&s);
    let e = h.step(Input::Control {
        id: 2,
        request: Request::Policy,
    });
    let Some(Effect::Answer {
        answer: Answer::Policy(r),
        ..
    }) = e.last()
    else {
        panic!("{e:?}");
    };
    assert_eq!(r.status.filter, FilterState::Installed);
    assert_eq!(r.status.version, Some(4));
}

#[test]
fn under_a_policy_only_the_views_peers_are_configured() {
    let mut h = harness();
    let mut s = one_state(7, 3); // peers 3, 4, 5; the view names only 3
    s.policy = Some(policy(3));
    let e = h.step(cached(&s));
    assert_eq!(applies(&e), vec![1], "{e:?}");
    let live = h.mesh.live_peers().unwrap();
    assert_eq!(live.len(), 1);
    assert_eq!(h.mesh.policy_version(), Some(3));
    // Without a policy (an older server) every peer is configured, as before.
    let mut h = harness();
    let e = h.step(cached(&one_state(7, 3)));
    assert_eq!(applies(&e), vec![3]);
}

/// A node whose view came before a peer registered: the control plane sends it the peer's
/// `peer_added` (its policy connects the two) but the view the node holds does not name the
/// peer, so the node pulls its state for the new view instead of leaving the peer off until
/// its next state poll (the broker's machines, which poll every few minutes, never met).
#[test]
fn a_peer_added_outside_the_view_pulls_the_state_for_the_new_view() {
    let mut h = harness();
    let mut s = one_state(7, 1); // peer 3, named by the view
    s.policy = Some(policy(3));
    h.up(&s);
    let mut e = h.frame(1, 8, EventKind::PeerAdded { peer: peer(9) });
    e.extend(h.wake());
    assert!(
        calls(&e).iter().any(|c| matches!(c, Call::State { .. })),
        "a state pull follows a peer the view does not name: {e:?}"
    );
    // A peer the view names is applied from the event alone.
    let mut h = harness();
    let mut s = one_state(7, 1);
    let mut p = policy(3);
    p.view.peers.push(view_peer(9));
    s.policy = Some(p);
    h.up(&s);
    let mut e = h.frame(1, 8, EventKind::PeerAdded { peer: peer(9) });
    e.extend(h.wake());
    assert!(
        !calls(&e).iter().any(|c| matches!(c, Call::State { .. })),
        "no pull for a peer the view names: {e:?}"
    );
}

/// Peer `n` as a view names it (`accept_fixtures::peer(n)`'s id, name and address).
fn view_peer(n: u8) -> PeerView {
    PeerView {
        id: peer_id(n),
        name: format!("node-{n}"),
        addrs: vec![format!("10.64.1.{n}").parse().unwrap()],
        inbound: None,
        outbound: None,
        routes_out: Vec::new(),
        routes_in: Vec::new(),
    }
}

/// Peers 3 and `more`, all named by the view, at `version`.
fn state_naming(version: u64, more: &[u8]) -> NodeState {
    let mut s = one_state(version, 1);
    let mut p = policy(3);
    for n in more {
        s.peers.push(peer(*n));
        p.view.peers.push(view_peer(*n));
    }
    s.policy = Some(p);
    s
}

/// Two nodes register one after the other: the first one's `peer_added` starts a state pull,
/// the second's arrives while it runs, and the pull answers a state made between the two. The
/// node pulls again one floor later (not one state-poll interval, minutes), and stops once a
/// state names both.
#[test]
fn a_peer_added_while_the_pull_for_the_view_runs_is_pulled_for_one_floor_later() {
    let mut h = harness();
    h.up(&state_naming(7, &[]));
    let mut e = h.frame(1, 8, EventKind::PeerAdded { peer: peer(9) });
    e.extend(h.wake());
    assert!(calls(&e).iter().any(|c| matches!(c, Call::State { .. })));
    // Peer 10 while the pull runs; the pull answers state 8, which names 9 but not 10.
    h.frame(1, 9, EventKind::PeerAdded { peer: peer(10) });
    let e = h.state_answer(&state_naming(8, &[9]));
    assert_eq!(
        applies(&e),
        vec![2],
        "3 and 9 configured, 10 not yet: {e:?}"
    );
    let asked = h.elapsed();
    let floor = h.core.schedule.floor();
    let mut pulled = false;
    for _ in 0..100 {
        if h.elapsed() >= asked + floor {
            break;
        }
        if calls(&h.wake())
            .iter()
            .any(|c| matches!(c, Call::State { .. }))
        {
            pulled = true;
            break;
        }
    }
    assert!(pulled, "pulled again within the floor ({floor:?})");
    assert_eq!(h.elapsed(), asked + floor, "one floor later, not at once");
    // State 9 names 10: configured, and no further pull until the normal interval.
    let e = h.state_answer(&state_naming(9, &[9, 10]));
    assert_eq!(applies(&e), vec![3], "{e:?}");
    let settled = h.elapsed();
    let interval = h.core.schedule.interval(Task::StatePoll);
    for _ in 0..1000 {
        if h.elapsed() >= settled + interval / 2 {
            break;
        }
        assert!(
            !calls(&h.wake())
                .iter()
                .any(|c| matches!(c, Call::State { .. })),
            "no pull once a state names every peer the events name"
        );
    }
}
