//! Key and credential rotation on the control plane (`plexsphere_wire::rotation` has the
//! protocol).
//!
//! - Key: a node asks for a challenge, proves it holds the current and the new private key,
//!   and the key changes only when the stored key is still the old one (compare and swap, so
//!   a replayed request changes nothing); every peer hears `peer_updated` in the same
//!   transaction. A repeat of a change already made answers it as done.
//! - Credential: a node proves its WireGuard private key (over a key challenge's nonce, its own
//!   label) and asks for a new credential; it is stored as pending, becomes the
//!   credential at its first use, and the old one still works [`CREDENTIAL_GRACE_SECS`] after
//!   that (calls the node sent before it switched).
//! - Both are limited to one change per [`MIN_ROTATION_GAP_SECS`] per node (429).
//!
//! The proof secret (an X25519 key) and the nonce key are derived from the Domain's signing
//! key: a deterministic Ed25519 signature of a fixed label, hashed. Never sent anywhere, the
//! same in every replica and across restarts.

use plexsphere_wire::node::EventKind;
use plexsphere_wire::proof::CredentialRotation;
use plexsphere_wire::rotation::{self, CHALLENGE_TTL_SECS, KeyChallenge, KeyRotated, KeyRotation};
use plexsphere_wire::secret::{NodeCredential, sha256};
use plexsphere_wire::signed::{DomainSigner, SignContext};

use uuid::Uuid;

use crate::error::Error;
use crate::node::decisions;
use crate::node::ops::NodeOps;
use crate::store::nodes::{self, NodeRow, rotation as rot};
use crate::store::{self, StoreError, domains, events};

pub(crate) use plexsphere_wire::rotation::MIN_ROTATION_GAP_SECS;

/// How long the old credential keeps working after the new one was first used, in seconds.
pub(crate) const CREDENTIAL_GRACE_SECS: i64 = 30;

const NONCE_LABEL: &[u8] = b"plexsphere key-rotation nonce v1";

/// The Domain's proof secret (X25519) and nonce key.
pub(crate) struct Secrets {
    pub(crate) x25519: [u8; 32],
    nonce_key: [u8; 32],
}

pub(crate) fn secrets(signer: &DomainSigner) -> Secrets {
    let derive = |label: &[u8]| sha256(&signer.sign_bytes(SignContext::KeyDerivation, label));
    Secrets {
        x25519: crate::node::key_proof::proof_secret(signer),
        nonce_key: derive(NONCE_LABEL),
    }
}

/// The rotation nonce for `node` expiring at `expires` ([`crate::node::key_proof::nonce`]).
fn nonce(s: &Secrets, node: Uuid, expires: i64, random: &str) -> String {
    crate::node::key_proof::nonce(&s.nonce_key, node.as_bytes(), expires, random)
}

/// Whether `text` is a nonce this Domain issued to `node` that has not expired at `now`.
fn nonce_ok(s: &Secrets, node: Uuid, text: &str, now: i64) -> bool {
    crate::node::key_proof::nonce_ok(&s.nonce_key, node.as_bytes(), text, now)
}

/// Seconds left before `last + MIN_ROTATION_GAP_SECS`, when that is in the future.
fn too_soon(last: Option<i64>, now: i64) -> Option<u64> {
    let next = last?.saturating_add(MIN_ROTATION_GAP_SECS);
    (next > now).then(|| u64::try_from(next - now).unwrap_or(1))
}

impl NodeOps<'_> {
    async fn signer_of(&self, node: &NodeRow) -> Result<std::sync::Arc<DomainSigner>, Error> {
        let mut conn = self.store.acquire().await?;
        let domain = domains::get(&mut conn, node.domain_id)
            .await?
            .ok_or_else(|| Error::Internal(format!("node {} names a missing domain", node.id)))?;
        Ok(self.keys.signer(&domain).await?)
    }

    /// `GET /v1/nodes/{id}/key`.
    pub(crate) async fn key_challenge(
        &self,
        node: &NodeRow,
        now: i64,
    ) -> Result<KeyChallenge, Error> {
        let s = secrets(&*self.signer_of(node).await?);
        let random = plexsphere_wire::secret::SecretPart::generate()
            .map_err(|e| Error::Internal(format!("cannot draw a nonce: {e}")))?;
        let expires_at = now.saturating_add(CHALLENGE_TTL_SECS);
        Ok(KeyChallenge {
            server_public_key: plexsphere_wire::reach::public_key(&s.x25519).to_base64(),
            nonce: nonce(&s, node.id, expires_at, random.expose()),
            expires_at,
        })
    }

    /// `POST /v1/nodes/{id}/key`: checks the proof, then swaps the key and tells the peers.
    pub(crate) async fn rotate_key(
        &self,
        node: &NodeRow,
        req: &KeyRotation,
        now: i64,
    ) -> Result<KeyRotated, Error> {
        let bad = |what: &str| {
            Error::Invalid(format!(
                "{what} must be the standard base64 of 32 bytes, as `wg pubkey` prints it"
            ))
        };
        let old = plexsphere_wire::key::PublicKey::from_base64(&req.old_public_key)
            .map_err(|_| bad("old_public_key"))?;
        let new = plexsphere_wire::key::PublicKey::from_base64(&req.new_public_key)
            .map_err(|_| bad("new_public_key"))?;
        if old == new {
            return Err(Error::Invalid(
                "new_public_key equals old_public_key; a rotation needs a new key".into(),
            ));
        }
        let signer = self.signer_of(node).await?;
        let s = secrets(&signer);
        if !nonce_ok(&s, node.id, &req.nonce, now) {
            tracing::warn!(node_id = %node.id, "key rotation refused: unknown or expired nonce");
            return Err(Error::Forbidden("the rotation's nonce is unknown or expired; ask for a fresh challenge (GET /v1/nodes/{id}/key)".into()));
        }
        let proved = rotation::verify(
            &s.x25519,
            &old,
            node.id,
            &old,
            &new,
            &req.nonce,
            &req.old_proof,
        ) && rotation::verify(
            &s.x25519,
            &new,
            node.id,
            &old,
            &new,
            &req.nonce,
            &req.new_proof,
        );
        if !proved {
            tracing::warn!(node_id = %node.id, "key rotation refused: the proof of possession does not match");
            return Err(Error::Forbidden(
                "the proof of possession of the old and the new key does not match; the request was not made by the holder of both private keys".into(),
            ));
        }
        let (old_b64, new_b64) = (old.to_base64(), new.to_base64());
        let outcome = store::retry("key rotation", Error::is_lost_race, || {
            self.rotate_key_attempt(node.id, &old_b64, &new_b64, now)
        })
        .await?;
        let (row, seq, already) = match outcome {
            KeyOutcome::Changed(row, seq) => {
                tracing::info!(node_id = %node.id, old_key = %old_b64, new_key = %new_b64, seq, "node rotated its WireGuard key; its peers were told");
                self.bus.notify(row.domain_id, seq);
                (row, seq, false)
            }
            KeyOutcome::Already(row, seq) => {
                tracing::info!(node_id = %node.id, new_key = %new_b64, "key rotation repeated (the node lost the answer); already done");
                (row, seq, true)
            }
        };
        let token = signer
            .sign(SignContext::RelayToken, &decisions::relay_token(&row, now))
            .map_err(|e| Error::Internal(format!("cannot encode a relay token: {e}")))?;
        Ok(KeyRotated {
            public_key: new_b64,
            state_version: seq,
            already,
            relay_token: Some(token),
        })
    }

    async fn rotate_key_attempt(
        &self,
        id: Uuid,
        old: &str,
        new: &str,
        now: i64,
    ) -> Result<KeyOutcome, Error> {
        let mut tx = self.store.begin().await?;
        let row = nodes::get(&mut tx, id)
            .await?
            .ok_or(Error::Unauthorized("this node no longer exists (deleted)"))?;
        if row.wireguard_public_key == new {
            let seq = events::head(&mut tx, row.domain_id).await?.seq;
            return Ok(KeyOutcome::Already(row, seq));
        }
        if row.wireguard_public_key != old {
            return Err(Error::Conflict(format!(
                "this node's key on the control plane is {}, not the old_public_key {old}; a rotation replaces the current key (a replayed or stale request changes nothing)",
                row.wireguard_public_key
            )));
        }
        if let Some(secs) = too_soon(row.rotation.key_rotated_at, now) {
            return Err(Error::RotationLimited(secs));
        }
        if rot::key_in_use_elsewhere(&mut tx, id, new).await? {
            tracing::warn!(node_id = %id, key = %new, "key rotation refused: another node has this key");
            return Err(Error::Conflict(
                "another node has this WireGuard key; generate a fresh key pair".into(),
            ));
        }
        crate::node::key_proof::key_unique(&mut tx, row.domain_id, new, Some(id)).await?;
        let swapped = match rot::set_key(&mut tx, id, old, new, now).await {
            Ok(done) => done,
            // Another writer took a key with this prefix between the check and the update.
            Err(e) if e.is_unique_violation() => {
                return Err(Error::KeyPrefixInUse(
                    "another node of this Domain took a WireGuard key with the same first 8 bytes meanwhile; generate a fresh key pair".into(),
                ));
            }
            Err(e) => return Err(e.into()),
        };
        if !swapped {
            return Err(Error::Conflict(
                "the node's key changed meanwhile; ask for a fresh challenge".into(),
            ));
        }
        let row = nodes::get(&mut tx, id)
            .await?
            .ok_or(Error::Unauthorized("this node no longer exists (deleted)"))?;
        let kind = EventKind::PeerUpdated {
            peer: decisions::peer_spec(&row),
        };
        let mut seq = events::append(&mut tx, row.domain_id, None, id, &kind, now).await?;
        // A router's `peer_updated` carries its mesh host routes only (its route prefixes
        // differ per receiver): a resync right after it makes its clients pull the prefixes
        // back with the new key (docs/routes.md).
        if crate::store::routes::carries_any(&mut tx, id).await? {
            let resync = EventKind::Resync {
                reason: format!("router {id} rotated its key"),
            };
            seq = events::append(
                &mut tx,
                row.domain_id,
                None,
                uuid::Uuid::nil(),
                &resync,
                now,
            )
            .await?;
        }
        tx.commit().await.map_err(StoreError::from)?;
        Ok(KeyOutcome::Changed(row, seq))
    }

    /// `POST /v1/nodes/{id}/credential`: a new credential, pending until its first use. The
    /// caller proves the node's WireGuard private key (over a nonce of `GET /v1/nodes/{id}/key`),
    /// so a credential alone (leaked from a backup or a log) cannot replace itself.
    pub(crate) async fn rotate_credential(
        &self,
        node: &NodeRow,
        req: &CredentialRotation,
        now: i64,
    ) -> Result<NodeCredential, Error> {
        let (Some(key), Some(nonce), Some(proof)) = (
            req.public_key.as_deref(),
            req.nonce.as_deref(),
            req.proof.as_deref(),
        ) else {
            return Err(Error::ProofRequired(
                "a credential rotation must prove the node's WireGuard private key (public_key, nonce from GET /v1/nodes/{id}/key, proof), and this plexd sent none: it is too old; upgrade plexd".into(),
            ));
        };
        if key != node.wireguard_public_key {
            return Err(Error::ProofInvalid(format!(
                "public_key is not this node's key on the control plane ({}); prove the current key",
                node.wireguard_public_key
            )));
        }
        let claimed = plexsphere_wire::key::PublicKey::from_base64(key).map_err(|_| {
            Error::Invalid("public_key must be the standard base64 of 32 bytes".into())
        })?;
        let s = secrets(&*self.signer_of(node).await?);
        if !nonce_ok(&s, node.id, nonce, now) {
            tracing::warn!(node_id = %node.id, "credential rotation refused: unknown or expired nonce");
            return Err(Error::ProofInvalid("the rotation's nonce is unknown or expired; ask for a fresh challenge (GET /v1/nodes/{id}/key)".into()));
        }
        if !plexsphere_wire::proof::verify_credential(&s.x25519, &claimed, node.id, nonce, proof) {
            tracing::warn!(node_id = %node.id, "credential rotation refused: the proof of possession does not match the node's key");
            return Err(Error::ProofInvalid(
                "the proof of possession does not match the node's WireGuard key: the request was not made by the holder of its private key".into(),
            ));
        }
        if let Some(secs) = too_soon(node.rotation.credential_rotated_at, now) {
            return Err(Error::RotationLimited(secs));
        }
        let cred = NodeCredential::generate(node.id)
            .map_err(|e| Error::Internal(format!("cannot draw a credential: {e}")))?;
        let digest = hex::encode(cred.secret.digest());
        let mut conn = self.store.acquire().await?;
        if !rot::set_pending_credential(&mut conn, node.id, &digest).await? {
            return Err(Error::NodeRevoked);
        }
        tracing::info!(node_id = %node.id, "handed out a new node credential; the old one works until the new one is used");
        Ok(cred)
    }

    /// An operator asks a node to rotate; it learns it from its next heartbeat answer.
    pub(crate) async fn request_rotation(
        &self,
        id: Uuid,
        what: rot::Request,
        now: i64,
    ) -> Result<bool, Error> {
        let mut conn = self.store.acquire().await?;
        Ok(rot::request(&mut conn, id, what, now).await?)
    }
}

enum KeyOutcome {
    Changed(NodeRow, u64),
    Already(NodeRow, u64),
}

/// Which of a node's credentials a presented secret is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CredentialMatch {
    Current,
    /// The one the last rotation handed out: its first use makes it current.
    Pending,
    /// The one a rotation replaced, still inside its grace.
    Previous,
    None,
}

/// Matches a presented secret against the node's current, pending and previous credentials.
pub(crate) fn credential_match(
    node: &NodeRow,
    secret: &plexsphere_wire::secret::SecretPart,
    now: i64,
) -> CredentialMatch {
    let r = &node.rotation;
    if store::secret_matches(secret, &node.credential_sha256) {
        CredentialMatch::Current
    } else if r
        .pending_credential_sha256
        .as_deref()
        .is_some_and(|p| store::secret_matches(secret, p))
    {
        CredentialMatch::Pending
    } else if r.previous_until.is_some_and(|until| now <= until)
        && r.previous_credential_sha256
            .as_deref()
            .is_some_and(|p| store::secret_matches(secret, p))
    {
        CredentialMatch::Previous
    } else {
        CredentialMatch::None
    }
}

/// The first use of a pending credential: it becomes current; the old one has a grace.
pub(crate) async fn promote(
    conn: &mut sqlx::AnyConnection,
    node: &NodeRow,
    now: i64,
) -> Result<(), StoreError> {
    let Some(pending) = &node.rotation.pending_credential_sha256 else {
        return Ok(());
    };
    if rot::promote_pending_credential(
        conn,
        node.id,
        pending,
        now,
        now.saturating_add(CREDENTIAL_GRACE_SECS),
    )
    .await?
    {
        tracing::info!(node_id = %node.id, grace_secs = CREDENTIAL_GRACE_SECS, "node switched to its new credential; the old one stops working after the grace");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_are_bound_to_node_and_time() {
        let s = Secrets {
            x25519: [1; 32],
            nonce_key: [2; 32],
        };
        let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let n = nonce(&s, a, 1300, "r");
        assert!(nonce_ok(&s, a, &n, 1000));
        assert!(nonce_ok(&s, a, &n, 1300));
        assert!(!nonce_ok(&s, a, &n, 1301), "expired");
        assert!(!nonce_ok(&s, b, &n, 1000), "other node");
        assert!(!nonce_ok(&s, a, &n, 900), "expiry further than the TTL");
        assert!(!nonce_ok(
            &s,
            a,
            &nonce(&s, a, 1300, "r").replace(".r.", ".x."),
            1000
        ));
        assert!(!nonce_ok(&s, a, "1300.r", 1000));
        let other = Secrets {
            x25519: [1; 32],
            nonce_key: [3; 32],
        };
        assert!(!nonce_ok(&other, a, &n, 1000), "another Domain's nonce");
    }

    #[test]
    fn credentials_match_current_pending_and_previous_within_its_grace() {
        let secrets: Vec<_> = (0..5)
            .map(|_| NodeCredential::generate(Uuid::nil()).unwrap().secret)
            .collect();
        let secret = |n: u8| secrets[usize::from(n)].clone();
        let digest = |n: u8| hex::encode(secret(n).digest());
        let mut row = NodeRow::for_test(1, "10.64.0.1");
        row.credential_sha256 = digest(1);
        row.rotation.pending_credential_sha256 = Some(digest(2));
        row.rotation.previous_credential_sha256 = Some(digest(3));
        row.rotation.previous_until = Some(1000);
        assert_eq!(
            credential_match(&row, &secret(1), 500),
            CredentialMatch::Current
        );
        assert_eq!(
            credential_match(&row, &secret(2), 500),
            CredentialMatch::Pending
        );
        assert_eq!(
            credential_match(&row, &secret(3), 1000),
            CredentialMatch::Previous
        );
        assert_eq!(
            credential_match(&row, &secret(3), 1001),
            CredentialMatch::None,
            "grace over"
        );
        assert_eq!(
            credential_match(&row, &secret(4), 500),
            CredentialMatch::None
        );
        row.rotation.previous_until = None;
        assert_eq!(credential_match(&row, &secret(3), 1), CredentialMatch::None);
    }

    #[test]
    fn the_gap_is_counted_from_the_last_change() {
        assert_eq!(too_soon(None, 100), None);
        assert_eq!(too_soon(Some(100), 100), Some(30));
        assert_eq!(too_soon(Some(100), 129), Some(1));
        assert_eq!(too_soon(Some(100), 130), None);
    }
}
