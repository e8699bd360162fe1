//! The HTTP surface: `/downloads/plexd` and below, as an axum router with its own state so the
//! server merges it with one `Router::merge`.

use std::io::{Seek as _, SeekFrom};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get};
use axum::{Json, Router};
use plexsphere_wire::{ApiError, codes};
use tokio::io::AsyncReadExt as _;
use tokio_util::io::ReaderStream;

use crate::checksums::{Digest, sha256};
use crate::downloads::{BASE_PATH, Downloads};
use crate::error::DownloadError;
use crate::platform::Platform;
use crate::range::{Conditions, Plan, plan};
use crate::slot::OpenedFile;

/// The chunk size bodies are streamed in.
const CHUNK: usize = 64 * 1024;
/// Names the served release on every file answer.
const VERSION_HEADER: &str = "x-plexd-version";

/// `GET|HEAD /downloads/plexd`, `/downloads/plexd/{linux-amd64,linux-arm64}`,
/// `/downloads/plexd/checksums.sha256`, `.../checksums.sha256.sig`, `.../signing-key.pem`.
/// No router-wide fallback, so it merges into a server that has its own.
pub fn router(downloads: Arc<Downloads>) -> Router {
    Router::new()
        .route(BASE_PATH, read_only(get(index)))
        .route(
            &format!("{BASE_PATH}/checksums.sha256"),
            read_only(get(checksums)),
        )
        .route(
            &format!("{BASE_PATH}/checksums.sha256.sig"),
            read_only(get(signature)),
        )
        .route(
            &format!("{BASE_PATH}/signing-key.pem"),
            read_only(get(signing_key)),
        )
        .route(&format!("{BASE_PATH}/{{platform}}"), read_only(get(binary)))
        .with_state(downloads)
}

type Shared = State<Arc<Downloads>>;

/// GET (and with it HEAD) only; every other method is a JSON 405.
fn read_only(route: MethodRouter<Arc<Downloads>>) -> MethodRouter<Arc<Downloads>> {
    route.fallback(|| async {
        let mut resp = (
            StatusCode::METHOD_NOT_ALLOWED,
            Json(ApiError::new(
                codes::INVALID_REQUEST,
                "downloads are read-only: use GET or HEAD",
            )),
        )
            .into_response();
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        resp
    })
}

async fn index(State(d): Shared) -> Response {
    let mut resp = Json(d.index().await).into_response();
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

async fn binary(
    State(d): Shared,
    slug: Result<Path<String>, PathRejection>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    let slug = match slug {
        Ok(Path(s)) => s,
        Err(e) => return DownloadError::UnknownPlatform(e.body_text()).into_response(),
    };
    let Some(platform) = Platform::from_slug(&slug) else {
        let shown: String = slug.chars().take(64).collect();
        return DownloadError::UnknownPlatform(shown).into_response();
    };
    match d.binary(platform).await {
        Ok(file) => file_response(file, platform, d.version(), &method, &headers),
        Err(e) => e.into_response(),
    }
}

async fn checksums(State(d): Shared, headers: HeaderMap) -> Response {
    match d.checksums_file().await {
        Ok(f) => bytes_response(
            f.text.into_bytes(),
            &f.digest,
            "text/plain; charset=utf-8",
            None,
            d.version(),
            &headers,
        ),
        Err(e) => e.into_response(),
    }
}

async fn signature(State(d): Shared, headers: HeaderMap) -> Response {
    match d.checksums_file().await {
        Ok(f) => match f.signature {
            Some(sig) => bytes_response(
                sig.to_vec(),
                &sha256(&sig),
                "application/octet-stream",
                Some("checksums.sha256.sig"),
                d.version(),
                &headers,
            ),
            None => DownloadError::NotSigned.into_response(),
        },
        Err(e) => e.into_response(),
    }
}

async fn signing_key(State(d): Shared, headers: HeaderMap) -> Response {
    match d.signer() {
        Some(s) => {
            let pem = s.public_key_pem().into_bytes();
            bytes_response(
                pem.clone(),
                &sha256(&pem),
                "application/x-pem-file",
                None,
                d.version(),
                &headers,
            )
        }
        None => DownloadError::NotSigned.into_response(),
    }
}

fn conditions(headers: &HeaderMap) -> Conditions<'_> {
    let text = |name| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    Conditions {
        range: text(header::RANGE),
        if_range: text(header::IF_RANGE),
        if_none_match: text(header::IF_NONE_MATCH),
    }
}

/// The headers every answer for a file carries, and the status/range lines of its plan.
fn head(
    status: StatusCode,
    etag: &str,
    content_type: &str,
    attachment: Option<&str>,
    version: &str,
) -> axum::http::response::Builder {
    let mut b = Response::builder()
        .status(status)
        .header(header::ETAG, etag)
        .header(header::ACCEPT_RANGES, "bytes")
        .header(header::CACHE_CONTROL, "no-cache")
        .header(VERSION_HEADER, version);
    if status != StatusCode::NOT_MODIFIED {
        b = b.header(header::CONTENT_TYPE, content_type);
        if let Some(name) = attachment {
            b = b.header(
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{name}\""),
            );
        }
    }
    b
}

fn unsatisfiable(len: u64, what: &str) -> Response {
    let mut resp = (
        StatusCode::RANGE_NOT_SATISFIABLE,
        Json(ApiError::new(
            codes::INVALID_REQUEST,
            format!("the requested range lies outside {what} ({len} bytes)"),
        )),
    )
        .into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("bytes */{len}")) {
        resp.headers_mut().insert(header::CONTENT_RANGE, v);
    }
    resp
}

fn built(r: Result<Response, axum::http::Error>) -> Response {
    r.unwrap_or_else(|e| {
        DownloadError::io(
            "cannot build the answer for",
            "a download",
            &std::io::Error::other(e.to_string()),
        )
        .into_response()
    })
}

/// A binary: whole, one range, 304 or 416; the body streams from the opened file.
fn file_response(
    file: OpenedFile,
    platform: Platform,
    version: &str,
    method: &Method,
    headers: &HeaderMap,
) -> Response {
    let etag = format!("\"{}\"", hex::encode(file.digest));
    let name = platform.file_name();
    let (status, start, count) = match plan(file.len, &etag, conditions(headers)) {
        Plan::NotModified => {
            return built(
                head(StatusCode::NOT_MODIFIED, &etag, "", None, version).body(Body::empty()),
            );
        }
        Plan::Unsatisfiable => return unsatisfiable(file.len, name),
        Plan::Full => (StatusCode::OK, 0, file.len),
        Plan::Partial { start, end } => (StatusCode::PARTIAL_CONTENT, start, end - start + 1),
    };
    let mut b = head(
        status,
        &etag,
        "application/octet-stream",
        Some(name),
        version,
    )
    .header(header::CONTENT_LENGTH, count);
    if status == StatusCode::PARTIAL_CONTENT {
        b = b.header(
            header::CONTENT_RANGE,
            format!("bytes {start}-{}/{}", start + count - 1, file.len),
        );
    }
    if method == Method::HEAD {
        return built(b.body(Body::empty()));
    }
    let mut std_file = file.file;
    if let Err(e) = std_file.seek(SeekFrom::Start(start)) {
        return DownloadError::io("cannot seek in", name, &e).into_response();
    }
    let reader = tokio::fs::File::from_std(std_file).take(count);
    built(b.body(Body::from_stream(ReaderStream::with_capacity(
        reader, CHUNK,
    ))))
}

/// A small file held in memory (checksums, signature, key), with the same range rules.
fn bytes_response(
    bytes: Vec<u8>,
    digest: &Digest,
    content_type: &str,
    attachment: Option<&str>,
    version: &str,
    headers: &HeaderMap,
) -> Response {
    let etag = format!("\"{}\"", hex::encode(digest));
    let len = bytes.len() as u64;
    match plan(len, &etag, conditions(headers)) {
        Plan::NotModified => {
            built(head(StatusCode::NOT_MODIFIED, &etag, "", None, version).body(Body::empty()))
        }
        Plan::Unsatisfiable => unsatisfiable(len, "the file"),
        Plan::Full => built(
            head(StatusCode::OK, &etag, content_type, attachment, version)
                .header(header::CONTENT_LENGTH, len)
                .body(Body::from(bytes)),
        ),
        Plan::Partial { start, end } => {
            // plan() keeps start <= end < len, which fits in memory's usize.
            let slice = bytes
                .get(start as usize..=end as usize)
                .map(<[u8]>::to_vec)
                .unwrap_or_default();
            built(
                head(
                    StatusCode::PARTIAL_CONTENT,
                    &etag,
                    content_type,
                    attachment,
                    version,
                )
                .header(header::CONTENT_LENGTH, slice.len())
                .header(header::CONTENT_RANGE, format!("bytes {start}-{end}/{len}"))
                .body(Body::from(slice)),
            )
        }
    }
}
