//! plexd's embedded userspace WireGuard data plane.
//!
//! Built on boringtun's `noise::Tunn` state machine (the default) or plexd's own
//! (`noise`, which the ordered crypto pool in `pool` needs), with our own I/O: the core (`Device`,
//! `AllowedIps`, the UAPI text protocol) has no sockets and reads no clock: the runner passes
//! `now: Instant` in and feeds it from a TUN device and a UDP socket behind the small `Tun` and
//! `Udp` traits, which have Linux and in-memory implementations. plexd's own protocol (`noise`)
//! reads neither a clock nor the OS's randomness either: the device's owner reads both clocks
//! once (`plexsphere_wire::clock::Now`, given to `Device::new`), from which a handshake
//! initiation takes its wall time, and the device builds each peer's machine with a random
//! source (the OS's CSPRNG, `rand_core::OsRng`; a seeded one in tests) for ephemeral keys and
//! retry jitter. boringtun's `Tunn` still reads its own inside the dependency
//! (docs/architecture.md, "One vocabulary for the sans-IO machines").
//!
//! `plexd-wg <iface>` serves the WireGuard UAPI socket like `wireguard-go -f <iface>`, so `wg`
//! and `wireguard-control` configure it like any userspace WireGuard.

// Every `pub` item is one another crate can reach; the rest is `pub(crate)` or private, and
// this lint (an error under `cargo clippy -- -D warnings`) keeps it so.
#![warn(unreachable_pub)]

// The public face (README.md, "The public face"): the device, its I/O traits and their Linux
// implementations, the runner, config, keys, the side channel and the probe, re-exported
// below. A module is public only where another crate names a path in it: plexd, plexd-wg
// (`src/bin`), the integration tests (`tests/`), benches/ and fuzz/.
pub mod batch;
pub mod device;
#[cfg(target_os = "linux")]
pub mod linux;
pub mod pool;
pub mod probe;
pub mod relay;
pub mod relay_link;
pub mod runner;
#[cfg(unix)]
pub mod uapi_server;
// Public for the fuzz targets (fuzz/fuzz_targets): the pure parsers and plexd's own protocol.
pub mod coalesce;
pub mod noise;
pub mod offload;
pub mod uapi;
// The test builders (the in-memory devices, the packet builder): this crate's tests and the
// `test-support` feature only, so plexd does not ship them.
#[cfg(any(test, feature = "test-support"))]
pub mod memory;
#[cfg(any(test, feature = "test-support"))]
pub mod packet;

// Only this crate names these; what the face needs of them is re-exported below.
mod allowed_ips;
mod codel;
mod config;
mod io;
mod key;
mod lane;
mod link_queue;
mod loops;
mod machine;
#[cfg(test)]
mod offload_tests;
mod peer;
mod policy;
mod probe_match;
mod shutdown;
mod side;
mod source;
mod udp_offload;

pub use allowed_ips::AllowedIps;
pub use batch::PacketBatch;
pub use config::{ConfigError, DeviceUpdate, PeerUpdate};
pub use device::{Counters, Crypto, Device};
pub use io::{Tun, Udp, UdpBind};
pub use key::{KeyError, PublicKey, SecretKey};
pub use machine::Protocol;
pub use peer::{DeviceSnapshot, PeerSnapshot};
pub use policy::{PolicyDrops, PolicyFilter, PolicyReader};
pub use probe::{ProbeError, ProbeReport, Prober, Verdict};
pub use relay::{RelayError, RelayTable};
pub use relay_link::{LinkDoor, LinkInbox, LinkQueue};
pub use side::{RawSender, SideSink};
pub use source::Source;
pub use udp_offload::{UdpOffloadState, UdpOffloadSwitch};
