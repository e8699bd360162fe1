//! Renaming a node and setting a Domain's DNS suffix (issue 27), one transaction each.
//!
//! A change appends ONE Domain `resync` event (no target, the nil subject): every node of
//! the Domain pulls its new signed state, where the name is (`PeerSpec::dns_name`,
//! `NodeState::dns`). A `peer_updated` per node is not enough: a router's allowed IPs differ
//! from one receiver to the next (each sees the route prefixes the policy grants it), so
//! one spec cannot be sent to all. Renames and suffix changes are rare operator actions.

use plexsphere_wire::node::EventKind;
use plexsphere_wire::routes::{check_label, check_suffix};
use uuid::Uuid;

use crate::bus::EventBus;
use crate::error::Error;
use crate::store::nodes::{self, NodeRow};
use crate::store::{self, Store, StoreError, events, names};

/// The name and suffix operations over one store and bus.
pub(crate) struct NameOps<'a> {
    pub store: &'a Store,
    pub bus: &'a dyn EventBus,
}

/// What a rename did.
#[derive(Debug)]
pub(crate) enum Renamed {
    /// No live node with that id.
    NoNode,
    /// The node as it is now.
    Done(Box<NodeRow>),
}

impl NameOps<'_> {
    /// Renames a live node. `name` must pass [`check_label`] (`422 invalid_request`); a name
    /// another live node of the Domain holds is `409 name_taken`. The same name is a no-op.
    pub async fn rename(&self, node_id: Uuid, name: &str, now: i64) -> Result<Renamed, Error> {
        check_label(name).map_err(|e| Error::Invalid(e.to_string()))?;
        let done = store::retry("rename node", Error::is_lost_race, || {
            self.rename_attempt(node_id, name, now)
        })
        .await;
        let done = match done {
            // A concurrent rename or registration took the name between check and write.
            Err(Error::Store(e)) if e.is_unique_violation() => {
                return Err(taken(name, None));
            }
            other => other?,
        };
        let Some((node, seq)) = done else {
            return Ok(Renamed::NoNode);
        };
        if let Some(seq) = seq {
            tracing::info!(node_id = %node.id, name = %node.dns_name, seq, "node renamed; every node of the Domain pulls its new state");
            self.bus.notify(node.domain_id, seq);
        }
        Ok(Renamed::Done(Box::new(node)))
    }

    async fn rename_attempt(
        &self,
        node_id: Uuid,
        name: &str,
        now: i64,
    ) -> Result<Option<(NodeRow, Option<u64>)>, Error> {
        let mut tx = self.store.begin().await?;
        let Some(before) = nodes::get(&mut tx, node_id).await? else {
            return Ok(None);
        };
        if before.revoked_at.is_some() {
            return Ok(None);
        }
        if before.dns_name == name {
            return Ok(Some((before, None)));
        }
        if let Some(other) = names::holder(&mut tx, before.domain_id, name, node_id).await? {
            return Err(taken(name, Some(other)));
        }
        if !names::set_name(&mut tx, node_id, name).await? {
            return Ok(None);
        }
        let resync = EventKind::Resync {
            reason: format!("node {node_id} renamed to {name}"),
        };
        let seq =
            events::append(&mut tx, before.domain_id, None, Uuid::nil(), &resync, now).await?;
        tx.commit().await.map_err(StoreError::from)?;
        let node = NodeRow {
            dns_name: name.to_owned(),
            ..before
        };
        Ok(Some((node, Some(seq))))
    }

    /// Sets a Domain's DNS suffix ([`check_suffix`], `422 invalid_request`); answers false
    /// when the Domain does not exist. The same suffix is a no-op.
    pub(crate) async fn set_suffix(
        &self,
        domain: Uuid,
        suffix: &str,
        now: i64,
    ) -> Result<bool, Error> {
        check_suffix(suffix).map_err(Error::Invalid)?;
        let done = store::retry("set dns suffix", Error::is_lost_race, || async {
            let mut tx = self.store.begin().await?;
            if names::suffix(&mut tx, domain).await? == suffix {
                return Ok::<_, Error>(Some(None));
            }
            if !names::set_suffix(&mut tx, domain, suffix).await? {
                return Ok(None);
            }
            let resync = EventKind::Resync {
                reason: format!("the Domain's DNS suffix is now {suffix}"),
            };
            let seq = events::append(&mut tx, domain, None, Uuid::nil(), &resync, now).await?;
            tx.commit().await.map_err(StoreError::from)?;
            Ok(Some(Some(seq)))
        })
        .await?;
        match done {
            None => Ok(false),
            Some(seq) => {
                if let Some(seq) = seq {
                    tracing::info!(domain_id = %domain, suffix, seq, "DNS suffix changed; every node of the Domain pulls its new state");
                    self.bus.notify(domain, seq);
                }
                Ok(true)
            }
        }
    }
}

fn taken(name: &str, by: Option<Uuid>) -> Error {
    let by = by.map_or_else(|| "another live node".to_owned(), |id| format!("node {id}"));
    Error::NameTaken(format!(
        "the name {name:?} is taken by {by} in this Domain; pick another (`plexctl node list` shows the names)"
    ))
}
