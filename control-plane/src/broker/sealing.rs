//! How cloud credentials are sealed at rest: under a key derived from the key-encryption key
//! (HKDF-SHA256 with [`CREDENTIAL_KEY_LABEL`]), the KEK that seals the Domain keys. Every replica
//! started with the KEK opens every credential, and `plexsphere kek rotate` seals them again
//! under the new KEK in the transaction that seals the Domain keys again.
//!
//! Earlier versions sealed them under a random key in `<data-dir>/credentials.key`, one per
//! replica. Such a file is still read to open what it sealed (and `plexctl cloud-credential
//! rotate` or `plexsphere kek rotate` moves those under the KEK), but nothing new is sealed
//! with it and no new file is made.

use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use plexsphere_broker::credentials::{self, CredentialKey, CredentialPayload};
use sqlx::AnyConnection;
use uuid::Uuid;

use crate::error::Error;
use crate::keys::{Kek, Keyring};
use crate::store::credentials::{self as cred_store, CredentialRow};

/// The HKDF label of the credentials' sealing key.
pub const CREDENTIAL_KEY_LABEL: &[u8] = b"plexsphere cloud credential sealing key v1";

/// The file earlier versions kept their sealing key in, under the data directory.
pub const LEGACY_KEY_FILE: &str = "credentials.key";

fn kek_key(bytes: [u8; 32]) -> Result<CredentialKey, Error> {
    CredentialKey::from_bytes(&bytes).map_err(|e| Error::Internal(e.to_string()))
}

/// The sealing key of this replica's KEK.
pub(crate) fn replica_key(keys: &Keyring) -> Result<CredentialKey, Error> {
    let bytes = keys.derive_key_bytes(CREDENTIAL_KEY_LABEL).map_err(|e| {
        Error::Unavailable(format!(
            "cannot derive the cloud credentials' sealing key from the key-encryption key: {e}"
        ))
    })?;
    kek_key(bytes)
}

/// The key of an earlier version's `credentials.key`, if the data directory has one.
pub(crate) fn legacy_key(data_dir: &Path) -> Result<Option<CredentialKey>, Error> {
    let path = data_dir.join(LEGACY_KEY_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => CredentialKey::from_bytes(&bytes).map(Some).map_err(|e| {
            Error::Internal(format!(
                "the earlier credential key {} is unusable: {e}",
                path.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::Internal(format!(
            "cannot read the earlier credential key {}: {e}; check the data directory's permissions",
            path.display()
        ))),
    }
}

/// `payload` sealed for the credential `id`, as the base64 the row stores.
pub(crate) fn seal(
    key: &CredentialKey,
    id: Uuid,
    payload: &CredentialPayload,
) -> Result<String, Error> {
    let blob = credentials::seal(key, id, payload)
        .map_err(|e| Error::Internal(format!("cannot seal the cloud credential: {e}")))?;
    Ok(STANDARD.encode(blob))
}

fn blob(row: &CredentialRow) -> Result<Vec<u8>, Error> {
    STANDARD.decode(&row.sealed_payload).map_err(|_| {
        Error::Internal(format!(
            "the sealed cloud credential {} is not base64; create the credential again",
            row.id
        ))
    })
}

/// A stored credential opened with the first of `keys` that opens it.
pub(crate) fn open(
    keys: &[&CredentialKey],
    row: &CredentialRow,
) -> Result<CredentialPayload, Error> {
    let blob = blob(row)?;
    let mut last = None;
    for key in keys {
        match credentials::open(key, row.id, &blob) {
            Ok(p) => return Ok(p),
            Err(e) => last = Some(e),
        }
    }
    Err(Error::Internal(match last {
        Some(e) => format!(
            "{e}; this replica's key-encryption key is not the one it was sealed under (start every replica with the same KEK), or rotate the credential with `plexctl cloud-credential rotate {}`",
            row.id
        ),
        None => format!("no key to open the cloud credential {} with", row.id),
    }))
}

/// What sealing the credentials again under a new KEK did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Resealed {
    /// Sealed again under the new KEK.
    pub resealed: usize,
    /// Opened with the new KEK already.
    pub already: usize,
}

/// Seals every cloud credential again under `new`'s key in the transaction `tx`, opening each
/// with `old`'s key or the data directory's earlier `credentials.key`. A credential that opens
/// with none of them fails the whole call and names itself; the caller commits (`plexsphere kek
/// rotate` does so once, with the Domain keys sealed again in the same transaction).
pub(crate) async fn reseal_in(
    tx: &mut AnyConnection,
    old: &Kek,
    new: &Kek,
    legacy: Option<&CredentialKey>,
) -> Result<Resealed, Error> {
    let old_key = kek_key(old.derive_key_bytes(CREDENTIAL_KEY_LABEL))?;
    let new_key = kek_key(new.derive_key_bytes(CREDENTIAL_KEY_LABEL))?;
    let mut done = Resealed::default();
    for row in cred_store::list(tx).await? {
        if open(&[&new_key], &row).is_ok() {
            done.already += 1;
            continue;
        }
        let mut keys = vec![&old_key];
        keys.extend(legacy);
        let payload = open(&keys, &row).map_err(|e| {
            Error::Invalid(format!(
                "cloud credential {} ({}) opens with neither the old nor the new key-encryption key: {e}; nothing was changed",
                row.id, row.name
            ))
        })?;
        let sealed = seal(&new_key, row.id, &payload)?;
        if !cred_store::reseal(tx, row.id, &row.sealed_payload, &sealed).await? {
            return Err(Error::Conflict(format!(
                "cloud credential {} changed while it was sealed again; nothing was changed, run the command again",
                row.id
            )));
        }
        done.resealed += 1;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: Uuid, sealed: String) -> CredentialRow {
        CredentialRow {
            id,
            name: "c".into(),
            provider: "openstack".into(),
            sealed_payload: sealed,
            created_at: 0,
            revoked_at: None,
        }
    }

    #[test]
    fn a_credential_opens_with_the_kek_it_was_sealed_under_and_with_no_other() {
        let one = Kek::from_bytes([1; 32], "one");
        let two = Kek::from_bytes([2; 32], "two");
        let k1 = kek_key(one.derive_key_bytes(CREDENTIAL_KEY_LABEL)).unwrap();
        let k2 = kek_key(two.derive_key_bytes(CREDENTIAL_KEY_LABEL)).unwrap();
        let id = Uuid::now_v7();
        let payload = CredentialPayload::new(b"{\"a\":1}".to_vec());
        let r = row(id, seal(&k1, id, &payload).unwrap());
        assert_eq!(open(&[&k1], &r).unwrap(), payload);
        assert_eq!(open(&[&k2, &k1], &r).unwrap(), payload);
        let e = open(&[&k2], &r).unwrap_err().to_string();
        assert!(e.contains("cloud-credential rotate"), "{e}");
        // The sealing key is not the KEK itself nor another label's key.
        assert_ne!(one.derive_key_bytes(CREDENTIAL_KEY_LABEL), [1; 32]);
        assert_ne!(
            one.derive_key_bytes(CREDENTIAL_KEY_LABEL),
            one.derive_key_bytes(b"another purpose")
        );
    }
}
