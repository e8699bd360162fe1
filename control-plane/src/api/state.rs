//! What every handler shares: the store, the Domain keys, the knobs, the rate limiter, the
//! clock, the bus, the open streams and the broker; and what the background tasks (the
//! broker's reconcile loop, the maintenance task) may see of it.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipnet::IpNet;
use plexsphere_wire::Intervals;
use time::OffsetDateTime;

use crate::broker::{Broker, BrokerConfig, BrokerHost};
use crate::bus::{EventBus, InProcessBus};
use crate::keys::Keyring;
use crate::maintenance::{MaintenanceHost, Schedule};
use crate::metrics::Metrics;
use crate::node::live_cache::LiveCache;
use crate::node::ops::NodeOps;
use crate::policy::cache::PolicyCache;
use crate::ratelimit::{RateLimit, RateLimiter};
use crate::store::Store;

use super::streams::Streams;

/// The default budget of one node on the node routes: a burst of 120, one more every 250 ms
/// (4 a second sustained). A healthy plexd sends a heartbeat every interval and a few state,
/// endpoint and ingest calls per change; this leaves room for a storm of mesh changes and
/// still stops a node in a tight loop.
pub const NODE_RATE_LIMIT: RateLimit = RateLimit {
    burst: 120,
    refill: Duration::from_millis(250),
};

/// [`ApiConfig::node_rate_limit`]: [`NODE_RATE_LIMIT`] by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeRateLimit(pub RateLimit);

impl Default for NodeRateLimit {
    fn default() -> Self {
        Self(NODE_RATE_LIMIT)
    }
}

/// The knobs of the API.
#[derive(Debug, Clone, Default)]
pub struct ApiConfig {
    pub intervals: Intervals,
    pub register_rate_limit: RateLimit,
    /// The budget of each node on the node routes (heartbeat, endpoints, state, ingest, the
    /// event stream...), per node id ([`NODE_RATE_LIMIT`] unless set).
    pub node_rate_limit: NodeRateLimit,
    /// Peers in these ranges are reverse proxies whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<IpNet>,
    /// The PEM of the CA the server's chain ends in, served at `/v1/ca.crt` (dev mode).
    pub ca_pem: Option<String>,
    /// A node is offline once its last authenticated call is older than this; `None`: three
    /// heartbeat intervals. Whole seconds.
    pub offline_after: Option<Duration>,
    pub events: EventConfig,
    /// The relays the control plane puts into every node's signed state (`--relay`).
    pub relays: Vec<plexsphere_wire::node::RelaySpec>,
    /// The STUN servers the control plane puts into every node's state (`--stun-advertise`).
    pub stun_advertise: Vec<std::net::SocketAddr>,
}

impl ApiConfig {
    /// The offline threshold in seconds.
    pub(crate) fn offline_after_secs(&self) -> i64 {
        match self.offline_after {
            Some(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            None => 3 * i64::from(self.intervals.heartbeat_secs),
        }
    }
}

/// The knobs of the event log and the streams.
#[derive(Debug, Clone)]
pub struct EventConfig {
    /// Events stay replayable at least this long (then a periodic task prunes them).
    pub retention: Duration,
    /// How often the periodic task prunes events and sweeps node status.
    pub maintenance_every: Duration,
    /// A keep-alive comment goes out after this long without an event.
    pub keepalive: Duration,
    /// A stream whose client accepts no frame for this long is dropped (it resumes later).
    pub slow_reader_timeout: Duration,
    /// Frames a stream may have waiting for its client.
    pub stream_buffer: usize,
}

impl Default for EventConfig {
    fn default() -> Self {
        Self {
            retention: Duration::from_secs(24 * 3600),
            maintenance_every: Duration::from_secs(30),
            keepalive: Duration::from_secs(plexsphere_wire::node::SSE_KEEPALIVE_SECS),
            slow_reader_timeout: Duration::from_secs(30),
            stream_buffer: 64,
        }
    }
}

/// A source of "now", so tests can move time.
pub type Clock = Arc<dyn Fn() -> OffsetDateTime + Send + Sync>;

pub struct AppState {
    pub store: Store,
    pub keys: Keyring,
    pub config: ApiConfig,
    pub register_limiter: Mutex<RateLimiter>,
    /// `POST /v1/register/challenge`'s budgets per client (the registration's limit, a bucket
    /// of its own: a join takes one of each).
    pub register_challenge_limiter: Mutex<RateLimiter>,
    /// The node routes' budgets, per node id.
    pub node_limiter: Mutex<RateLimiter<uuid::Uuid>>,
    /// Whether this replica runs the broker's reconcile loop and maintenance (`leader`).
    pub leadership: Arc<crate::leader::Leadership>,
    pub clock: Clock,
    pub bus: Arc<dyn EventBus>,
    /// The event streams open in this process.
    pub streams: Streams,
    /// The provisioning broker (catalog, sealing key, substrates, the reconcile loop's wake).
    pub broker: Broker,
    /// The Prometheus series of `/metrics` (docs/metrics.md).
    pub metrics: Metrics,
    /// Each Domain's compiled access policy (`crate::policy::cache`).
    pub policies: PolicyCache,
    /// Each Domain's live node rows for the state builds (`crate::node::live_cache`).
    pub live: LiveCache,
    /// Where the audit pepper comes from (`crate::audit::pepper`): derived from the KEK unless
    /// [`AppState::with_audit_pepper`] gives one.
    pub pepper: crate::audit::Pepper,
    /// The path routes' report slots, relay health and console streams (`api::paths`).
    pub paths: super::paths_shared::PathsShared,
    /// Sign-in (`--oidc-issuer`); `None`: operators use tokens only.
    pub auth: Option<Arc<crate::auth::Auth>>,
}

impl AppState {
    /// The state with the default broker (built-in catalog, no local machines, the API's CA).
    pub fn new(store: Store, data_dir: &Path, config: ApiConfig) -> Self {
        let broker = BrokerConfig {
            ca_pem: config.ca_pem.clone(),
            ..BrokerConfig::default()
        };
        Self::with_broker_config(store, data_dir, config, broker)
    }

    pub fn with_broker_config(
        store: Store,
        data_dir: &Path,
        config: ApiConfig,
        broker: BrokerConfig,
    ) -> Self {
        let metrics = Metrics::default();
        let policies = PolicyCache::new(
            metrics.policy_compiles.clone(),
            metrics.policy_compile_seconds.clone(),
        );
        Self {
            broker: Broker::new(data_dir, broker),
            keys: Keyring::with_data_dir_kek(store.clone(), data_dir),
            store,
            register_limiter: Mutex::new(RateLimiter::new(config.register_rate_limit)),
            register_challenge_limiter: Mutex::new(RateLimiter::new(config.register_rate_limit)),
            node_limiter: Mutex::new(RateLimiter::new(config.node_rate_limit.0)),
            leadership: Arc::new(crate::leader::Leadership::single()),
            config,
            clock: Arc::new(OffsetDateTime::now_utc),
            bus: Arc::new(InProcessBus::new()),
            streams: Streams::default(),
            metrics,
            policies,
            live: LiveCache::default(),
            pepper: crate::audit::Pepper::FromKek,
            paths: super::paths_shared::PathsShared::default(),
            auth: None,
        }
    }

    /// Uses this audit pepper (`--audit-pepper-file`, the systemd credential, `plexsphere dev`'s).
    pub(crate) fn with_audit_pepper(mut self, pepper: crate::audit::Pepper) -> Self {
        self.pepper = pepper;
        self
    }

    /// Uses these Domain keys (a replica's KEK) instead of the data directory's own KEK.
    pub(crate) fn with_keyring(mut self, keys: Keyring) -> Self {
        self.keys = keys;
        self
    }

    /// Takes part in the leader lease of the database (`plexsphere serve`): the broker and
    /// maintenance act only while this replica holds it.
    pub(crate) fn with_leadership(mut self, leadership: Arc<crate::leader::Leadership>) -> Self {
        self.leadership = leadership;
        self
    }

    /// Uses another bus than the in-process one.
    pub fn with_auth(mut self, auth: Option<Arc<crate::auth::Auth>>) -> Self {
        self.auth = auth;
        self
    }

    pub(crate) fn with_bus(mut self, bus: Arc<dyn EventBus>) -> Self {
        self.bus = bus;
        self
    }

    pub fn now(&self) -> OffsetDateTime {
        (self.clock)()
    }

    /// The node operations over this state's store, keys and bus.
    /// The access policy and tag operations (`crate::policy::ops`).
    pub(crate) fn policy_ops(&self) -> crate::policy::ops::PolicyOps<'_> {
        crate::policy::ops::PolicyOps {
            store: &self.store,
            bus: self.bus.as_ref(),
        }
    }

    /// The rename and DNS suffix operations (`crate::node::names`).
    pub(crate) fn name_ops(&self) -> crate::node::names::NameOps<'_> {
        crate::node::names::NameOps {
            store: &self.store,
            bus: self.bus.as_ref(),
        }
    }

    pub(crate) fn node_ops(&self) -> NodeOps<'_> {
        NodeOps {
            store: &self.store,
            keys: &self.keys,
            bus: self.bus.as_ref(),
            relays: &self.config.relays,
            stun: &self.config.stun_advertise,
            policies: &self.policies,
            live: &self.live,
        }
    }
}

/// The broker's reconcile loop sees the store, keys, node operations, broker and clock.
impl BrokerHost for AppState {
    fn store(&self) -> &Store {
        &self.store
    }
    fn keys(&self) -> &Keyring {
        &self.keys
    }
    fn node_ops(&self) -> NodeOps<'_> {
        AppState::node_ops(self)
    }
    fn broker(&self) -> &Broker {
        &self.broker
    }
    fn now(&self) -> OffsetDateTime {
        AppState::now(self)
    }
    fn metrics(&self) -> &Metrics {
        &self.metrics
    }
    fn leadership(&self) -> &crate::leader::Leadership {
        &self.leadership
    }
    fn audit_pepper(&self) -> Option<ring::hmac::Key> {
        match self.pepper_key() {
            Ok(k) => Some(k),
            Err(e) => {
                self.metrics.audit_write_failures.inc();
                tracing::error!(error = %e, "the broker's phase changes cannot be audited: no audit pepper");
                None
            }
        }
    }
}

/// The maintenance task sees the store, the clock and its schedule from the API's knobs.
impl MaintenanceHost for AppState {
    fn store(&self) -> &Store {
        &self.store
    }
    fn node_ops(&self) -> NodeOps<'_> {
        AppState::node_ops(self)
    }
    fn now(&self) -> OffsetDateTime {
        AppState::now(self)
    }
    fn leadership(&self) -> &crate::leader::Leadership {
        &self.leadership
    }
    fn schedule(&self) -> Schedule {
        Schedule {
            every: self.config.events.maintenance_every,
            retention: self.config.events.retention,
            offline_after_secs: self.config.offline_after_secs(),
        }
    }
}
