//! Keystone v3: the `POST /v3/auth/tokens` body for each sign-in form, and what the answer
//! gives the broker (the token's expiry and the compute, image and network endpoints picked
//! from the catalog by service type, interface and region). Pure; the call is in
//! `session.rs`.

use serde::Deserialize;
use serde_json::{Value, json};
use time::OffsetDateTime;

use super::credential::{Auth, OpenStackCredential, Project};

/// `<auth_url>/auth/tokens`, with `/v3` added when the URL lacks it.
pub(crate) fn tokens_url(auth_url: &str) -> String {
    let base = auth_url.trim_end_matches('/');
    if base.ends_with("/v3") {
        format!("{base}/auth/tokens")
    } else {
        format!("{base}/v3/auth/tokens")
    }
}

/// The sign-in request body.
pub(crate) fn auth_body(cred: &OpenStackCredential) -> Value {
    match &cred.auth {
        Auth::ApplicationCredentialId { id, secret } => json!({"auth": {"identity": {
            "methods": ["application_credential"],
            "application_credential": {"id": id, "secret": secret.expose()}
        }}}),
        Auth::ApplicationCredentialName {
            name,
            username,
            user_domain_name,
            secret,
        } => json!({"auth": {"identity": {
            "methods": ["application_credential"],
            "application_credential": {
                "name": name,
                "secret": secret.expose(),
                "user": {"name": username, "domain": {"name": user_domain_name}}
            }
        }}}),
        Auth::Password {
            username,
            user_domain_name,
            password,
            project,
        } => {
            let project = match project {
                Project::Id(id) => json!({"id": id}),
                Project::Name { name, domain_name } => {
                    json!({"name": name, "domain": {"name": domain_name}})
                }
            };
            json!({"auth": {
                "identity": {
                    "methods": ["password"],
                    "password": {"user": {
                        "name": username,
                        "domain": {"name": user_domain_name},
                        "password": password.expose()
                    }}
                },
                "scope": {"project": project}
            }})
        }
    }
}

/// The endpoints the broker uses, base URLs without a trailing `/`; the image and network
/// ones without their API version (`/v2`, `/v2.0`), which the calls add, since catalogs
/// differ in whether they carry it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoints {
    pub compute: String,
    pub image: String,
    pub network: String,
}

/// What a sign-in answer holds for the broker (the token itself is the header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Issued {
    pub expires_at: OffsetDateTime,
    pub project_id: Option<String>,
    pub endpoints: Endpoints,
}

#[derive(Deserialize)]
struct TokenBody {
    token: TokenInfo,
}

#[derive(Deserialize)]
struct TokenInfo {
    #[serde(with = "time::serde::rfc3339")]
    expires_at: OffsetDateTime,
    #[serde(default)]
    project: Option<Named>,
    #[serde(default)]
    catalog: Vec<Service>,
}

#[derive(Deserialize)]
struct Named {
    id: String,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Service {
    #[serde(rename = "type")]
    pub service_type: String,
    #[serde(default)]
    pub endpoints: Vec<Endpoint>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Endpoint {
    pub interface: String,
    #[serde(default)]
    pub region_id: Option<String>,
    #[serde(default)]
    pub region: Option<String>,
    pub url: String,
}

impl Endpoint {
    fn region(&self) -> &str {
        self.region_id
            .as_deref()
            .or(self.region.as_deref())
            .unwrap_or("")
    }
}

/// Reads a sign-in answer's body: the expiry and the endpoints for `region` (or the only
/// region) and `interface`. `Err`: one line saying what the catalog lacks.
pub(crate) fn parse_issued(
    body: &[u8],
    region: Option<&str>,
    interface: &str,
) -> Result<Issued, String> {
    let parsed: TokenBody = serde_json::from_slice(body)
        .map_err(|e| format!("Keystone's token answer does not parse: {e}"))?;
    let token = parsed.token;
    let pick = |t: &str| endpoint(&token.catalog, t, interface, region);
    Ok(Issued {
        expires_at: token.expires_at,
        project_id: token.project.map(|p| p.id),
        endpoints: Endpoints {
            compute: pick("compute")?,
            image: unversioned(pick("image")?, "/v2"),
            network: unversioned(pick("network")?, "/v2.0"),
        },
    })
}

fn unversioned(url: String, version: &str) -> String {
    match url.strip_suffix(version) {
        Some(base) => base.to_owned(),
        None => url,
    }
}

/// The URL of `service_type` at `interface` in `region`; without a region, the catalog must
/// offer the service in one region only (else the error lists them).
pub(crate) fn endpoint(
    catalog: &[Service],
    service_type: &str,
    interface: &str,
    region: Option<&str>,
) -> Result<String, String> {
    let candidates: Vec<&Endpoint> = catalog
        .iter()
        .filter(|s| s.service_type == service_type)
        .flat_map(|s| s.endpoints.iter())
        .filter(|e| e.interface == interface)
        .collect();
    if candidates.is_empty() {
        return Err(format!(
            "the cloud's catalog has no {interface} endpoint of type {service_type}; set `interface` in the credential to one the catalog offers, or ask the cloud's operator"
        ));
    }
    let mut regions: Vec<&str> = candidates.iter().map(|e| e.region()).collect();
    regions.sort_unstable();
    regions.dedup();
    let chosen = match region {
        Some(r) => candidates.iter().find(|e| e.region() == r).ok_or_else(|| {
            format!(
                "the cloud's catalog has no {interface} {service_type} endpoint in region {r}; it has regions {}; set `region` in the credential to one of them",
                regions.join(", ")
            )
        })?,
        None if regions.len() > 1 => {
            return Err(format!(
                "the cloud's catalog has {service_type} in several regions ({}); set `region` in the credential to one of them",
                regions.join(", ")
            ));
        }
        None => candidates[0],
    };
    Ok(chosen.url.trim_end_matches('/').to_owned())
}

#[cfg(test)]
#[path = "keystone_tests.rs"]
mod tests;
