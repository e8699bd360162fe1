//! The HTTP client the mirror is fetched with, and how its failures and URLs are shown.

use plexsphere_tls_client::{ALPN_H2_HTTP1, Trust, TrustError};

use crate::config::{ConfigError, MAX_REDIRECTS, MirrorConfig};

/// The mirror client: the system's roots plus the optional CA file, rustls with ring
/// (`plexsphere_tls_client`), ALPN h2 and http/1.1; at most [`MAX_REDIRECTS`] redirects, each
/// to an https URL (one to http:// fails the fetch: see [`redirect_policy`]).
pub(crate) fn http_client(config: &MirrorConfig) -> Result<reqwest::Client, ConfigError> {
    let trust = Trust::system_and(config.ca_file.clone());
    let tls = plexsphere_tls_client::client_config(&trust, ALPN_H2_HTTP1).map_err(|e| match e {
        TrustError::CaFile { path, problem } => ConfigError::CaFile {
            path,
            reason: problem.to_string(),
        },
        TrustError::Setup(reason) => ConfigError::Client(reason),
    })?;
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .connect_timeout(config.connect_timeout)
        .read_timeout(config.read_timeout)
        .timeout(config.total_timeout)
        .redirect(redirect_policy())
        .https_only(true)
        .user_agent(concat!("plexsphere/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| ConfigError::Client(describe(&e)))
}

/// Follows a redirect only to https, and at most [`MAX_REDIRECTS`] of them.
fn redirect_policy() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        if attempt.url().scheme() != "https" {
            let to = crate::config::redact(attempt.url().as_str());
            attempt.error(format!(
                "the mirror redirected to {to}, which is not https; a plexd mirror and every redirect it sends must stay on https"
            ))
        } else if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error(format!(
                "the mirror sent more than {MAX_REDIRECTS} redirects"
            ))
        } else {
            attempt.follow()
        }
    })
}

/// An error and its causes in one line (`error sending request: ...: Connection refused`).
pub(crate) fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = s.source();
    }
    out
}

/// A template as logs show it: placeholders kept, credentials dropped.
pub(crate) fn redact_template(template: &str) -> String {
    let Some((scheme, rest)) = template.split_once("://") else {
        return template.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
        None => template.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_lose_credentials_in_logs() {
        assert_eq!(
            redact_template("https://u:p@m.example/{version}/{arch}"),
            "https://m.example/{version}/{arch}"
        );
        assert_eq!(
            redact_template("https://m.example/{version}/a@b/{arch}"),
            "https://m.example/{version}/a@b/{arch}"
        );
    }
}
