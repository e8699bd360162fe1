//! What every command does with the operator's environment: connect to the operator API the
//! settings name, and ask on the terminal before a destructive step.

use plexsphere_wire::admin::{List, ProjectView};
use uuid::Uuid;

use crate::client::Api;
use crate::config::Settings;
use crate::failure::Failure;

/// The operator API at the configured server, with the session `plexctl login` saved for it
/// when there is one, else the operator token, and the CA file.
pub fn operator_api(settings: &Settings) -> Result<Api, Failure> {
    let server = settings.server_url()?;
    let token = match crate::login::saved(settings) {
        Some(s) => crate::secret::Secret::new(s.session),
        None => settings.operator_token()?,
    };
    let ca_file = settings.ca_file.as_ref().map(|(path, _)| path.as_path());
    Ok(Api::new(server, Some(token), ca_file)?)
}

/// Asks `question` on the terminal and succeeds on yes; `what` names the action in the
/// refusal without a terminal (then `--yes` is required), `declined` is the answer to a no.
pub fn confirm(what: &str, question: &str, declined: &str) -> Result<(), Failure> {
    use std::io::{BufRead as _, IsTerminal as _, Write as _};
    if !std::io::stdin().is_terminal() {
        return Err(Failure::Usage(format!(
            "refusing to {what} without confirmation: stdin is not a terminal; pass --yes"
        )));
    }
    let mut err = std::io::stderr().lock();
    let _ = write!(err, "{question} [y/N] ");
    let _ = err.flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| Failure::Usage(format!("cannot read the confirmation: {e}")))?;
    if confirmed(&answer) {
        Ok(())
    } else {
        Err(Failure::Usage(declined.to_owned()))
    }
}

/// Whether a confirmation answer says yes (`y` or `yes`, any case).
pub fn confirmed(answer: &str) -> bool {
    matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

/// A project given by id is used as is; a slug is looked up in `GET /v1/projects`.
pub async fn project_id(api: &Api, given: &str) -> Result<Uuid, Failure> {
    if let Ok(id) = Uuid::parse_str(given.trim()) {
        return Ok(id);
    }
    let list: List<ProjectView> = api.get(&["v1", "projects"], &[]).await?;
    project_by_slug(&list.items, given.trim())
}

/// [`project_id`] when one is given; without one, the only project the operator's token sees
/// (a token bound to one project, or a Domain with one project); with several, the error
/// lists them.
pub async fn project_or_sole(api: &Api, given: Option<&str>) -> Result<Uuid, Failure> {
    match given {
        Some(g) => project_id(api, g).await,
        None => {
            let list: List<ProjectView> = api.get(&["v1", "projects"], &[]).await?;
            sole_project(&list.items)
        }
    }
}

/// The one project of `projects`, or an error that says to pass `--project` and lists them.
pub fn sole_project(projects: &[ProjectView]) -> Result<Uuid, Failure> {
    match projects {
        [one] => Ok(one.id),
        [] => Err(Failure::NotFound(
            "the operator token sees no project; create one with `plexctl project create`".into(),
        )),
        many => {
            let names: Vec<String> = many
                .iter()
                .map(|p| format!("{} ({})", p.slug, p.id))
                .collect();
            Err(Failure::Usage(format!(
                "the operator token sees {} projects: pass --project with one of {}",
                many.len(),
                names.join(", ")
            )))
        }
    }
}

/// Finds the one project with this slug.
pub fn project_by_slug(projects: &[ProjectView], slug: &str) -> Result<Uuid, Failure> {
    let found: Vec<&ProjectView> = projects.iter().filter(|p| p.slug == slug).collect();
    match found.as_slice() {
        [one] => Ok(one.id),
        [] => Err(Failure::NotFound(format!(
            "no project has the id or slug `{slug}`; see `plexctl project list`"
        ))),
        many => {
            let ids: Vec<String> = many.iter().map(|p| p.id.to_string()).collect();
            Err(Failure::Usage(format!(
                "the slug `{slug}` names projects in several domains ({}); give the project's id",
                ids.join(", ")
            )))
        }
    }
}
