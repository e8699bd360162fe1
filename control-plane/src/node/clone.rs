//! Clone detection: one node credential used from two hosts.
//!
//! plexd sends its host fingerprint (`Plexd-Host`, see `plexsphere_wire::host`) with every
//! authenticated request. The first one the control plane sees binds the node to that host;
//! a request with the same credential and another fingerprint, or with none once the node is
//! bound, comes from a copy of the node's state directory (a golden image made after
//! enrolment) and is refused with 409 `clone_refused`. The refusal is recorded on the node
//! (for `plexctl node get`) at most once every [`RECORD_EVERY_SECS`] per node, and nothing
//! else changes: the original's credential, peers, state and last-seen time stay as they are.
//!
//! | bound | sent   | verdict |
//! |-------|--------|---------|
//! | none  | none   | [`Verdict::Legacy`]: a plexd from before host binding, served as before |
//! | none  | F      | [`Verdict::Bind`]: the first host binds the node |
//! | F     | F      | [`Verdict::Same`] |
//! | F     | G      | [`Verdict::Clone`] |
//! | F     | none   | [`Verdict::Clone`]: a bound node's plexd always sends it; an old or tampered binary is refused |

use std::net::IpAddr;

use plexsphere_wire::host::HostFingerprint;
use sqlx::AnyConnection;
use uuid::Uuid;

use crate::error::Error;
use crate::store::nodes::hosts;

/// At most one clone record write per node in this many seconds; refusals in between are
/// refused all the same, only not counted.
pub const RECORD_EVERY_SECS: i64 = 5;

/// What to do with a node's request, by the fingerprint it is bound to and the one it sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Legacy,
    Bind(HostFingerprint),
    Same,
    Clone,
}

/// The table above. Pure.
pub(crate) fn judge(bound: Option<&HostFingerprint>, sent: Option<&HostFingerprint>) -> Verdict {
    match (bound, sent) {
        (None, None) => Verdict::Legacy,
        (None, Some(f)) => Verdict::Bind(*f),
        (Some(b), Some(f)) if b == f => Verdict::Same,
        (Some(_), _) => Verdict::Clone,
    }
}

/// The refusal the copy's plexd reads (and prints).
pub(crate) fn refusal(node_id: Uuid) -> Error {
    Error::CloneRefused(format!(
        "node {node_id}'s credential is bound to another host: this request came from a copy of its state directory (copied? golden image?); on this host remove plexd's state directory and enrol it with its own bootstrap token (plexd join); the original host keeps working"
    ))
}

/// Lets the request through, binds the node to its first host, or refuses (and records) a
/// request from another host. Runs after the credential was checked, with the fingerprint
/// the node's row (just read) is bound to.
pub(crate) async fn check(
    conn: &mut AnyConnection,
    node_id: Uuid,
    bound: Option<&HostFingerprint>,
    sent: Option<&HostFingerprint>,
    client: IpAddr,
    now: i64,
) -> Result<(), Error> {
    let verdict = match judge(bound, sent) {
        Verdict::Bind(f) => {
            // Two hosts may race to be first: whichever bound it decides.
            let now_bound = hosts::bind(conn, node_id, &f, now)
                .await?
                .ok_or(Error::Unauthorized(GONE))?;
            if now_bound == f {
                tracing::info!(node_id = %node_id, client = %client, host = %f, "node bound to its host (the first host fingerprint it sent)");
            }
            judge(Some(&now_bound), sent)
        }
        v => v,
    };
    if verdict != Verdict::Clone {
        return Ok(());
    }
    let addr = client.to_string();
    if hosts::record_clone(conn, node_id, &addr, sent, now, RECORD_EVERY_SECS).await? {
        let host = sent.map_or_else(|| "none".to_owned(), HostFingerprint::to_hex);
        tracing::warn!(node_id = %node_id, client = %client, host = %host, "refused node {node_id}'s credential from another host than the one it is bound to (clone_refused); its state directory was copied; the original keeps working");
    }
    Err(refusal(node_id))
}

const GONE: &str =
    "this node no longer exists (deleted); register it again with a fresh bootstrap token";

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(b: u8) -> HostFingerprint {
        HostFingerprint::from_bytes([b; 32])
    }

    #[test]
    fn the_table_row_for_row() {
        assert_eq!(judge(None, None), Verdict::Legacy);
        assert_eq!(judge(None, Some(&fp(1))), Verdict::Bind(fp(1)));
        assert_eq!(judge(Some(&fp(1)), Some(&fp(1))), Verdict::Same);
        assert_eq!(judge(Some(&fp(1)), Some(&fp(2))), Verdict::Clone);
        assert_eq!(judge(Some(&fp(1)), None), Verdict::Clone);
    }

    #[test]
    fn the_refusal_says_what_to_do() {
        let e = refusal(Uuid::from_u128(7));
        let (status, code) = crate::api::error::classify(&e);
        assert_eq!((status.as_u16(), code), (409, "clone_refused"));
        let msg = e.to_string();
        assert!(
            msg.contains("remove plexd's state directory") && msg.contains("plexd join"),
            "{msg}"
        );
    }
}
