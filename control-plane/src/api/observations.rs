//! `GET /v1/nodes/{node_id}/observations` (operator): what a node reported through ingest,
//! newest first, with the count of observations the node dropped before sending.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use plexsphere_wire::admin::{ObservationList, ObservationView};
use plexsphere_wire::node::{IngestBatch, ObservationKind};
use serde::Deserialize;

use super::extract::{Operator, UuidPath};
use super::state::AppState;
use crate::error::Error;
use crate::store::observations::{self, KEEP_PER_NODE, Kind};
use crate::store::{StoreError, from_unix};

/// Observations answered when `?limit=` is not given.
pub(crate) const DEFAULT_LIMIT: u32 = 50;
/// The largest `?limit=`: everything the server keeps for a node.
pub(crate) const MAX_LIMIT: u32 = KEEP_PER_NODE as u32;

/// The longest `message` of an `error` observation, in bytes (the whole batch is bounded by
/// the node routes' body limit, 256 KiB, and `api::node::MAX_OBSERVATIONS`).
pub(crate) const MAX_ERROR_MESSAGE_BYTES: usize = 4096;

/// Pure: refuses a batch with an over-long field (400 `invalid_request`, naming the
/// observation and the limit) before anything of it is stored.
pub(crate) fn check_batch(batch: &IngestBatch) -> Result<(), Error> {
    for (i, obs) in batch.observations.iter().enumerate() {
        if let ObservationKind::Error { message } = &obs.kind
            && message.len() > MAX_ERROR_MESSAGE_BYTES
        {
            return Err(Error::BadRequest(format!(
                "observation {i} is an error whose message has {} bytes; at most {MAX_ERROR_MESSAGE_BYTES} are taken (shorten it; nothing of this batch was stored)",
                message.len()
            )));
        }
    }
    Ok(())
}

#[derive(Debug, Deserialize)]
pub(crate) struct ObservationQuery {
    limit: Option<String>,
    kind: Option<String>,
}

/// Pure: the checked `limit` and `kind` query parameters.
pub(crate) fn parse_query(
    limit: Option<&str>,
    kind: Option<&str>,
) -> Result<(u32, Option<Kind>), Error> {
    let limit = match limit {
        None => DEFAULT_LIMIT,
        Some(raw) => match raw.parse::<u32>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => n,
            _ => {
                return Err(Error::BadRequest(format!(
                    "the query parameter limit must be a whole number from 1 to {MAX_LIMIT}, not {raw:?}"
                )));
            }
        },
    };
    let kind = kind
        .map(|raw| {
            Kind::parse(raw).ok_or_else(|| {
                Error::BadRequest(format!(
                    "the query parameter kind must be handshake, traffic or error, not {raw:?}"
                ))
            })
        })
        .transpose()?;
    Ok((limit, kind))
}

pub async fn list(
    State(st): State<Arc<AppState>>,
    op: Operator,
    UuidPath(id): UuidPath,
    query: Result<Query<ObservationQuery>, QueryRejection>,
) -> Result<Json<ObservationList>, Error> {
    let Query(q) = query.map_err(|e| Error::BadRequest(format!("bad query string: {e}")))?;
    let (limit, kind) = parse_query(q.limit.as_deref(), q.kind.as_deref())?;
    let mut conn = st.store.acquire().await?;
    super::operator::require_node(&mut conn, &op, id).await?;
    let dropped = observations::dropped(&mut conn, id).await?.ok_or_else(|| {
        Error::NotFound(format!(
            "no node with id {id}; `plexctl node list` shows them"
        ))
    })?;
    let items = observations::list(&mut conn, id, kind, limit)
        .await?
        .into_iter()
        .map(|r| {
            Ok(ObservationView {
                received_at: from_unix("observations.received_at", r.received_at)?,
                at: r.observation.at,
                kind: r.observation.kind,
            })
        })
        .collect::<Result<_, StoreError>>()?;
    Ok(Json(ObservationList {
        node_id: id,
        dropped,
        items,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(limit: Option<&str>, kind: Option<&str>) -> String {
        match parse_query(limit, kind) {
            Err(Error::BadRequest(m)) => m,
            other => panic!("expected a 400, got {other:?}"),
        }
    }

    #[test]
    fn an_error_message_is_bounded() {
        let batch = |len: usize| -> IngestBatch {
            serde_json::from_value(serde_json::json!({
                "batch_id": "019a0816-0000-7000-8000-0000000000aa",
                "dropped": 0,
                "observations": [
                    {"at": 1, "type": "error", "message": "ok"},
                    {"at": 2, "type": "error", "message": "x".repeat(len)},
                ],
            }))
            .unwrap()
        };
        assert!(check_batch(&batch(MAX_ERROR_MESSAGE_BYTES)).is_ok());
        match check_batch(&batch(MAX_ERROR_MESSAGE_BYTES + 1)) {
            Err(Error::BadRequest(m)) => {
                assert!(m.contains("observation 1") && m.contains("4096"), "{m}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_query_has_defaults_and_bounds() {
        assert_eq!(parse_query(None, None).unwrap(), (50, None));
        assert_eq!(
            parse_query(Some("500"), Some("traffic")).unwrap(),
            (500, Some(Kind::Traffic))
        );
        assert_eq!(parse_query(Some("1"), None).unwrap().0, 1);
        for bad in ["0", "501", "-1", "ten", ""] {
            let m = refusal(Some(bad), None);
            assert!(m.contains("limit") && m.contains("1 to 500"), "{m}");
        }
        let m = refusal(None, Some("Handshake"));
        assert!(m.contains("kind") && m.contains("\"Handshake\""), "{m}");
    }
}
