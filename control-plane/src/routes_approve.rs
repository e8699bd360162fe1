//! Auto-approval of routes and exits by the Domain's policy (`auto_approvers`, issue 27) and
//! the small reads the route operations share.

use ipnet::IpNet;
use plexsphere_policy::{NodeInfo, Policy};
use sqlx::{AnyConnection, Row as _};
use uuid::Uuid;

use crate::error::Error;
use crate::routes_select::Kind;
use crate::store::nodes::NodeRow;
use crate::store::{StoreError, policies};

/// `approved_by` of a row the policy approved.
pub const AUTO_APPROVER: &str = "policy auto_approvers";

/// The Domain's policy and inventory as of one report, for one node's rows.
pub struct AutoApprover {
    policy: Option<Policy>,
    inv: plexsphere_policy::Inventory,
    node: Option<NodeInfo>,
}

impl AutoApprover {
    /// Reads the Domain's current document (only its `auto_approvers` matter here). A
    /// document without any approves nothing, and costs no inventory read.
    pub async fn load(conn: &mut AnyConnection, me: &NodeRow) -> Result<Self, Error> {
        let row = policies::current_or_default(conn, me.domain_id).await?;
        let policy = plexsphere_policy::parse(&row.document).ok();
        let wanted = policy.as_ref().is_some_and(|p| {
            !p.auto_approvers.routes.is_empty() || !p.auto_approvers.exit.is_empty()
        });
        if !wanted {
            return Ok(Self {
                policy: None,
                inv: Default::default(),
                node: None,
            });
        }
        let inv = policies::inventory(conn, me.domain_id, 0).await?;
        let node = inv.nodes.iter().find(|n| n.id == me.id).cloned();
        Ok(Self { policy, inv, node })
    }

    /// Whether the policy approves this node's route `cidr` (of `kind`).
    pub fn approves(&self, cidr: IpNet, kind: Kind) -> bool {
        let (Some(policy), Some(node)) = (&self.policy, &self.node) else {
            return false;
        };
        let cidr = match kind {
            Kind::Route => Some(cidr),
            Kind::Exit => None,
        };
        plexsphere_policy::auto_approves(policy, &self.inv, node, cidr)
    }
}

/// The exit a node named in its last report.
pub async fn use_exit_of(
    conn: &mut AnyConnection,
    node: Uuid,
) -> Result<Option<String>, StoreError> {
    let row = sqlx::query("SELECT use_exit FROM nodes WHERE id = $1")
        .bind(node.to_string())
        .fetch_optional(&mut *conn)
        .await?;
    Ok(match row {
        Some(r) => r.try_get("use_exit")?,
        None => None,
    })
}
