//! What `plexd status` shows of routes (`routes` in its JSON).

use serde::{Deserialize, Serialize};

use plexsphere_wire::routes::{Approval, RouterRole, ServedRoute};

/// One route this node advertises, with the control plane's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdvertisedStatus {
    pub cidr: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<String>,
    /// This node's own verdict (probe with hysteresis; no probe: healthy).
    pub healthy: bool,
    /// From the last answer to the report (`None` before the first).
    pub approval: Option<Approval>,
    pub role: Option<RouterRole>,
    #[serde(default)]
    pub reason: String,
}

/// `routes` of `plexd status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutesStatus {
    pub advertise: Vec<AdvertisedStatus>,
    /// Config routes left out (they overlap the mesh range).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<String>,
    pub exit: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_exit: Option<String>,
    /// Why `use_exit` is not in effect, as the control plane says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_exit_error: Option<String>,
    /// The exit's node id while its policy routing is in place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_in_use: Option<uuid::Uuid>,
    /// What the signed state says this node serves.
    #[serde(default)]
    pub serving: Vec<ServedRoute>,
    pub forwarding: bool,
    /// Prefixes routed through the mesh interface (`table:prefix` for the exit's table).
    #[serde(default)]
    pub via_mesh: Vec<String>,
    pub last_report_age_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// What the host refused when routes were applied last (one line each).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_errors: Vec<String>,
}

impl RoutesStatus {
    /// Lines for the human `plexd status` (none when routes are not used at all).
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        for a in &self.advertise {
            let role = a.role.map_or("not reported yet".to_owned(), |r| {
                format!("{r:?}").to_lowercase()
            });
            let approval = a.approval.map_or(String::new(), |a| {
                format!(", {}", format!("{a:?}").to_lowercase())
            });
            let health = if a.healthy { "healthy" } else { "unhealthy" };
            let reason = if a.reason.is_empty() {
                String::new()
            } else {
                format!(" ({})", a.reason)
            };
            out.push(format!(
                "route {}: {role}{approval}, {health}{reason}",
                a.cidr
            ));
        }
        for r in &self.refused {
            out.push(format!("route refused: {r}"));
        }
        if self.exit {
            out.push("exit: offered".to_owned());
        }
        if let Some(e) = &self.use_exit {
            let state = match (&self.exit_in_use, &self.use_exit_error) {
                (Some(_), _) => "in use".to_owned(),
                (None, Some(err)) => format!("not in effect: {err}"),
                (None, None) => "waiting for the control plane".to_owned(),
            };
            out.push(format!("use exit {e}: {state}"));
        }
        if !self.via_mesh.is_empty() {
            out.push(format!("routes via the mesh: {}", self.via_mesh.join(", ")));
        }
        if self.forwarding {
            out.push(format!(
                "forwarding for {} served route(s)",
                self.serving.len()
            ));
        }
        if let Some(e) = &self.last_error {
            out.push(format!("route report failing: {e}"));
        }
        for e in &self.host_errors {
            out.push(format!("routes on this host: {e}"));
        }
        out
    }
}
