//! The console's files and how they are served: the embedded assets contain no way to turn
//! data into markup or code (the XSS rules of docs/console.md), every file is embedded, the
//! headers, the fallback between the API and the console.

use axum::body::to_bytes;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};

use super::{ASSETS, CSP, INDEX, fallback, is_api_path};

/// What no console file may contain: each is a way to parse a string as HTML or code, or
/// an inline handler/style the CSP would block (and that would hide a policy hole).
const FORBIDDEN: &[&str] = &[
    "innerHTML",
    "outerHTML",
    "insertAdjacentHTML",
    "document.write",
    "eval(",
    "new Function",
    "setTimeout('",
    "setTimeout(\"",
    "javascript:",
    "DOMParser",
    "createContextualFragment",
    "srcdoc",
    " onclick=\"",
    " onload=\"",
    " style=\"",
    "<style",
];

fn all() -> impl Iterator<Item = &'static super::Asset> {
    std::iter::once(&INDEX).chain(ASSETS.iter())
}

#[test]
fn no_asset_turns_data_into_markup_or_code() {
    for a in all() {
        let text = std::str::from_utf8(a.body).expect("the console's files are UTF-8");
        for bad in FORBIDDEN {
            assert!(
                !text.contains(bad),
                "{} contains {bad:?}: build the DOM with textContent and attributes",
                a.path
            );
        }
    }
}

#[test]
fn index_loads_scripts_only_from_files() {
    let text = std::str::from_utf8(INDEX.body).expect("utf-8");
    let scripts: Vec<&str> = text.split("<script").skip(1).collect();
    assert!(!scripts.is_empty(), "index.html loads the app");
    for s in scripts {
        let tag = &s[..s.find('>').expect("a closed tag")];
        assert!(
            tag.contains("src=\"/assets/"),
            "inline script in index.html: {tag}"
        );
        assert!(
            s[tag.len() + 1..].starts_with("</script>"),
            "a script with a body"
        );
    }
}

#[test]
fn every_console_file_is_embedded() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("console");
    let mut stack = vec![root.clone()];
    let mut found = Vec::new();
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("read console/") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(&root).expect("under root");
                found.push(format!("/{}", rel.display()));
            }
        }
    }
    for f in found {
        assert!(
            all().any(|a| a.path == f),
            "{f} is in control-plane/console/ but not in console/assets.rs"
        );
    }
}

#[test]
fn the_policy_is_strict() {
    for part in [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
        "form-action 'self'",
    ] {
        assert!(CSP.contains(part), "{part}");
    }
    assert!(!CSP.contains("unsafe"), "no unsafe-inline or unsafe-eval");
}

#[test]
fn api_paths_are_not_the_console() {
    for p in [
        "/v1",
        "/v1/",
        "/v1/nope",
        "/downloads",
        "/downloads/x",
        "/healthz",
        "/readyz",
        "/metrics",
    ] {
        assert!(is_api_path(p), "{p}");
    }
    for p in [
        "/",
        "/nodes",
        "/nodes/1",
        "/v1x",
        "/metricsy",
        "/assets/app.js",
    ] {
        assert!(!is_api_path(p), "{p}");
    }
}

async fn get(path: &str, headers: HeaderMap) -> axum::response::Response {
    fallback(Method::GET, Uri::try_from(path).expect("uri"), headers).await
}

fn assert_console_headers(r: &axum::response::Response) {
    let h = r.headers();
    assert_eq!(h[header::CONTENT_SECURITY_POLICY], CSP);
    assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
    assert_eq!(h[header::REFERRER_POLICY], "no-referrer");
    assert_eq!(h[header::X_FRAME_OPTIONS], "DENY");
}

#[tokio::test]
async fn console_paths_answer_the_page_with_its_headers() {
    for p in [
        "/",
        "/nodes",
        "/nodes/0b3a4a2e-0000-4000-8000-000000000000",
        "/map?domain=x",
    ] {
        let r = get(p, HeaderMap::new()).await;
        assert_eq!(r.status(), StatusCode::OK, "{p}");
        assert_console_headers(&r);
        assert_eq!(
            r.headers()[header::CONTENT_TYPE],
            "text/html; charset=utf-8"
        );
        assert_eq!(r.headers()[header::CACHE_CONTROL], "no-cache");
        let body = to_bytes(r.into_body(), usize::MAX).await.expect("body");
        assert_eq!(&body[..], INDEX.body, "{p}");
    }
}

#[tokio::test]
async fn assets_have_types_etags_and_revalidate() {
    let r = get("/assets/app.js", HeaderMap::new()).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_console_headers(&r);
    assert_eq!(
        r.headers()[header::CONTENT_TYPE],
        "text/javascript; charset=utf-8"
    );
    let tag = r.headers()[header::ETAG].clone();
    assert!(tag.to_str().expect("ascii").starts_with('"'));
    let r = get("/assets/app.css", HeaderMap::new()).await;
    assert_eq!(r.headers()[header::CONTENT_TYPE], "text/css; charset=utf-8");
    assert_ne!(r.headers()[header::ETAG], tag, "each file its own tag");

    let mut h = HeaderMap::new();
    h.insert(header::IF_NONE_MATCH, tag.clone());
    let r = get("/assets/app.js", h).await;
    assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(r.headers()[header::ETAG], tag);
    let body = to_bytes(r.into_body(), usize::MAX).await.expect("body");
    assert!(body.is_empty());

    let mut h = HeaderMap::new();
    h.insert(header::IF_NONE_MATCH, HeaderValue::from_static("\"stale\""));
    assert_eq!(get("/assets/app.js", h).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn unknown_assets_and_api_paths_are_404_not_the_page() {
    let r = get("/assets/nope.js", HeaderMap::new()).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_console_headers(&r);
    assert_eq!(
        r.headers()[header::CONTENT_TYPE],
        "text/plain; charset=utf-8"
    );

    for p in ["/v1/nope", "/downloads/nope", "/v1"] {
        let r = get(p, HeaderMap::new()).await;
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{p}");
        let body = to_bytes(r.into_body(), usize::MAX).await.expect("body");
        let v: serde_json::Value = serde_json::from_slice(&body).expect("the API's JSON error");
        assert_eq!(v["code"], "not_found", "{p}: {v}");
    }
    let r = fallback(Method::POST, Uri::from_static("/nodes"), HeaderMap::new()).await;
    assert_eq!(
        r.status(),
        StatusCode::NOT_FOUND,
        "a write to a console path is no endpoint"
    );
}
