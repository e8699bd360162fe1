//! `<state_dir>/state.json`: the last good signed state envelope, the signed events applied on
//! top of it since, and the last applied seq; 0600, written atomically, and verified again when
//! loaded (a cache never bypasses the signature check). Replaying the cached events makes a
//! restart resume exactly where the node was, with `Last-Event-ID` = the last applied seq.

use std::path::Path;

use plexsphere_wire::node::{Event, NodeState};
use plexsphere_wire::signed::SignedEnvelope;
use serde::{Deserialize, Serialize};

use super::accept::{Acceptor, SignedBy};
use crate::fsutil::{self, FsError};

pub const STATE_FILE_NAME: &str = "state.json";
pub const CACHE_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheFile {
    pub version: u32,
    /// The state document exactly as the server signed it.
    pub state: SignedEnvelope,
    /// The events applied on top of the state, in order, as the stream delivered them.
    #[serde(default)]
    pub events: Vec<CachedEvent>,
    /// The last event seq applied on top of it (the stream resumes after it).
    pub last_seq: u64,
}

/// One signed event frame: its `id:` and its `data:` (a signed envelope).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CachedEvent {
    pub id: u64,
    pub data: String,
}

/// A loaded and verified cache.
#[derive(Debug, Clone)]
pub struct Cached {
    /// A cached document was signed by the announced next key: the node moves to it (the
    /// documents after it were checked as if it were pinned already).
    pub promoted: bool,
    pub state: NodeState,
    pub envelope: SignedEnvelope,
    /// The cached events, verified, with their frames.
    pub events: Vec<(Event, CachedEvent)>,
    pub last_seq: u64,
}

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
pub fn load(path: &Path, acceptor: &Acceptor) -> Result<Option<Cached>, String> {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    fsutil::enforce_private(path).map_err(|e| e.to_string())?;
    decode(&text, acceptor)
        .map(Some)
        .map_err(|e| format!("the cached state {} is refused: {e}", path.display()))
}

/// Decodes and verifies the cache file's bytes.
pub fn decode(bytes: &[u8], acceptor: &Acceptor) -> Result<Cached, String> {
    let file: CacheFile = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    if file.version != CACHE_VERSION {
        return Err(format!(
            "version {} is not the version {CACHE_VERSION} this plexd reads",
            file.version
        ));
    }
    // Checked in order as they were applied: after a document signed by the next key, the
    // old key is refused, as it was when they arrived.
    let mut acceptor = acceptor.clone();
    let mut promoted = false;
    let (state, by) = acceptor
        .state_by(&file.state, None)
        .map_err(|e| e.to_string())?;
    if by == SignedBy::Next {
        acceptor.promote();
        promoted = true;
    }
    let mut events = Vec::with_capacity(file.events.len());
    let mut last = state.version;
    for frame in file.events {
        let (ev, by) = acceptor
            .event(Some(&frame.id.to_string()), &frame.data)
            .map_err(|e| format!("cached event {}: {e}", frame.id))?;
        if by == SignedBy::Next {
            acceptor.promote();
            promoted = true;
        }
        if ev.seq <= last {
            return Err(format!("cached event {} is out of order", ev.seq));
        }
        last = ev.seq;
        events.push((ev, frame));
    }
    Ok(Cached {
        promoted,
        last_seq: file.last_seq.max(last),
        state,
        envelope: file.state,
        events,
    })
}

#[cfg(test)]
mod tests {
    use plexsphere_wire::signed::SignContext;

    use plexsphere_wire::node::{Event, EventKind};

    use super::super::accept::tests::{acceptor, event_data, own, peer, signer, state};
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
        let e = load(&p, &acceptor()).unwrap_err();
        assert!(e.contains("cached event 9"), "{e}");
        save(&p, &env, &[frame], 9).unwrap();

        // a tampered cache is refused with the reason
        let text = std::fs::read_to_string(&p).unwrap();
        let tampered = text.replacen(&env.signature[..4], "AAAA", 1);
        std::fs::write(&p, tampered).unwrap();
        let e = load(&p, &acceptor()).unwrap_err();
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
            "peers": [{"id": super::super::accept::tests::peer_id(3), "name": "node-3", "addrs": ["10.64.1.3"]}]
        }))
        .unwrap();
        s.policy = Some(plexsphere_wire::node::PolicyState { version: 12, view });
        let env = signer().sign(SignContext::NodeState, &s).unwrap();
        save(&p, &env, &[], 7).unwrap();
        let c = load(&p, &acceptor()).unwrap().unwrap();
        assert_eq!(c.state.policy, s.policy);
        assert!(c.state.policy.is_some());
    }

    #[test]
    fn a_cache_signed_by_the_next_key_loads_and_promotes_and_the_old_key_is_refused_after() {
        use super::super::accept::tests::{key_of, keys, signer2};
        let with_next =
            Acceptor::with_keys(keys(&signer(), Some(key_of(&signer2(), 2))), own()).unwrap();
        // The state by the pinned key, then an event by the next key: loads, promoted.
        let env = signer()
            .sign(SignContext::NodeState, &state(7, vec![]))
            .unwrap();
        let by_next = |seq: u64| {
            let ev = Event {
                seq,
                node_id: own(),
                kind: EventKind::PeerAdded { peer: peer(4) },
            };
            serde_json::to_string(&signer2().sign(SignContext::Event, &ev).unwrap()).unwrap()
        };
        let frames = vec![CachedEvent {
            id: 8,
            data: by_next(8),
        }];
        let json = serde_json::to_vec(&CacheFile {
            version: 1,
            state: env.clone(),
            events: frames.clone(),
            last_seq: 8,
        })
        .unwrap();
        let c = decode(&json, &with_next).unwrap();
        assert!(c.promoted);
        assert!(
            decode(&json, &acceptor()).is_err(),
            "not without the announcement"
        );

        // An old-key event after a next-key one is refused, as it was when it arrived.
        let mut late = frames.clone();
        late.push(CachedEvent {
            id: 9,
            data: event_data(9, own(), EventKind::NodeRevoked),
        });
        let json = serde_json::to_vec(&CacheFile {
            version: 1,
            state: env.clone(),
            events: late,
            last_seq: 9,
        })
        .unwrap();
        let e = decode(&json, &with_next).unwrap_err();
        assert!(e.contains("cached event 9"), "{e}");

        // After a promotion at run time, a cache still signed by the old key is refused (the
        // daemon starts without it and pulls the state, which the promotion already asked
        // for): documented in docs/security.md.
        let mut promoted = with_next.clone();
        promoted.promote();
        let json = serde_json::to_vec(&CacheFile {
            version: 1,
            state: env,
            events: vec![],
            last_seq: 7,
        })
        .unwrap();
        let e = decode(&json, &promoted).unwrap_err();
        assert!(e.contains("signature"), "{e}");
        assert!(!decode(&json, &with_next).unwrap().promoted);
    }

    #[test]
    fn last_seq_is_never_below_the_state_version() {
        let env = signer()
            .sign(SignContext::NodeState, &state(7, vec![]))
            .unwrap();
        let json = serde_json::to_vec(&CacheFile {
            version: 1,
            state: env,
            events: vec![],
            last_seq: 2,
        })
        .unwrap();
        assert_eq!(decode(&json, &acceptor()).unwrap().last_seq, 7);
    }
}
