//! `<state_dir>/state.json` on disk: written 0600 and atomically, read back and verified
//! again by the core's [`decode`] (the file's shape and the checks are in `core/cache.rs`).

use std::path::Path;

use plexsphere_wire::signed::SignedEnvelope;

use super::core::accept::Acceptor;
pub use super::core::cache::{
    CACHE_VERSION, CacheError, CacheFile, Cached, CachedEvent, STATE_FILE_NAME, decode,
};
use crate::fsutil::{self, FsError};

/// Saves the cache (0600, atomic).
pub fn save(
    path: &Path,
    envelope: &SignedEnvelope,
    events: &[CachedEvent],
    last_seq: u64,
) -> Result<(), FsError> {
    let file = CacheFile {
        version: CACHE_VERSION,
        state: envelope.clone(),
        events: events.to_vec(),
        last_seq,
    };
    let json = fsutil::pretty_json(&file)
        .map_err(|e| FsError::new("cannot encode", path, std::io::Error::other(e)))?;
    fsutil::write_atomic(path, &json, 0o600)
}

/// Loads the cache; a missing file is `Ok(None)`, an unusable one is an error the daemon logs
/// at warn before starting without it.
pub fn load(path: &Path, acceptor: &Acceptor) -> Result<Option<Cached>, CacheError> {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(CacheError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    fsutil::enforce_private(path)?;
    decode(&text, acceptor)
        .map(Some)
        .map_err(|reason| CacheError::Refused {
            path: path.to_path_buf(),
            reason,
        })
}

#[cfg(test)]
mod tests {
    use plexsphere_wire::signed::SignContext;

    use plexsphere_wire::node::EventKind;

    use super::super::core::accept_fixtures::{acceptor, event_data, own, peer, signer, state};
    use super::*;

    #[test]
    fn round_trip_with_0600_and_reverification() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(STATE_FILE_NAME);
        assert!(load(&p, &acceptor()).unwrap().is_none());
        let env = signer()
            .sign(SignContext::NodeState, &state(7, vec![peer(3)]))
            .unwrap();
        let frame = CachedEvent {
            id: 8,
            data: event_data(8, own(), EventKind::PeerAdded { peer: peer(4) }),
        };
        save(&p, &env, std::slice::from_ref(&frame), 9).unwrap();
        assert_eq!(fsutil::mode_of(&p).unwrap(), 0o600);
        let c = load(&p, &acceptor()).unwrap().unwrap();
        assert_eq!(c.state.version, 7);
        assert_eq!(c.last_seq, 9);
        assert_eq!(c.envelope, env);
        assert_eq!(c.events.len(), 1);
        assert_eq!(c.events[0].0.seq, 8);

        // an event whose id does not match its signed seq is refused
        let bad = CachedEvent {
            id: 9,
            data: frame.data.clone(),
        };
        save(&p, &env, &[bad], 9).unwrap();
        let e = load(&p, &acceptor()).unwrap_err().to_string();
        assert!(e.contains("cached event 9"), "{e}");
        save(&p, &env, &[frame], 9).unwrap();

        // a tampered cache is refused with the reason
        let text = std::fs::read_to_string(&p).unwrap();
        let tampered = text.replacen(&env.signature[..4], "AAAA", 1);
        std::fs::write(&p, tampered).unwrap();
        let e = load(&p, &acceptor()).unwrap_err().to_string();
        assert!(e.contains("is refused") && e.contains("signature"), "{e}");
        std::fs::write(&p, "{}").unwrap();
        assert!(load(&p, &acceptor()).is_err());
    }

    #[test]
    fn the_policy_survives_the_cache_round_trip() {
        // A restarting node enforces the cached policy before the API answers: it must come
        // back from the file exactly as signed.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(STATE_FILE_NAME);
        let mut s = state(7, vec![peer(3)]);
        let view: plexsphere_policy::view::NodeView = serde_json::from_value(serde_json::json!({
            "node": own(),
            "addrs": ["10.64.1.2"],
            "grants": [],
            "peers": [{"id": super::super::core::accept_fixtures::peer_id(3), "name": "node-3", "addrs": ["10.64.1.3"]}]
        }))
        .unwrap();
        s.policy = Some(plexsphere_wire::node::PolicyState { version: 12, view });
        let env = signer().sign(SignContext::NodeState, &s).unwrap();
        save(&p, &env, &[], 7).unwrap();
        let c = load(&p, &acceptor()).unwrap().unwrap();
        assert_eq!(c.state.policy, s.policy);
        assert!(c.state.policy.is_some());
    }
}
