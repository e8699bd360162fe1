//! The route table: every route of the API with who may call it. The router is built from
//! it (`Routes::add`), so a route cannot exist without an [`Access`]; an operator route gets
//! its required scope attached as a [`RouteScope`], which the [`Operator`] extractor checks.
//! Tests walk the same table (`api::route_table`).
//!
//! [`Operator`]: super::extract::Operator

use std::sync::Arc;

use axum::Extension;
use axum::Router;
use axum::handler::Handler;
use axum::routing::{MethodFilter, on};
use plexsphere_wire::admin::OperatorScope;

use super::extract::RouteScope;
use super::state::AppState;

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
    /// An operator token of at least this scope (`pxop_...`).
    Operator(OperatorScope),
}

/// Shorthands for the table.
pub const READ: Access = Access::Operator(OperatorScope::ReadOnly);
pub const OPERATE: Access = Access::Operator(OperatorScope::Operator);
pub const ADMIN: Access = Access::Operator(OperatorScope::Admin);

/// The POST routes open to `read-only` tokens: each computes an answer from its body and
/// stores nothing (a body too large for a query string). Every other write needs more.
pub const COMPUTE_ONLY_POSTS: &[&str] = &["/v1/domains/{domain}/policy/validate"];

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
            Access::Operator(scope) => method_router.layer(Extension(RouteScope(scope))),
            Access::Public | Access::Node => method_router,
        };
        self.router = self.router.route(path, method_router);
        self.table.push(RouteSpec { verb, path, access });
        self
    }
}
