//! Where plexctl finds the server, the operator token and the extra CA: flags, then the
//! environment, then a config file.
//!
//! The config file is YAML with the keys `server`, `token`, `token_file` and `ca_file`; relative
//! paths in it are resolved against the file's directory; an unknown key is an error naming
//! the file and line. Every function here takes its inputs as arguments (no process
//! environment), so the precedence rules are unit-tested without touching global state.

use std::fmt;
use std::path::{Path, PathBuf};

use reqwest::Url;
use serde::Deserialize;

use crate::secret::Secret;

/// The environment variables plexctl reads.
pub const ENV_SERVER: &str = "PLEXCTL_SERVER";
pub const ENV_TOKEN: &str = "PLEXCTL_TOKEN";
pub const ENV_TOKEN_FILE: &str = "PLEXCTL_TOKEN_FILE";
pub const ENV_CA_FILE: &str = "PLEXCTL_CA_FILE";
pub const ENV_CONFIG: &str = "PLEXCTL_CONFIG";

/// A configuration problem: the operator fixes a flag, a variable or the file (exit 64).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "cannot read the config file {path}: {source}; check the path given by --config or PLEXCTL_CONFIG"
    )]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the config file {path} is invalid at line {line}: {message}")]
    ParseAt {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error(
        "the config file {path} is invalid: {message}; its keys are server, token, token_file and ca_file"
    )]
    Parse { path: PathBuf, message: String },
    #[error(
        "no server is set; pass --server URL, set {ENV_SERVER}, or add `server: https://...` to {config}"
    )]
    NoServer { config: String },
    #[error(
        "no operator token is set; pass --token-file PATH (or --token), set {ENV_TOKEN_FILE} (or {ENV_TOKEN}), or add `token_file:` to {config}"
    )]
    NoToken { config: String },
    #[error("{origin} sets both a token and a token file; keep only one of them")]
    TwoTokens { origin: Origin },
    #[error(
        "the server URL `{url}` from {origin} is not usable: {reason}; give one like https://plexsphere.example.com"
    )]
    BadServer {
        url: String,
        origin: Origin,
        reason: String,
    },
    #[error(
        "cannot read the operator token file {path} (from {origin}): {source}; write the token from `plexsphere operator-token create` there or fix the path"
    )]
    TokenFile {
        path: PathBuf,
        origin: Origin,
        source: std::io::Error,
    },
    #[error(
        "the operator token from {origin} is not a plexsphere operator token ({reason}); create one on the server with `plexsphere operator-token create`"
    )]
    BadToken { origin: Origin, reason: String },
}

/// Where a setting came from, named the way the operator would change it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A command-line flag, e.g. `--server`.
    Flag(&'static str),
    /// An environment variable, e.g. `PLEXCTL_SERVER`.
    Env(&'static str),
    /// A key of the config file.
    File { key: &'static str, path: PathBuf },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Flag(flag) => write!(f, "{flag}"),
            Origin::Env(var) => write!(f, "{var}"),
            Origin::File { key, path } => write!(f, "`{key}` in {}", path.display()),
        }
    }
}

/// One source's values (flags, environment or file); empty strings count as unset.
#[derive(Debug, Default, Clone)]
pub struct Layer {
    pub server: Option<String>,
    pub token: Option<Secret>,
    pub token_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
}

/// The config file as written on disk.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    server: Option<String>,
    token: Option<Secret>,
    token_file: Option<PathBuf>,
    ca_file: Option<PathBuf>,
}

/// The config file to read and whether the operator named it (then it must exist).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigLocation {
    pub path: PathBuf,
    pub explicit: bool,
}

/// Picks the config file: `--config`, then `PLEXCTL_CONFIG`, then
/// `$XDG_CONFIG_HOME/plexctl/config.yaml`, then `$HOME/.config/plexctl/config.yaml`.
pub fn config_location(
    flag: Option<&Path>,
    env: Option<&Path>,
    xdg_config_home: Option<&Path>,
    home: Option<&Path>,
) -> Option<ConfigLocation> {
    fn nonempty(p: Option<&Path>) -> Option<&Path> {
        p.filter(|p| !p.as_os_str().is_empty())
    }
    if let Some(path) = nonempty(flag).or(nonempty(env)) {
        return Some(ConfigLocation {
            path: path.to_path_buf(),
            explicit: true,
        });
    }
    // The XDG spec ignores relative values of XDG_CONFIG_HOME.
    let base = nonempty(xdg_config_home)
        .filter(|p| p.is_absolute())
        .map(Path::to_path_buf)
        .or_else(|| nonempty(home).map(|h| h.join(".config")))?;
    Some(ConfigLocation {
        path: base.join("plexctl").join("config.yaml"),
        explicit: false,
    })
}

/// Reads the config file; a missing default file is no file, a missing named one an error.
pub fn load_file(location: &ConfigLocation) -> Result<Option<Layer>, ConfigError> {
    match std::fs::read_to_string(&location.path) {
        Ok(text) => parse_file(&location.path, &text).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !location.explicit => Ok(None),
        Err(source) => Err(ConfigError::Read {
            path: location.path.clone(),
            source,
        }),
    }
}

/// Parses the config file's text; relative paths become relative to the file's directory.
pub fn parse_file(path: &Path, text: &str) -> Result<Layer, ConfigError> {
    // An empty file (or one of only comments) is a null document: no settings.
    let parsed: Option<FileConfig> =
        serde_yaml::from_str(text).map_err(|e| yaml_error(path, &e))?;
    let file = parsed.unwrap_or_default();
    let dir = path.parent().unwrap_or(Path::new(""));
    let anchor = |p: PathBuf| if p.is_relative() { dir.join(p) } else { p };
    Ok(Layer {
        server: file.server,
        token: file.token,
        token_file: file.token_file.map(anchor),
        ca_file: file.ca_file.map(anchor),
    }
    .without_empty())
}

fn yaml_error(path: &Path, e: &serde_yaml::Error) -> ConfigError {
    let full = e.to_string();
    match e.location() {
        Some(loc) => {
            // serde_yaml appends " at line L column C"; the line is in our own wording.
            let suffix = format!(" at line {} column {}", loc.line(), loc.column());
            let message = full.strip_suffix(&suffix).unwrap_or(&full).to_owned();
            ConfigError::ParseAt {
                path: path.to_path_buf(),
                line: loc.line(),
                message,
            }
        }
        None => ConfigError::Parse {
            path: path.to_path_buf(),
            message: full,
        },
    }
}

impl Layer {
    /// Treats empty values (`PLEXCTL_TOKEN=`) as unset.
    pub fn without_empty(self) -> Self {
        Layer {
            server: self.server.filter(|s| !s.trim().is_empty()),
            token: self.token.filter(|t| !t.expose().trim().is_empty()),
            token_file: self.token_file.filter(|p| !p.as_os_str().is_empty()),
            ca_file: self.ca_file.filter(|p| !p.as_os_str().is_empty()),
        }
    }
}

/// How the operator token is given: inline or as a file to read when it is needed.
#[derive(Debug, Clone)]
pub enum TokenSource {
    Inline(Secret),
    File(PathBuf),
}

/// The settings after precedence, each with where it came from.
#[derive(Debug, Clone)]
pub struct Settings {
    pub server: Option<(String, Origin)>,
    pub token: Option<(TokenSource, Origin)>,
    pub ca_file: Option<(PathBuf, Origin)>,
    /// The config file used, or the default one would be read from (for messages).
    pub config_hint: String,
    /// Where `plexctl login` keeps the session (beside the config file); `None`: nowhere.
    pub session_file: Option<PathBuf>,
}

/// Applies flag > environment > file, per setting. A token and a token file count as one
/// setting: the highest layer that has either wins, and a layer with both is refused.
pub fn resolve(
    flags: Layer,
    env: Layer,
    file: Option<(PathBuf, Layer)>,
    config_hint: String,
) -> Result<Settings, ConfigError> {
    let (file_path, file) = match file {
        Some((path, layer)) => (Some(path), layer),
        None => (None, Layer::default()),
    };
    let in_file = |key: &'static str| Origin::File {
        key,
        path: file_path.clone().unwrap_or_default(),
    };
    let token = match token_of(
        &flags,
        Origin::Flag("--token"),
        Origin::Flag("--token-file"),
    )? {
        Some(token) => Some(token),
        None => match token_of(&env, Origin::Env(ENV_TOKEN), Origin::Env(ENV_TOKEN_FILE))? {
            Some(token) => Some(token),
            None => token_of(&file, in_file("token"), in_file("token_file"))?,
        },
    };
    let server = pick([
        (flags.server, Origin::Flag("--server")),
        (env.server, Origin::Env(ENV_SERVER)),
        (file.server, in_file("server")),
    ]);
    let ca_file = pick([
        (flags.ca_file, Origin::Flag("--ca-file")),
        (env.ca_file, Origin::Env(ENV_CA_FILE)),
        (file.ca_file, in_file("ca_file")),
    ]);
    Ok(Settings {
        server,
        token,
        ca_file,
        config_hint,
        session_file: None,
    })
}

fn pick<T>(candidates: [(Option<T>, Origin); 3]) -> Option<(T, Origin)> {
    candidates
        .into_iter()
        .find_map(|(value, origin)| value.map(|v| (v, origin)))
}

fn token_of(
    layer: &Layer,
    token_origin: Origin,
    file_origin: Origin,
) -> Result<Option<(TokenSource, Origin)>, ConfigError> {
    match (&layer.token, &layer.token_file) {
        (Some(_), Some(_)) => Err(ConfigError::TwoTokens {
            origin: token_origin,
        }),
        (Some(t), None) => Ok(Some((TokenSource::Inline(t.clone()), token_origin))),
        (None, Some(p)) => Ok(Some((TokenSource::File(p.clone()), file_origin))),
        (None, None) => Ok(None),
    }
}

impl Settings {
    /// The server's base URL, checked: http(s), a host, no query or fragment.
    pub fn server_url(&self) -> Result<Url, ConfigError> {
        let Some((text, origin)) = &self.server else {
            return Err(ConfigError::NoServer {
                config: self.config_hint.clone(),
            });
        };
        let bad = |reason: &str| ConfigError::BadServer {
            url: text.clone(),
            origin: origin.clone(),
            reason: reason.to_owned(),
        };
        let url = Url::parse(text.trim()).map_err(|e| bad(&e.to_string()))?;
        if !matches!(url.scheme(), "https" | "http") {
            return Err(bad("the scheme must be https (or http behind a TLS proxy)"));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(bad("it names no host"));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(bad("it must not carry a query or a fragment"));
        }
        Ok(url)
    }

    /// The operator token, read from its file when given as one, and checked for its form.
    pub fn operator_token(&self) -> Result<Secret, ConfigError> {
        let Some((source, origin)) = &self.token else {
            return Err(ConfigError::NoToken {
                config: self.config_hint.clone(),
            });
        };
        let text = match source {
            TokenSource::Inline(secret) => secret.expose().trim().to_owned(),
            TokenSource::File(path) => std::fs::read_to_string(path)
                .map_err(|source| ConfigError::TokenFile {
                    path: path.clone(),
                    origin: origin.clone(),
                    source,
                })?
                .trim()
                .to_owned(),
        };
        plexsphere_wire::secret::OperatorToken::parse(&text).map_err(|e| {
            ConfigError::BadToken {
                origin: origin.clone(),
                reason: e.to_string(),
            }
        })?;
        Ok(Secret::new(text))
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
