//! The HTTP client the mirror is fetched with, and how its failures and URLs are shown.

use plexsphere_tls_client::{ALPN_H2_HTTP1, Trust, TrustError};

use crate::config::{ConfigError, MirrorConfig};

/// The mirror client: the system's roots plus the optional CA file, rustls with ring
/// (`plexsphere_tls_client`), ALPN h2 and http/1.1.
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
        .user_agent(concat!("plexsphere/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| ConfigError::Client(describe(&e)))
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
