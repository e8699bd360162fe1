//! The I/O of a rotation, run by the executor as tasks (the core decides when and what next,
//! `core/rotation.rs`): the pending key file, the challenge and the rotation call, the
//! promotion of the pending key; the credential call and the identity file.

use plexsphere_wire::key::PublicKey;
use plexsphere_wire::rotation::{self, KeyRotation};

use super::core::io::KeyDone;
use crate::identity::rotation::{self as files, KeySecret};
use crate::identity::{Identity, NodeKey, SecretString};
use crate::node_api::{CallError, NodeApi};
use crate::paths::StatePaths;

fn disk(e: impl std::fmt::Display) -> CallError {
    CallError::BadAnswer(format!("the node's own files: {e}"))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, CallError> + Send + 'static,
) -> Result<T, CallError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| disk(format!("the file task failed: {e}")))?
}

/// The key rotation's calls: the pending key is on disk (0600) before the control plane
/// hears of it; the same pending key is sent again after a crash or a failure.
pub async fn rotate_key(api: NodeApi, paths: StatePaths) -> Result<KeyDone, CallError> {
    let key_file = paths.key_file();
    let (current, pending) = blocking(move || {
        let (current, generated) = NodeKey::load_or_generate(&key_file).map_err(disk)?;
        if generated {
            return Err(disk(format!(
                "{} was missing; this node's registered key is lost",
                key_file.display()
            )));
        }
        let (pending, _) = files::pending_or_generate(&key_file).map_err(disk)?;
        Ok((current, pending))
    })
    .await?;
    let challenge = api.key_challenge().await?;
    let server = plexsphere_wire::key::PublicKey::from_base64(&challenge.server_public_key)
        .map_err(|_| {
            CallError::BadAnswer(
                "the challenge's server_public_key is not base64 of 32 bytes".into(),
            )
        })?;
    let (old, new) = (
        PublicKey(current.public().to_bytes()),
        PublicKey(pending.public().to_bytes()),
    );
    let node = api.node_id();
    let nonce = challenge.nonce;
    let prove =
        |k: &NodeKey| rotation::prove(&k.secret().to_bytes(), &server, node, &old, &new, &nonce);
    let req = KeyRotation {
        old_public_key: current.public_base64(),
        new_public_key: pending.public_base64(),
        old_proof: prove(&current),
        new_proof: prove(&pending),
        nonce: nonce.clone(),
    };
    let answer = api.rotate_key(&req).await?;
    if answer.public_key != req.new_public_key {
        return Err(CallError::BadAnswer(format!(
            "the control plane answered the key {} for a rotation to {}",
            answer.public_key, req.new_public_key
        )));
    }
    Ok(KeyDone {
        secret: KeySecret(pending.secret().to_bytes()),
        old_public_key: req.old_public_key,
        answer,
    })
}

/// The interface uses the pending key: it becomes `wireguard.key`.
pub async fn promote(paths: StatePaths) {
    let key_file = paths.key_file();
    let r = tokio::task::spawn_blocking(move || files::promote(&key_file)).await;
    match r {
        Ok(Ok(())) => {
            tracing::info!(path = %paths.key_file().display(), "the new WireGuard key is now the node's key")
        }
        Ok(Err(e)) => tracing::error!(
            "cannot make the pending key the node's key: {e}; the next start finishes the rotation"
        ),
        Err(e) => tracing::error!("cannot make the pending key the node's key: {e}"),
    }
}

/// The control plane will never take the pending key: remove it.
pub async fn discard(paths: StatePaths) {
    let key_file = paths.key_file();
    match tokio::task::spawn_blocking(move || files::discard(&key_file)).await {
        Ok(Ok(())) => tracing::warn!(
            "removed the pending WireGuard key the control plane refused; the next rotation makes a new one"
        ),
        Ok(Err(e)) => tracing::error!("cannot remove the refused pending key: {e}"),
        Err(e) => tracing::error!("cannot remove the refused pending key: {e}"),
    }
}

/// The credential rotation: the node proves its WireGuard private key over a challenge's nonce
/// (a credential alone does not replace itself); the new credential is saved in the identity
/// (atomically, 0600) before any call uses it; until then the old one works (the control plane
/// keeps the new one pending until its first use).
pub async fn rotate_credential(api: NodeApi, paths: StatePaths) -> Result<(), CallError> {
    let key_file = paths.key_file();
    let current = blocking(move || {
        let (current, generated) = NodeKey::load_or_generate(&key_file).map_err(disk)?;
        if generated {
            return Err(disk(format!(
                "{} was missing; this node's registered key is lost",
                key_file.display()
            )));
        }
        Ok(current)
    })
    .await?;
    let challenge = api.key_challenge().await?;
    let server = plexsphere_wire::key::PublicKey::from_base64(&challenge.server_public_key)
        .map_err(|_| {
            CallError::BadAnswer(
                "the challenge's server_public_key is not base64 of 32 bytes".into(),
            )
        })?;
    let proof = plexsphere_wire::proof::prove_credential(
        &current.secret().to_bytes(),
        &server,
        api.node_id(),
        &challenge.nonce,
    );
    let req = plexsphere_wire::proof::CredentialRotation {
        public_key: Some(current.public_base64()),
        nonce: Some(challenge.nonce),
        proof: Some(proof),
    };
    let answer = api.rotate_credential(&req).await?;
    let parsed = plexsphere_wire::secret::NodeCredential::parse(&answer.node_credential)
        .map_err(|e| CallError::BadAnswer(format!("the new credential: {e}")))?;
    if parsed.node_id != api.node_id() {
        return Err(CallError::BadAnswer(
            "the new credential names another node".into(),
        ));
    }
    let credential = SecretString::new(answer.node_credential);
    let c = credential.clone();
    blocking(move || {
        Identity::update(&paths.identity_file(), |id| {
            id.node_credential = c;
            id.credential_rotated_at = Some(time::OffsetDateTime::now_utc());
        })
        .map(|_| ())
        .map_err(disk)
    })
    .await?;
    api.set_credential(credential);
    Ok(())
}
