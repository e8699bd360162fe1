//! The broker's commands: `resource`, `cloud-credential` and `blueprint list`. Arguments are
//! checked before any request; `--wait` follows the phases through [`crate::wait`].

use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use plexsphere_wire::duration::{self, DurationError};
use serde::Serialize;
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::broker_output::{self as out, CredentialView, Items, Resource};
use crate::cli_broker::{CredentialCommand, PayloadArgs, ResourceCommand, WaitArgs};
use crate::config::Settings;
use crate::failure::Failure;
use crate::output::{self, Format, render};
use crate::session::{confirm, operator_api, project_or_sole};
use crate::wait::{self, Ended, Goal};

/// The body of `POST /v1/projects/{id}/resources`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CreateRequest {
    pub kind: String,
    pub blueprint_version_id: Uuid,
    pub cloud_credential_id: Uuid,
    pub parameters: Map<String, Value>,
}

/// The body of `POST /v1/cloud-credentials`. The payload is a secret: never in Debug.
#[derive(Clone, Serialize)]
pub struct CredentialRequest {
    pub name: String,
    pub provider: String,
    pub payload: Map<String, Value>,
}

impl std::fmt::Debug for CredentialRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialRequest")
            .field("name", &self.name)
            .field("provider", &self.provider)
            .field("payload", &"<redacted>")
            .finish()
    }
}

pub async fn resources(
    cmd: &ResourceCommand,
    format: Format,
    settings: &Settings,
) -> Result<String, Failure> {
    match cmd {
        ResourceCommand::Create {
            project_id,
            kind,
            blueprint_version_id,
            cloud_credential_id,
            parameters,
            wait,
        } => {
            let request =
                create_request(kind, blueprint_version_id, cloud_credential_id, parameters)?;
            let wait = wait_settings(wait)?;
            let api = &operator_api(settings)?;
            let project = project_or_sole(api, project_id.as_deref()).await?;
            let path = ["v1", "projects", &project.to_string(), "resources"];
            let created: Resource = api.post(&path, Some(&request)).await?;
            match wait {
                None => render(format, &created, out::created),
                Some(w) => {
                    if format == Format::Table {
                        print_now(&out::created(&created));
                    }
                    follow(api, created.view.id, Some(created), Goal::Ready, w, format).await
                }
            }
        }
        ResourceCommand::Get { id, wait } => {
            let id = resource_id(id)?;
            let wait = wait_settings(wait)?;
            let api = &operator_api(settings)?;
            match wait {
                None => {
                    let r: Resource = api.get(&["v1", "resources", &id.to_string()], &[]).await?;
                    render(format, &r, out::resource)
                }
                Some(w) => follow(api, id, None, Goal::Ready, w, format).await,
            }
        }
        ResourceCommand::List { project_id } => {
            let api = &operator_api(settings)?;
            let project = project_or_sole(api, project_id.as_deref()).await?;
            let path = ["v1", "projects", &project.to_string(), "resources"];
            let list: Items<Resource> = api.get(&path, &[]).await?;
            render(format, list.items.as_slice(), out::resources)
        }
        ResourceCommand::Delete { id, yes, wait } => {
            let id = resource_id(id)?;
            let wait = wait_settings(wait)?;
            let api = &operator_api(settings)?;
            let path = ["v1", "resources", &id.to_string()];
            if !yes {
                let r: Resource = api.get(&path, &[]).await?;
                confirm_delete(&r)?;
            }
            let r: Resource = api.delete(&path).await?;
            match wait {
                None => render(format, &r, out::resource),
                Some(w) => follow(api, id, Some(r), Goal::Deleted, w, format).await,
            }
        }
    }
}

pub async fn credentials(
    cmd: &CredentialCommand,
    format: Format,
    settings: &Settings,
) -> Result<String, Failure> {
    match cmd {
        CredentialCommand::Create {
            name,
            provider,
            payload,
        } => {
            let request = credential_request(name, provider, payload_of(payload)?)?;
            let created: CredentialView = operator_api(settings)?
                .post(&["v1", "cloud-credentials"], Some(&request))
                .await?;
            render(format, &created, |c| {
                out::credentials(std::slice::from_ref(c))
            })
        }
        CredentialCommand::Rotate { id, payload } => {
            let id = uuid_arg("the credential id", id, "plexctl cloud-credential list")?;
            let Some(payload) = payload_of(payload)? else {
                return Err(Failure::Usage(
                    "give the new payload with --payload-file, --payload or --clouds-yaml and --cloud".to_owned(),
                ));
            };
            let request = RotateRequest { payload };
            let rotated: CredentialView = operator_api(settings)?
                .post(
                    &["v1", "cloud-credentials", &id.to_string(), "rotate"],
                    Some(&request),
                )
                .await?;
            render(format, &rotated, |c| {
                out::credentials(std::slice::from_ref(c))
            })
        }
        CredentialCommand::List => {
            let list: Items<CredentialView> = operator_api(settings)?
                .get(&["v1", "cloud-credentials"], &[])
                .await?;
            render(format, list.items.as_slice(), out::credentials)
        }
        CredentialCommand::Revoke { id } => {
            let id = uuid_arg("the credential id", id, "plexctl cloud-credential list")?;
            let revoked: CredentialView = operator_api(settings)?
                .post::<(), _>(
                    &["v1", "cloud-credentials", &id.to_string(), "revoke"],
                    None,
                )
                .await?;
            render(format, &revoked, |c| {
                out::credentials(std::slice::from_ref(c))
            })
        }
    }
}

pub async fn blueprints(format: Format, settings: &Settings) -> Result<String, Failure> {
    let list: Items<Value> = operator_api(settings)?
        .get(&["v1", "blueprints"], &[])
        .await?;
    render(format, list.items.as_slice(), |items| {
        out::blueprints(items)
    })
}

/// Follows the phases; the lines go to stdout for tables and to stderr with `--output json`,
/// whose stdout gets the final resource.
async fn follow(
    api: &crate::client::Api,
    id: Uuid,
    first: Option<Resource>,
    goal: Goal,
    (interval, timeout): (Duration, Duration),
    format: Format,
) -> Result<String, Failure> {
    let ended = match format {
        Format::Table => {
            let mut sink = std::io::stdout();
            wait::watch(api, id, first, goal, interval, timeout, &mut sink).await?
        }
        Format::Json => {
            let mut sink = std::io::stderr();
            wait::watch(api, id, first, goal, interval, timeout, &mut sink).await?
        }
    };
    let (last, failure) = match ended {
        Ended::Reached(r) => (r, None),
        Ended::Failed(r, reason) => (
            r,
            Some(Failure::ResourceFailed(format!(
                "resource {id} failed: {reason}"
            ))),
        ),
        Ended::TimedOut(r) => {
            let text = format!(
                "resource {id} is still {} after {}s, not {} yet; keep following it with `plexctl resource get {id} --wait` or give a longer --timeout",
                r.view.provisioning.phase,
                timeout.as_secs(),
                goal.phase()
            );
            (r, Some(Failure::WaitTimedOut(text)))
        }
    };
    let text = match format {
        Format::Table => String::new(),
        Format::Json => output::json(&last)?,
    };
    match failure {
        None => Ok(text),
        Some(failure) => {
            print_now(&text);
            Err(failure)
        }
    }
}

fn print_now(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes());
    let _ = stdout.flush();
}

/// Checks `resource create`'s arguments before anything is sent.
pub fn create_request(
    kind: &str,
    blueprint_version_id: &str,
    cloud_credential_id: &str,
    parameters: &str,
) -> Result<CreateRequest, Failure> {
    let kind = kind.trim();
    if kind.is_empty() {
        return Err(Failure::Usage(
            "--kind is empty; give the blueprint's kind (the KIND column of `plexctl blueprint list`)"
                .to_owned(),
        ));
    }
    Ok(CreateRequest {
        kind: kind.to_owned(),
        blueprint_version_id: uuid_arg(
            "--blueprint-version-id",
            blueprint_version_id,
            "plexctl blueprint list",
        )?,
        cloud_credential_id: uuid_arg(
            "--cloud-credential-id",
            cloud_credential_id,
            "plexctl cloud-credential list",
        )?,
        parameters: json_object("--parameters", parameters)?,
    })
}

/// The body of `POST /v1/cloud-credentials/{id}/rotate`. The payload is a secret: no Debug.
#[derive(Clone, Serialize)]
pub struct RotateRequest {
    pub payload: Map<String, Value>,
}

/// The payload the flags give, if any, as a JSON object.
pub fn payload_of(args: &PayloadArgs) -> Result<Option<Map<String, Value>>, Failure> {
    match (
        &args.payload,
        &args.payload_file,
        &args.clouds_yaml,
        &args.cloud,
    ) {
        (Some(text), _, _, _) => json_object("--payload", text).map(Some),
        (None, Some(path), _, _) => json_object("--payload-file", &read_payload(path)?).map(Some),
        (None, None, Some(path), Some(cloud)) => crate::clouds_yaml::payload(path, cloud).map(Some),
        _ => Ok(None),
    }
}

/// Checks `cloud-credential create`'s arguments; no payload is `{}`.
pub fn credential_request(
    name: &str,
    provider: &str,
    payload: Option<Map<String, Value>>,
) -> Result<CredentialRequest, Failure> {
    let name = name.trim();
    if name.is_empty() {
        return Err(Failure::Usage(
            "--name is empty; give the credential a name people recognise".to_owned(),
        ));
    }
    if !matches!(provider, "local" | "openstack") {
        return Err(Failure::Usage(format!(
            "--provider `{provider}` is not a provider; use local or openstack"
        )));
    }
    let payload = payload.unwrap_or_default();
    Ok(CredentialRequest {
        name: name.to_owned(),
        provider: provider.to_owned(),
        payload,
    })
}

/// A JSON object flag. The message never quotes the text: it may hold a secret.
pub fn json_object(flag: &str, text: &str) -> Result<Map<String, Value>, Failure> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(Failure::Usage(format!(
            "{flag} must be a JSON object, e.g. '{{\"region\":\"us-east-1\"}}'"
        ))),
        Err(e) => Err(Failure::Usage(format!(
            "{flag} is not valid JSON ({e}); give an object, e.g. '{{\"region\":\"us-east-1\"}}'"
        ))),
    }
}

/// The text of --payload-file, at most [`crate::clouds_yaml::MAX_FILE`] bytes.
fn read_payload(path: &Path) -> Result<String, Failure> {
    crate::clouds_yaml::read_capped(path, "--payload-file")
        .map_err(|e| Failure::Usage(format!("{e}; give a readable file holding a JSON object")))
}

/// An id flag or argument: a UUID, else a usage error that says where to find one.
pub fn uuid_arg(what: &str, given: &str, list: &str) -> Result<Uuid, Failure> {
    Uuid::parse_str(given.trim()).map_err(|_| {
        Failure::Usage(format!(
            "{what} `{given}` is not an id; ids are UUIDs, see `{list}`"
        ))
    })
}

fn resource_id(given: &str) -> Result<Uuid, Failure> {
    uuid_arg(
        "the resource id",
        given,
        "plexctl resource list --project-id <id>",
    )
}

/// `--poll-interval` and `--timeout` when `--wait` is given.
pub fn wait_settings(args: &WaitArgs) -> Result<Option<(Duration, Duration)>, Failure> {
    if !args.wait {
        return Ok(None);
    }
    let duration = |flag: &str, text: &str| match duration::parse(text) {
        Ok(secs) => Ok(Duration::from_secs(secs)),
        Err(DurationError::Zero(_)) => Err(Failure::Usage(format!(
            "{flag} `{text}` is zero; give a duration like 1s, 30s or 15m"
        ))),
        Err(e) => Err(Failure::Usage(format!("{flag}: {e}"))),
    };
    Ok(Some((
        duration("--poll-interval", &args.poll_interval)?,
        duration("--timeout", &args.timeout)?,
    )))
}

/// Asks on the terminal before deleting; without a terminal, `--yes` is required.
fn confirm_delete(r: &Resource) -> Result<(), Failure> {
    let v = &r.view;
    confirm(
        &format!("delete resource {}", v.id),
        &format!(
            "delete resource {} ({}, {})? The substrate tears it down.",
            v.id, v.kind, v.provisioning.phase
        ),
        &format!("not deleted: resource {} is unchanged", v.id),
    )
}

#[cfg(test)]
#[path = "broker_tests.rs"]
mod tests;
