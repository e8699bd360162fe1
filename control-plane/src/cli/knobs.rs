//! The option groups `serve` and `dev` flatten into their arguments (the server's limits,
//! the node API, sign-in through OIDC, the broker), the checks of the knobs that need more
//! than a type (`LimitArgs::rate_limit`, `NodeApiArgs::apply`), and the `--*-secs` parser.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use ipnet::IpNet;
use plexsphere_wire::duration::{Rules, parse_with};

use super::reach::ReachArgs;
use crate::ratelimit::RateLimit;

#[derive(Debug, Clone, Args)]
pub struct LimitArgs {
    /// Registration requests a client may send at once.
    #[arg(long, env = "PLEXSPHERE_REGISTER_BURST", default_value_t = 10)]
    pub register_burst: u32,
    /// Seconds until a client gets one more registration request (a number, or e.g. 3s).
    #[arg(
        long,
        env = "PLEXSPHERE_REGISTER_REFILL_SECS",
        default_value_t = 3,
        value_parser = secs_flag
    )]
    pub register_refill_secs: u64,
    /// A reverse proxy's address range whose X-Forwarded-For is believed (repeatable).
    #[arg(
        long = "trusted-proxy",
        env = "PLEXSPHERE_TRUSTED_PROXIES",
        value_delimiter = ','
    )]
    pub trusted_proxies: Vec<IpNet>,
    /// Requests one node may send to the node routes at once (heartbeat, endpoints, state,
    /// ingest, events...).
    #[arg(long, env = "PLEXSPHERE_NODE_BURST", default_value_t = 120)]
    pub node_burst: u32,
    /// Milliseconds until a node gets one more request of its node-route budget.
    #[arg(long, env = "PLEXSPHERE_NODE_REFILL_MS", default_value_t = 250)]
    pub node_refill_ms: u64,
    /// Open connections beyond which each request is answered 503 with Retry-After and its
    /// connection closed.
    #[arg(long, env = "PLEXSPHERE_MAX_CONNECTIONS", default_value_t = crate::server::MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Seconds a client has to send a request's header (and an HTTP/1.1 connection may sit
    /// idle between requests) before the connection is closed.
    #[arg(
        long,
        env = "PLEXSPHERE_HEADER_READ_TIMEOUT_SECS",
        default_value_t = 10,
        value_parser = secs_flag
    )]
    pub header_read_timeout_secs: u64,
}

impl LimitArgs {
    /// The node routes' budget.
    pub(super) fn node_rate_limit(&self) -> Result<RateLimit, String> {
        if self.node_burst == 0 {
            return Err("--node-burst must be at least 1".into());
        }
        if self.node_refill_ms == 0 {
            return Err("--node-refill-ms must be at least 1".into());
        }
        Ok(RateLimit {
            burst: self.node_burst,
            refill: Duration::from_millis(self.node_refill_ms),
        })
    }

    /// The connection bounds of the listener.
    pub(super) fn server_limits(&self) -> Result<crate::server::ServerLimits, String> {
        if self.max_connections == 0 {
            return Err("--max-connections must be at least 1".into());
        }
        if self.header_read_timeout_secs == 0 {
            return Err("--header-read-timeout-secs must be at least 1".into());
        }
        Ok(crate::server::ServerLimits {
            header_read_timeout: Duration::from_secs(self.header_read_timeout_secs),
            max_connections: self.max_connections,
        })
    }

    pub(super) fn rate_limit(&self) -> Result<RateLimit, String> {
        if self.register_burst == 0 {
            return Err("--register-burst must be at least 1".into());
        }
        if self.register_refill_secs == 0 {
            return Err("--register-refill-secs must be at least 1".into());
        }
        Ok(RateLimit {
            burst: self.register_burst,
            refill: Duration::from_secs(self.register_refill_secs),
        })
    }
}

/// The node API's knobs.
#[derive(Debug, Clone, Args)]
pub struct NodeApiArgs {
    /// Seconds between node heartbeats (nodes get it at registration and with every ack).
    #[arg(
        long,
        env = "PLEXSPHERE_HEARTBEAT_SECS",
        default_value_t = 30,
        value_parser = secs_flag_u32
    )]
    pub heartbeat_secs: u32,
    /// A node is offline after this many seconds without a call; default: 3 heartbeats.
    #[arg(long, env = "PLEXSPHERE_OFFLINE_AFTER_SECS", value_parser = secs_flag)]
    pub offline_after_secs: Option<u64>,
    /// How long events stay replayable for a stream resuming with Last-Event-ID.
    #[arg(
        long,
        env = "PLEXSPHERE_EVENT_RETENTION_SECS",
        default_value_t = 86_400,
        value_parser = secs_flag
    )]
    pub event_retention_secs: u64,
    /// Seconds between keep-alive comments on an idle event stream.
    #[arg(
        long,
        env = "PLEXSPHERE_SSE_KEEPALIVE_SECS",
        default_value_t = plexsphere_wire::node::SSE_KEEPALIVE_SECS,
        value_parser = secs_flag
    )]
    pub sse_keepalive_secs: u64,
    /// The relays and STUN servers every node's state lists (`--relay`, `--stun-advertise`).
    #[command(flatten)]
    pub reach: ReachArgs,
}

impl NodeApiArgs {
    /// Applies the knobs to an API config, or says which one is out of range.
    pub(super) fn apply(&self, config: &mut crate::api::ApiConfig) -> Result<(), String> {
        if self.heartbeat_secs == 0 {
            return Err("--heartbeat-secs must be at least 1".into());
        }
        if self.sse_keepalive_secs == 0 {
            return Err("--sse-keepalive-secs must be at least 1".into());
        }
        if self.offline_after_secs == Some(0) {
            return Err("--offline-after-secs must be at least 1".into());
        }
        self.reach.check()?;
        config.relays = self.reach.relays.clone();
        config.stun_advertise = self.reach.stun_advertise.clone();
        config.intervals.heartbeat_secs = self.heartbeat_secs;
        config.offline_after = self.offline_after_secs.map(Duration::from_secs);
        config.events.retention = Duration::from_secs(self.event_retention_secs);
        config.events.keepalive = Duration::from_secs(self.sse_keepalive_secs);
        // Prune and sweep often enough for the shortest window configured.
        let offline = u64::try_from(config.offline_after_secs()).unwrap_or(u64::MAX);
        let every = (self.event_retention_secs / 2)
            .min(offline / 2)
            .clamp(1, 30);
        config.events.maintenance_every = Duration::from_secs(every);
        Ok(())
    }
}

/// Sign-in through an OpenID Connect issuer (docs/auth.md); off without `--oidc-issuer`.
#[derive(Debug, Clone, Args)]
pub struct OidcArgs {
    /// The issuer URL (https; http only on loopback). Enables the console's sign-in and
    /// `plexctl login`.
    #[arg(long, env = "PLEXSPHERE_OIDC_ISSUER")]
    pub oidc_issuer: Option<String>,
    /// The console's client id at the issuer (redirect URI `<public url>/v1/auth/callback`).
    #[arg(long, env = "PLEXSPHERE_OIDC_CLIENT_ID")]
    pub oidc_client_id: Option<String>,
    /// A file holding the console client's secret.
    #[arg(long, env = "PLEXSPHERE_OIDC_CLIENT_SECRET_FILE")]
    pub oidc_client_secret_file: Option<PathBuf>,
    /// plexctl's (public) client id at the issuer; without it `plexctl login` is off.
    #[arg(long, env = "PLEXSPHERE_OIDC_CLI_CLIENT_ID")]
    pub oidc_cli_client_id: Option<String>,
    /// The ID token claim that lists a person's groups.
    #[arg(long, env = "PLEXSPHERE_OIDC_GROUPS_CLAIM", default_value = "groups")]
    pub oidc_groups_claim: String,
    /// The scopes asked of the issuer.
    #[arg(long, env = "PLEXSPHERE_OIDC_SCOPES", default_value = crate::api::auth::SCOPES)]
    pub oidc_scopes: String,
    /// A CA file for an issuer under a private CA (beside the system's roots).
    #[arg(long, env = "PLEXSPHERE_OIDC_CA_FILE")]
    pub oidc_ca_file: Option<PathBuf>,
    /// A session's lifetime from sign-in, in seconds.
    #[arg(long, env = "PLEXSPHERE_SESSION_LIFETIME_SECS", default_value_t = crate::auth::session::SESSION_LIFETIME.as_secs())]
    pub session_lifetime_secs: u64,
    /// A session ends after this many seconds without a request.
    #[arg(long, env = "PLEXSPHERE_SESSION_IDLE_TIMEOUT_SECS", default_value_t = crate::auth::session::SESSION_IDLE_TIMEOUT.as_secs())]
    pub session_idle_timeout_secs: u64,
}

impl OidcArgs {
    /// The sign-in of these flags (`None` without `--oidc-issuer`) for an API reached at
    /// `public_url`.
    pub fn auth(
        &self,
        public_url: &str,
    ) -> Result<Option<std::sync::Arc<crate::auth::Auth>>, String> {
        let Some(issuer) = &self.oidc_issuer else {
            return Ok(None);
        };
        let client_id = self
            .oidc_client_id
            .clone()
            .ok_or("--oidc-client-id is required with --oidc-issuer")?;
        let secret_file = self
            .oidc_client_secret_file
            .as_ref()
            .ok_or("--oidc-client-secret-file is required with --oidc-issuer")?;
        let secret = std::fs::read_to_string(secret_file)
            .map_err(|e| {
                format!(
                    "cannot read --oidc-client-secret-file {}: {e}",
                    secret_file.display()
                )
            })?
            .trim()
            .to_owned();
        if self.session_lifetime_secs == 0 || self.session_idle_timeout_secs == 0 {
            return Err(
                "--session-lifetime-secs and --session-idle-timeout-secs must be at least 1".into(),
            );
        }
        let public_origin = crate::auth::session::origin_of(public_url)
            .ok_or_else(|| format!("the public URL {public_url:?} is not a URL"))?;
        let config = crate::auth::AuthConfig {
            issuer: issuer.trim_end_matches('/').to_owned(),
            client_id,
            client_secret: secret,
            cli_client_id: self.oidc_cli_client_id.clone(),
            groups_claim: self.oidc_groups_claim.clone(),
            scopes: self.oidc_scopes.clone(),
            public_origin,
            session_lifetime: Duration::from_secs(self.session_lifetime_secs),
            session_idle_timeout: Duration::from_secs(self.session_idle_timeout_secs),
            ca_file: self.oidc_ca_file.clone(),
        };
        crate::auth::Auth::new(config).map(|a| Some(std::sync::Arc::new(a)))
    }
}

/// The broker's knobs.
#[derive(Debug, Clone, Args)]
pub struct BrokerArgs {
    /// A blueprint file or a directory of them, added to the built-in catalog (repeatable).
    #[arg(
        long = "blueprints",
        env = "PLEXSPHERE_BLUEPRINTS",
        value_delimiter = ','
    )]
    pub blueprints: Vec<PathBuf>,
    /// Seconds between the broker's periodic re-checks of every resource.
    #[arg(
        long,
        env = "PLEXSPHERE_RECONCILE_SECS",
        default_value_t = 3,
        value_parser = secs_flag
    )]
    pub reconcile_secs: u64,
    /// Seconds the broker lease lasts: one replica of those sharing the database runs the
    /// broker and maintenance; another takes over within this plus a third of it after the
    /// leader dies (at least 3).
    #[arg(
        long,
        env = "PLEXSPHERE_LEADER_LEASE_SECS",
        default_value_t = 15,
        value_parser = secs_flag
    )]
    pub leader_lease_secs: u64,
    /// Turn the local-machine substrate off (by default it is on when running as root with
    /// systemd-nspawn, debootstrap and /dev/net/tun). Machines reach the server on the bridge
    /// address: listen there (`--listen 172.30.231.1:8443`, or 0.0.0.0 with `--san
    /// 172.30.231.1` and `--public-url https://172.30.231.1:8443`).
    #[arg(
        long,
        env = "PLEXSPHERE_NO_LOCAL_MACHINES",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub no_local_machines: bool,
    /// Where the local machines' Debian base image is cached.
    #[arg(long, env = "PLEXSPHERE_MACHINE_IMAGE_CACHE", default_value = plexsphere_nspawn::DEFAULT_IMAGE_CACHE)]
    pub machine_image_cache: PathBuf,
    /// The host bridge local machines sit on.
    #[arg(long, env = "PLEXSPHERE_MACHINE_BRIDGE", default_value = plexsphere_nspawn::DEFAULT_BRIDGE)]
    pub machine_bridge: String,
    /// The bridge's host address with the machines' prefix.
    #[arg(long, env = "PLEXSPHERE_MACHINE_BRIDGE_ADDRESS", default_value = plexsphere_nspawn::DEFAULT_BRIDGE_ADDRESS)]
    pub machine_bridge_address: ipnet::Ipv4Net,
}

/// A `--*-secs` flag (and its environment variable): a bare number of seconds, as before, or a
/// duration in the one syntax (`90s`, `30m`, `1h30m`, `2d`). Zero parses; each flag's own check
/// says why it is refused.
fn secs_flag(text: &str) -> Result<u64, String> {
    let rules = Rules {
        bare_seconds: true,
        zero: true,
    };
    parse_with(text, rules).map_err(|e| e.to_string())
}

/// [`secs_flag`] for a flag counted in `u32` seconds.
fn secs_flag_u32(text: &str) -> Result<u32, String> {
    let secs = secs_flag(text)?;
    u32::try_from(secs).map_err(|_| {
        format!(
            "`{text}` is too long for this flag (at most {} seconds)",
            u32::MAX
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secs_flags_take_seconds_or_the_duration_syntax() {
        assert_eq!(secs_flag("90"), Ok(90));
        assert_eq!(secs_flag("1m30s"), Ok(90));
        assert_eq!(secs_flag("1d"), Ok(86_400));
        // Zero parses; the flag's own check refuses it with its name.
        assert_eq!(secs_flag("0"), Ok(0));
        assert!(secs_flag("5w").is_err_and(|e| e.contains("unknown unit `w`")));
        assert!(secs_flag("1h30").is_err());
        assert_eq!(secs_flag_u32("30s"), Ok(30));
        assert!(secs_flag_u32("200000d").is_err_and(|e| e.contains("too long")));
    }
}
