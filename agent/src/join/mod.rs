//! Enrolment: trade the bootstrap token for an identity, exactly once.
//!
//! The order matters: the WireGuard key is saved before the API is called (so a crash after the
//! server's commit can replay the token with the same key), the identity is saved before the
//! token file is removed, and an enrolled node never needs a token again. Each attempt asks
//! for a challenge (`POST /v1/register/challenge`) and proves the WireGuard private key with
//! the registration, so the token and the public key alone (a fleet neighbour has both)
//! register nothing.

mod decide;
pub mod result;
mod token;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use plexsphere_wire::RegisterRequest;
use time::OffsetDateTime;

pub use decide::{
    CONNECT_RETRY_CAP, CONNECT_RETRY_INITIAL, DEFAULT_RETRY_AFTER, RateLimitStep,
    connect_retry_delay, rate_limit_delay, rate_limit_step, rate_limited_message, refusal,
    unreachable_message,
};
pub use token::{TokenFileError, read_token};

use crate::api_client::{ApiClient, ApiClientError, RegisterAnswer};
use crate::config::Config;
use crate::exit::{ExitCode, Failure};
use crate::fsutil;
use crate::identity::{Identity, NodeKey, host};
use crate::paths::StatePaths;
use crate::tls::TrustSources;

/// The default bound on retrying 429 answers.
pub(crate) const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(300);

/// Everything `join` needs, resolved from flags, environment and config.
#[derive(Debug, Clone)]
pub struct JoinSettings {
    pub config_file: PathBuf,
    pub config: Config,
    pub state: StatePaths,
    pub token_file: PathBuf,
    pub trust: TrustSources,
    /// Named in the "not trusted" message.
    pub dropped_ca: PathBuf,
    pub max_wait: Duration,
}

/// How `join` ended well.
#[derive(Debug, Clone)]
pub enum Joined {
    /// The node was enrolled already; nothing was sent.
    AlreadyEnrolled(Identity),
    /// The node registered now.
    Registered(Identity),
}

impl Joined {
    pub fn identity(&self) -> &Identity {
        match self {
            Joined::AlreadyEnrolled(i) | Joined::Registered(i) => i,
        }
    }
}

/// The two lines `plexd join` prints on stdout.
pub(crate) fn stdout_lines(id: &Identity) -> String {
    format!("node_id: {}\nmesh_ip: {}\n", id.node_id, id.mesh_ip)
}

/// Joins the mesh unless the node is enrolled already.
pub async fn join(s: &JoinSettings) -> Result<Joined, Failure> {
    let identity_file = s.state.identity_file();
    if let Some(id) = Identity::load(&identity_file)? {
        tracing::debug!(node_id = %id.node_id, mesh_ip = %id.mesh_ip, "already enrolled");
        // A state dir copied from another host is not this host's enrolment.
        host::check_or_bind(
            &s.state.dir,
            id.node_id,
            &host::machine_id_file(),
            OffsetDateTime::now_utc(),
        )?;
        return Ok(Joined::AlreadyEnrolled(id));
    }
    // Checked before the token is spent: a host without a usable machine id cannot be bound.
    let machine_id = host::MachineId::read(&host::machine_id_file())?;
    let api_url = s.config.require_api_url(&s.config_file)?.clone();

    fsutil::ensure_dir(&s.state.dir, 0o700)?;
    let (key, _) = NodeKey::load_or_generate(&s.state.key_file())?;
    let token = read_token(&s.token_file)?;

    let client = ApiClient::new(api_url.clone(), &s.trust, s.dropped_ca.clone())?;
    let request = RegisterRequest {
        bootstrap_token: token.expose(),
        wireguard_public_key: key.public_base64(),
        hostname: hostname(),
        arch: arch().to_owned(),
        plexd_version: env!("CARGO_PKG_VERSION").to_owned(),
        project_id: s.config.registration.project_id,
        resource_handle: s
            .config
            .registration
            .resource_handle
            .as_ref()
            .map(|h| h.as_str().to_owned()),
        nonce: None,
        proof: None,
    };
    let secret = key.secret().to_bytes();

    let started = Instant::now();
    let mut attempts = 0u32;
    let mut connect_failures = 0u32;
    let mut jitter = crate::jitter::Jitter::from_os();
    let response = loop {
        attempts += 1;
        tracing::info!(api_url = %api_url, attempt = attempts, hostname = %request.hostname, "registering with the control plane");
        let answer = match client.register(&request, &secret).await {
            Ok(answer) => answer,
            // The network may not be up yet (cloud-init, early boot): retried within
            // --max-wait. A certificate the trust refuses, or a bad answer, is not.
            Err(e @ ApiClientError::Unreachable { .. }) => {
                connect_failures += 1;
                let delay = connect_retry_delay(connect_failures, jitter.unit());
                match rate_limit_step(started.elapsed(), delay, s.max_wait) {
                    RateLimitStep::RetryAfter(d) => {
                        tracing::warn!(
                            attempt = attempts,
                            retry_in_ms = d.as_millis() as u64,
                            "{e}; retrying in {:.1}s",
                            d.as_secs_f64()
                        );
                        tokio::time::sleep(d).await;
                        continue;
                    }
                    RateLimitStep::GiveUp => {
                        return Err(Failure::new(
                            ExitCode::ApiUnreachable,
                            unreachable_message(&e.to_string(), s.max_wait, attempts),
                        ));
                    }
                }
            }
            Err(e) => return Err(e.into()),
        };
        match answer {
            RegisterAnswer::Registered { response, status } => {
                tracing::debug!(status, "registration accepted");
                break response;
            }
            RegisterAnswer::Refused {
                status: 429,
                error,
                retry_after,
            } => {
                let delay = rate_limit_delay(retry_after, crate::jitter::Jitter::from_os().unit());
                match rate_limit_step(started.elapsed(), delay, s.max_wait) {
                    RateLimitStep::RetryAfter(d) => {
                        tracing::warn!(code = %error.code, wait_ms = d.as_millis() as u64, "the API is rate-limiting registrations; waiting");
                        tokio::time::sleep(d).await;
                    }
                    RateLimitStep::GiveUp => {
                        return Err(Failure::new(
                            ExitCode::RateLimited,
                            rate_limited_message(api_url.as_str(), s.max_wait, attempts),
                        ));
                    }
                }
            }
            RegisterAnswer::Refused { status, error, .. } => {
                let (code, message) = refusal(
                    status,
                    &error,
                    &s.token_file,
                    &s.config_file,
                    api_url.as_str(),
                );
                return Err(Failure::new(code, message));
            }
        }
    };

    let id = Identity::from_response(response, api_url.as_str(), OffsetDateTime::now_utc());
    id.save(&identity_file).map_err(|e| {
        Failure::new(
            ExitCode::Io,
            format!(
                "registered as node {} but could not save the identity: {e}; fix the state dir and run plexd again (the same key replays the token)",
                id.node_id
            ),
        )
    })?;
    // This host registered the node now: the binding is this host's, whatever was there.
    host::bind(
        &s.state.dir.join(host::HOST_FILE_NAME),
        id.node_id,
        &host::stored_fingerprint(&machine_id, id.node_id),
        OffsetDateTime::now_utc(),
    )?;
    if let Err(e) = std::fs::remove_file(&s.token_file) {
        tracing::warn!(path = %s.token_file.display(), error = %e, "could not remove the used bootstrap token file; remove it by hand");
    }
    tracing::info!(node_id = %id.node_id, mesh_ip = %id.mesh_ip, mesh_cidr = %id.mesh_cidr, project_id = %id.project_id, "registered as node {} with mesh IP {} (mesh {}, project {})", id.node_id, id.mesh_ip, id.mesh_cidr, id.project_id);
    Ok(Joined::Registered(id))
}

/// The kernel's host name.
fn hostname() -> String {
    match nix::unistd::gethostname() {
        Ok(h) => h.to_string_lossy().into_owned(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the host name; registering as `localhost`");
            "localhost".to_owned()
        }
    }
}

/// The Debian name of this machine's architecture.
pub fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}
