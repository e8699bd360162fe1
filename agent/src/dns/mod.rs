//! plexd answers DNS for mesh names (docs/dns.md).
//!
//! | part | what it owns |
//! |---|---|
//! | [`zone`] | the name table built from the signed state: this node, the peers it may open something on, their mesh addresses (pure) |
//! | [`answer`] | one query in, one answer out: A/AAAA/PTR, NXDOMAIN under the suffix and the mesh range, REFUSED otherwise (pure) |
//! | [`reverse`] | `in-addr.arpa`/`ip6.arpa` names to addresses and prefixes, and the reverse zone of the mesh range (pure) |
//! | [`limit`] | the query rate limit and the rate-limited log line (pure, `now` passed in) |
//! | [`server`] | the UDP and TCP listeners on the mesh address, port 53, for this host's own queries only |
//! | [`runtime`] | the listeners, the table and the resolved link as the daemon runs them |
//! | [`resolved`] | systemd-resolved over D-Bus: the link's DNS server and routing-only domains |
//!
//! Every bound is a constant here, with its reason; docs/dns.md "Limits" lists them.

pub mod answer;
pub mod limit;
pub mod resolved;
pub mod reverse;
pub mod runtime;
pub mod server;
pub mod zone;

#[cfg(test)]
mod answer_tests;
#[cfg(test)]
mod root_tests;

use std::time::Duration;

/// The TTL of every answer (A, AAAA, PTR) and of the negative answers (the SOA's minimum):
/// short, so a rename, a departure or a policy change shows within seconds even in a cache.
pub(crate) const NAME_TTL: u32 = 5;
/// The UDP payload size plexd advertises and answers within (EDNS, RFC 6891; the DNS flag
/// day 2020 value that avoids IP fragmentation). Without EDNS a UDP answer fits 512 bytes.
pub(crate) const UDP_PAYLOAD: u16 = 1232;
/// The largest query plexd reads (a DNS message over TCP can be 65,535 bytes; a query with
/// one question and an OPT record is far smaller). Larger ones are dropped and counted.
pub(crate) const MAX_QUERY_BYTES: usize = 4096;
/// At most this many TCP connections at once; a further one is closed at once (counted).
pub(crate) const MAX_TCP_CONNECTIONS: usize = 64;
/// A TCP connection that sends no complete query for this long is closed (RFC 7766 leaves the
/// value to the server; a stub resolver reconnects).
pub(crate) const TCP_IDLE: Duration = Duration::from_secs(10);
/// At most this many queries per second are answered (UDP and TCP together, bursts up to the
/// same number); more are dropped and counted, with one log line per [`LOG_EVERY`].
pub(crate) const MAX_QUERIES_PER_SEC: u32 = 20_000;
/// At most one log line per this interval for each kind of drop.
pub(crate) const LOG_EVERY: Duration = Duration::from_secs(10);
/// At most this many names in the table (the node itself and its peers); past it, names are
/// left out with a log line. The control plane's own Domain limits keep states far smaller.
pub(crate) const MAX_NAMES: usize = 100_000;
pub use crate::config::dns::DNS_PORT;
