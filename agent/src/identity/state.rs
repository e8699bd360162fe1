//! `identity.json`: the node's registered identity, versioned, 0600, written atomically.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use plexsphere_wire::signing_keys::SigningKey;
use plexsphere_wire::{Intervals, RegisterResponse};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::fsutil::{self, FsError};

/// The version of the identity file this plexd writes and reads.
pub const IDENTITY_VERSION: u32 = 1;

/// A secret string: serialised as is (into a 0600 file), redacted in Debug.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretString(String);

impl SecretString {
    pub fn new(s: String) -> Self {
        Self(s)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SecretString {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The node's identity as the control plane registered it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub version: u32,
    pub node_id: Uuid,
    pub domain_id: Uuid,
    pub project_id: Uuid,
    pub mesh_ip: IpAddr,
    pub mesh_cidr: IpNet,
    /// `pxnk_...`, the key every later call authenticates with.
    pub node_credential: SecretString,
    pub domain_signing_public_key: String,
    /// The pinned key's generation, when the node learnt it (a rotation it followed); a key
    /// pinned at registration has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain_signing_key_generation: Option<u64>,
    /// The Domain's next signing key, announced by a state document signed with the pinned
    /// key during a rotation's overlap: documents signed by it are accepted too, and the first
    /// one makes it the pinned key. Absent outside an overlap (and in files of older plexd).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_signing_key: Option<SigningKey>,
    /// The API the node registered with.
    pub api_url: String,
    pub intervals: Intervals,
    #[serde(with = "time::serde::rfc3339")]
    pub registered_at: OffsetDateTime,
    /// When the credential was last rotated (absent: never, it is the registration's).
    #[serde(
        with = "time::serde::rfc3339::option",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub credential_rotated_at: Option<OffsetDateTime>,
}

/// Held while the identity file is read, changed and written again ([`Identity::update`]).
static IDENTITY_WRITE: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error(
        "the identity file {path} has version {found}; this plexd reads version {IDENTITY_VERSION}; install a plexd that matches it, or move the file away to enrol the node again"
    )]
    UnknownVersion { path: PathBuf, found: String },
    #[error(
        "the identity file {path} is not valid: {reason}; restore it from a backup, or move it away to enrol the node again"
    )]
    Corrupt { path: PathBuf, reason: String },
}

impl Identity {
    pub fn from_response(r: RegisterResponse, api_url: &str, now: OffsetDateTime) -> Self {
        Self {
            version: IDENTITY_VERSION,
            node_id: r.node_id,
            domain_id: r.domain_id,
            project_id: r.project_id,
            mesh_ip: r.mesh_ip,
            mesh_cidr: r.mesh_cidr,
            node_credential: SecretString::new(r.node_credential),
            domain_signing_public_key: r.domain_signing_public_key,
            domain_signing_key_generation: None,
            next_signing_key: r.next_signing_key,
            api_url: api_url.to_owned(),
            intervals: r.intervals,
            registered_at: now,
            credential_rotated_at: None,
        }
    }

    /// Writes the identity atomically with mode 0600.
    pub fn save(&self, path: &Path) -> Result<(), IdentityError> {
        let json = fsutil::pretty_json(self).map_err(|e| IdentityError::Corrupt {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        fsutil::write_atomic(path, &json, 0o600)?;
        Ok(())
    }

    /// Changes the identity file under [`IDENTITY_WRITE`]: reads it, applies `f`, writes it
    /// atomically. Every writer while the daemon runs (the credential rotation, a Domain key
    /// change) goes through here, so one never writes back a copy older than the other's.
    pub fn update(path: &Path, f: impl FnOnce(&mut Identity)) -> Result<Identity, IdentityError> {
        let _held = IDENTITY_WRITE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut id = Self::load(path)?.ok_or_else(|| IdentityError::Corrupt {
            path: path.to_path_buf(),
            reason: "it is gone (the node left?)".to_owned(),
        })?;
        f(&mut id);
        id.save(path)?;
        Ok(id)
    }

    /// Reads the identity, or `None` when the node is not enrolled (no file). Refuses an
    /// unknown version; forces 0600 on a looser file.
    pub fn load(path: &Path) -> Result<Option<Self>, IdentityError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(FsError::new("cannot read", path, e).into()),
        };
        fsutil::enforce_private(path)?;
        Self::parse(&text, path).map(Some)
    }

    fn parse(text: &str, path: &Path) -> Result<Self, IdentityError> {
        let corrupt = |reason: String| IdentityError::Corrupt {
            path: path.to_path_buf(),
            reason,
        };
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| corrupt(e.to_string()))?;
        match value.get("version") {
            Some(v) if v.as_u64() == Some(u64::from(IDENTITY_VERSION)) => {}
            Some(v) => {
                return Err(IdentityError::UnknownVersion {
                    path: path.to_path_buf(),
                    found: v.to_string(),
                });
            }
            None => return Err(corrupt("it has no `version`".to_owned())),
        }
        serde_json::from_value(value).map_err(|e| corrupt(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use std::fs::Permissions;
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn sample() -> Identity {
        let json = r#"{"node_id":"019a0816-0000-7000-8000-0000000000aa","domain_id":"019a0816-0000-7000-8000-000000000001","project_id":"019a0816-0000-7000-8000-000000000002","mesh_ip":"10.64.1.2","mesh_cidr":"10.64.0.0/16","node_credential":"pxnk_secretvalue","domain_signing_public_key":"AAAA","intervals":{"heartbeat_secs":30,"endpoint_report_secs":60,"state_poll_secs":300,"ingest_secs":60}}"#;
        let r: RegisterResponse = serde_json::from_str(json).unwrap();
        Identity::from_response(r, "https://a.example", OffsetDateTime::UNIX_EPOCH)
    }

    #[test]
    fn save_and_load_round_trip_with_0600() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("identity.json");
        assert_eq!(Identity::load(&p).unwrap(), None);
        let id = sample();
        id.save(&p).unwrap();
        assert_eq!(fsutil::mode_of(&p).unwrap(), 0o600);
        assert_eq!(Identity::load(&p).unwrap(), Some(id.clone()));
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.contains("\"version\": 1"), "{text}");
        assert!(
            text.contains("\"registered_at\": \"1970-01-01T00:00:00Z\""),
            "{text}"
        );
        assert!(!format!("{id:?}").contains("secretvalue"));
    }

    #[test]
    fn the_next_signing_key_round_trips_and_an_older_file_loads_without_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("identity.json");
        // A file written before rotation existed: neither field.
        let id = sample();
        id.save(&p).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(
            !text.contains("next_signing_key") && !text.contains("generation"),
            "{text}"
        );
        let loaded = Identity::load(&p).unwrap().unwrap();
        assert_eq!(loaded.next_signing_key, None);
        assert_eq!(loaded.domain_signing_key_generation, None);

        let next = SigningKey {
            generation: 2,
            public_key: "BBBB".into(),
            active_from: 1_700_000_100,
        };
        let updated = Identity::update(&p, |i| {
            i.next_signing_key = Some(next.clone());
            i.domain_signing_key_generation = Some(1);
        })
        .unwrap();
        assert_eq!(fsutil::mode_of(&p).unwrap(), 0o600);
        let loaded = Identity::load(&p).unwrap().unwrap();
        assert_eq!(loaded, updated);
        assert_eq!(loaded.next_signing_key, Some(next));
        assert_eq!(loaded.domain_signing_key_generation, Some(1));

        // Registration keeps the next key the answer announces.
        let json = r#"{"node_id":"019a0816-0000-7000-8000-0000000000aa","domain_id":"019a0816-0000-7000-8000-000000000001","project_id":"019a0816-0000-7000-8000-000000000002","mesh_ip":"10.64.1.2","mesh_cidr":"10.64.0.0/16","node_credential":"pxnk_secretvalue","domain_signing_public_key":"AAAA","intervals":{"heartbeat_secs":30,"endpoint_report_secs":60,"state_poll_secs":300,"ingest_secs":60},"next_signing_key":{"generation":2,"public_key":"BBBB","active_from":5}}"#;
        let r: RegisterResponse = serde_json::from_str(json).unwrap();
        let id = Identity::from_response(r, "https://a.example", OffsetDateTime::UNIX_EPOCH);
        assert_eq!(id.next_signing_key.map(|k| k.generation), Some(2));

        std::fs::remove_file(&p).unwrap();
        assert!(Identity::update(&p, |_| {}).is_err(), "no file, no update");
    }

    #[test]
    fn loose_mode_is_forced_to_0600() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("identity.json");
        sample().save(&p).unwrap();
        std::fs::set_permissions(&p, Permissions::from_mode(0o644)).unwrap();
        assert!(Identity::load(&p).unwrap().is_some());
        assert_eq!(fsutil::mode_of(&p).unwrap(), 0o600);
    }

    #[test]
    fn unknown_version_is_refused_clearly() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("identity.json");
        let mut v = serde_json::to_value(sample()).unwrap();
        v["version"] = serde_json::json!(2);
        std::fs::write(&p, v.to_string()).unwrap();
        let e = Identity::load(&p).unwrap_err();
        assert!(matches!(e, IdentityError::UnknownVersion { .. }), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("version 2") && msg.contains("identity.json"),
            "{msg}"
        );

        std::fs::write(&p, "{not json").unwrap();
        let e = Identity::load(&p).unwrap_err().to_string();
        assert!(e.contains("is not valid"), "{e}");
        std::fs::write(&p, "{}").unwrap();
        let e = Identity::load(&p).unwrap_err().to_string();
        assert!(e.contains("no `version`"), "{e}");
    }
}
