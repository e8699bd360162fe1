//! One signed-in cloud: the credential, its HTTP client and its Keystone token, cached until
//! [`TOKEN_MARGIN`] before it expires. Every call to Nova, Glance or Neutron goes through
//! [`Session::call`]: a 401 drops the token, signs in again and retries once.

use std::sync::Mutex;
use std::time::Duration;

use reqwest::Method;
use serde_json::Value;
use time::OffsetDateTime;

use super::credential::OpenStackCredential;
use super::error;
use super::http::{self, Reply};
use super::keystone::{self, Endpoints};
use crate::broker::substrate::SubstrateError;

/// A token is used until this long before its `expires_at`, then a new one is asked for.
pub(crate) const TOKEN_MARGIN: Duration = Duration::from_secs(5 * 60);

/// The compute microversion every Nova call asks for: 2.79 (Train, 2019) and later accept
/// everything the broker sends and return servers with `fault`, `metadata` and the flavor;
/// Zed serves up to 2.93. A fixed one keeps the answers' shape stable across clouds.
pub(crate) const COMPUTE_MICROVERSION: &str = "compute 2.79";

/// Which service a call is for: the catalog type and the name in messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Service {
    Compute,
    Image,
    Network,
}

impl Service {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Service::Compute => "Nova",
            Service::Image => "Glance",
            Service::Network => "Neutron",
        }
    }
}

#[derive(Clone)]
struct Token {
    value: String,
    expires_at: OffsetDateTime,
    endpoints: Endpoints,
}

/// A cloud credential's client and token.
pub(crate) struct Session {
    pub cred: OpenStackCredential,
    http: reqwest::Client,
    token: Mutex<Option<Token>>,
}

impl Session {
    pub(crate) fn new(cred: OpenStackCredential) -> Result<Self, String> {
        let http = http::client(cred.ca_pem.as_deref())?;
        Ok(Self {
            cred,
            http,
            token: Mutex::new(None),
        })
    }

    /// The cloud, as error lines name it.
    pub(crate) fn cloud(&self) -> &str {
        &self.cred.auth_url
    }

    /// The cached token when it is good for [`TOKEN_MARGIN`] more, else a fresh one.
    async fn token(&self, now: OffsetDateTime) -> Result<Token, SubstrateError> {
        let cached = self.token.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(t) = cached
            && t.expires_at - TOKEN_MARGIN > now
        {
            return Ok(t);
        }
        let fresh = self.sign_in().await?;
        *self.token.lock().unwrap_or_else(|p| p.into_inner()) = Some(fresh.clone());
        Ok(fresh)
    }

    fn drop_token(&self) {
        *self.token.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// `POST /v3/auth/tokens`.
    async fn sign_in(&self) -> Result<Token, SubstrateError> {
        let cloud = self.cloud();
        let what = "signing in";
        let request = self
            .http
            .post(keystone::tokens_url(cloud))
            .json(&keystone::auth_body(&self.cred));
        let reply = http::send(request)
            .await
            .map_err(|e| error::transport(cloud, "Keystone", what, &e))?;
        if reply.status == 401 {
            return Err(error::refused_credential(
                cloud,
                &self.cred.who(),
                &reply.body,
            ));
        }
        if reply.status != 201 && reply.status != 200 {
            return Err(error::from_status(
                cloud,
                "Keystone",
                what,
                reply.status,
                &reply.body,
            ));
        }
        let value = reply.subject_token.ok_or_else(|| {
            SubstrateError::Failed(format!(
                "Keystone of the cloud {cloud} answered the sign-in without an X-Subject-Token header; check auth_url points at Keystone v3"
            ))
        })?;
        let issued = keystone::parse_issued(
            &reply.body,
            self.cred.region.as_deref(),
            &self.cred.interface,
        )
        .map_err(|e| SubstrateError::Failed(format!("{e} (cloud {cloud})")))?;
        tracing::debug!(cloud, expires_at = %issued.expires_at, project_id = ?issued.project_id, "signed in to Keystone");
        Ok(Token {
            value,
            expires_at: issued.expires_at,
            endpoints: issued.endpoints,
        })
    }

    /// Calls `service` at `path` (relative to its catalog endpoint) with the token; a 401
    /// signs in again and retries once. `what` names the call in error lines. Statuses other
    /// than 401 are returned for the caller to judge.
    pub(crate) async fn call(
        &self,
        service: Service,
        method: Method,
        path: &str,
        body: Option<&Value>,
        what: &str,
    ) -> Result<Reply, SubstrateError> {
        let cloud = self.cloud();
        let mut retried = false;
        loop {
            let token = self.token(OffsetDateTime::now_utc()).await?;
            let base = match service {
                Service::Compute => &token.endpoints.compute,
                Service::Image => &token.endpoints.image,
                Service::Network => &token.endpoints.network,
            };
            let mut request = self
                .http
                .request(method.clone(), format!("{base}{path}"))
                .header("X-Auth-Token", &token.value)
                .header("Accept", "application/json");
            if service == Service::Compute {
                request = request.header("OpenStack-API-Version", COMPUTE_MICROVERSION);
            }
            if let Some(b) = body {
                request = request.json(b);
            }
            let reply = http::send(request)
                .await
                .map_err(|e| error::transport(cloud, service.label(), what, &e))?;
            if reply.status != 401 {
                return Ok(reply);
            }
            self.drop_token();
            if retried {
                return Err(error::refused_token(
                    cloud,
                    service.label(),
                    what,
                    &reply.body,
                ));
            }
            retried = true;
            tracing::info!(
                cloud,
                service = service.label(),
                "the cloud refused the cached token; signing in again"
            );
        }
    }
}
