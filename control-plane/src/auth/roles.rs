//! Roles (sans-IO): admin, auditor and member on the platform, a Domain or a Project; what
//! each allows for a route's [`Need`]; how an operator token maps onto them.

use plexsphere_wire::admin::OperatorScope;
use serde::Serialize;
use uuid::Uuid;

/// What a route needs of its caller (the route table names it, `api::mod`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Need {
    /// Reads.
    Read,
    /// Day-to-day changes: tokens, nodes, resources, tags, names, routes.
    Operate,
    /// What manages access or global configuration.
    Admin,
    /// Reading the audit log.
    Audit,
}

impl Need {
    pub fn as_str(self) -> &'static str {
        match self {
            Need::Read => "read",
            Need::Operate => "operate",
            Need::Admin => "admin",
            Need::Audit => "audit",
        }
    }

    /// The operator-token scope that has always been needed for this (tokens behave as
    /// before: read-only < operator < admin; the audit log is read-only's).
    pub fn token_scope(self) -> OperatorScope {
        match self {
            Need::Read | Need::Audit => OperatorScope::ReadOnly,
            Need::Operate => OperatorScope::Operator,
            Need::Admin => OperatorScope::Admin,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Admin,
    Auditor,
    Member,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Auditor => "auditor",
            Role::Member => "member",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "admin" => Some(Role::Admin),
            "auditor" => Some(Role::Auditor),
            "member" => Some(Role::Member),
            _ => None,
        }
    }

    /// Admin: everything; member: reads and operates; auditor: reads and the audit log.
    pub fn allows(self, need: Need) -> bool {
        match self {
            Role::Admin => true,
            Role::Member => matches!(need, Need::Read | Need::Operate),
            Role::Auditor => matches!(need, Need::Read | Need::Audit),
        }
    }

    /// The role an operator token of `scope` has: read-only -> auditor, operator -> member,
    /// admin -> admin.
    pub fn of_token(scope: OperatorScope) -> Self {
        match scope {
            OperatorScope::ReadOnly => Role::Auditor,
            OperatorScope::Operator => Role::Member,
            OperatorScope::Admin => Role::Admin,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RoleScope {
    Platform,
    Domain(Uuid),
    Project(Uuid),
}

impl RoleScope {
    pub fn kind(self) -> &'static str {
        match self {
            RoleScope::Platform => "platform",
            RoleScope::Domain(_) => "domain",
            RoleScope::Project(_) => "project",
        }
    }

    pub fn id(self) -> Option<Uuid> {
        match self {
            RoleScope::Platform => None,
            RoleScope::Domain(d) | RoleScope::Project(d) => Some(d),
        }
    }

    /// From the stored `(scope_kind, scope_id)`.
    pub fn parse(kind: &str, id: &str) -> Option<Self> {
        match kind {
            "platform" => Some(RoleScope::Platform),
            "domain" => Uuid::parse_str(id).ok().map(RoleScope::Domain),
            "project" => Uuid::parse_str(id).ok().map(RoleScope::Project),
            _ => None,
        }
    }
}

/// One role on one scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RoleGrant {
    pub role: Role,
    pub scope: RoleScope,
}

impl RoleGrant {
    /// An operator token's grant: its role on its project, or on the platform.
    pub fn of_token(scope: OperatorScope, project: Option<Uuid>) -> Self {
        RoleGrant {
            role: Role::of_token(scope),
            scope: project.map_or(RoleScope::Platform, RoleScope::Project),
        }
    }

    /// The JSON of whoami: `{"role":"admin","scope":{"kind":"platform","id":null}}`.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "role": self.role.as_str(),
            "scope": { "kind": self.scope.kind(), "id": self.scope.id() },
        })
    }
}

/// What a caller reaches for one need: everything, or some Domains (with all their projects)
/// and some Projects.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reach {
    pub all: bool,
    pub domains: Vec<Uuid>,
    pub projects: Vec<Uuid>,
}

impl Reach {
    /// The reach of `grants` for `need`.
    pub(crate) fn of(grants: &[RoleGrant], need: Need) -> Self {
        let mut r = Reach::default();
        for g in grants.iter().filter(|g| g.role.allows(need)) {
            match g.scope {
                RoleScope::Platform => r.all = true,
                RoleScope::Domain(d) if !r.domains.contains(&d) => r.domains.push(d),
                RoleScope::Project(p) if !r.projects.contains(&p) => r.projects.push(p),
                _ => {}
            }
        }
        r
    }

    pub fn is_empty(&self) -> bool {
        !self.all && self.domains.is_empty() && self.projects.is_empty()
    }
}

/// Whether `grants` let their holder bind `role` on `scope`: a platform admin binds
/// anything; a Domain admin binds on its Domain and that Domain's projects
/// (`project_domain`: the Domain of the scope's project, when it is one).
pub(crate) fn may_bind(
    grants: &[RoleGrant],
    scope: RoleScope,
    project_domain: Option<Uuid>,
) -> bool {
    grants.iter().any(|g| {
        g.role == Role::Admin
            && match (g.scope, scope) {
                (RoleScope::Platform, _) => true,
                (RoleScope::Domain(d), RoleScope::Domain(s)) => d == s,
                (RoleScope::Domain(d), RoleScope::Project(_)) => project_domain == Some(d),
                _ => false,
            }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_allow_what_the_design_says() {
        assert!(Role::Admin.allows(Need::Admin) && Role::Admin.allows(Need::Audit));
        assert!(Role::Member.allows(Need::Operate) && !Role::Member.allows(Need::Admin));
        assert!(!Role::Member.allows(Need::Audit));
        assert!(Role::Auditor.allows(Need::Audit) && !Role::Auditor.allows(Need::Operate));
    }

    #[test]
    fn tokens_map_onto_roles_on_their_project_or_the_platform() {
        let p = Uuid::from_u128(7);
        assert_eq!(
            RoleGrant::of_token(OperatorScope::Operator, Some(p)),
            RoleGrant {
                role: Role::Member,
                scope: RoleScope::Project(p)
            }
        );
        assert_eq!(
            RoleGrant::of_token(OperatorScope::ReadOnly, None),
            RoleGrant {
                role: Role::Auditor,
                scope: RoleScope::Platform
            }
        );
    }

    #[test]
    fn only_admins_bind_and_a_domain_admin_only_in_its_domain() {
        let (d1, d2, p) = (Uuid::from_u128(1), Uuid::from_u128(2), Uuid::from_u128(3));
        let dom_admin = [RoleGrant {
            role: Role::Admin,
            scope: RoleScope::Domain(d1),
        }];
        assert!(may_bind(&dom_admin, RoleScope::Domain(d1), None));
        assert!(may_bind(&dom_admin, RoleScope::Project(p), Some(d1)));
        assert!(!may_bind(&dom_admin, RoleScope::Project(p), Some(d2)));
        assert!(!may_bind(&dom_admin, RoleScope::Platform, None));
        let member = [RoleGrant {
            role: Role::Member,
            scope: RoleScope::Platform,
        }];
        assert!(!may_bind(&member, RoleScope::Domain(d1), None));
    }

    #[test]
    fn reach_follows_the_need() {
        let p = Uuid::from_u128(3);
        let g = [
            RoleGrant {
                role: Role::Auditor,
                scope: RoleScope::Platform,
            },
            RoleGrant {
                role: Role::Member,
                scope: RoleScope::Project(p),
            },
        ];
        assert!(Reach::of(&g, Need::Read).all);
        let op = Reach::of(&g, Need::Operate);
        assert!(!op.all && op.projects == vec![p]);
        assert!(Reach::of(&g, Need::Admin).is_empty());
    }
}
