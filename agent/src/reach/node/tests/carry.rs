//! How the node has the runtime carry what it decided, seen only through its inputs and its
//! output queue on a stepped clock (`scripted.rs`): the relays whose frames the data plane
//! unwraps.

use crate::reach::io::TICK;

use super::scripted::{Rig, position, relay_r1};

const PLANE_R1: &str = "plane-relays [192.0.2.1:3478]";
const PLANE_NONE: &str = "plane-relays []";

fn count(lines: &[String], line: &str) -> usize {
    lines.iter().filter(|l| *l == line).count()
}

#[test]
fn the_data_plane_is_told_its_relays_once_at_the_end_of_the_pass_that_changed_them() {
    let mut rig = Rig::new();
    // The first pass: no relay yet, and nothing to tell (the data plane starts with none).
    let lines = rig.at(rig.start);
    assert_eq!(count(&lines, PLANE_NONE), 0, "{lines:?}");

    // r1 comes with a daemon input: the pass opens its connection over UDP (it registers as
    // it answers), and the data plane hears of r1 once, after the views are published.
    let now = rig.now();
    rig.node.handle_relays(vec![relay_r1()], Vec::new(), now);
    rig.node.handle_daemon_input(now);
    let lines = rig.at(rig.now);
    assert_eq!(count(&lines, PLANE_R1), 1, "{lines:?}");
    assert!(position(&lines, "publish") < position(&lines, PLANE_R1));

    // Passes that change nothing tell nothing.
    let lines = rig.run_until(rig.start + 4 * TICK);
    assert!(
        !lines.iter().any(|l| l.starts_with("plane-relays")),
        "{lines:?}"
    );

    // r1 leaves the state: its connection closes with the next pass, and the data plane
    // hears of that once.
    let now = rig.now();
    rig.node.handle_relays(Vec::new(), Vec::new(), now);
    assert!(
        !rig.drain().iter().any(|l| l.starts_with("plane-relays")),
        "not before the pass"
    );
    rig.node.handle_daemon_input(now);
    let lines = rig.at(rig.now);
    assert_eq!(count(&lines, PLANE_NONE), 1, "{lines:?}");
    assert_eq!(count(&lines, PLANE_R1), 0, "{lines:?}");
}
