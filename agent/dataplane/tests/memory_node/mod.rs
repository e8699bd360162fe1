//! A node of the in-memory network for the integration tests that run the data plane's runner
//! (`relay`, `side_channel`, `one_loop`): a device with a fresh key, its runner on a thread bound through
//! the network's binder, a host end of its TUN, and a raw sender; stopped and joined on drop.

// Each test crate that includes this module uses a part of it.
#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use plexd_dataplane::memory::{MemoryNetwork, MemoryTun, tun_pair};
use plexd_dataplane::runner::{RunConfig, RunError, Shutdown, run};
use plexd_dataplane::{
    Device, DeviceUpdate, PeerUpdate, PublicKey, RawSender, SecretKey, SideSink,
};

/// One running node. `host` is the host side of its TUN.
pub struct Node {
    pub host: MemoryTun,
    pub device: Arc<Device>,
    pub raw: RawSender,
    shutdown: Shutdown,
    thread: Option<JoinHandle<Result<(), RunError>>>,
    key: SecretKey,
}

impl Node {
    /// Starts a node at `ip` listening on `port`, its runner configured by `config` (its `raw`
    /// is the node's own). Returns once the runner has bound its socket.
    pub fn start(net: &MemoryNetwork, ip: [u8; 4], port: u16, config: RunConfig) -> Node {
        let (host, tun) = tun_pair();
        let key = SecretKey::generate().expect("key");
        let device = Arc::new(Device::new(plexsphere_wire::clock::Now::system()));
        device
            .apply(DeviceUpdate {
                private_key: Some(Some(key.clone())),
                ..DeviceUpdate::default()
            })
            .expect("key");
        device.set_listen_port(port);
        let raw = RawSender::new();
        let config = RunConfig {
            raw: Some(raw.clone()),
            ..config
        };
        let shutdown = Shutdown::new();
        let (d, s, binder) = (
            device.clone(),
            shutdown.clone(),
            net.binder(IpAddr::from(ip)),
        );
        let thread = std::thread::spawn(move || run(d, tun, binder, config, s));
        wait(|| raw.local_addr().is_some(), "the runner binds its socket");
        Node {
            host,
            device,
            raw,
            shutdown,
            thread: Some(thread),
            key,
        }
    }

    pub fn public(&self) -> PublicKey {
        self.key.public_key()
    }

    /// The address the runner's socket is bound to.
    pub fn addr(&self) -> SocketAddr {
        self.raw.local_addr().expect("bound")
    }

    /// `other` as a peer at `endpoint`, owning `mesh`.
    pub fn add_peer(&self, other: &Node, endpoint: SocketAddr, mesh: &str) {
        self.device
            .apply(DeviceUpdate {
                peers: vec![PeerUpdate {
                    endpoint: Some(endpoint),
                    replace_allowed_ips: true,
                    allowed_ips: vec![mesh.parse().expect("net")],
                    ..PeerUpdate::new(other.public())
                }],
                ..DeviceUpdate::default()
            })
            .expect("peer");
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.shutdown.trigger();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The runner's default configuration, datagrams that are not WireGuard going to `side` if
/// given.
pub fn with_side(side: Option<SideSink>) -> RunConfig {
    RunConfig {
        side,
        ..RunConfig::default()
    }
}

/// Waits until `ok` holds, at most 10 s (then fails naming `what`).
pub fn wait(mut ok: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < deadline, "{what} within 10 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A sink over a bounded channel, as the reach runtime builds it.
pub fn bounded_sink(capacity: usize) -> (SideSink, mpsc::Receiver<(Vec<u8>, SocketAddr)>) {
    let (tx, rx) = mpsc::sync_channel(capacity);
    let sink = SideSink::new(move |d, from| tx.try_send((d.to_vec(), from)).is_ok());
    (sink, rx)
}
