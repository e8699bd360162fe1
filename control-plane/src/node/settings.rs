//! What an operator sets on one node that its signed state carries: the UDP GSO/GRO switch
//! (`PUT /v1/nodes/{id}/udp-offload`, `plexctl node set ID --udp-offload off`).
//!
//! A change is one transaction: the column, and a `resync` event addressed to the node alone
//! (its peers' states do not change), so the node pulls its new signed state at once; an
//! older node does the same and ignores the field it does not know.

use plexsphere_wire::node::{EventKind, UdpOffload};
use uuid::Uuid;

use crate::error::Error;
use crate::node::ops::NodeOps;
use crate::store::nodes::NodeRow;
use crate::store::{self, StoreError, events, nodes};

/// The reason the node's stream gives for the pull.
pub const UDP_OFFLOAD_RESYNC: &str = "the operator changed this node's UDP offload setting";

impl NodeOps<'_> {
    /// Sets `node_id`'s UDP GSO/GRO switch (`None`: the node's default). Answers the node as it
    /// is now, `None` when there is no live node with that id.
    pub(crate) async fn set_udp_offload(
        &self,
        node_id: Uuid,
        setting: Option<UdpOffload>,
        now: i64,
    ) -> Result<Option<NodeRow>, Error> {
        let done = store::retry("set udp offload", Error::is_lost_race, || {
            self.udp_offload_attempt(node_id, setting, now)
        })
        .await?;
        let Some((node, seq)) = done else {
            return Ok(None);
        };
        if let Some(seq) = seq {
            tracing::info!(node_id = %node.id, udp_offload = setting.map_or("default", UdpOffload::as_str), seq, "the node's UDP offload setting changed; it pulls its new state");
            self.bus.notify(node.domain_id, seq);
        }
        Ok(Some(node))
    }

    async fn udp_offload_attempt(
        &self,
        node_id: Uuid,
        setting: Option<UdpOffload>,
        now: i64,
    ) -> Result<Option<(NodeRow, Option<u64>)>, Error> {
        let mut tx = self.store.begin().await?;
        let Some(before) = nodes::get(&mut tx, node_id).await? else {
            return Ok(None);
        };
        if before.revoked_at.is_some() {
            return Ok(None);
        }
        if before.udp_offload == setting {
            return Ok(Some((before, None)));
        }
        if !nodes::set_udp_offload(&mut tx, node_id, setting).await? {
            return Ok(None);
        }
        let resync = EventKind::Resync {
            reason: UDP_OFFLOAD_RESYNC.to_owned(),
        };
        let seq = events::append(
            &mut tx,
            before.domain_id,
            Some(node_id),
            node_id,
            &resync,
            now,
        )
        .await?;
        tx.commit().await.map_err(StoreError::from)?;
        let node = NodeRow {
            udp_offload: setting,
            ..before
        };
        Ok(Some((node, Some(seq))))
    }
}
