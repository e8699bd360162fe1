//! `plexd leave` through the daemon: the call, the teardown, the files, the answer, the exit;
//! and what happens when the node is revoked meanwhile.

use std::path::PathBuf;

use super::*;
use crate::daemon::core::protocol::{Answer, Request};
use crate::node_api::LeaveAnswer;

fn answer_of(e: &[Effect], id: ControlId) -> Option<&Answer> {
    e.iter().find_map(|e| match e {
        Effect::Answer { id: i, answer } if *i == id => Some(answer),
        _ => None,
    })
}

#[test]
fn leave_tears_down_removes_the_files_answers_and_exits() {
    let mut h = harness();
    h.up(&one_state(4, 2));
    let e = h.step(Input::Control {
        id: 3,
        request: Request::Leave,
    });
    assert_eq!(calls(&e), vec![&Call::Leave]);
    let e = h.step(Input::Control {
        id: 4,
        request: Request::Leave,
    });
    assert!(
        matches!(answer_of(&e, 4), Some(Answer::Error { message, .. }) if message.contains("already in progress"))
    );
    let e = h.call(CallResult::Leave(Ok(LeaveAnswer::Deleted)));
    assert!(e.iter().any(|e| matches!(
        e,
        Effect::Mesh {
            op: MeshOp::Teardown,
            ..
        }
    )));
    assert_eq!(e.last(), Some(&Effect::RemoveNodeFiles));
    assert!(exits(&e).is_empty(), "not before the files are gone");
    let files = vec![PathBuf::from("/var/lib/plexd/identity.json")];
    let e = h.step(Input::NodeFilesRemoved(files));
    let Some(Answer::Left { message }) = answer_of(&e, 3) else {
        panic!("{e:?}")
    };
    assert!(
        message.contains("deregistered from https://cp.example")
            && message.contains("identity.json"),
        "{message}"
    );
    assert_eq!(exits(&e), vec![&Outcome::Left]);
}

#[test]
fn a_leave_the_control_plane_refuses_keeps_the_daemon_running() {
    let mut h = harness();
    h.up(&one_state(4, 2));
    h.step(Input::Control {
        id: 3,
        request: Request::Leave,
    });
    let e = h.call(CallResult::Leave(Err(unreachable())));
    let Some(Answer::Error { exit_code, .. }) = answer_of(&e, 3) else {
        panic!("{e:?}")
    };
    assert_eq!(
        *exit_code,
        Some(crate::exit::ExitCode::ApiUnreachable.as_i32())
    );
    assert!(exits(&e).is_empty());
    // Not leaving any more: a 401 now ends the daemon.
    let e = h.call(CallResult::Endpoints(Err(CallError::Unauthorized)));
    assert_eq!(exits(&e), vec![&Outcome::Gone(DELETED.into())]);
    // A leave answer nobody waits for is ignored.
    let mut idle = harness();
    assert!(
        idle.call(CallResult::Leave(Ok(LeaveAnswer::Deleted)))
            .is_empty()
    );
    assert!(idle.step(Input::NodeFilesRemoved(vec![])).is_empty());
}

#[test]
fn leave_while_revoked() {
    // The node is revoked while its leave is in flight: the stream's end, the revoked event
    // and other calls' 403 all wait for the leave's own answer, which says it was revoked.
    let mut h = harness();
    h.up(&one_state(4, 2));
    h.step(Input::Control {
        id: 3,
        request: Request::Leave,
    });
    assert!(exits(&h.frame(1, 5, EventKind::NodeRevoked)).is_empty());
    assert!(exits(&h.call(CallResult::Heartbeat(Err(CallError::Revoked)))).is_empty());
    let e = h.stream(
        1,
        StreamMsg::Ended {
            reason: "403".into(),
            retry_after: None,
            fatal: Some(CallError::Revoked),
        },
    );
    assert!(exits(&e).is_empty());
    let e = h.call(CallResult::Leave(Err(CallError::Revoked)));
    assert_eq!(e.last(), Some(&Effect::RemoveNodeFiles));
    let e = h.step(Input::NodeFilesRemoved(vec![]));
    let Some(Answer::Left { message }) = answer_of(&e, 3) else {
        panic!("{e:?}")
    };
    assert!(
        message.contains("revoked") && message.contains("nothing (no local files were left)"),
        "{message}"
    );
    assert_eq!(exits(&e), vec![&Outcome::Left]);
    // The mesh is torn down, not just emptied.
    assert!(h.mesh.live_peers().unwrap().is_empty());
}

#[test]
fn a_failed_teardown_still_removes_the_files() {
    let mut h = harness();
    h.auto_mesh = false;
    h.up(&one_state(4, 1));
    h.release_mesh();
    h.step(Input::Control {
        id: 3,
        request: Request::Leave,
    });
    h.call(CallResult::Leave(Ok(LeaveAnswer::AlreadyGone(404))));
    let (id, op) = h.held.pop().expect("the teardown");
    assert_eq!(op, MeshOp::Teardown);
    let err = crate::mesh::MeshError {
        backend: "kernel",
        interface: "plexd0".into(),
        what: "busy".into(),
    };
    let e = h.step(Input::Mesh {
        id,
        answer: MeshAnswer::TornDown(Err(err)),
    });
    assert_eq!(e, vec![Effect::RemoveNodeFiles]);
}
