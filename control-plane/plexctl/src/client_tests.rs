//! The client against real TLS on 127.0.0.1:0: a certificate from a generated CA, served by
//! rustls on a std thread that answers each connection with one fixed HTTP/1.1 response and
//! reports the request head it received.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, mpsc};

use plexsphere_wire::admin::{List, NodeView, VersionInfo};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::*;

pub(crate) struct Lab {
    dir: tempfile::TempDir,
    ca_pem: String,
    cert: CertificateDer<'static>,
    key: Vec<u8>,
}

/// A CA and a server certificate for `names`.
pub(crate) fn lab(names: &[&str]) -> Lab {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    let cert = params.signed_by(&key, &ca).unwrap();
    Lab {
        dir: tempfile::tempdir().unwrap(),
        ca_pem: ca.pem(),
        cert: cert.der().clone(),
        key: key.serialize_der(),
    }
}

impl Lab {
    pub(crate) fn ca_file(&self) -> PathBuf {
        let path = self.dir.path().join("ca.crt");
        std::fs::write(&path, &self.ca_pem).unwrap();
        path
    }

    /// Serves `connections` connections, each answered with `response`; request heads come
    /// back through the receiver (a failed handshake sends nothing).
    fn serve(&self, response: String, connections: usize) -> (SocketAddr, mpsc::Receiver<String>) {
        self.serve_each(vec![response; connections])
    }

    /// Serves one connection per response, in order; each request (head and body) comes back
    /// through the receiver.
    pub(crate) fn serve_each(
        &self,
        responses: Vec<String>,
    ) -> (SocketAddr, mpsc::Receiver<String>) {
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.clone()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![self.cert.clone()], key)
            .unwrap();
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for response in responses {
                let Ok((tcp, _)) = listener.accept() else {
                    return;
                };
                let conn = rustls::ServerConnection::new(config.clone()).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, tcp);
                let Some(mut head) = read_head(&mut tls) else {
                    continue;
                };
                head.push_str(&read_body(&mut tls, &head));
                let _ = tx.send(head);
                let _ = tls.write_all(response.as_bytes());
                let _ = tls.flush();
                tls.conn.send_close_notify();
                let _ = tls.flush();
            }
        });
        (addr, rx)
    }
}

/// The body a request head announces with content-length (none without one).
fn read_body(stream: &mut impl Read, head: &str) -> String {
    let length = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    match stream.read_exact(&mut body) {
        Ok(()) => String::from_utf8_lossy(&body).into_owned(),
        Err(_) => String::new(),
    }
}

fn read_head(stream: &mut impl Read) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    String::from_utf8(head).ok()
}

pub(crate) fn http(status: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

pub(crate) fn base(addr: SocketAddr) -> Url {
    Url::parse(&format!("https://{addr}")).unwrap()
}

pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_server_signed_by_an_unknown_ca_is_not_trusted() {
    let lab = lab(&["127.0.0.1", "localhost"]);
    let (addr, _) = lab.serve(http("200 OK", "{}"), 1);
    let api = Api::new(base(addr), None, None).unwrap();
    let err = runtime()
        .block_on(api.get::<VersionInfo>(&["v1", "version"], &[]))
        .unwrap_err();
    assert_eq!(err.exit_code(), 2);
    let text = err.to_string();
    assert!(matches!(err, ClientError::NotTrusted { .. }), "{text}");
    assert!(
        text.starts_with(&format!("the server at https://{addr} is not trusted: ")),
        "{text}"
    );
    assert!(text.contains("UnknownIssuer"), "{text}");
    assert!(text.contains("--ca-file"), "{text}");
}

#[test]
fn the_ca_file_makes_it_trusted_and_the_token_is_sent() {
    let lab = lab(&["127.0.0.1"]);
    let body = r#"{"items":[]}"#;
    let (addr, heads) = lab.serve(http("200 OK", body), 1);
    let token = Secret::new("pxop_0123456789abcdef_secret");
    let api = Api::new(base(addr), Some(token), Some(&lab.ca_file())).unwrap();
    let list: List<NodeView> = runtime()
        .block_on(api.get(
            &["v1", "nodes"],
            &[("project_id", "019a0816-0000-7000-8000-000000000002")],
        ))
        .unwrap();
    assert!(list.items.is_empty());
    let head = heads.recv().unwrap().to_ascii_lowercase();
    assert!(
        head.starts_with(
            "get /v1/nodes?project_id=019a0816-0000-7000-8000-000000000002 http/1.1\r\n"
        ),
        "{head}"
    );
    assert!(
        head.contains("\r\nauthorization: bearer pxop_0123456789abcdef_secret\r\n"),
        "{head}"
    );
    assert!(head.contains("\r\nuser-agent: plexctl/"), "{head}");
}

#[test]
fn an_api_error_answer_is_returned_with_its_code_and_status() {
    let lab = lab(&["127.0.0.1"]);
    let body = r#"{"code":"token_revoked","message":"the bootstrap token was revoked"}"#;
    let (addr, heads) = lab.serve(http("403 Forbidden", body), 1);
    let api = Api::new(base(addr), None, Some(&lab.ca_file())).unwrap();
    let err = runtime()
        .block_on(api.post::<_, VersionInfo>(
            &["v1", "bootstrap-tokens", "abc", "revoke"],
            Some(&serde_json::json!({})),
        ))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the bootstrap token was revoked (token_revoked, HTTP 403)"
    );
    assert_eq!(err.exit_code(), 1);
    let head = heads.recv().unwrap().to_ascii_lowercase();
    assert!(
        head.starts_with("post /v1/bootstrap-tokens/abc/revoke http/1.1\r\n"),
        "{head}"
    );
    assert!(
        head.contains("\r\ncontent-type: application/json\r\n"),
        "{head}"
    );
}

#[test]
fn a_certificate_for_another_name_is_not_trusted_with_a_name_hint() {
    let lab = lab(&["plexsphere.example.invalid"]);
    let (addr, _) = lab.serve(http("200 OK", "{}"), 1);
    let api = Api::new(base(addr), None, Some(&lab.ca_file())).unwrap();
    let err = runtime()
        .block_on(api.get::<VersionInfo>(&["v1", "version"], &[]))
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ClientError::NotTrusted { .. }), "{text}");
    assert!(text.contains("does not name this host"), "{text}");
}

#[test]
fn a_closed_port_is_not_reachable() {
    let addr = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let api = Api::new(base(addr), None, None).unwrap();
    let err = runtime()
        .block_on(api.get::<VersionInfo>(&["v1", "version"], &[]))
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ClientError::NotReachable { .. }), "{text}");
    assert!(
        text.starts_with(&format!("cannot reach the server at https://{addr}: ")),
        "{text}"
    );
    assert_eq!(err.exit_code(), 2);
}

#[test]
fn plain_http_on_the_port_is_a_tls_failure_not_a_trust_one() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        if let Ok((mut tcp, _)) = listener.accept() {
            let mut buf = [0u8; 512];
            let _ = tcp.read(&mut buf);
            let _ = tcp.write_all(http("400 Bad Request", "plain http").as_bytes());
        }
    });
    let api = Api::new(base(addr), None, None).unwrap();
    let err = runtime()
        .block_on(api.get::<VersionInfo>(&["v1", "version"], &[]))
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ClientError::TlsFailed { .. }), "{text}");
    assert!(text.contains("may not speak TLS"), "{text}");
}

#[test]
fn bad_ca_files_are_configuration_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.crt");
    let err = tls_config(Some(&missing)).unwrap_err();
    assert_eq!(err.exit_code(), 64);
    assert!(
        err.to_string()
            .starts_with(&format!("cannot use the CA file {}: ", missing.display()))
    );
    let empty = dir.path().join("empty.crt");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    let err = tls_config(Some(&empty)).unwrap_err();
    assert!(
        err.to_string().contains("it holds no PEM certificate"),
        "{err}"
    );
}

#[test]
fn alpn_offers_h2_and_http1() {
    let config = tls_config(None).unwrap();
    assert_eq!(
        config.alpn_protocols,
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    );
}

#[test]
fn endpoints_keep_a_base_path_and_escape_segments() {
    let base = Url::parse("https://h:8443/plexsphere/").unwrap();
    assert_eq!(
        endpoint(&base, &["v1", "nodes"], &[]).as_str(),
        "https://h:8443/plexsphere/v1/nodes"
    );
    let base = Url::parse("https://h").unwrap();
    assert_eq!(
        endpoint(
            &base,
            &["v1", "bootstrap-tokens", "a/b?c", "revoke"],
            &[("project_id", "x y")]
        )
        .as_str(),
        "https://h/v1/bootstrap-tokens/a%2Fb%3Fc/revoke?project_id=x+y"
    );
}

#[test]
fn answers_that_are_not_plexsphere_json_are_explained() {
    let url = Url::parse("https://h/v1/nodes").unwrap();
    let err = decode::<VersionInfo>(&url, StatusCode::BAD_GATEWAY, b"<html>bad gateway</html>")
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "https://h/v1/nodes answered HTTP 502 without a plexsphere error body; check that the server URL points at plexsphere"
    );
    assert_eq!(err.exit_code(), 1);
    let err = decode::<VersionInfo>(&url, StatusCode::OK, br#"{"name":1}"#).unwrap_err();
    assert!(matches!(err, ClientError::BadBody { .. }), "{err}");
    let ok = decode::<VersionInfo>(
        &url,
        StatusCode::OK,
        br#"{"name":"plexsphere","version":"0.1.0"}"#,
    )
    .unwrap();
    assert_eq!(ok.version, "0.1.0");
}
