//! The route table: every route of the API with who may call it. The router is built from
//! it (`Routes::add`), so a route cannot exist without an [`Access`]; an operator route gets
//! its required scope attached as a [`RouteScope`], which the [`Operator`] extractor checks.
//! Tests walk the same table (`api::route_table`).
//!
//! [`Operator`]: super::extract::Operator

use std::sync::Arc;

use super::extract::RouteScope;
use super::state::AppState;
pub use crate::auth::roles::Need;
use axum::Extension;
use axum::Router;
use axum::handler::Handler;
use axum::routing::{MethodFilter, on};

/// The HTTP methods the API uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "GET",
            Verb::Post => "POST",
            Verb::Put => "PUT",
            Verb::Patch => "PATCH",
            Verb::Delete => "DELETE",
        }
    }

    /// Whether the method only reads (what a `read-only` token may call).
    pub fn reads_only(self) -> bool {
        self == Verb::Get
    }

    fn filter(self) -> MethodFilter {
        match self {
            Verb::Get => MethodFilter::GET,
            Verb::Post => MethodFilter::POST,
            Verb::Put => MethodFilter::PUT,
            Verb::Patch => MethodFilter::PATCH,
            Verb::Delete => MethodFilter::DELETE,
        }
    }
}

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone (version, CA, registration with a bootstrap token in the body).
    Public,
    /// A node about itself, with its credential (`pxnk_...`).
    Node,
    /// An operator token (`pxop_...`) or a person's session whose role allows this need
    /// (`auth::roles`: a token's scope maps onto a role).
    Operator(Need),
}

/// Shorthands for the table.
pub const READ: Access = Access::Operator(Need::Read);
pub const OPERATE: Access = Access::Operator(Need::Operate);
pub const ADMIN: Access = Access::Operator(Need::Admin);
/// Reading the audit log: auditors and admins (read-only and admin tokens).
pub const AUDIT: Access = Access::Operator(Need::Audit);

/// The POST routes open to `read-only` tokens: each computes an answer from its body and
/// stores nothing (a body too large for a query string). Every other write needs more.
pub const COMPUTE_ONLY_POSTS: &[&str] =
    &["/v1/domains/{domain}/policy/validate", "/v1/audit/verify"];

/// The POST routes any signed-in caller may call about its own session (sign-out): they
/// change nothing but the caller's own session.
pub const SELF_POSTS: &[&str] = &["/v1/auth/sign-out"];

/// One row of the route table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteSpec {
    pub verb: Verb,
    /// The axum path, with `{name}` parameters.
    pub path: &'static str,
    pub access: Access,
}

/// The router under construction and the table of what was added to it.
#[derive(Default)]
pub struct Routes {
    pub router: Router<Arc<AppState>>,
    pub table: Vec<RouteSpec>,
}

impl Routes {
    /// Adds one route: `verb path`, callable by `access`, served by `handler`.
    pub fn add<H, T>(mut self, verb: Verb, path: &'static str, access: Access, handler: H) -> Self
    where
        H: Handler<T, Arc<AppState>>,
        T: 'static,
    {
        let method_router = on(verb.filter(), handler);
        let method_router = match access {
            Access::Operator(need) => method_router.layer(Extension(RouteScope(need))),
            Access::Public | Access::Node => method_router,
        };
        self.router = self.router.route(path, method_router);
        self.table.push(RouteSpec { verb, path, access });
        self
    }
}
