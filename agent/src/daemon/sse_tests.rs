//! The event stream against small plain-HTTP servers: frames, refusals, bounds.

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

use super::*;
use crate::config::ApiUrl;
use crate::identity::SecretString;
use crate::tls::TrustSources;

/// A plain-HTTP server on 127.0.0.1:0 that answers one request with `head` and then
/// writes `chunks` one by one (flushing each), then closes. Returns the request text.
async fn serve_once(
    head: String,
    chunks: Vec<&'static [u8]>,
) -> (u16, tokio::task::JoinHandle<String>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut req = vec![0u8; 4096];
        let n = s.read(&mut req).await.unwrap();
        s.write_all(head.as_bytes()).await.unwrap();
        for c in chunks {
            s.write_all(c).await.unwrap();
            s.flush().await.unwrap();
            tokio::task::yield_now().await;
        }
        String::from_utf8_lossy(&req[..n]).into_owned()
    });
    (port, task)
}

fn api(port: u16) -> NodeApi {
    let url = ApiUrl::parse(&format!("http://127.0.0.1:{port}")).unwrap();
    let trust = TrustSources {
        system_store: false,
        ..Default::default()
    };
    let client = ApiClient::new(url, &trust, "/etc/plexd/ca.crt".into()).unwrap();
    let id = uuid::Uuid::parse_str("019a0816-0000-7000-8000-0000000000aa").unwrap();
    NodeApi::new(client, id, SecretString::new("pxnk_test".into()))
}

async fn collect(port: u16, resume: Option<u64>) -> Vec<StreamMsg> {
    let (tx, mut rx) = mpsc::channel(64);
    let task = tokio::spawn(connect_once(api(port), resume, 7, tx));
    let mut out = vec![];
    while let Some(Input::Core(io::Input::Stream { conn, msg })) =
        tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .unwrap()
    {
        assert_eq!(conn, 7);
        let end = matches!(msg, StreamMsg::Ended { .. });
        out.push(msg);
        if end {
            break;
        }
    }
    task.await.unwrap();
    out
}

use crate::api_client::ApiClient;

#[tokio::test]
async fn frames_split_across_chunks_with_comments_crlf_and_multiline_data() {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
        .to_owned();
    let chunks: Vec<&'static [u8]> = vec![
        b": keep-alive\n\n",
        b"id: 4",
        b"1\r\nevent: peer_ad",
        b"ded\r\ndata: {\"a\":\r\ndata: 1}\r\n\r",
        b"\n",
        b"id: 42\nevent: resync\ndata: x\n\n",
    ];
    let (port, server) = serve_once(head, chunks).await;
    let msgs = collect(port, Some(40)).await;
    let request = server.await.unwrap();
    assert!(
        request.to_ascii_lowercase().contains("last-event-id: 40"),
        "{request}"
    );
    assert!(request.contains("Bearer pxnk_test"), "{request}");
    // plexd understands the Domain's one signed copy of an event (wire/src/domain_event.rs).
    assert!(
        request
            .to_ascii_lowercase()
            .contains("plexsphere-event-envelopes: domain"),
        "{request}"
    );
    assert_eq!(msgs[0], StreamMsg::Connected);
    assert_eq!(msgs[1], StreamMsg::Activity);
    assert_eq!(
        msgs[2],
        StreamMsg::Frame {
            id: Some("41".into()),
            event: "peer_added".into(),
            data: "{\"a\":\n1}".into()
        }
    );
    assert_eq!(
        msgs[3],
        StreamMsg::Frame {
            id: Some("42".into()),
            event: "resync".into(),
            data: "x".into()
        }
    );
    assert!(
        matches!(&msgs[4], StreamMsg::Ended { fatal: None, .. }),
        "{msgs:?}"
    );
}

/// A stream whose line never ends: plexd drops it past the line bound instead of buffering
/// it, names the bound, and hangs up long before the server is done writing.
#[tokio::test]
async fn a_line_that_never_ends_is_dropped_at_the_bound() {
    const TOTAL: usize = 64 * 1024 * 1024;
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut req = vec![0u8; 4096];
        let _ = s.read(&mut req).await.unwrap();
        let head =
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\ndata: ";
        s.write_all(head.as_bytes()).await.unwrap();
        let chunk = vec![b'a'; 64 * 1024];
        let mut written = 0;
        while written < TOTAL {
            if s.write_all(&chunk).await.is_err() {
                break;
            }
            written += chunk.len();
        }
        written
    });
    let msgs = collect(port, None).await;
    let Some(StreamMsg::Ended { reason, fatal, .. }) = msgs.last() else {
        panic!("{msgs:?}")
    };
    assert!(reason.contains("longer than 256 KiB"), "{reason}");
    assert!(fatal.is_none(), "the stream is opened again: {msgs:?}");
    let written = server.await.unwrap();
    assert!(written < TOTAL, "plexd read all {written} bytes");
}

#[tokio::test]
async fn a_revoked_node_is_fatal_and_retry_after_is_read() {
    let body = r#"{"code":"node_revoked","message":"revoked"}"#;
    let head = format!(
        "HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let (port, _server) = serve_once(head, vec![]).await;
    let msgs = collect(port, None).await;
    assert!(
        matches!(
            &msgs[..],
            [StreamMsg::Ended {
                fatal: Some(CallError::Revoked),
                ..
            }]
        ),
        "{msgs:?}"
    );

    let body = r#"{"code":"unavailable","message":"busy"}"#;
    let head = format!(
        "HTTP/1.1 503 Busy\r\nretry-after: 7\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let (port, _server) = serve_once(head, vec![]).await;
    let msgs = collect(port, None).await;
    match &msgs[..] {
        [
            StreamMsg::Ended {
                retry_after,
                fatal: None,
                reason,
            },
        ] => {
            assert_eq!(*retry_after, Some(Duration::from_secs(7)));
            assert!(
                reason.contains("503") && reason.contains("unavailable"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_refused_connection_ends_with_the_reason() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let msgs = collect(port, None).await;
    match &msgs[..] {
        [
            StreamMsg::Ended {
                reason,
                fatal: None,
                ..
            },
        ] => {
            assert!(reason.contains("not reachable"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}
