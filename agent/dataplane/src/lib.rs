//! plexd's embedded userspace WireGuard data plane.
//!
//! Built on boringtun's `noise::Tunn` state machine (the default) or plexd's own
//! (`noise`, which the ordered crypto pool in `pool` needs), with our own I/O: the core (`Device`,
//! `AllowedIps`, the UAPI text protocol) has no sockets and reads no monotonic clock: the
//! runner passes `now: Instant` in and feeds it from a TUN device and a UDP socket behind the
//! small `Tun` and `Udp` traits, which have Linux and in-memory implementations. Two inputs are
//! not passed in yet: plexd's own protocol (`noise`) reads the wall clock (`SystemTime::now`)
//! for its handshake timestamps and the OS's randomness (`noise::crypto`) for ephemeral keys and
//! retry jitter, as boringtun's `Tunn` does (docs/architecture.md).
//!
//! `plexd-wg <iface>` serves the WireGuard UAPI socket like `wireguard-go -f <iface>`, so `wg`
//! and `wireguard-control` configure it like any userspace WireGuard.

pub mod allowed_ips;
pub mod batch;
pub mod coalesce;
pub mod codel;
pub mod config;
pub mod device;
pub mod io;
pub mod key;
pub mod lane;
#[cfg(target_os = "linux")]
pub mod linux;
pub mod machine;
pub mod memory;
pub mod noise;
pub mod offload;
#[cfg(test)]
mod offload_tests;
#[cfg(any(test, feature = "test-support"))]
pub mod packet;
pub mod peer;
pub mod policy;
pub mod pool;
pub mod probe;
mod probe_match;
mod queued;
pub mod relay;
pub mod runner;
pub mod shutdown;
pub mod side;
pub mod source;
pub mod uapi;
#[cfg(unix)]
pub mod uapi_server;
pub mod udp_offload;

pub use allowed_ips::AllowedIps;
pub use batch::PacketBatch;
pub use config::{ConfigError, DeviceUpdate, PeerUpdate};
pub use device::{Counters, Device};
pub use io::{Tun, Udp, UdpBind};
pub use key::{Key, KeyError, SecretKey};
pub use machine::Protocol;
pub use peer::{DeviceSnapshot, PeerSnapshot};
pub use policy::{PEER_FLOW_CAPACITY, POLICY_LOG_EVERY, PolicyDrops, PolicyFilter, PolicyReader};
pub use probe::{ProbeError, ProbeReport, Prober, Verdict};
pub use relay::{RelayError, RelayTable};
pub use side::{RawSender, SideSink};
pub use source::Source;
pub use udp_offload::{UdpOffloadState, UdpOffloadSwitch};
