//! What the node's own tests (`node.rs`) and its routing tests (`routing.rs`) start from: the
//! node's and the relay's keys, the mesh, a relay spec, the node with a relay token, and the
//! stepped clock's `Now`.

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use plexsphere_test_support::seeded::SeededRng;
use plexsphere_wire::node::RelaySpec;
use plexsphere_wire::reach::public_key;

use crate::reach::io::Now;
use crate::reach::node::Node;

pub(super) const NODE_SECRET: [u8; 32] = [0x4e; 32];
pub(super) const RELAY_SECRET: [u8; 32] = [0x52; 32];
pub(super) const PORT: u16 = 51820;

pub(super) fn mesh() -> ipnet::IpNet {
    "100.64.0.0/10".parse().expect("a mesh range")
}

/// Relay `name` at 192.0.2.`n`:3478 over UDP, with the tests' relay key.
pub(super) fn relay(name: &str, n: u8) -> RelaySpec {
    RelaySpec {
        name: name.to_owned(),
        public_key: public_key(&RELAY_SECRET).to_base64(),
        udp: Some(SocketAddr::from(([192, 0, 2, n], 3478))),
        tls: None,
        tls_server_name: None,
    }
}

/// The node with the tests' key and mesh, the engine's tx ids and nonces from seed 2, STUN ids from seed 1, its first pass due at `start`,
/// and a relay token (without one a relay connection waits; with one it says hello).
pub(super) fn node_with_token(start: Instant) -> Node {
    let mut node = Node::new(
        NODE_SECRET,
        mesh(),
        false,
        Box::new(SeededRng::new(2)),
        Box::new(SeededRng::new(1)),
        start,
    );
    node.handle_token(b"{\"token\":1}".to_vec());
    node
}

/// `at` with a fixed wall clock.
pub(super) fn now_at(at: Instant) -> Now {
    Now::new(
        at,
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
    )
}
