//! `plexsphere dev` as a real child process for the durability tests: a data directory on a
//! small tmpfs (root), the operator token and CA read from what `dev` wrote, registrations and
//! operator calls over HTTPS, `SIGTERM` or `SIGKILL`, and the database read back afterwards.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;

use super::{LAB_NODES, client_for, register_body, wg_key};

/// A tmpfs of `size` mounted on a fresh temp dir, unmounted on drop. Root only: outside CI a
/// test without root says so and returns None; under CI it fails.
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    pub fn mount(size: &str) -> Option<Self> {
        if !plexsphere_test_support::is_root() {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI is set but the tests do not run as root: the full-disk tests need to mount a tmpfs"
            );
            eprintln!("skipping: mounting a tmpfs needs root (scripts/test runs as root)");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        run(
            "mount",
            &["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"],
            dir.path(),
        );
        Some(Self { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes `fill` until the filesystem says it is full (ENOSPC).
    pub fn fill(&self) -> PathBuf {
        use std::io::Write as _;
        let path = self.path().join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0x5au8; 4096];
        loop {
            match f.write_all(&chunk) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(28) => break,
                Err(e) => panic!("filling {}: {e}", path.display()),
            }
        }
        // Whatever a partial write left.
        let _ = f.flush();
        path
    }

    pub fn remount_read_only(&self) {
        run("mount", &["-o", "remount,ro"], self.path());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.path()).status();
    }
}

fn run(cmd: &str, args: &[&str], target: &Path) {
    let status = Command::new(cmd).args(args).arg(target).status().unwrap();
    assert!(status.success(), "{cmd} {args:?} {}", target.display());
}

/// `plexsphere dev` on `data_dir` (127.0.0.1:0, no local machines, no rate limit to speak of,
/// plexd artifacts kept outside the data dir), read up to its listening line.
pub struct DevProcess {
    child: Child,
    pub base: String,
    pub client: reqwest::Client,
    pub operator_token: String,
    pub data_dir: PathBuf,
    stderr: PathBuf,
    _artifacts: tempfile::TempDir,
}

impl DevProcess {
    pub fn start(data_dir: &Path, extra: &[&str]) -> Self {
        let artifacts = tempfile::tempdir().unwrap();
        let stderr = artifacts.path().join("stderr.log");
        let mut child = dev_command(data_dir, artifacts.path())
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut listening = None;
        let deadline = Instant::now() + Duration::from_secs(60);
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if let Some(url) = line.strip_prefix("listening on ") {
                listening = Some(url.to_owned());
                break;
            }
            assert!(Instant::now() < deadline, "dev did not start in time");
        }
        let Some(url) = listening else {
            let log = std::fs::read_to_string(&stderr).unwrap_or_default();
            panic!("dev exited before listening: {log}");
        };
        let port = url.rsplit(':').next().unwrap();
        let ca = std::fs::read_to_string(data_dir.join("tls").join("ca.crt")).unwrap();
        let operator_token = std::fs::read_to_string(data_dir.join("operator-token"))
            .unwrap()
            .trim()
            .to_owned();
        Self {
            child,
            base: format!("https://localhost:{port}"),
            client: client_for(&ca),
            operator_token,
            data_dir: data_dir.to_owned(),
            stderr,
            _artifacts: artifacts,
        }
    }

    /// Starts `dev` on `data_dir` expecting it to give up: answers its exit code and stderr,
    /// or panics when it is still running after `limit` (it must fail at once).
    pub fn start_expecting_exit(data_dir: &Path, limit: Duration) -> (Option<i32>, String) {
        let artifacts = tempfile::tempdir().unwrap();
        let mut child = dev_command(data_dir, artifacts.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                let mut stderr = String::new();
                std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr)
                    .unwrap();
                return (status.code(), stderr);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!(
                    "dev on {} was still running after {limit:?}",
                    data_dir.display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// What the server wrote to stderr so far (its log).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Issues `n` node tokens of the lab Project; answers their texts.
    pub async fn issue_tokens(&self, n: usize) -> Vec<String> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let r = self
                .client
                .post(self.url(&format!("/v1/projects/{LAB_NODES}/bootstrap-tokens")))
                .bearer_auth(&self.operator_token)
                .json(&serde_json::json!({"kind": "node", "env_prefix": "lab", "ttl_secs": 3600}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::CREATED);
            let body: Value = r.json().await.unwrap();
            out.push(body["token"].as_str().unwrap().to_owned());
        }
        out
    }

    /// One registration with token `token` and key number `n`, bounded by `limit`: answers
    /// the status and body, or None when no answer came in time (a hang).
    pub async fn register(&self, token: &str, n: u32, limit: Duration) -> Option<(u16, Value)> {
        let body = register_body(token, &wg_key(n));
        let prove = super::prove::prove_body(&self.client, &self.base, &body);
        let body = tokio::time::timeout(limit, prove).await.ok()?;
        let send = self
            .client
            .post(self.url("/v1/register"))
            .json(&body)
            .send();
        let r = tokio::time::timeout(limit, send).await.ok()?.ok()?;
        let status = r.status().as_u16();
        let body = tokio::time::timeout(limit, r.json::<Value>())
            .await
            .ok()?
            .ok()?;
        Some((status, body))
    }

    /// The ids of the nodes `GET /v1/nodes` lists.
    pub async fn node_ids(&self) -> std::collections::BTreeSet<String> {
        let (status, nodes) = self.op_get("/v1/nodes").await;
        assert_eq!(status, 200, "{nodes}");
        nodes["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["id"].as_str().unwrap().to_owned())
            .collect()
    }

    /// `GET path` as the operator: status and JSON body.
    pub async fn op_get(&self, path: &str) -> (u16, Value) {
        let r = self
            .client
            .get(self.url(path))
            .bearer_auth(&self.operator_token)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// SIGTERM and a clean exit.
    pub fn stop(mut self) {
        signal(&self.child, "TERM");
        let status = self.child.wait().unwrap();
        assert!(status.success(), "{status:?}: {}", self.log());
    }

    /// SIGKILL: no chance to flush or close anything (the process is reaped on drop).
    pub fn kill(&self) {
        signal(&self.child, "KILL");
    }
}

impl Drop for DevProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `dev` as these tests run it: the server's log at [`server_log_filter`], registration
/// practically unlimited, and the plexd artifacts outside the data directory (a copy of plexd
/// would not fit a small tmpfs).
fn dev_command(data_dir: &Path, artifacts: &Path) -> Command {
    let mut cmd = super::dev::command(data_dir);
    cmd.env("PLEXSPHERE_LOG", server_log_filter())
        .args(["--register-burst", "1000000", "--plexd-artifacts"])
        .arg(artifacts);
    cmd
}

/// The server's log filter: `PLEXSPHERE_TEST_SERVER_LOG` when set (e.g. `info,sqlx=debug` to
/// see every statement while debugging), else `info`.
fn server_log_filter() -> String {
    std::env::var("PLEXSPHERE_TEST_SERVER_LOG").unwrap_or_else(|_| "info".to_owned())
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig} {}", child.id());
}

/// What a stopped server's database holds, read back through the store.
pub struct Stored {
    /// Every node's id.
    pub nodes: std::collections::BTreeSet<String>,
    /// Mesh IPs held by more than one live node of a Domain (must be empty).
    pub duplicate_mesh_ips: Vec<String>,
    /// Bootstrap tokens marked consumed.
    pub consumed_tokens: usize,
    /// SQLite's `PRAGMA integrity_check` (`ok`), or `postgres`.
    pub integrity: String,
}

/// Reads `database_url` (SQLite or Postgres) back after the server stopped.
pub async fn read_back(database_url: &str) -> Stored {
    use sqlx::Row as _;
    let store = plexsphere::store::Store::connect(database_url)
        .await
        .unwrap();
    let mut conn = store.acquire().await.unwrap();
    let nodes = sqlx::query("SELECT id FROM nodes")
        .fetch_all(&mut *conn)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<String, _>("id"))
        .collect();
    let duplicate_mesh_ips = sqlx::query(
        "SELECT mesh_ip FROM nodes WHERE revoked_at IS NULL GROUP BY domain_id, mesh_ip HAVING COUNT(*) > 1",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap()
    .iter()
    .map(|r| r.get::<String, _>("mesh_ip"))
    .collect();
    let consumed: i64 =
        sqlx::query("SELECT COUNT(*) AS n FROM bootstrap_tokens WHERE consumed_at IS NOT NULL")
            .fetch_one(&mut *conn)
            .await
            .unwrap()
            .get("n");
    let integrity = if database_url.starts_with("sqlite:") {
        sqlx::query("PRAGMA integrity_check")
            .fetch_one(&mut *conn)
            .await
            .unwrap()
            .get::<String, _>(0)
    } else {
        "postgres".to_owned()
    };
    drop(conn);
    store.close().await;
    Stored {
        nodes,
        duplicate_mesh_ips,
        consumed_tokens: usize::try_from(consumed).unwrap(),
        integrity,
    }
}

/// Runs every call on its own task, so that they really are in flight together, and answers
/// their outputs in order.
pub async fn join_all<F>(futs: impl IntoIterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futs.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}
