//! What every command does with the operator's environment: connect to the operator API the
//! settings name, and ask on the terminal before a destructive step.

use crate::client::Api;
use crate::config::Settings;
use crate::failure::Failure;

/// The operator API at the configured server, with the operator token and CA file.
pub fn operator_api(settings: &Settings) -> Result<Api, Failure> {
    let server = settings.server_url()?;
    let token = settings.operator_token()?;
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
