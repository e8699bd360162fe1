//! Nova servers: the create request (`POST /servers`), finding a resource's server again by
//! its name and metadata (`GET /servers/detail?name=^pr-<id>$`), deleting it, and what its
//! status means as observations. The shapes and the mapping are pure and tested; the calls go
//! through the session.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use plexsphere_broker::Observation;
use reqwest::Method;
use serde::Deserialize;
use serde_json::{Value, json};

use super::error;
use super::session::{Service, Session};
use crate::broker::substrate::SubstrateError;

/// Nova's limit on `user_data`: at most this many bytes of base64.
pub(crate) const MAX_USER_DATA_BASE64: usize = 65_535;

/// The metadata keys that tie a server to its resource.
pub(crate) const META_RESOURCE: &str = "plexsphere-resource-id";
pub(crate) const META_PROJECT: &str = "plexsphere-project-id";
pub(crate) const META_BLUEPRINT_VERSION: &str = "plexsphere-blueprint-version-id";

/// A server as Nova lists it (the fields the broker reads).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct Server {
    pub id: String,
    pub name: String,
    pub status: String,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub fault: Option<Fault>,
    /// `deleting` while Nova removes it.
    #[serde(default, rename = "OS-EXT-STS:task_state")]
    pub task_state: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct Fault {
    #[serde(default)]
    pub code: Option<u16>,
    #[serde(default)]
    pub message: String,
}

#[derive(Deserialize)]
struct ServerList {
    servers: Vec<Server>,
}

/// The cloud-init document as Nova's `user_data`: base64, refused before any call when it
/// is longer than [`MAX_USER_DATA_BASE64`].
pub(crate) fn user_data(document: &str) -> Result<String, String> {
    let encoded = STANDARD.encode(document.as_bytes());
    if encoded.len() > MAX_USER_DATA_BASE64 {
        return Err(format!(
            "the machine's cloud-init document is {} bytes, {} bytes as base64, more than the {MAX_USER_DATA_BASE64} bytes Nova accepts as user_data; shorten it (fewer packages or files in the blueprint)",
            document.len(),
            encoded.len()
        ));
    }
    Ok(encoded)
}

/// What the create request carries besides the name and metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placement {
    pub image_id: String,
    pub flavor_id: String,
    pub network_id: String,
    pub key_name: Option<String>,
    pub config_drive: bool,
    pub availability_zone: Option<String>,
}

/// The `POST /servers` body.
pub(crate) fn create_body(
    name: &str,
    metadata: &BTreeMap<String, String>,
    user_data_base64: &str,
    placement: &Placement,
) -> Value {
    let mut server = json!({
        "name": name,
        "imageRef": placement.image_id,
        "flavorRef": placement.flavor_id,
        "networks": [{"uuid": placement.network_id}],
        "metadata": metadata,
        "user_data": user_data_base64,
        "config_drive": placement.config_drive,
    });
    if let Some(key) = &placement.key_name {
        server["key_name"] = json!(key);
    }
    if let Some(az) = &placement.availability_zone {
        server["availability_zone"] = json!(az);
    }
    json!({ "server": server })
}

/// The servers of this name that are the resource's, or an error naming a server of that
/// name that belongs to something else.
pub(crate) fn ours(
    servers: Vec<Server>,
    name: &str,
    resource_id: &str,
) -> Result<Vec<Server>, String> {
    let mut mine = Vec::new();
    for s in servers.into_iter().filter(|s| s.name == name) {
        match s.metadata.get(META_RESOURCE) {
            Some(id) if id == resource_id => mine.push(s),
            other => {
                return Err(format!(
                    "a server named {name} ({}) exists and is not this resource's (its {META_RESOURCE} is {}); rename or delete it, then create the resource again",
                    s.id,
                    other.map(String::as_str).unwrap_or("missing")
                ));
            }
        }
    }
    Ok(mine)
}

/// Whether Nova counts the server as gone.
pub(crate) fn is_deleted(server: &Server) -> bool {
    matches!(server.status.as_str(), "DELETED" | "SOFT_DELETED")
}

/// What a server's status means. `deleting`: the resource is being deleted, so nothing but
/// its disappearance matters. `Err`: the resource fails with this reason.
pub(crate) fn observations(
    server: &Server,
    deleting: bool,
    cloud: &str,
) -> Result<Vec<Observation>, String> {
    if deleting || is_deleted(server) {
        return Ok(Vec::new());
    }
    match server.status.as_str() {
        "BUILD" => Ok(vec![Observation::SubstrateAccepted]),
        "ACTIVE" => Ok(vec![
            Observation::SubstrateAccepted,
            Observation::MachineBooted,
        ]),
        // Passing states of a running server (an operator's reboot, a live migration): the
        // machine is there; the next pass looks again.
        "REBOOT" | "HARD_REBOOT" | "MIGRATING" | "PASSWORD" => {
            Ok(vec![Observation::SubstrateAccepted])
        }
        "ERROR" => {
            let fault = match &server.fault {
                Some(f) => match f.code {
                    Some(code) => format!("{} (code {code})", f.message.trim()),
                    None => f.message.trim().to_owned(),
                },
                None => "Nova gives no fault message".to_owned(),
            };
            let advice = if fault.contains("No valid host") {
                "no compute host can take it: pick a smaller flavor or another availability zone, or ask the cloud's operator about capacity"
            } else {
                "see the fault, fix the blueprint parameters or the cloud, and create the resource again"
            };
            Err(format!(
                "Nova of the cloud {cloud} put the server {} ({}) in ERROR: {fault}; {advice}",
                server.name, server.id
            ))
        }
        other => Err(format!(
            "the server {} ({}) in the cloud {cloud} is {other}, not running; the broker does not restart servers: delete the resource and create it again",
            server.name, server.id
        )),
    }
}

/// The resource's servers (by name and metadata), none deleted.
pub(crate) async fn find(
    session: &Session,
    name: &str,
    resource_id: &str,
) -> Result<Vec<Server>, SubstrateError> {
    let what = format!("looking for the server {name}");
    let path = format!("/servers/detail?name=%5E{name}%24");
    let reply = session
        .call(Service::Compute, Method::GET, &path, None, &what)
        .await?;
    if reply.status != 200 {
        return Err(error::from_status(
            session.cloud(),
            "Nova",
            &what,
            reply.status,
            &reply.body,
        ));
    }
    let list: ServerList = serde_json::from_slice(&reply.body).map_err(|e| {
        SubstrateError::Unreachable(format!(
            "Nova of the cloud {} answered {what} with a body that does not parse ({e}); the broker asks again on its next pass",
            session.cloud()
        ))
    })?;
    let mine = ours(list.servers, name, resource_id)
        .map_err(|e| SubstrateError::Failed(format!("{e} (cloud {})", session.cloud())))?;
    Ok(mine.into_iter().filter(|s| !is_deleted(s)).collect())
}

/// `GET /servers/<id>`: one server with its `fault` (Nova's list leaves the fault out);
/// `None` when it is gone.
pub(crate) async fn show(session: &Session, id: &str) -> Result<Option<Server>, SubstrateError> {
    let what = format!("reading the server {id}");
    let path = format!("/servers/{id}");
    let reply = session
        .call(Service::Compute, Method::GET, &path, None, &what)
        .await?;
    match reply.status {
        200 => {}
        404 => return Ok(None),
        status => {
            return Err(error::from_status(
                session.cloud(),
                "Nova",
                &what,
                status,
                &reply.body,
            ));
        }
    }
    #[derive(Deserialize)]
    struct One {
        server: Server,
    }
    serde_json::from_slice::<One>(&reply.body)
        .map(|o| Some(o.server))
        .map_err(|e| {
            SubstrateError::Unreachable(format!(
                "Nova of the cloud {} answered {what} with a body that does not parse ({e}); the broker asks again on its next pass",
                session.cloud()
            ))
        })
}

/// `POST /servers`; Nova answers 202 with the new server's id.
pub(crate) async fn create(
    session: &Session,
    name: &str,
    body: &Value,
) -> Result<String, SubstrateError> {
    let what = format!("creating the server {name}");
    let reply = session
        .call(
            Service::Compute,
            Method::POST,
            "/servers",
            Some(body),
            &what,
        )
        .await?;
    if reply.status != 202 && reply.status != 200 {
        return Err(error::from_status(
            session.cloud(),
            "Nova",
            &what,
            reply.status,
            &reply.body,
        ));
    }
    let id = serde_json::from_slice::<Value>(&reply.body)
        .ok()
        .and_then(|v| v["server"]["id"].as_str().map(str::to_owned))
        .unwrap_or_default();
    Ok(id)
}

/// `DELETE /servers/<id>`; a server already gone (404) is fine.
pub(crate) async fn delete(session: &Session, server: &Server) -> Result<(), SubstrateError> {
    if server.task_state.as_deref() == Some("deleting") {
        return Ok(());
    }
    let what = format!("deleting the server {} ({})", server.name, server.id);
    let path = format!("/servers/{}", server.id);
    let reply = session
        .call(Service::Compute, Method::DELETE, &path, None, &what)
        .await?;
    match reply.status {
        204 | 202 | 200 | 404 => Ok(()),
        // Nova is busy with the server (a task in progress): the next pass deletes again.
        409 => {
            tracing::info!(server_id = %server.id, "Nova cannot delete the server yet (409); the next pass asks again");
            Ok(())
        }
        status => Err(error::from_status(
            session.cloud(),
            "Nova",
            &what,
            status,
            &reply.body,
        )),
    }
}

#[cfg(test)]
#[path = "compute_tests.rs"]
mod tests;
