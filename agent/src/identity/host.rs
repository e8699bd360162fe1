//! The host binding: which host a state directory belongs to, so a copy of it (a golden image
//! made after enrolment) refuses to run instead of impersonating the node.
//!
//! Two values derive from the host's machine id, each HMAC-SHA256 keyed by it over a label of
//! its own and the node id (the idea of systemd's `sd_id128_get_machine_app_specific`): stable
//! for one host and one node, different on another host, and neither the machine id nor a value
//! that another enrolment of the same host shares ever leaves the host.
//! - the *sent* fingerprint ([`fingerprint`]): plexd sends it with every authenticated request
//!   (`Plexd-Host`), and the control plane binds the node to the first one it sees. It is
//!   never written to disk: it is recomputed from the machine id at every start.
//! - the *stored* fingerprint ([`stored_fingerprint`]): `host.json` in the state dir records it
//!   for the host the node was enrolled on; every start recomputes it ([`check_or_bind`]).
//!
//! So a copy of the state dir on another host holds nothing that it could send as the
//! original's `Plexd-Host`: even with the local check skipped or edited, the control plane sees
//! another host's fingerprint and refuses (and records) the copy (`clone_refused`), which can
//! then neither rotate the credential nor lock the original out.
//!
//! Upgrade: a `host.json` of version 1 (written by an older plexd) holds the sent fingerprint.
//! A start that finds it matching this host rewrites it as version 2 with the stored one (the
//! sent value is unchanged, so the control plane's binding stays valid); a version 1 file that
//! does not match is a copy, as before.
//!
//! The machine id is read from `/etc/machine-id`, or the file `PLEXD_MACHINE_ID_FILE` names
//! (for tests and containers whose machine id lives elsewhere). A missing, empty, malformed or
//! `uninitialized` machine id is a start-up error, never a silent skip.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use plexsphere_wire::host::HostFingerprint;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::fsutil::{self, FsError};

/// Where the machine id is read from unless [`MACHINE_ID_ENV`] names another file.
pub(crate) const DEFAULT_MACHINE_ID_FILE: &str = "/etc/machine-id";
/// The environment variable naming another machine-id file (tests, containers).
pub(crate) const MACHINE_ID_ENV: &str = "PLEXD_MACHINE_ID_FILE";
/// The binding's file name inside the state dir.
pub(crate) const HOST_FILE_NAME: &str = "host.json";
/// The version of `host.json` this plexd writes (it reads 1 and 2: see the module's upgrade).
pub(crate) const HOST_FILE_VERSION: u32 = 2;
/// The version of `host.json` whose fingerprint is the sent one (older plexd).
pub(crate) const HOST_FILE_VERSION_SENT: u32 = 1;
/// A machine id is 32 hex characters and a newline (machine-id(5)); more than this many bytes
/// is not a machine-id file.
pub(crate) const MAX_MACHINE_ID_FILE: u64 = 256;
/// The sent fingerprint's HMAC label: a fingerprint means nothing outside plexd's host binding.
const LABEL: &[u8] = b"plexd host binding v1\0";
/// The stored fingerprint's HMAC label (`host.json` version 2).
const STORED_LABEL: &[u8] = b"plexd host binding stored v2\0";

/// The machine-id file this process reads.
pub fn machine_id_file() -> PathBuf {
    std::env::var_os(MACHINE_ID_ENV)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_MACHINE_ID_FILE), PathBuf::from)
}

/// The host's fingerprint for `node_id` that plexd sends (`Plexd-Host`); never written down.
pub fn fingerprint(machine_id: &MachineId, node_id: Uuid) -> HostFingerprint {
    derive(machine_id, LABEL, node_id)
}

/// The host's fingerprint for `node_id` that `host.json` records; never sent.
pub(crate) fn stored_fingerprint(machine_id: &MachineId, node_id: Uuid) -> HostFingerprint {
    derive(machine_id, STORED_LABEL, node_id)
}

fn derive(machine_id: &MachineId, label: &[u8], node_id: Uuid) -> HostFingerprint {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, machine_id.0.as_bytes());
    let mut ctx = ring::hmac::Context::with_key(&key);
    ctx.update(label);
    ctx.update(node_id.as_bytes());
    let tag = ctx.sign();
    let mut out = [0u8; plexsphere_wire::host::FINGERPRINT_LEN];
    out.copy_from_slice(tag.as_ref());
    HostFingerprint::from_bytes(out)
}

/// A host's machine id: 32 lowercase hex characters. Redacted in Debug.
#[derive(Clone, PartialEq, Eq)]
pub struct MachineId(String);

impl std::fmt::Debug for MachineId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MachineId(<redacted>)")
    }
}

impl MachineId {
    /// Parses a machine-id file's text (surrounding whitespace ignored, hex of any case).
    pub fn parse(text: &str) -> Result<Self, &'static str> {
        let t = text.trim();
        if t.is_empty() {
            return Err("it is empty");
        }
        if t == "uninitialized" {
            return Err("it says `uninitialized` (the first boot has not finished)");
        }
        if t.len() != 32 || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err("it is not 32 hex characters");
        }
        Ok(Self(t.to_ascii_lowercase()))
    }

    /// Reads and parses the file at `path`.
    pub fn read(path: &Path) -> Result<Self, HostError> {
        let bad = |reason: String| HostError::MachineId {
            path: path.to_path_buf(),
            reason,
        };
        let file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
        let mut text = String::new();
        file.take(MAX_MACHINE_ID_FILE + 1)
            .read_to_string(&mut text)
            .map_err(|e| bad(e.to_string()))?;
        if text.len() as u64 > MAX_MACHINE_ID_FILE {
            return Err(bad(format!(
                "it is larger than {MAX_MACHINE_ID_FILE} bytes"
            )));
        }
        Self::parse(&text).map_err(|r| bad(r.to_owned()))
    }
}

/// `host.json`: the host a node's state dir was bound to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostBinding {
    pub version: u32,
    /// The node the binding is for (a binding left by an earlier enrolment is not this one's).
    pub node_id: Uuid,
    /// The stored fingerprint, 64 hex (version 1: the sent one).
    pub fingerprint: String,
    #[serde(with = "time::serde::rfc3339")]
    pub bound_at: OffsetDateTime,
}

/// What a start finds, decided by [`judge`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// The state dir was bound to this host.
    Same,
    /// No binding for this node (enrolled before host binding, or a binding of an earlier
    /// enrolment): bind to this host now.
    Unbound,
    /// Bound to another host: the state dir was copied.
    Moved,
    /// Bound to this host by an older plexd (version 1, the sent fingerprint on disk): rewrite
    /// it as version 2.
    Upgrade,
}

/// This host's two fingerprints for one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprints {
    pub sent: HostFingerprint,
    pub stored: HostFingerprint,
}

impl Fingerprints {
    pub fn of(machine_id: &MachineId, node_id: Uuid) -> Self {
        Self {
            sent: fingerprint(machine_id, node_id),
            stored: stored_fingerprint(machine_id, node_id),
        }
    }
}

/// Compares the stored binding with this host's fingerprints for `node_id`. Pure.
pub fn judge(stored: Option<&HostBinding>, node_id: Uuid, current: &Fingerprints) -> Check {
    match stored {
        Some(b) if b.node_id == node_id => {
            let on_disk = HostFingerprint::parse(&b.fingerprint).ok();
            match b.version {
                HOST_FILE_VERSION_SENT if on_disk == Some(current.sent) => Check::Upgrade,
                HOST_FILE_VERSION if on_disk == Some(current.stored) => Check::Same,
                _ => Check::Moved,
            }
        }
        _ => Check::Unbound,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error(
        "cannot read this host's machine id from {path}: {reason}; plexd binds its state to the host by it: create it (systemd-machine-id-setup), or point {MACHINE_ID_ENV} at a file with a unique 32-hex id (containers, tests)"
    )]
    MachineId { path: PathBuf, reason: String },
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error(
        "the host binding {path} is not valid: {reason}; if this state dir was enrolled on this host, remove {path} and start plexd again (it binds anew)"
    )]
    Corrupt { path: PathBuf, reason: String },
    /// The state dir was enrolled on another host.
    #[error("{0}")]
    Cloned(String),
}

/// Who noticed the copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoticedBy {
    /// This host's machine id is not the one the state dir was bound to.
    LocalCheck,
    /// The control plane saw the credential from another host (`clone_refused`).
    ControlPlane,
}

/// The one line that tells the operator of a copied state dir what happened and what to do.
pub(crate) fn clone_message(state_dir: &Path, node_id: Uuid, by: NoticedBy) -> String {
    let why = match by {
        NoticedBy::LocalCheck => "this host's machine id is not the one it was bound to",
        NoticedBy::ControlPlane => {
            "the control plane refused its credential from this host (clone_refused)"
        }
    };
    let dir = state_dir.display();
    format!(
        "this state directory {dir} was enrolled on another host (copied? golden image?): {why}; node {node_id} stays with the host it was enrolled on; on this host remove {dir} and enrol it with its own token: write a fresh bootstrap token to the token file and run plexd join"
    )
}

/// Checks that `state_dir` belongs to this host, binding it now when it has no binding for
/// `node_id`. Returns this host's fingerprint, to be sent with every request.
pub(crate) fn check_or_bind(
    state_dir: &Path,
    node_id: Uuid,
    machine_id_file: &Path,
    now: OffsetDateTime,
) -> Result<HostFingerprint, HostError> {
    let current = Fingerprints::of(&MachineId::read(machine_id_file)?, node_id);
    let path = state_dir.join(HOST_FILE_NAME);
    let stored = load(&path)?;
    match judge(stored.as_ref(), node_id, &current) {
        Check::Same => Ok(current.sent),
        Check::Upgrade => {
            bind(&path, node_id, &current.stored, now)?;
            tracing::info!(node_id = %node_id, path = %path.display(), "rewrote the host binding as version {HOST_FILE_VERSION} (it no longer holds the fingerprint plexd sends)");
            Ok(current.sent)
        }
        Check::Moved => Err(HostError::Cloned(clone_message(
            state_dir,
            node_id,
            NoticedBy::LocalCheck,
        ))),
        Check::Unbound => {
            bind(&path, node_id, &current.stored, now)?;
            tracing::info!(node_id = %node_id, path = %path.display(), machine_id_file = %machine_id_file.display(), "bound this state directory to this host (its machine id); a copy of it on another host will refuse to run");
            Ok(current.sent)
        }
    }
}

/// Writes the binding for `node_id` with this host's stored fingerprint `fp` (0600,
/// atomically), replacing any other.
pub fn bind(
    path: &Path,
    node_id: Uuid,
    fp: &HostFingerprint,
    now: OffsetDateTime,
) -> Result<(), HostError> {
    let b = HostBinding {
        version: HOST_FILE_VERSION,
        node_id,
        fingerprint: fp.to_hex(),
        bound_at: now,
    };
    let json = fsutil::pretty_json(&b).map_err(|e| HostError::Corrupt {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    fsutil::write_atomic(path, &json, 0o600)?;
    Ok(())
}

/// Reads the binding, `None` when there is none.
pub fn load(path: &Path) -> Result<Option<HostBinding>, HostError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(FsError::new("cannot read", path, e).into()),
    };
    let corrupt = |reason: String| HostError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let b: HostBinding = serde_json::from_str(&text).map_err(|e| corrupt(e.to_string()))?;
    if b.version != HOST_FILE_VERSION && b.version != HOST_FILE_VERSION_SENT {
        return Err(corrupt(format!(
            "it has version {}; this plexd reads versions {HOST_FILE_VERSION_SENT} and {HOST_FILE_VERSION}",
            b.version
        )));
    }
    Ok(Some(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    const X: &str = "3d1219c7c4c5404aaa1f6d2a48adfda4";
    const Y: &str = "0f5f1c0b2a7e4d3c9b8a796857463524";

    fn id(s: &str) -> MachineId {
        MachineId::parse(s).unwrap()
    }

    fn node(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    #[test]
    fn the_fingerprint_is_stable_differs_per_host_and_node_and_hides_the_machine_id() {
        let a = fingerprint(&id(X), node(1));
        assert_eq!(a, fingerprint(&id(X), node(1)));
        // Case and a trailing newline do not change the host.
        assert_eq!(
            a,
            fingerprint(&id(&format!("{}\n", X.to_uppercase())), node(1))
        );
        assert_ne!(a, fingerprint(&id(Y), node(1)));
        assert_ne!(a, fingerprint(&id(X), node(2)));
        let hex = a.to_hex();
        assert!(!hex.contains(X) && !hex.contains(&X[..16]) && !hex.contains(&X[16..]));
        // Pinned, computed outside this code (Python: `hmac.new(machine_id_text,
        // b"plexd host binding v1\0" + node_id.bytes, sha256)`): another plexd version must
        // derive the same value, or every node would look like a clone after an upgrade.
        assert_eq!(
            hex, "cf38cbac2bb93402f2604cb86f77a1afc1f8345bccdce10f461608bb26dacee0",
            "the derivation changed"
        );
        assert!(!format!("{:?}", id(X)).contains(X));
    }

    #[test]
    fn a_bad_machine_id_is_refused_with_its_reason() {
        assert_eq!(MachineId::parse(""), Err("it is empty"));
        assert_eq!(MachineId::parse(" \n"), Err("it is empty"));
        assert!(
            MachineId::parse("uninitialized\n")
                .unwrap_err()
                .contains("uninitialized")
        );
        assert!(MachineId::parse("abc").unwrap_err().contains("32 hex"));
        assert!(
            MachineId::parse(&"g".repeat(32))
                .unwrap_err()
                .contains("32 hex")
        );

        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("machine-id");
        let e = MachineId::read(&missing).unwrap_err().to_string();
        assert!(
            e.contains("machine-id") && e.contains(MACHINE_ID_ENV),
            "{e}"
        );
        std::fs::write(&missing, vec![b'a'; 300]).unwrap();
        let e = MachineId::read(&missing).unwrap_err().to_string();
        assert!(e.contains("larger than 256 bytes"), "{e}");
    }

    #[test]
    fn judge_tells_same_moved_unbound_and_upgrade() {
        let fp = Fingerprints::of(&id(X), node(1));
        let other = Fingerprints::of(&id(Y), node(1));
        let b = |v: u32, n: u128, fp: &HostFingerprint| HostBinding {
            version: v,
            node_id: node(n),
            fingerprint: fp.to_hex(),
            bound_at: OffsetDateTime::UNIX_EPOCH,
        };
        assert_eq!(judge(None, node(1), &fp), Check::Unbound);
        assert_eq!(judge(Some(&b(2, 1, &fp.stored)), node(1), &fp), Check::Same);
        assert_eq!(
            judge(Some(&b(2, 1, &other.stored)), node(1), &fp),
            Check::Moved
        );
        // Version 2 holds the stored value: the sent one written there is not this host's.
        assert_eq!(judge(Some(&b(2, 1, &fp.sent)), node(1), &fp), Check::Moved);
        // Version 1 (an older plexd) holds the sent value: this host's is upgraded.
        assert_eq!(
            judge(Some(&b(1, 1, &fp.sent)), node(1), &fp),
            Check::Upgrade
        );
        assert_eq!(
            judge(Some(&b(1, 1, &other.sent)), node(1), &fp),
            Check::Moved
        );
        // A binding of an earlier enrolment (another node id) is replaced.
        assert_eq!(
            judge(Some(&b(2, 9, &other.stored)), node(1), &fp),
            Check::Unbound
        );
        let mut garbled = b(2, 1, &fp.stored);
        garbled.fingerprint = "zz".into();
        assert_eq!(judge(Some(&garbled), node(1), &fp), Check::Moved);
    }

    /// The attack of a copied state dir: read what it stores and send it as `Plexd-Host`.
    /// Before version 2 the file held exactly the value sent.
    #[test]
    fn the_state_dir_never_holds_the_value_sent() {
        let dir = tempfile::tempdir().unwrap();
        let mx = dir.path().join("x");
        std::fs::write(&mx, format!("{X}\n")).unwrap();
        let sent = check_or_bind(dir.path(), node(1), &mx, OffsetDateTime::UNIX_EPOCH).unwrap();
        assert_eq!(sent, fingerprint(&id(X), node(1)));
        let text = std::fs::read_to_string(dir.path().join(HOST_FILE_NAME)).unwrap();
        assert!(!text.contains(&sent.to_hex()), "{text}");
    }

    #[test]
    fn a_version_1_binding_of_this_host_is_rewritten_and_keeps_the_sent_value() {
        let dir = tempfile::tempdir().unwrap();
        let (mx, my) = (dir.path().join("x"), dir.path().join("y"));
        std::fs::write(&mx, format!("{X}\n")).unwrap();
        std::fs::write(&my, format!("{Y}\n")).unwrap();
        let state = dir.path().join("s");
        std::fs::create_dir(&state).unwrap();
        let path = state.join(HOST_FILE_NAME);
        let old = HostBinding {
            version: 1,
            node_id: node(1),
            fingerprint: fingerprint(&id(X), node(1)).to_hex(),
            bound_at: OffsetDateTime::UNIX_EPOCH,
        };
        std::fs::write(&path, serde_json::to_vec(&old).unwrap()).unwrap();
        // Another host's copy of the old file is still a copy.
        assert!(matches!(
            check_or_bind(&state, node(1), &my, OffsetDateTime::UNIX_EPOCH),
            Err(HostError::Cloned(_))
        ));
        let sent = check_or_bind(&state, node(1), &mx, OffsetDateTime::UNIX_EPOCH).unwrap();
        assert_eq!(
            sent.to_hex(),
            old.fingerprint,
            "the control plane's binding holds"
        );
        let now = load(&path).unwrap().unwrap();
        assert_eq!(now.version, HOST_FILE_VERSION);
        assert_ne!(now.fingerprint, old.fingerprint);
        assert_eq!(
            check_or_bind(&state, node(1), &mx, OffsetDateTime::UNIX_EPOCH).unwrap(),
            sent
        );
    }

    #[test]
    fn a_copied_state_dir_refuses_to_start_and_the_original_keeps_starting() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        let (mx, my) = (dir.path().join("x"), dir.path().join("y"));
        std::fs::write(&mx, format!("{X}\n")).unwrap();
        std::fs::write(&my, format!("{Y}\n")).unwrap();
        let now = OffsetDateTime::UNIX_EPOCH;

        let first = check_or_bind(&state, node(1), &mx, now).unwrap();
        let file = state.join(HOST_FILE_NAME);
        assert_eq!(fsutil::mode_of(&file).unwrap(), 0o600);
        assert!(!std::fs::read_to_string(&file).unwrap().contains(X));
        assert_eq!(check_or_bind(&state, node(1), &mx, now).unwrap(), first);

        let e = check_or_bind(&state, node(1), &my, now).unwrap_err();
        assert!(matches!(e, HostError::Cloned(_)), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("was enrolled on another host (copied? golden image?)")
                && msg.contains(&format!("remove {}", state.display()))
                && msg.contains("plexd join"),
            "{msg}"
        );
        // The refusal left the binding as it was.
        assert_eq!(check_or_bind(&state, node(1), &mx, now).unwrap(), first);
    }
}
