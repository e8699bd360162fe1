//! The resource as the API answers it (`plexctl resource get --output json`), and the names the
//! broker derives from its id.
//!
//! ```json
//! {"id":"…","project_id":"…","kind":"node","origin":"provisioned",
//!  "blueprint_version_id":"…","cloud_credential_id":"…","parameters":{…},
//!  "provisioning":{"phase":"Ready","reason":null,"observed_at":"…",
//!                  "history":[{"phase":"Pending","observed":"…","at":"…"},…]},
//!  "node_id":"…","created_at":"…"}
//! ```
//! The tutorial reads `.provisioning.phase` with jq.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::blueprint::Class;
use crate::phase::{Observation, Outcome, Provisioning};

/// How a resource came to be. Only `provisioned` (by the broker) exists today.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    Provisioned,
}

/// A provisioned resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resource {
    pub id: Uuid,
    pub project_id: Uuid,
    /// The `--kind` it was created with (the blueprint's `resource_kind`).
    pub kind: String,
    pub origin: Origin,
    pub blueprint_version_id: Uuid,
    pub cloud_credential_id: Uuid,
    /// The resolved parameters (defaults applied).
    pub parameters: Map<String, Value>,
    pub provisioning: Provisioning,
    /// The node that registered with the resource's token (machines, once Ready).
    pub node_id: Option<Uuid>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

impl Resource {
    /// A resource whose declaration was accepted at `now`: phase Pending.
    pub fn new(
        id: Uuid,
        project_id: Uuid,
        kind: String,
        blueprint_version_id: Uuid,
        cloud_credential_id: Uuid,
        parameters: Map<String, Value>,
        now: OffsetDateTime,
    ) -> Self {
        Self {
            id,
            project_id,
            kind,
            origin: Origin::Provisioned,
            blueprint_version_id,
            cloud_credential_id,
            parameters,
            provisioning: Provisioning::new(now),
            node_id: None,
            created_at: now,
        }
    }

    /// Applies an observation; a registration that moves the phase records the node.
    pub fn observe(&mut self, class: Class, obs: &Observation, at: OffsetDateTime) -> Outcome {
        let out = self.provisioning.observe(class, obs, at);
        if let (Outcome::Moved { .. }, Observation::NodeRegistered { node_id }) = (&out, obs) {
            self.node_id = Some(*node_id);
        }
        out
    }

    /// The name of everything composed for it: `pr-<resource id>`. Also the node's
    /// `registration.resource_handle`.
    pub fn composed_name(&self) -> String {
        composed_name(self.id)
    }
}

/// `pr-<resource id>`.
pub fn composed_name(resource_id: Uuid) -> String {
    format!("pr-{resource_id}")
}

/// The Project's namespace on a management cluster: `plexsphere-project-<project id>`.
pub fn project_namespace(project_id: Uuid) -> String {
    format!("plexsphere-project-{project_id}")
}

#[cfg(test)]
mod tests {
    use time::macros::datetime;

    use super::*;
    use crate::phase::Phase;

    #[test]
    fn json_shape_is_pinned() {
        let t0 = datetime!(2026-11-30 14:31:02 UTC);
        let id = Uuid::from_u128(0x019fb9d7_fb6c_7681_a082_07407e041cc0);
        let project = Uuid::from_u128(0x019a0816_0000_7000_8000_000000000001);
        let cred = Uuid::from_u128(0x019a0816_0000_7000_8000_0000000000cc);
        let bp = crate::blueprint::version_id("local-bucket", "v1");
        let mut params = Map::new();
        params.insert("region".into(), Value::String("us-east-1".into()));
        let mut r = Resource::new(id, project, "bucket".into(), bp, cred, params, t0);
        r.observe(
            Class::Standalone,
            &Observation::SubstrateAccepted,
            datetime!(2026-11-30 14:31:12 UTC),
        );
        let json = serde_json::to_string(&r).unwrap();
        let want = format!(
            concat!(
                r#"{{"id":"019fb9d7-fb6c-7681-a082-07407e041cc0","project_id":"019a0816-0000-7000-8000-000000000001","#,
                r#""kind":"bucket","origin":"provisioned","blueprint_version_id":"{bp}","#,
                r#""cloud_credential_id":"019a0816-0000-7000-8000-0000000000cc","parameters":{{"region":"us-east-1"}},"#,
                r#""provisioning":{{"phase":"Provisioning","reason":null,"observed_at":"2026-11-30T14:31:12Z","history":["#,
                r#"{{"phase":"Pending","observed":"the declaration was accepted","at":"2026-11-30T14:31:02Z"}},"#,
                r#"{{"phase":"Provisioning","observed":"the substrate accepted the composite","at":"2026-11-30T14:31:12Z"}}]}},"#,
                r#""node_id":null,"created_at":"2026-11-30T14:31:02Z"}}"#
            ),
            bp = bp
        );
        assert_eq!(json, want);
        let back: Resource = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r);
        let v: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["provisioning"]["phase"], "Provisioning");
        assert_eq!(r.composed_name(), "pr-019fb9d7-fb6c-7681-a082-07407e041cc0");
        assert_eq!(
            project_namespace(project),
            "plexsphere-project-019a0816-0000-7000-8000-000000000001"
        );
    }

    #[test]
    fn node_id_is_recorded_only_when_the_registration_moves_the_phase() {
        let t0 = datetime!(2026-11-30 14:31:02 UTC);
        let n = Uuid::from_u128(7);
        let mut r = Resource::new(
            Uuid::from_u128(1),
            Uuid::from_u128(2),
            "node".into(),
            Uuid::from_u128(3),
            Uuid::from_u128(4),
            Map::new(),
            t0,
        );
        r.observe(
            Class::Machine,
            &Observation::NodeRegistered { node_id: n },
            t0,
        );
        assert_eq!(r.node_id, None);
        r.observe(Class::Machine, &Observation::SubstrateAccepted, t0);
        r.observe(Class::Machine, &Observation::MachineBooted, t0);
        r.observe(
            Class::Machine,
            &Observation::NodeRegistered { node_id: n },
            t0,
        );
        assert_eq!((r.provisioning.phase, r.node_id), (Phase::Ready, Some(n)));
    }
}
