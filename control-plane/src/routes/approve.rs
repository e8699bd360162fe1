//! Auto-approval of routes and exits by the Domain's policy (`auto_approvers`, issue 27) and
//! the small reads the route operations share.

use ipnet::IpNet;
use plexsphere_policy::NodeApprovals;
use sqlx::{AnyConnection, Row as _};
use uuid::Uuid;

use crate::error::Error;
use crate::store::nodes::NodeRow;
use crate::store::routes::Kind;
use crate::store::{StoreError, policies};

/// `approved_by` of a row the policy approved.
pub(crate) const AUTO_APPROVER: &str = "policy auto_approvers";

/// What the Domain's policy auto-approves for one node, as of one report (resolved once
/// for all the report's rows).
pub(crate) struct AutoApprover {
    approvals: NodeApprovals,
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
        let (Some(policy), true) = (policy, wanted) else {
            return Ok(Self {
                approvals: NodeApprovals::default(),
            });
        };
        let inv = policies::inventory(conn, me.domain_id, 0).await?;
        let approvals = match inv.nodes.iter().find(|n| n.id == me.id) {
            Some(node) => NodeApprovals::of(&policy, &inv, node),
            // Not in the inventory (revoked meanwhile): nothing is approved.
            None => NodeApprovals::default(),
        };
        Ok(Self { approvals })
    }

    /// Whether the policy approves this node's route `cidr` (of `kind`).
    pub(crate) fn approves(&self, cidr: IpNet, kind: Kind) -> bool {
        let cidr = match kind {
            Kind::Route => Some(cidr),
            Kind::Exit => None,
        };
        self.approvals.approves(cidr)
    }
}

/// The exit a node named in its last report.
pub(crate) async fn use_exit_of(
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
