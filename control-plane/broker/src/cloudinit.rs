//! The `#cloud-config` document a provisioned machine boots with.
//!
//! It makes the machine trust the lab CA (cloud-init's `ca_certs` module, and
//! `/etc/plexd/ca.crt`), writes the single-use bootstrap token and `/etc/plexd/config.yaml`,
//! installs plexd with `/etc/plexd/install-plexd.sh` (the template in `cloud-init/`), registers
//! with `plexd join` (its `node_id:`/`mesh_ip:` lines land in the console log; a refusal is
//! recorded in [`JOIN_RESULT_PATH`] for the substrate to read), and starts the plexd unit so
//! the node keeps heartbeating and meshes. The unit is installed and enabled before the join and
//! started after it unless the join was refused for good ([`JOIN_THEN_START`]): a join that did
//! not finish during cloud-init (the network or the control plane not up yet) finishes under
//! systemd. `runcmd` stops at the first failing command, so a failed install, or a refused
//! join, is cloud-init's result, not hidden by later steps.
//!
//! The document carries a bootstrap token: [`CloudInitDocument`] never shows it in `Debug`, and
//! [`CloudInitDocument::redacted`] is the copy that may be stored (the token replaced by
//! [`REDACTED_TOKEN`]).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use plexsphere_wire::secret::BootstrapToken;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use serde::Serialize;
use uuid::Uuid;

/// The install script's template; `@PLEXD_API_URL@` is replaced with the API URL.
pub const INSTALL_SCRIPT_TEMPLATE: &str = include_str!("../../../cloud-init/install-plexd.sh");

pub const CONFIG_DIR: &str = "/etc/plexd";
pub const CA_PATH: &str = "/etc/plexd/ca.crt";
/// What a stored copy of a document holds where the machine's document has its token.
pub const REDACTED_TOKEN: &str = "<bootstrap token: redacted>";

pub const TOKEN_PATH: &str = "/etc/plexd/bootstrap-token";
pub const CONFIG_PATH: &str = "/etc/plexd/config.yaml";
pub const INSTALL_SCRIPT_PATH: &str = "/etc/plexd/install-plexd.sh";
pub const SIGNING_KEY_PATH: &str = "/etc/plexd/domain-signing.pub.pem";
/// Where `plexd join --result-file` records a failed join (`{"exit_code": N, "message": ...}`);
/// the substrate reads it when cloud-init reports an error, to say why the machine failed.
pub const JOIN_RESULT_PATH: &str = "/run/plexd/join-result.json";

/// runcmd's last step: join (retrying an unreachable API within `--max-wait`), then hand the
/// node to the enabled unit. A join that worked, or failed in a way a restart may fix (12 rate
/// limited, 13 unreachable, 14 a server error: what the unit's `Restart=` retries), starts the
/// unit and ends runcmd well, so a join cut short during cloud-init (the network or the control
/// plane not up yet) finishes under systemd (`plexd run` joins if needed) and the resource
/// still reaches Ready when the node registers. A refusal no restart fixes (10, 11, 15, 16, 64,
/// 78: `RestartPreventExitStatus=`) leaves the unit enabled but not started and is cloud-init's
/// result, so the broker fails the resource with join's message. The path is
/// [`JOIN_RESULT_PATH`]; `--no-block`: the unit may still be joining.
pub const JOIN_THEN_START: &str = "rc=0; plexd join --result-file /run/plexd/join-result.json || rc=$?; case $rc in 0|12|13|14) systemctl start --no-block plexd; exit 0;; esac; exit $rc";

/// What the document is rendered from.
pub struct MachineBootstrap<'a> {
    /// The control plane's origin, `https://<host>[:port][/base]`.
    pub api_url: &'a str,
    /// The lab CA (PEM, one or more certificates) the machine must trust.
    pub ca_pem: &'a str,
    /// The single-use token minted for this resource.
    pub bootstrap_token: &'a BootstrapToken,
    pub project_id: Uuid,
    /// `registration.resource_handle`: the resource's `pr-<id>`.
    pub resource_handle: &'a str,
    /// The Domain's raw Ed25519 public key, to verify the signature of checksums.sha256.
    /// Without it the install script fails closed (it installs no unverified plexd).
    pub domain_signing_public_key: Option<[u8; 32]>,
}

/// A rendered `#cloud-config` document. It holds a secret, so `Debug` shows only its size.
#[derive(Clone, PartialEq, Eq)]
pub struct CloudInitDocument(String);

impl CloudInitDocument {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }

    /// The document with every occurrence of `token`'s text replaced by [`REDACTED_TOKEN`]:
    /// the copy that may be stored. Only the machine's own copy, handed over in memory,
    /// carries the token.
    pub fn redacted(&self, token: &BootstrapToken) -> CloudInitDocument {
        CloudInitDocument(self.0.replace(&token.expose(), REDACTED_TOKEN))
    }
}

impl std::fmt::Debug for CloudInitDocument {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CloudInitDocument(<{} bytes, holds a bootstrap token>)",
            self.0.len()
        )
    }
}

/// Why a document could not be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CloudInitError {
    #[error(
        "the API URL `{0}` cannot go into a cloud-init document: it must be https://<host>[:port][/path] with no query, quotes or blanks; fix the server's public URL"
    )]
    ApiUrl(String),
    #[error("the lab CA is not usable PEM ({0}); point the server at the CA certificate file")]
    CaPem(String),
    #[error(
        "the resource handle `{0}` is not 1-63 characters of a-z, 0-9, `-`, `.`, `_` (what plexd accepts)"
    )]
    ResourceHandle(String),
    #[error("cannot serialise the cloud-init document: {0}")]
    Serialize(String),
}

#[derive(Serialize)]
struct CloudConfig {
    bootcmd: Vec<Vec<String>>,
    ca_certs: CaCerts,
    write_files: Vec<WriteFile>,
    runcmd: Vec<RunCmd>,
}

#[derive(Serialize)]
struct CaCerts {
    trusted: Vec<String>,
}

#[derive(Serialize)]
struct WriteFile {
    path: &'static str,
    owner: &'static str,
    permissions: &'static str,
    content: String,
}

#[derive(Serialize)]
#[serde(untagged)]
enum RunCmd {
    Shell(&'static str),
    Argv(Vec<String>),
}

#[derive(Serialize)]
struct AgentConfig<'a> {
    api_url: &'a str,
    token_file: &'static str,
    registration: AgentRegistration<'a>,
}

#[derive(Serialize)]
struct AgentRegistration<'a> {
    project_id: Uuid,
    resource_handle: &'a str,
}

/// Renders the document.
pub fn render(input: &MachineBootstrap<'_>) -> Result<CloudInitDocument, CloudInitError> {
    let api_url = check_api_url(input.api_url)?;
    let ca = normalise_ca(input.ca_pem)?;
    if !handle_ok(input.resource_handle) {
        return Err(CloudInitError::ResourceHandle(
            input.resource_handle.to_owned(),
        ));
    }
    let ser = |e: serde_yaml::Error| CloudInitError::Serialize(e.to_string());
    let config = serde_yaml::to_string(&AgentConfig {
        api_url,
        token_file: TOKEN_PATH,
        registration: AgentRegistration {
            project_id: input.project_id,
            resource_handle: input.resource_handle,
        },
    })
    .map_err(ser)?;
    let config = format!(
        "# Written by the plexsphere broker's cloud-init document; plexd install adds to it.\n{config}"
    );

    let mut files = vec![
        file(CA_PATH, "0644", ca.clone()),
        file(
            TOKEN_PATH,
            "0600",
            format!("{}\n", input.bootstrap_token.expose()),
        ),
        file(CONFIG_PATH, "0600", config),
    ];
    if let Some(key) = input.domain_signing_public_key {
        files.push(file(SIGNING_KEY_PATH, "0644", ed25519_spki_pem(&key)));
    }
    files.push(file(
        INSTALL_SCRIPT_PATH,
        "0755",
        INSTALL_SCRIPT_TEMPLATE.replace("@PLEXD_API_URL@", api_url),
    ));

    let argv = |a: &[&str]| RunCmd::Argv(a.iter().map(|s| (*s).to_owned()).collect());
    let doc = CloudConfig {
        // Before write_files: the directory holding the token is 0700 from the start.
        bootcmd: vec![vec![
            "install".into(),
            "-d".into(),
            "-m".into(),
            "0700".into(),
            CONFIG_DIR.into(),
        ]],
        ca_certs: CaCerts { trusted: vec![ca] },
        write_files: files,
        runcmd: vec![
            RunCmd::Shell("set -e"),
            argv(&[INSTALL_SCRIPT_PATH]),
            argv(&[
                "plexd",
                "install",
                "--api-url",
                api_url,
                "--token-file",
                TOKEN_PATH,
            ]),
            argv(&["systemctl", "enable", "plexd"]),
            argv(&["sh", "-c", JOIN_THEN_START]),
        ],
    };
    let body = serde_yaml::to_string(&doc).map_err(ser)?;
    Ok(CloudInitDocument(format!(
        "#cloud-config\n# plexsphere broker: resource {} in project {}.\n# This document holds a single-use bootstrap token: treat it as a secret.\n{body}",
        input.resource_handle, input.project_id
    )))
}

fn file(path: &'static str, permissions: &'static str, content: String) -> WriteFile {
    WriteFile {
        path,
        owner: "root:root",
        permissions,
        content,
    }
}

/// The API URL without a trailing `/`, refused unless it is a plain https origin (and path):
/// it lands in YAML and in a single-quoted shell assignment.
fn check_api_url(url: &str) -> Result<&str, CloudInitError> {
    let bad = || CloudInitError::ApiUrl(url.to_owned());
    let trimmed = url.trim_end_matches('/');
    let rest = trimmed.strip_prefix("https://").ok_or_else(bad)?;
    let host = rest.split('/').next().unwrap_or_default();
    let ok_chars = rest
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~:/%[]".contains(&b));
    if host.is_empty() || !ok_chars || rest.contains("//") {
        return Err(bad());
    }
    Ok(trimmed)
}

fn handle_ok(h: &str) -> bool {
    (1..=63).contains(&h.len())
        && h.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.' | b'_')
        })
}

/// Re-encodes every certificate of the PEM in canonical form (64-column base64), dropping
/// anything else, so the document carries exactly the certificates and nothing the caller
/// smuggled around them.
fn normalise_ca(pem: &str) -> Result<String, CloudInitError> {
    let mut out = String::new();
    for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let cert = cert.map_err(|e| CloudInitError::CaPem(e.to_string()))?;
        out.push_str(&pem_block("CERTIFICATE", cert.as_ref()));
    }
    if out.is_empty() {
        return Err(CloudInitError::CaPem(
            "it holds no CERTIFICATE block".to_owned(),
        ));
    }
    Ok(out)
}

fn pem_block(label: &str, der: &[u8]) -> String {
    let b64 = STANDARD.encode(der);
    let mut s = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        s.push_str(&String::from_utf8_lossy(chunk));
        s.push('\n');
    }
    s.push_str(&format!("-----END {label}-----\n"));
    s
}

pub use plexsphere_wire::signed::ed25519_spki_pem;

#[cfg(test)]
#[path = "cloudinit_tests.rs"]
mod tests;
