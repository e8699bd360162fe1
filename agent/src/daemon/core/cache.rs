//! The cache file's shape (`<state_dir>/state.json`): the last good signed state envelope,
//! the signed events applied on top of it since, and the last applied seq; and [`decode`],
//! which verifies it all again (a cache never bypasses the signature check). Replaying the
//! cached events makes a restart resume exactly where the node was, with `Last-Event-ID` =
//! the last applied seq. Reading and writing the file is the shell's (`daemon/cache.rs`).

use std::path::PathBuf;

use plexsphere_wire::node::{Event, NodeState};
use plexsphere_wire::signed::SignedEnvelope;
use serde::{Deserialize, Serialize};

use super::accept::{Acceptor, SignedBy};
use crate::fsutil::FsError;

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

/// Why the cache file could not be used at start. The core logs it and starts without the
/// cache: the control plane's state replaces it once the API answers.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The file is there but could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Its mode could not be read or set to 0600.
    #[error(transparent)]
    Private(#[from] FsError),
    /// It was read but refused: another cache version, not JSON, or a document or event that
    /// does not verify ([`decode`] says which).
    #[error("the cached state {} is refused: {reason}", path.display())]
    Refused { path: PathBuf, reason: String },
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

    use super::super::accept_fixtures::{acceptor, event_data, own, peer, signer, state};
    use super::*;

    #[test]
    fn a_cache_signed_by_the_next_key_loads_and_promotes_and_the_old_key_is_refused_after() {
        use super::super::accept_fixtures::{key_of, keys, signer2};
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
