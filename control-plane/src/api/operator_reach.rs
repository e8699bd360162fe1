//! The operator a route is called by ([`Operator`]: by token or session, with what the route
//! needs and what its roles reach) and the checks handlers make with it: a project, a Domain,
//! the whole platform. `api::operator_auth` makes one; `api::extract` re-exports these types.

use plexsphere_wire::admin::OperatorScope;
use uuid::Uuid;

use crate::auth::roles::{Need, Reach, RoleGrant};
use crate::error::Error;

/// What a route needs of its caller ([`Need`]). The router (`api::routes`) attaches it to
/// every operator route from its one route table; a route without it is refused (500),
/// never served unchecked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteScope(pub Need);

/// How the caller authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// An operator token (`pxop_...`).
    Token,
    /// A person's session (cookie or `pxss_...`); `session_id` is the public id.
    Session { session_id: String },
}

/// The person behind a session, as the issuer's ID token named them at sign-in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Person {
    pub issuer: String,
    pub subject: String,
    pub email: Option<String>,
    pub name: Option<String>,
}

/// An authenticated operator: an operator token (`Authorization: Bearer pxop_...`), a
/// person's bearer session (`Authorization: Bearer pxss_...`, what `plexctl login` keeps) or
/// the console's session cookie, whose roles allow the route's [`RouteScope`]. ONE check for
/// both: a token is a role on its project or the platform (`auth::roles`), a person has the
/// roles their bindings give them NOW (computed at every request; a session left with no role
/// is revoked). A cookie-authenticated write needs the CSRF header and our `Origin`
/// (`auth::session::check_write`).
///
/// Refusals: missing, malformed, unknown, wrong or revoked 401 `unauthorized`; an expired
/// token 401 `operator_token_expired`; an expired, idle or signed-out session 401
/// `session_expired`; a role below the route's need 403 `insufficient_scope`; a cookie write
/// without CSRF or from another origin 403 `csrf_required`. Success records the last use.
#[derive(Debug, Clone)]
pub struct Operator {
    /// The token's id, or the session's public id.
    pub id: String,
    /// The token's name, or the person's e-mail address (else subject).
    pub name: String,
    /// A token's scope; for a session the scope its best role corresponds to.
    pub scope: OperatorScope,
    /// The one project this caller is limited to; `None`: not limited to one project (a
    /// token of every project, or a person with a platform role for this need). A person
    /// whose reach is some Domains or several projects is answered as limited (the first of
    /// them) by handlers that read this field; [`Operator::sees`] knows the whole reach.
    pub project_id: Option<Uuid>,
    pub via: Via,
    /// `Some` for sessions.
    pub person: Option<Person>,
    /// Every role the caller holds (a token: exactly one).
    pub roles: Vec<RoleGrant>,
    /// The route's need.
    pub need: Need,
    /// What the roles reach for the need.
    pub reach: Reach,
    /// `(project, its Domain)` of every project the caller reaches for the need, when the
    /// reach is not everything.
    pub reached_projects: Vec<(Uuid, Uuid)>,
}

impl Operator {
    /// Whether the caller may see the resources of `project`.
    pub(crate) fn sees(&self, project: Uuid) -> bool {
        self.reach.all || self.reached_projects.iter().any(|(p, _)| *p == project)
    }

    /// `not_found` unless the caller may see the resources of `project`: to a caller limited
    /// to some projects, another project's objects do not exist (404, the same answer as a
    /// missing id).
    pub(crate) fn require(
        &self,
        project: Uuid,
        not_found: impl FnOnce() -> Error,
    ) -> Result<(), Error> {
        if self.sees(project) {
            Ok(())
        } else {
            Err(not_found())
        }
    }

    /// Whether the caller reaches `domain` for the route's need: a platform role, a role on
    /// the Domain, or (for reads) a role on one of its projects.
    pub(crate) fn sees_domain(&self, domain: Uuid) -> bool {
        self.reach.all
            || self.reach.domains.contains(&domain)
            || (matches!(self.need, Need::Read | Need::Audit)
                && self.reached_projects.iter().any(|(_, d)| *d == domain))
    }

    /// For changes that reach a whole Domain (its policy, DNS suffix, signing key, names,
    /// tags, routes): a platform role, or a role on that Domain, for the route's need; a
    /// caller limited to projects is refused (403) with `what` saying why.
    pub(crate) fn domain_wide(&self, domain: Uuid, what: &str) -> Result<(), Error> {
        if self.reach.all || self.reach.domains.contains(&domain) {
            return Ok(());
        }
        Err(Error::Forbidden(format!(
            "{what}; {} reaches only some projects of this Domain: it needs this role on the Domain or the platform (a token not limited to a project)",
            self.describe()
        )))
    }

    /// For what belongs to no Domain (the platform's audit chain): a platform role.
    pub(crate) fn platform_wide(&self, what: &str) -> Result<(), Error> {
        if self.reach.all {
            return Ok(());
        }
        Err(Error::Forbidden(format!(
            "{what}; {} has no platform role for it (a token not limited to a project, or a platform role binding)",
            self.describe()
        )))
    }

    /// The Domains the caller reaches for the route's need ([`Operator::sees_domain`]) of
    /// `all` (every Domain's id).
    pub(crate) fn seen_domains(&self, all: impl IntoIterator<Item = Uuid>) -> Vec<Uuid> {
        all.into_iter().filter(|d| self.sees_domain(*d)).collect()
    }

    /// "this token (ID)" or "this session (ID)", for messages.
    fn describe(&self) -> String {
        match &self.via {
            Via::Token => format!("this token ({})", self.id),
            Via::Session { session_id } => format!("this session ({session_id})"),
        }
    }

    /// `not_found` unless the caller reaches `domain` ([`Operator::sees_domain`]).
    pub(crate) fn require_domain(
        &self,
        domain: Uuid,
        not_found: impl FnOnce() -> Error,
    ) -> Result<(), Error> {
        if self.sees_domain(domain) {
            Ok(())
        } else {
            Err(not_found())
        }
    }
}
