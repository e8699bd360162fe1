//! One peer change at 10 000 peers through plexd's own path: an `EndpointChanged` event for
//! one peer is applied to the desired set and then to the embedded (userspace) data plane the
//! way `plexd run` does it (the wanted set, the mesh's one diff and update, the journal's
//! change lines). The data plane runs over in-memory TUN and UDP; it serves its UAPI
//! socket under /var/run/wireguard, so this bench needs root (it is skipped otherwise).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use plexd::daemon::core::wanted::{DesiredPeers, change_lines};
use plexd::mesh::Mesh as _;
use plexd::mesh::userspace::DirectControl;
use plexd::mesh::worker::{Plane, WgMesh, WorkerError};
use plexd_dataplane::memory::{MemoryNetwork, tun_pair};
use plexd_dataplane::runner::{self, RunConfig, Shutdown};
use plexd_dataplane::uapi_server::socket_path;
use plexd_dataplane::{Device, DeviceUpdate, SecretKey};
use plexsphere_wire::node::{EventKind, NodeState, PeerSpec};

const PEERS: u32 = 10_000;
const IFACE: &str = "plexbench0";

struct Plain;

impl Plane for Plain {
    fn check(&mut self) -> Result<(), WorkerError> {
        Ok(())
    }
    fn teardown(&mut self) -> Result<(), WorkerError> {
        Ok(())
    }
}

fn peer(i: u32) -> PeerSpec {
    let mut key = [0u8; 32];
    key[..4].copy_from_slice(&i.to_be_bytes());
    key[31] = 1;
    let ip = Ipv4Addr::from(0x0a64_0000 + i + 2);
    PeerSpec {
        node_id: uuid::Uuid::from_u128(u128::from(i) + 1),
        hostname: format!("node-{i}"),
        public_key: base64_key(&key),
        mesh_ip: ip.into(),
        allowed_ips: vec![ipnet::IpNet::from(ipnet::Ipv4Net::from(ip))],
        endpoints: vec![SocketAddr::from((
            Ipv4Addr::new(192, 0, 2, (i % 250) as u8 + 1),
            51820,
        ))],
        persistent_keepalive_secs: None,
        home_relay: None,
        dns_name: None,
    }
}

fn base64_key(k: &[u8; 32]) -> String {
    wireguard_control::Key(*k).to_base64()
}

fn state(peers: Vec<PeerSpec>) -> NodeState {
    serde_json::from_value(serde_json::json!({
        "version": 1,
        "node_id": uuid::Uuid::from_u128(1 << 100),
        "domain_id": uuid::Uuid::from_u128(2 << 100),
        "mesh_ip": "10.100.0.1",
        "mesh_cidr": "10.100.0.0/16",
        "listen_port": 51820,
        "issued_at": 1_700_000_000u64,
        "peers": peers,
    }))
    .expect("a NodeState")
}

fn bench(c: &mut Criterion) {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("peer_change: skipped (the UAPI socket under /var/run/wireguard needs root)");
        return;
    }
    let device = Arc::new(Device::new(plexsphere_wire::clock::Now::system()));
    let shutdown = Shutdown::new();
    let net = MemoryNetwork::new();
    let (tun, _other) = tun_pair();
    let config = RunConfig {
        uapi_socket: Some(socket_path(IFACE)),
        ..RunConfig::default()
    };
    let runner = {
        let (device, shutdown, binder) = (
            device.clone(),
            shutdown.clone(),
            net.binder([192, 0, 2, 200].into()),
        );
        std::thread::spawn(move || runner::run(device, tun, binder, config, shutdown))
    };
    while std::os::unix::net::UnixStream::connect(socket_path(IFACE)).is_err() {
        std::thread::sleep(Duration::from_millis(10));
    }
    // As `plexd run` does it: the identity and every peer change go straight into the device;
    // the UAPI socket is there for `wg show`.
    device
        .apply(DeviceUpdate {
            private_key: Some(Some(SecretKey::from_bytes([7; 32]))),
            ..DeviceUpdate::default()
        })
        .expect("identity");
    let ctl = DirectControl::new(device.clone());
    let mut mesh = WgMesh::start("userspace", IFACE, ctl, Plain, None).expect("mesh");
    let mut desired = DesiredPeers::from_state(&state((0..PEERS).map(peer).collect()));
    let mut applied = Arc::new(desired.list());
    mesh.apply(applied.clone()).expect("first apply");

    let target = peer(PEERS / 2);
    let mut flip = false;
    let mut g = c.benchmark_group("peer_change");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    g.bench_function("one_endpoint_change_at_10k_peers", |b| {
        b.iter(|| {
            flip = !flip;
            let port = if flip { 51821 } else { 51820 };
            let ev = EventKind::EndpointChanged {
                peer_node_id: target.node_id,
                endpoints: vec![SocketAddr::from((Ipv4Addr::new(198, 51, 100, 9), port))],
                home_relay: None,
            };
            desired.apply(&ev);
            let set = Arc::new(desired.list());
            let changes = mesh.apply(set.clone()).expect("apply");
            let lines = change_lines(&changes, &applied, &set);
            applied = set;
            lines
        });
    });
    g.finish();
    drop(mesh);
    shutdown.trigger();
    let _ = runner.join();
}

criterion_group!(benches, bench);
criterion_main!(benches);
