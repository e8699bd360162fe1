//! `plexd leave`: deregister (`DELETE /v1/nodes/{id}`), tear the mesh down, remove the
//! identity, the cached state and the key. Through the daemon when it runs, directly otherwise.

use std::path::PathBuf;

use super::cache::STATE_FILE_NAME;
pub use super::core::leave::{files_text, left_message, note};
use crate::api_client::ApiClient;
use crate::exit::{ExitCode, Failure};
use crate::identity::Identity;
use crate::join::JoinSettings;
use crate::mesh::Mesh;
use crate::node_api::{CallError, LeaveAnswer, NodeApi};
use crate::paths::StatePaths;

/// Removes what makes this host a node; returns the files removed.
pub fn cleanup(paths: &StatePaths, mesh: &mut dyn Mesh) -> Vec<PathBuf> {
    if let Err(e) = mesh.teardown() {
        tracing::warn!(error = %e, "could not tear the mesh down; remove the interface by hand");
    }
    remove_files(paths)
}

/// Removes the identity, the cached state, the key and the host binding; returns the files
/// removed.
pub fn remove_files(paths: &StatePaths) -> Vec<PathBuf> {
    let mut removed = vec![];
    for f in [
        paths.identity_file(),
        paths.dir.join(STATE_FILE_NAME),
        paths.key_file(),
        paths.dir.join(crate::identity::host::HOST_FILE_NAME),
        crate::identity::rotation::pending_path(&paths.key_file()),
    ] {
        match crate::fsutil::remove_file_if_present(&f) {
            Ok(true) => removed.push(f),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(path = %f.display(), error = %e, "could not remove; remove it by hand")
            }
        }
    }
    removed
}

/// What a leave answered, for the operator; `Err` (saying why the node could not deregister)
/// when nothing was removed.
pub fn finish(
    id: &Identity,
    answer: Result<LeaveAnswer, CallError>,
    paths: &StatePaths,
    mesh: &mut dyn Mesh,
) -> Result<String, Failure> {
    let note = note(id, answer)?;
    let removed = cleanup(paths, mesh);
    Ok(left_message(id.node_id, &note, &removed))
}

/// `plexd leave` when no daemon answers.
pub async fn leave_direct(s: &JoinSettings) -> Result<String, Failure> {
    let Some(id) = Identity::load(&s.state.identity_file())? else {
        return Ok(format!(
            "this host is not enrolled (no {}); nothing to leave",
            s.state.identity_file().display()
        ));
    };
    let url = crate::config::ApiUrl::parse(&id.api_url).map_err(|e| {
        Failure::new(
            ExitCode::Config,
            format!("{}: api_url {e}", s.state.identity_file().display()),
        )
    })?;
    // A copy of another host's state dir must not deregister that host's node.
    let host = crate::identity::host::check_or_bind(
        &s.state.dir,
        id.node_id,
        &crate::identity::host::machine_id_file(),
        time::OffsetDateTime::now_utc(),
    )?;
    let client = ApiClient::new(url, &s.trust, s.dropped_ca.clone())?;
    let api = NodeApi::new(client, id.node_id, id.node_credential.clone()).with_host(host);
    let answer = api.leave().await;
    let mut mesh = crate::mesh::for_leave(&s.config.wireguard, crate::routes::remove_leftovers);
    finish(&id, answer, &s.state, mesh.as_mut())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::NoneMesh;

    #[test]
    fn cleanup_removes_the_node_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let paths = StatePaths::new(dir.path());
        for f in [
            "identity.json",
            "state.json",
            "wireguard.key",
            "host.json",
            "other",
        ] {
            std::fs::write(dir.path().join(f), "x").unwrap();
        }
        let removed = cleanup(&paths, &mut NoneMesh::default());
        assert_eq!(removed.len(), 4);
        assert!(dir.path().join("other").exists());
        assert!(cleanup(&paths, &mut NoneMesh::default()).is_empty());
        assert_eq!(files_text(&[]), "nothing (no local files were left)");
    }
}
