//! The kernel backend: the `wireguard` module through `wireguard-control`'s netlink backend.
//! Creates the interface (or adopts an existing WireGuard interface of that name), sets the
//! node's private key and listen port, then the address, MTU and link state.
//!
//! With reach on (`wireguard.reach.enabled`, the default) the interface listens on
//! `wireguard.listen_port` and plexd shares that port with it through
//! [`SharedPort`](super::shared_port::SharedPort): raw sockets that see only STUN, disco and
//! relay frames to the port and send from it. A direct path is the kernel peer's endpoint
//! itself, so its packets go kernel to kernel; only a relayed peer's endpoint is a loopback
//! forwarder (`crate::reach::forward`, all of them on one thread) that wraps its datagrams for
//! the relay and sends them from the shared port. docs/reach.md ("The kernel backend") has the
//! design and its limits.

use std::io;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, SystemTime};

use plexsphere_wire::reach::MAX_DATAGRAM;

use wireguard_control::{Backend, DeviceUpdate, Key, PeerConfigBuilder};

use super::shared_port::SharedPort;
use crate::reach::forward::Underlay;
use crate::reach::runtime::{PathControl, Runtime, RuntimeSetup};
use plexsphere_wire::key::PublicKey;

use super::link::setup_link;
use super::netlink;
use super::nft;
use super::setup::{NodeSetup, OpenError};
use super::wg::{WgControl, iface_name};
use super::worker::{Plane, WgMesh, WorkerError};
use crate::config::WireguardConfig;

/// EOPNOTSUPP: what RTM_NEWLINK answers for a link kind no module provides.
const EOPNOTSUPP: i32 = 95;
/// EPERM.
const EPERM: i32 = 1;

/// Why the kernel backend could not start.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error(
        "the wireguard kernel module is missing (RTM_NEWLINK kind wireguard for {iface}: {source}; the kernel found no module to load, as `modprobe wireguard` would)"
    )]
    ModuleMissing { iface: String, source: io::Error },
    #[error(
        "an interface named {iface} exists but is of kind {kind}, not wireguard; remove it (`ip link del {iface}`) or set wireguard.interface to another name"
    )]
    NotWireguard { iface: String, kind: String },
    #[error("cannot {what} {iface} ({source}){hint}")]
    Io {
        what: &'static str,
        iface: String,
        source: io::Error,
        hint: &'static str,
    },
}

fn io_err(what: &'static str, iface: &str, source: io::Error) -> KernelError {
    let hint = if source.raw_os_error() == Some(EPERM) {
        "; plexd needs CAP_NET_ADMIN (run it as root or through its systemd unit)"
    } else {
        ""
    };
    KernelError::Io {
        what,
        iface: iface.to_owned(),
        source,
        hint,
    }
}

/// Creates or adopts the kernel interface; see the module docs.
pub fn create(cfg: &WireguardConfig) -> Result<WgControl, KernelError> {
    let name = &cfg.interface;
    let iface = iface_name(name).map_err(|e| io_err("name", name, e))?;
    match netlink::link(name).map_err(|e| io_err("look up", name, e))? {
        Some(l) if l.kind.as_deref() == Some("wireguard") => {
            tracing::info!(interface = %name, "adopting the existing kernel WireGuard interface");
        }
        Some(l) => {
            return Err(KernelError::NotWireguard {
                iface: name.clone(),
                kind: l.kind.unwrap_or_else(|| "none".to_owned()),
            });
        }
        None => {
            // An empty update only creates the link (RTM_NEWLINK kind wireguard).
            DeviceUpdate::new()
                .apply(&iface, Backend::Kernel)
                .map_err(|source| match source.raw_os_error() {
                    Some(EOPNOTSUPP) => KernelError::ModuleMissing {
                        iface: name.clone(),
                        source,
                    },
                    _ => io_err("create the kernel WireGuard interface", name, source),
                })?;
            tracing::info!(interface = %name, "created the kernel WireGuard interface");
        }
    }
    Ok(WgControl {
        iface,
        backend: Backend::Kernel,
    })
}

struct KernelPlane {
    iface: String,
}

impl Plane for KernelPlane {
    fn check(&mut self) -> Result<(), WorkerError> {
        Ok(())
    }

    /// Removes the interface, then its policy table (`super::nft`).
    fn teardown(&mut self) -> Result<(), WorkerError> {
        match netlink::delete_link(&self.iface) {
            Ok(true) => {
                tracing::info!(interface = %self.iface, "removed the WireGuard interface");
            }
            Ok(false) => {}
            Err(source) => {
                return Err(WorkerError::DeleteInterface {
                    iface: self.iface.clone(),
                    source,
                });
            }
        }
        nft::remove_on_leave(&self.iface).map_err(WorkerError::PolicyTable)
    }
}

/// The reach runtime's way to the kernel interface: one peer's endpoint, the handshakes.
struct KernelEndpoints {
    ctl: WgControl,
}

impl PathControl for KernelEndpoints {
    fn set_endpoint(&self, peer: PublicKey, endpoint: SocketAddr) -> io::Result<()> {
        DeviceUpdate::new()
            .add_peer(PeerConfigBuilder::new(&Key(peer.0)).set_endpoint(endpoint))
            .apply(&self.ctl.iface, self.ctl.backend)
    }

    fn handshakes(&self) -> io::Result<Vec<(PublicKey, Option<SystemTime>)>> {
        Ok(self
            .ctl
            .live()?
            .into_iter()
            .map(|l| (l.key, l.last_handshake))
            .collect())
    }
}

/// How long the shared port's reader waits before it looks at its stop flag.
const PORT_POLL: Duration = Duration::from_millis(250);

impl Underlay for SharedPort {
    fn send(&self, datagram: &[u8], to: SocketAddr) -> io::Result<()> {
        self.send_to(datagram, to).map(|_| ())
    }
}

/// The kernel backend, configured and running.
pub fn open(cfg: &WireguardConfig, node: &NodeSetup) -> Result<WgMesh, OpenError> {
    let ctl = create(cfg).map_err(|e| match e {
        KernelError::ModuleMissing { .. } => OpenError::ModuleMissing(e.to_string()),
        KernelError::NotWireguard { .. } => OpenError::Config(e.to_string()),
        KernelError::Io { .. } => OpenError::Runtime(e.to_string()),
    })?;
    // Closed until the daemon installs the cached or fetched state's policy (or none, for a
    // server older than policies): an adopted interface's peers carry nothing unfiltered.
    // Without nft the daemon's set_policy decides (no policy: nothing to filter; a policy:
    // no peers).
    if let Err(e) = nft::install_closed(&cfg.interface) {
        tracing::warn!(interface = %cfg.interface, "policy: cannot install the closed nftables table at start ({e})");
    }
    let reach = cfg.reach.enabled;
    if reach && cfg.reach.kernel_port.is_some() {
        tracing::warn!(interface = %cfg.interface, "wireguard.reach.kernel_port is no longer used: the kernel interface listens on wireguard.listen_port and plexd shares it (docs/reach.md); remove the setting");
    }
    ctl.set_identity(node.private_key(), cfg.listen_port)
        .map_err(|e| {
            OpenError::Runtime(format!(
                "cannot set the private key and listen port {} on {} ({e}); is the port in use?",
                cfg.listen_port, cfg.interface
            ))
        })?;
    setup_link(cfg, node).map_err(OpenError::Runtime)?;
    let runtime = if reach {
        Some(start_reach(cfg, node, ctl)?)
    } else {
        None
    };
    WgMesh::start(
        "kernel",
        &cfg.interface,
        ctl,
        KernelPlane {
            iface: cfg.interface.clone(),
        },
        runtime,
    )
    .map_err(|e| OpenError::Runtime(e.to_string()))
}

fn start_reach(
    cfg: &WireguardConfig,
    node: &NodeSetup,
    ctl: WgControl,
) -> Result<Arc<Runtime>, OpenError> {
    let fail = |what: &str, e: io::Error| {
        OpenError::Runtime(format!("cannot {what} for {} ({e})", cfg.interface))
    };
    // listen_port 0 lets the kernel pick; the shared port is the one it picked.
    let listen = ctl
        .listen_port()
        .map_err(|e| fail("read the kernel interface's port", e))?
        .unwrap_or(cfg.listen_port);
    let port = Arc::new(SharedPort::open(listen).map_err(|e| {
        fail(
            &format!(
                "share UDP port {listen} with the kernel interface (raw sockets need CAP_NET_RAW)"
            ),
            e,
        )
    })?);
    let runtime = Runtime::start(RuntimeSetup {
        secret: node.private_key(),
        mesh: node.mesh_net(),
        underlay: port.clone(),
        listen_port: Box::new(move || listen),
        wg_port: Box::new(move || listen),
        control: Box::new(KernelEndpoints { ctl }),
        local_addrs: node.local_addrs(),
        tls: node.relay_tls(),
    })
    .map_err(|e| fail("start the reach runtime", e))?;
    serve_shared_port(runtime.clone(), port)
        .map_err(|e| fail("start the shared port's thread", e))?;
    tracing::info!(interface = %cfg.interface, listen_port = listen, "reach: the kernel interface {} listens on UDP port {listen} and plexd shares it (STUN, disco, relay frames); direct peers go kernel to kernel, relayed ones through loopback forwarders", cfg.interface);
    Ok(runtime)
}

/// Reads the shared port until the runtime is dropped (its last holder besides this thread)
/// or stopped: what arrives is never WireGuard (the port's filter), so all of it is reach's.
fn serve_shared_port(runtime: Arc<Runtime>, port: Arc<SharedPort>) -> io::Result<()> {
    let weak = Arc::downgrade(&runtime);
    drop(runtime);
    thread::Builder::new()
        .name("reach-port".into())
        .spawn(move || {
            let mut buf = vec![0u8; MAX_DATAGRAM];
            loop {
                let Some(runtime) = weak.upgrade() else {
                    return;
                };
                if runtime.stopped() {
                    return;
                }
                drop(runtime);
                match port.recv_from(&mut buf, PORT_POLL) {
                    Ok(Some((n, from))) => {
                        if let Some(runtime) = weak.upgrade() {
                            runtime.offer(&buf[..n], from);
                        }
                    }
                    Ok(None) => {}
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => {
                        tracing::debug!("the shared port's read failed: {e}");
                        thread::sleep(PORT_POLL);
                    }
                }
            }
        })
        .map(|_| ())
}
