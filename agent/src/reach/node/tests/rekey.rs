//! A key rotation seen only through the node's inputs and its output queue: the relayed
//! peers lose their paths, the relays register again under the new key, and the same paths
//! come back.

use std::time::Duration;

use plexsphere_wire::reach::public_key;

use super::base::NODE_SECRET;
use super::scripted::{Rig, position, position_from, relay_udp, short};
use crate::reach::io::{Path, Transport};
use crate::reach::node::Carry;

const NEW_SECRET: [u8; 32] = [0x61; 32];

#[test]
fn a_key_rotation_holds_the_relayed_peers_registers_again_with_the_new_key_and_the_same_paths_come_back()
 {
    let (mut rig, relayed) = Rig::with_peer_homed_on_r1();
    let r1 = Path::Relay {
        relay: "r1".to_owned(),
        transport: Transport::Udp,
    };
    let through_r1 = Carry::PlaneRelay {
        relay: "r1".to_owned(),
        udp: relay_udp(),
    };
    let set_r1 = format!("carry {} {through_r1:?}", short(&relayed.key));
    let lines = rig.at(rig.start);
    let register = position(&lines, "relay-udp 192.0.2.1:3478 register");
    assert!(
        position_from(&lines, register, &set_r1) > register,
        "{lines:?}"
    );
    assert_eq!(rig.hellos, [public_key(&NODE_SECRET)]);
    assert_eq!(rig.node.paths()[0].path, r1);

    // The key rotates (a daemon input): the new engine knows the peer again, but no path for
    // it yet, and nothing goes to r1 until the pass.
    rig.now = rig.start + Duration::from_secs(2);
    rig.node_secret = NEW_SECRET;
    let now = rig.now();
    rig.node.handle_secret(NEW_SECRET, now);
    let lines = rig.drain();
    assert_eq!(lines[0], format!("carry {} Hold", short(&relayed.key)));
    assert!(
        !lines
            .iter()
            .any(|l| l.starts_with("relay-udp") || l.starts_with("plane-relays")),
        "{lines:?}"
    );
    let views = rig.node.paths();
    assert_eq!(views.len(), 1);
    assert_eq!(views[0].path, Path::None, "the relayed peer holds");

    // The pass right after it: r1 is greeted with the new key, registers, and the peer is
    // relayed through r1 again.
    rig.node.handle_daemon_input(now);
    let lines = rig.at(rig.now);
    let register = position(&lines, "relay-udp 192.0.2.1:3478 register");
    assert!(
        position_from(&lines, register, &set_r1) > register,
        "{lines:?}"
    );
    assert_eq!(
        rig.hellos,
        [public_key(&NODE_SECRET), public_key(&NEW_SECRET)]
    );
    // r1's connection closed and opened again within the rotation's turn: the data plane
    // keeps unwrapping r1's frames, and is not told anything.
    assert!(
        !lines.iter().any(|l| l.starts_with("plane-relays")),
        "{lines:?}"
    );
    assert_eq!(rig.node.paths()[0].path, r1);
}
