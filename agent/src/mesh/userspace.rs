//! The userspace backend: plexd's embedded data plane (`plexd-dataplane`) runs in this
//! process on its own threads, over a TUN named after `wireguard.interface`. plexd configures
//! it directly ([`DirectControl`]: the peer diff's update becomes a `DeviceUpdate`, the live
//! peers are the device's snapshot; no UAPI text is printed and parsed back in-process). The
//! data plane still serves the UAPI socket /var/run/wireguard/<iface>.sock, so `wg show
//! <iface>` and other tools work for operators.
//!
//! The data plane lives and dies with plexd: on SIGTERM its threads stop with the process and
//! the TUN interface goes away (the kernel removes a TUN when its last descriptor closes); a
//! restarted plexd creates it again and re-applies the cached state.

use std::io;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, mpsc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime};

use plexd_dataplane::linux::{LinuxTun, LinuxUdpBinder, SwitchedBinder};
use plexd_dataplane::runner::{self, RunConfig, Shutdown};
use plexd_dataplane::uapi_server::socket_path;
use plexd_dataplane::{
    Device, DeviceUpdate, LinkDoor, LinkQueue, PeerUpdate, PolicyFilter, RawSender, SecretKey,
    UdpOffloadSwitch,
};

use super::diff::{LiveConfig, MeshUpdate, PeerOp, PublicKey};
use super::link::setup_link;
use super::netlink;
use super::setup::{NodeSetup, OpenError};
use super::wg::iface_name;
use super::worker::{Control, Plane, WgMesh, WorkerError};
use crate::config::WireguardConfig;
use crate::reach::runtime::{PathControl, Runtime, RuntimeSetup};

/// How long the data plane may take to serve its UAPI socket.
const START_BOUND: Duration = Duration::from_secs(10);

struct UserspacePlane {
    iface: String,
    shutdown: Shutdown,
    /// The runner's end, kept typed until it is logged.
    done: mpsc::Receiver<Result<(), runner::RunError>>,
    thread: Option<JoinHandle<()>>,
    stopped: Option<String>,
}

impl UserspacePlane {
    fn halt(&mut self) {
        self.shutdown.trigger();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Plane for UserspacePlane {
    fn check(&mut self) -> Result<(), WorkerError> {
        if self.stopped.is_none()
            && let Ok(r) = self.done.try_recv()
        {
            let why = match r {
                Ok(()) => "it stopped".to_owned(),
                Err(e) => e.to_string(),
            };
            tracing::error!(interface = %self.iface, "the embedded WireGuard data plane stopped: {why}; restart plexd");
            self.stopped = Some(why);
        }
        match &self.stopped {
            Some(why) => Err(WorkerError::PlaneStopped { why: why.clone() }),
            None => Ok(()),
        }
    }

    fn stop(&mut self) {
        self.halt();
        tracing::info!(interface = %self.iface, "the embedded data plane stopped; its interface goes with plexd");
    }

    fn teardown(&mut self) -> Result<(), WorkerError> {
        self.halt();
        // A TUN goes away with its descriptor; a persistent one someone left is removed too.
        match netlink::delete_link(&self.iface) {
            Ok(_) => {
                tracing::info!(interface = %self.iface, "removed the WireGuard interface");
                Ok(())
            }
            Err(source) => Err(WorkerError::DeleteInterface {
                iface: self.iface.clone(),
                source,
            }),
        }
    }
}

impl Drop for UserspacePlane {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Reads and writes the embedded data plane's peers in memory.
pub struct DirectControl {
    device: Arc<Device>,
}

impl DirectControl {
    pub fn new(device: Arc<Device>) -> Self {
        Self { device }
    }
}

/// The diff's update as the data plane's: removals and per-peer changes, never
/// `replace_peers` (that would drop every session for one change).
pub fn to_device_update(update: &MeshUpdate) -> DeviceUpdate {
    let peers = update
        .ops
        .iter()
        .map(|op| match op {
            PeerOp::Remove(key) => PeerUpdate {
                remove: true,
                ..PeerUpdate::new(*key)
            },
            PeerOp::Set {
                key,
                endpoint,
                allowed_ips,
                keepalive,
            } => PeerUpdate {
                endpoint: *endpoint,
                persistent_keepalive: *keepalive,
                replace_allowed_ips: allowed_ips.is_some(),
                allowed_ips: allowed_ips.clone().unwrap_or_default(),
                ..PeerUpdate::new(*key)
            },
        })
        .collect();
    DeviceUpdate {
        peers,
        ..DeviceUpdate::default()
    }
}

impl Control for DirectControl {
    fn live(&self) -> io::Result<Vec<LiveConfig>> {
        let snapshot = self.device.snapshot(Instant::now(), SystemTime::now());
        Ok(snapshot
            .peers
            .into_iter()
            .map(|p| LiveConfig {
                key: PublicKey(p.public_key.0),
                endpoint: p.endpoint,
                allowed_ips: p.allowed_ips,
                keepalive: p.persistent_keepalive,
                last_handshake: p.last_handshake,
                rx_bytes: p.rx_bytes,
                tx_bytes: p.tx_bytes,
            })
            .collect())
    }

    fn apply(&self, update: &MeshUpdate) -> io::Result<()> {
        if update.is_empty() {
            return Ok(());
        }
        self.device
            .apply(to_device_update(update))
            .map_err(io::Error::other)
    }

    fn set_private_key(&self, key: [u8; 32]) -> io::Result<()> {
        self.device
            .apply(DeviceUpdate {
                private_key: Some(Some(SecretKey::from_bytes(key))),
                ..DeviceUpdate::default()
            })
            .map_err(io::Error::other)
    }

    /// The view's filter, atomically for every lane; a view that cannot become a filter
    /// installs the closed one and answers `Err` (fail closed).
    fn set_policy(&self, policy: Option<&plexsphere_wire::node::PolicyState>) -> io::Result<()> {
        let Some(policy) = policy else {
            self.device.set_policy(None);
            return Ok(());
        };
        let (filter, error) = PolicyFilter::from_view(policy.version, &policy.view);
        self.device.set_policy(Some(filter));
        match error {
            None => Ok(()),
            Some(e) => Err(io::Error::other(format!(
                "the filter of policy version {} cannot be built ({e}); nothing passes to or from any peer until a usable policy arrives",
                policy.version
            ))),
        }
    }
}

/// The reach runtime's way to the embedded data plane: one peer's endpoint, nothing else of
/// it (`update_only`: a peer the diff has not added yet is not created).
struct DeviceEndpoints {
    device: Arc<Device>,
    /// The runner's door for relay links' readers (`plexd_dataplane::relay_link`).
    door: LinkDoor,
}

impl PathControl for DeviceEndpoints {
    fn set_endpoint(&self, peer: PublicKey, endpoint: std::net::SocketAddr) -> io::Result<()> {
        self.device
            .apply(DeviceUpdate {
                peers: vec![PeerUpdate {
                    endpoint: Some(endpoint),
                    update_only: true,
                    ..PeerUpdate::new(peer)
                }],
                ..DeviceUpdate::default()
            })
            .map_err(io::Error::other)
    }

    fn relay_endpoint(
        &self,
        relay: std::net::SocketAddr,
        peer: PublicKey,
    ) -> io::Result<Option<std::net::SocketAddr>> {
        self.device
            .relay_endpoint(relay, &peer)
            .map(Some)
            .map_err(io::Error::other)
    }

    fn set_relays(&self, relays: &[std::net::SocketAddr]) -> io::Result<()> {
        self.device.relays().set(relays).map_err(io::Error::other)
    }

    fn link_endpoint(
        &self,
        link: &Arc<LinkQueue>,
        peer: PublicKey,
    ) -> io::Result<Option<std::net::SocketAddr>> {
        self.device
            .relay_link_endpoint(link, &peer)
            .map(Some)
            .map_err(io::Error::other)
    }

    fn link_door(&self) -> Option<LinkDoor> {
        Some(self.door.clone())
    }

    fn handshakes(&self) -> io::Result<Vec<(PublicKey, Option<SystemTime>)>> {
        let s = self.device.snapshot(Instant::now(), SystemTime::now());
        Ok(s.peers
            .into_iter()
            .map(|p| (PublicKey(p.public_key.0), p.last_handshake))
            .collect())
    }
}

fn runtime(what: &str, iface: &str, e: impl std::fmt::Display) -> OpenError {
    OpenError::Runtime(format!("cannot {what} for {iface}: {e}"))
}

/// Starts the embedded data plane and configures it.
pub fn open(cfg: &WireguardConfig, node: &NodeSetup) -> Result<WgMesh, OpenError> {
    let name = cfg.interface.clone();
    iface_name(&name).map_err(|e| OpenError::Config(e.to_string()))?;
    let tun = LinuxTun::create(&name, u32::from(cfg.mtu), true).map_err(|e| {
        runtime(
            "create the TUN interface (is /dev/net/tun available and plexd root?)",
            &name,
            e,
        )
    })?;
    let device = Arc::new(Device::new(plexsphere_wire::clock::Now::system()));
    device
        .apply(DeviceUpdate {
            private_key: Some(Some(SecretKey::from_bytes(node.private_key()))),
            ..DeviceUpdate::default()
        })
        .map_err(|e| runtime("set the private key", &name, e))?;
    device.set_listen_port(cfg.listen_port);
    // Closed until the daemon installs the cached or fetched state's policy (or none, for a
    // server older than policies): no packet crosses before the node knows its filter.
    device.set_policy(Some(PolicyFilter::closed(
        "plexd has not installed a policy yet (starting)",
    )));
    // The reach runtime first: the data plane hands it the socket's other datagrams from the
    // start, and its sends go out of the data plane's socket once that is bound.
    let raw = RawSender::new();
    let door = LinkDoor::new();
    let reach = if cfg.reach.enabled {
        let port = {
            let d = device.clone();
            move || d.listen_port()
        };
        let setup = RuntimeSetup {
            secret: node.private_key(),
            mesh: node.mesh_net(),
            underlay: Arc::new(raw.clone()),
            listen_port: Box::new(port.clone()),
            wg_port: Box::new(port),
            control: Box::new(DeviceEndpoints {
                device: device.clone(),
                door: door.clone(),
            }),
            local_addrs: node.local_addrs(),
            tls: node.relay_tls(),
        };
        Some(Runtime::start(setup).map_err(|e| runtime("start the reach runtime", &name, e))?)
    } else {
        None
    };
    // Offload on until the signed state says otherwise (the daemon sets it from each state).
    let udp_offload = Arc::new(UdpOffloadSwitch::new(true));
    let binder = SwitchedBinder {
        inner: LinuxUdpBinder::default(),
        switch: udp_offload.clone(),
    };
    let shutdown = Shutdown::new();
    let socket: PathBuf = socket_path(&name);
    let (done_tx, done) = mpsc::channel();
    let thread = {
        let (shutdown, socket, device) = (shutdown.clone(), socket.clone(), device.clone());
        let config = RunConfig {
            uapi_socket: Some(socket),
            side: reach.as_ref().map(|r| r.side_sink()),
            raw: Some(raw.clone()),
            links: Some(door),
            crypto_workers: usize::from(cfg.crypto_workers),
            ..RunConfig::default()
        };
        thread::Builder::new()
            .name("wg-dataplane".into())
            .spawn(move || {
                let r = runner::run(device, tun, binder, config, shutdown);
                let _ = done_tx.send(r);
            })
            .map_err(|e| runtime("start the data-plane thread", &name, e))?
    };
    let mut plane = UserspacePlane {
        iface: name.clone(),
        shutdown,
        done,
        thread: Some(thread),
        stopped: None,
    };
    // Ready when the UAPI socket answers; a bind failure ends the runner first.
    let deadline = Instant::now() + START_BOUND;
    while UnixStream::connect(&socket).is_err() {
        plane
            .check()
            .map_err(|e| OpenError::Runtime(e.to_string()))?;
        if Instant::now() > deadline {
            return Err(OpenError::Runtime(format!(
                "the embedded data plane of {name} did not serve {} within {} s",
                socket.display(),
                START_BOUND.as_secs()
            )));
        }
        thread::sleep(Duration::from_millis(10));
    }
    setup_link(cfg, node).map_err(OpenError::Runtime)?;
    tracing::info!(interface = %name, socket = %socket.display(), listen_port = cfg.listen_port, "the embedded userspace WireGuard data plane is running on {name}, UDP port {}", cfg.listen_port);
    let prober = plexd_dataplane::Prober::new(device.clone(), raw, Some(udp_offload.clone()));
    let reader = plexd_dataplane::PolicyReader::new(device.clone());
    WgMesh::start("userspace", &name, DirectControl::new(device), plane, reach)
        .map(|m| {
            m.with_udp_offload(udp_offload)
                .with_gso_prober(prober)
                .with_policy_reader(reader)
        })
        .map_err(|e| OpenError::Runtime(e.to_string()))
}
