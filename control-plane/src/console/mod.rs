//! The web console (issue 28, docs/console.md): static files compiled into the binary and
//! served on the API's own origin. Every path that is not the API's (`/v1`, `/downloads`,
//! `/healthz`, `/readyz`, `/metrics`) is the console's: `/assets/...` are its files, anything
//! else answers `index.html` and the page's script routes on the client (`/nodes/ID`).
//!
//! Every console answer carries [`CSP`] and the headers of [`security_headers`]: no inline
//! script or style can run, the page cannot be framed, and nothing leaks in a `Referer`.
//! Files carry a strong `ETag` (SHA-256 of the bytes) and `Cache-Control: no-cache`, so a
//! browser revalidates (a 304 costs no body) and an upgrade is seen at once.

mod assets;
#[cfg(test)]
mod tests;

use std::sync::OnceLock;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};

pub(crate) use assets::{ASSETS, Asset, INDEX};

use crate::error::Error;

/// The Content-Security-Policy of every console answer.
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// How browsers may keep the files: revalidate every time (the ETag makes that cheap).
pub(crate) const CACHE_CONTROL: &str = "no-cache";

/// Paths that belong to the API: an unknown one answers the API's JSON 404, never the page.
const API_PREFIXES: &[&str] = &["/v1", "/downloads", "/healthz", "/readyz", "/metrics"];

/// Whether `path` is the API's (so not the console's).
pub(crate) fn is_api_path(path: &str) -> bool {
    API_PREFIXES.iter().any(|p| {
        path.strip_prefix(p)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    })
}

/// The headers every console answer carries.
pub(crate) fn security_headers(h: &mut HeaderMap) {
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
}

fn etag(asset: &'static Asset) -> &'static str {
    static TAGS: OnceLock<Vec<(&'static str, String)>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        std::iter::once(&INDEX)
            .chain(ASSETS.iter())
            .map(|a| {
                let d = ring::digest::digest(&ring::digest::SHA256, a.body);
                (a.path, format!("\"{}\"", hex::encode(&d.as_ref()[..16])))
            })
            .collect()
    });
    tags.iter()
        .find(|(p, _)| *p == asset.path)
        .map(|(_, t)| t.as_str())
        .unwrap_or("\"\"")
}

fn serve(asset: &'static Asset, req: &HeaderMap) -> Response {
    let tag = etag(asset);
    let fresh = req
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == tag || t.trim() == "*"));
    let mut resp = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let mut r = Response::new(Body::from(asset.body));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(asset.content_type),
        );
        r
    };
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(tag) {
        h.insert(header::ETAG, v);
    }
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static(CACHE_CONTROL),
    );
    security_headers(h);
    resp
}

fn not_found_asset() -> Response {
    let mut resp = (
        StatusCode::NOT_FOUND,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "no such console file\n",
    )
        .into_response();
    security_headers(resp.headers_mut());
    resp
}

/// The router's fallback: the API's JSON 404 for the API's paths and for writes, the
/// console's files and `index.html` for the rest.
pub(crate) async fn fallback(method: Method, uri: Uri, headers: HeaderMap) -> Response {
    let path = uri.path();
    if is_api_path(path) || (method != Method::GET && method != Method::HEAD) {
        return Error::NotFound("no such endpoint; see docs/api.md".into()).into_response();
    }
    if path.starts_with("/assets/") {
        return match assets::find(path) {
            Some(a) => serve(a, &headers),
            None => not_found_asset(),
        };
    }
    serve(&INDEX, &headers)
}
