//! `plexsphere relay`: forwards WireGuard ciphertext (and disco probes) between nodes that
//! cannot reach each other directly, over UDP and over TCP with TLS, and answers STUN Binding
//! requests on its UDP socket. The protocol is `plexsphere_wire::reach::relay`: a node proves
//! it holds its WireGuard key and shows a Domain-signed relay token, then sends to other
//! registered keys. The relay keeps no database: its key pair, the Domains' public keys and a
//! clock.
//!
//! - [`core`]: the decisions (registrations, budgets, where a `send` goes), no sockets, time
//!   passed in; [`cookie`], [`bucket`], [`prefix`], [`limits`] are its parts.
//! - `udp` (a blocking thread a core) and `tcp` (tokio tasks with rustls) perform them, meeting in
//!   `shared` (the core behind its lock, the counters, delivery on either transport).
//! - [`relay::start`] binds and starts; [`stun::answer`] is the pure STUN responder, and
//!   [`stun::serve`] the small loop the control plane's `--stun-listen` runs.

pub mod bucket;
pub mod cookie;
pub mod core;
pub mod limits;
mod mmsg;
pub mod prefix;
pub mod relay;
mod shared;
pub mod stats;
pub mod stun;
mod tcp;
mod tcp_in;
mod udp;

pub use limits::Limits;
pub use relay::{RelayConfig, RelayHandle, StartError, TlsListen, start};
pub use stats::Stats;
