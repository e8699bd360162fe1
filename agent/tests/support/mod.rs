//! Test support: a temp node root, a test CA, and a tiny real TLS server on 127.0.0.1:0.
#![allow(dead_code, clippy::unwrap_used)] // test-only helpers: a failure here is a test failure

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use plexsphere_wire::secret::{BootstrapToken, TokenKind};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

pub mod node_api;

/// A node's file-system root: config dir, state dir and unit dir under one temp dir.
pub struct Node {
    pub root: tempfile::TempDir,
}

impl Node {
    pub fn new() -> Self {
        Self {
            root: tempfile::tempdir().unwrap(),
        }
    }
    pub fn config_dir(&self) -> PathBuf {
        self.root.path().join("etc/plexd")
    }
    pub fn config_file(&self) -> PathBuf {
        self.config_dir().join("config.yaml")
    }
    pub fn token_file(&self) -> PathBuf {
        self.config_dir().join("bootstrap-token")
    }
    pub fn state_dir(&self) -> PathBuf {
        self.root.path().join("var/lib/plexd")
    }
    pub fn unit_dir(&self) -> PathBuf {
        self.root.path().join("etc/systemd/system")
    }
    pub fn key_file(&self) -> PathBuf {
        self.state_dir().join("wireguard.key")
    }
    pub fn identity_file(&self) -> PathBuf {
        self.state_dir().join("identity.json")
    }

    /// Writes config.yaml (creating the config dir 0700).
    pub fn write_config(&self, text: &str) {
        std::fs::create_dir_all(self.config_dir()).unwrap();
        std::fs::write(self.config_file(), text).unwrap();
    }

    /// Writes a well-formed bootstrap token and returns its text.
    pub fn write_token(&self) -> String {
        std::fs::create_dir_all(self.config_dir()).unwrap();
        let t = BootstrapToken::generate("lab", TokenKind::Node)
            .unwrap()
            .expose();
        std::fs::write(self.token_file(), format!("{t}\n")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(self.token_file(), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        t
    }

    /// Runs plexd with this root's paths.
    pub fn plexd(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_plexd"))
            .args(args)
            .env("PLEXD_CONFIG", self.config_file())
            .env("PLEXD_STATE_DIR", self.state_dir())
            .env("PLEXD_UNIT_DIR", self.unit_dir())
            .env("PLEXD_LOG", "warn")
            .env_remove("JOURNAL_STREAM")
            .env_remove("NOTIFY_SOCKET")
            .output()
            .unwrap()
    }
}

/// A `https://127.0.0.1:<port>` origin where nothing listens (bound, noted, closed).
pub fn dead_origin() -> String {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("https://127.0.0.1:{port}")
}

pub fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A test CA and a server certificate for 127.0.0.1 and localhost that it signed.
pub struct TestPki {
    pub ca: CertifiedIssuer<'static, KeyPair>,
    pub server_cert: rustls_pki_types::CertificateDer<'static>,
    pub server_key: rustls_pki_types::PrivateKeyDer<'static>,
}

impl TestPki {
    pub fn new() -> Self {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "plexd test CA");
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let leaf_key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .unwrap()
            .signed_by(&leaf_key, &ca)
            .unwrap();
        Self {
            server_cert: leaf.der().clone(),
            server_key: rustls_pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
            ca,
        }
    }

    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// The CA's SHA-256 fingerprint, colon-separated.
    pub fn ca_fingerprint(&self) -> String {
        plexsphere_wire::secret::sha256(self.ca.der().as_ref())
            .iter()
            .map(|b| format!("{b:02X}"))
            .collect::<Vec<_>>()
            .join(":")
    }
}

/// An HTTP answer the test server sends.
#[derive(Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    pub fn json(status: u16, body: &str) -> Self {
        Self {
            status,
            headers: vec![],
            body: body.to_owned(),
        }
    }
}

/// A request as the test server saw it.
#[derive(Debug, Clone)]
pub struct Req {
    pub method: String,
    pub path: String,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Req {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The fake control plane's X25519 proof secret.
pub const SERVER_PROOF_SECRET: [u8; 32] = [3; 32];

/// The answer of a fake `POST /v1/register/challenge` (the key of [`SERVER_PROOF_SECRET`], a
/// fixed nonce).
pub fn challenge() -> String {
    let server = plexsphere_wire::reach::public_key(&SERVER_PROOF_SECRET);
    serde_json::json!({
        "server_public_key": server.to_base64(),
        "nonce": "4102444800.r.t",
        "expires_at": 4_102_444_800_i64,
    })
    .to_string()
}

pub type Handler = Arc<dyn Fn(&Req) -> Answer + Send + Sync>;

/// A real TLS server (rustls over std TcpStream) answering every request with `answer`.
/// It sends the leaf and the CA, like plexsphere does.
pub struct TlsServer {
    pub port: u16,
    /// The request bodies received, in order.
    pub requests: Arc<Mutex<Vec<String>>>,
    /// `METHOD /path` of every request, in order.
    pub lines: Arc<Mutex<Vec<String>>>,
}

impl TlsServer {
    /// Every registration asks for a challenge first: that path gets [`CHALLENGE`].
    pub fn start(pki: &TestPki, answer: Answer) -> Self {
        Self::start_with(
            pki,
            Arc::new(move |req: &Req| {
                if req.path == plexsphere_wire::proof::REGISTER_CHALLENGE_PATH {
                    Answer::json(200, &challenge())
                } else {
                    answer.clone()
                }
            }),
        )
    }

    /// A server that answers each request with what `handler` says (one thread per connection).
    pub fn start_with(pki: &TestPki, handler: Handler) -> Self {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![pki.server_cert.clone(), pki.ca.der().clone()],
                pki.server_key.clone_key(),
            )
            .unwrap();
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let lines = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        let seen_lines = lines.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(tcp) = stream else { continue };
                let Ok(conn) = rustls::ServerConnection::new(config.clone()) else {
                    continue;
                };
                let (seen, seen_lines, handler) =
                    (seen.clone(), seen_lines.clone(), handler.clone());
                std::thread::spawn(move || {
                    let mut tls = rustls::StreamOwned::new(conn, tcp);
                    if let Some(req) = read_request(&mut tls) {
                        // A registration's challenge is not counted among the bodies.
                        if req.path != plexsphere_wire::proof::REGISTER_CHALLENGE_PATH {
                            seen.lock().unwrap().push(req.body.clone());
                        }
                        seen_lines
                            .lock()
                            .unwrap()
                            .push(format!("{} {}", req.method, req.path));
                        let answer = handler(&req);
                        let _ = write_answer(&mut tls, &answer);
                    }
                });
            }
        });
        Self {
            port,
            requests,
            lines,
        }
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }
}

fn read_request(stream: &mut impl Read) -> Option<Req> {
    let mut reader = BufReader::new(stream);
    let mut content_length = 0usize;
    let mut first = String::new();
    reader.read_line(&mut first).ok()?;
    let mut parts = first.split_whitespace();
    let method = parts.next()?.to_owned();
    let path = parts.next()?.to_owned();
    let mut headers = vec![];
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                content_length = v.trim().parse().ok()?;
            }
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
    }
    let mut body = vec![0u8; content_length];
    reader.read_exact(&mut body).ok()?;
    Some(Req {
        method,
        path,
        headers,
        body: String::from_utf8(body).ok()?,
    })
}

fn write_answer(stream: &mut impl Write, a: &Answer) -> std::io::Result<()> {
    let content_type = a
        .headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        .map_or("application/json", |(_, v)| v.as_str());
    let mut head = format!(
        "HTTP/1.1 {} X\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n",
        a.status,
        a.body.len()
    );
    for (k, v) in a
        .headers
        .iter()
        .filter(|(k, _)| !k.eq_ignore_ascii_case("content-type"))
    {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(a.body.as_bytes())?;
    stream.flush()
}

/// A registration answer as plexsphere sends it.
pub const REGISTERED: &str = r#"{"node_id":"019a0816-0000-7000-8000-0000000000aa","domain_id":"019a0816-0000-7000-8000-000000000001","project_id":"019a0816-0000-7000-8000-000000000002","mesh_ip":"10.64.1.2","mesh_cidr":"10.64.0.0/16","node_credential":"pxnk_019a0816000070008000000000aa_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA","domain_signing_public_key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","intervals":{"heartbeat_secs":30,"endpoint_report_secs":60,"state_poll_secs":300,"ingest_secs":60}}"#;
