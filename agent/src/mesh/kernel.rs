//! The kernel backend: the `wireguard` module through `wireguard-control`'s netlink backend.
//! Creates the interface (or adopts an existing WireGuard interface of that name), sets the
//! node's private key and listen port, then the address, MTU and link state.
//!
//! With reach on (`wireguard.reach.enabled`, the default) the kernel cannot share its socket
//! with plexd, so the ports split: plexd binds `wireguard.listen_port` itself (the underlay
//! socket peers reach: WireGuard, STUN, disco, relay frames), the interface listens on
//! `wireguard.reach.kernel_port` (default `listen_port + 1`), and every peer's kernel endpoint
//! is a loopback forwarder (`crate::reach::forward`) that carries its datagrams to the path
//! reach chose, direct from the underlay socket or through a relay. docs/reach.md has the
//! trade-off (kernel crypto, one userspace copy per packet each way).

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::SystemTime;

use wireguard_control::{Backend, DeviceUpdate, Key, PeerConfigBuilder};

use super::key::PeerKey;
use crate::reach::runtime::{Mode, PathControl, Runtime, RuntimeSetup};

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
    fn set_endpoint(&self, peer: PeerKey, endpoint: SocketAddr) -> io::Result<()> {
        DeviceUpdate::new()
            .add_peer(PeerConfigBuilder::new(&Key(peer.0)).set_endpoint(endpoint))
            .apply(&self.ctl.iface, self.ctl.backend)
    }

    fn handshakes(&self) -> io::Result<Vec<(PeerKey, Option<SystemTime>)>> {
        Ok(self
            .ctl
            .live()?
            .into_iter()
            .map(|l| (l.key, l.last_handshake))
            .collect())
    }
}

/// plexd's own socket on the listen port (IPv6 with IPv4 mapped, else IPv4 only).
pub fn bind_underlay(port: u16) -> io::Result<UdpSocket> {
    UdpSocket::bind(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)))
        .or_else(|_| UdpSocket::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))))
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
    // With reach, the kernel moves to the port next to listen_port first (an adopted interface
    // may still hold listen_port from a run without reach), then plexd takes listen_port.
    let kernel_port = if reach {
        cfg.kernel_port()
    } else {
        cfg.listen_port
    };
    ctl.set_identity(node.private_key(), kernel_port)
        .map_err(|e| {
            OpenError::Runtime(format!(
                "cannot set the private key and listen port {kernel_port} on {} ({e}); is the port in use? (with reach on, the kernel interface listens on wireguard.reach.kernel_port, default listen_port + 1)",
                cfg.interface
            ))
        })?;
    let underlay = if reach {
        Some(bind_underlay(cfg.listen_port).map_err(|e| {
            OpenError::Runtime(format!(
                "cannot bind UDP port {} for {}'s reach socket ({e}); free the port or set wireguard.listen_port",
                cfg.listen_port, cfg.interface
            ))
        })?)
    } else {
        None
    };
    setup_link(cfg, node).map_err(OpenError::Runtime)?;
    let runtime = match underlay {
        Some(socket) => Some(start_reach(cfg, node, ctl, socket)?),
        None => None,
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
    socket: UdpSocket,
) -> Result<Arc<Runtime>, OpenError> {
    let fail = |what: &str, e: io::Error| {
        OpenError::Runtime(format!("cannot {what} for {} ({e})", cfg.interface))
    };
    let listen = socket
        .local_addr()
        .map_err(|e| fail("read the reach socket's port", e))?
        .port();
    let kernel = ctl
        .listen_port()
        .map_err(|e| fail("read the kernel interface's port", e))?
        .unwrap_or(0);
    let socket = Arc::new(socket);
    let runtime = Runtime::start(RuntimeSetup {
        secret: node.private_key(),
        mesh: node.mesh_net(),
        mode: Mode::Kernel,
        underlay: socket.clone(),
        listen_port: Box::new(move || listen),
        wg_port: Box::new(move || kernel),
        control: Box::new(KernelEndpoints { ctl }),
        local_addrs: node.local_addrs(),
        tls: node.relay_tls(),
    })
    .map_err(|e| fail("start the reach runtime", e))?;
    runtime
        .serve_underlay(socket)
        .map_err(|e| fail("start the reach socket's thread", e))?;
    tracing::info!(interface = %cfg.interface, listen_port = listen, kernel_port = kernel, "reach: plexd listens on UDP port {listen}; the kernel interface {} listens on {kernel} and reaches its peers through loopback forwarders", cfg.interface);
    Ok(runtime)
}
