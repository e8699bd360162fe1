//! The highly available lab: Postgres, a NATS cluster, several `plexsphere serve` replicas on
//! one database and HAProxy in front (TLS terminated there with a lab CA, X-Forwarded-For to
//! the replicas over plain HTTP, `/readyz` as the health check). The HA tests
//! (tests/tests/ha.rs) and `scripts/ha-lab` (through `tests/examples/ha_lab.rs`) share it.
//!
//! Every port is picked free at runtime on 127.0.0.1; names carry the prefix `ha1` and the
//! pid. Everything is a child process killed on drop (the Postgres cluster is stopped).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::process::{Proc, STARTUP_BOUND, bin};

/// How often HAProxy asks each replica's `/readyz`, and after how many failures it stops
/// sending it requests (`inter`, `fall`).
pub const HEALTH_CHECK_EVERY_MS: u64 = 500;
pub const HEALTH_CHECK_FALL: u32 = 2;
/// The replicas' keep-alive comment on idle event streams (shorter than HAProxy's timeouts).
pub const SSE_KEEPALIVE_SECS: u64 = 2;

/// A free TCP port on 127.0.0.1 (bound and released; the caller binds it next).
pub fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("picking a free port")?;
    Ok(l.local_addr()?.port())
}

/// `n` distinct free TCP ports on 127.0.0.1: every listener is held until all are picked, so
/// the kernel cannot hand the same port out twice (releasing each before picking the next
/// could, and did: a NATS server's client and route ports came out equal).
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    let held = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").context("picking a free port"))
        .collect::<Result<Vec<_>>>()?;
    held.iter().map(|l| Ok(l.local_addr()?.port())).collect()
}

/// A free TCP port on `ip`.
pub fn free_port_on(ip: std::net::Ipv4Addr) -> Result<u16> {
    let l = std::net::TcpListener::bind((ip, 0))
        .with_context(|| format!("picking a free port on {ip}"))?;
    Ok(l.local_addr()?.port())
}

/// Waits until something accepts TCP connections on `addr`.
pub fn wait_listening(addr: SocketAddr, what: &str, proc: &mut Proc) -> Result<()> {
    let deadline = Instant::now() + STARTUP_BOUND;
    while std::net::TcpStream::connect(addr).is_err() {
        if let Some(status) = proc.try_exit()? {
            bail!(
                "{what} exited with {status}; its output:\n{}",
                proc.output()
            );
        }
        if Instant::now() > deadline {
            bail!(
                "{what} does not listen on {addr}; its output:\n{}",
                proc.output()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Runs `program args`, insisting it succeeded; answers its stdout.
fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

// ---------------------------------------------------------------------------------------
// Postgres

/// The lab's database: a scratch database on the server of `PLEXSPHERE_TEST_POSTGRES_URL`
/// (the tests; `scripts/test` starts one), or a throwaway cluster of our own (the lab).
pub struct Postgres {
    /// What the replicas get as `--database-url`.
    pub url: String,
    scratch: Option<(String, String)>,
    cluster: Option<PathBuf>,
}

impl Postgres {
    /// A fresh database on the test server, or `None` (outside CI) without one.
    pub fn scratch_from_env() -> Result<Option<Self>> {
        let admin = std::env::var("PLEXSPHERE_TEST_POSTGRES_URL").unwrap_or_default();
        if admin.is_empty() {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI is set but PLEXSPHERE_TEST_POSTGRES_URL is not: scripts/test starts a Postgres for the HA tests"
            );
            eprintln!("skipping: set PLEXSPHERE_TEST_POSTGRES_URL (scripts/test does)");
            return Ok(None);
        }
        let name = format!("ha1_{}_{}", std::process::id(), unique());
        psql(&admin, &format!("CREATE DATABASE {name}"))?;
        let url = database_url(&admin, &name);
        Ok(Some(Self {
            url,
            scratch: Some((admin, name)),
            cluster: None,
        }))
    }

    /// A new cluster in `dir` on `port` (root: it runs as the `postgres` user), listening on
    /// a socket in `dir` only.
    pub fn own_cluster(dir: &Path, port: u16) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        run(Command::new("chown").args(["postgres:"]).arg(dir))?;
        let bin_dir = pg_bin_dir()?;
        let data = dir.join("data");
        run(Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(bin_dir.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "postgres"]))?;
        run(Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(bin_dir.join("pg_ctl"))
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(dir.join("log"))
            .arg("-w")
            .arg("-o")
            .arg(format!(
                "-k {} -c listen_addresses='' -p {port} -c max_connections=300",
                dir.display()
            ))
            .arg("start"))?;
        let url = format!(
            "postgres://postgres@localhost:{port}/postgres?host={}",
            dir.display()
        );
        Ok(Self {
            url,
            scratch: None,
            cluster: Some(dir.to_owned()),
        })
    }

    /// Runs `sql` (unaligned, tuples only) and answers what it printed.
    pub fn query(&self, sql: &str) -> Result<String> {
        psql(&self.url, sql)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some((admin, name)) = &self.scratch {
            let _ = psql(
                admin,
                &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            );
        }
        if let (Some(dir), Ok(bin_dir)) = (&self.cluster, pg_bin_dir()) {
            let _ = Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(bin_dir.join("pg_ctl"))
                .arg("-D")
                .arg(dir.join("data"))
                .args(["-m", "immediate", "-w", "stop"])
                .output();
        }
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Debian's newest `/usr/lib/postgresql/<version>/bin`.
fn pg_bin_dir() -> Result<PathBuf> {
    let mut versions: Vec<u32> = std::fs::read_dir("/usr/lib/postgresql")
        .context("Postgres is not installed (/usr/lib/postgresql); scripts/deps.sh installs it")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    versions.sort_unstable();
    let v = versions
        .last()
        .context("no Postgres version in /usr/lib/postgresql")?;
    Ok(PathBuf::from(format!("/usr/lib/postgresql/{v}/bin")))
}

/// `postgres://user@host:port/<admin db>?params` with another database name.
fn database_url(admin: &str, name: &str) -> String {
    let (base, params) = admin.split_once('?').unwrap_or((admin, ""));
    let server = base.rsplit_once('/').map_or(base, |(s, _)| s);
    if params.is_empty() {
        format!("{server}/{name}")
    } else {
        format!("{server}/{name}?{params}")
    }
}

/// Runs `sql` on `url` with psql; answers what it printed (unaligned, tuples only).
pub fn psql(url: &str, sql: &str) -> Result<String> {
    let out = run(Command::new("psql").args([url, "-v", "ON_ERROR_STOP=1", "-qAtc", sql]))?;
    Ok(out.trim().to_owned())
}

// ---------------------------------------------------------------------------------------
// NATS

/// How many times [`NatsCluster::start`] picks fresh ports after a server found one taken.
const PORT_RACE_ATTEMPTS: u32 = 3;
/// What the servers print when a port is taken.
const ADDR_IN_USE: &str = "address already in use";

/// One `nats-server -js` of the lab's cluster.
pub struct NatsNode {
    pub name: String,
    pub port: u16,
    pub cluster_port: u16,
    store_dir: PathBuf,
    proc: Option<Proc>,
}

/// A NATS cluster of one or more JetStream servers on loopback.
pub struct NatsCluster {
    pub nodes: Vec<NatsNode>,
}

impl NatsCluster {
    /// Starts `n` servers under `root` (one: a plain JetStream server; more: a cluster with
    /// routes between all of them).
    pub fn start(root: &Path, n: usize) -> Result<Self> {
        if Command::new("nats-server")
            .arg("--version")
            .output()
            .is_err()
        {
            bail!(
                "nats-server is not installed; scripts/deps.sh installs it (Debian's nats-server)"
            );
        }
        let mut attempt = 1;
        loop {
            match Self::start_once(root, n) {
                // Another process may take a picked port between its release and the server's
                // bind; fresh ports then, a bounded number of times.
                Err(e)
                    if attempt < PORT_RACE_ATTEMPTS && format!("{e:#}").contains(ADDR_IN_USE) =>
                {
                    eprintln!("nats: a picked port was taken meanwhile, starting again: {e:#}");
                    attempt += 1;
                }
                done => return done,
            }
        }
    }

    fn start_once(root: &Path, n: usize) -> Result<Self> {
        let ports = free_ports(2 * n)?;
        let mut nodes = Vec::with_capacity(n);
        for (i, pair) in ports.chunks_exact(2).enumerate() {
            let name = format!("ha1-nats-{}-{i}", std::process::id());
            let store_dir = root.join(&name);
            // A retried start begins with an empty store, as the first did.
            let _ = std::fs::remove_dir_all(&store_dir);
            std::fs::create_dir_all(&store_dir)?;
            nodes.push(NatsNode {
                name,
                port: pair[0],
                cluster_port: pair[1],
                store_dir,
                proc: None,
            });
        }
        let mut cluster = Self { nodes };
        for i in 0..n {
            cluster.spawn(i)?;
        }
        for node in &mut cluster.nodes {
            if let Some(p) = &mut node.proc {
                wait_listening(SocketAddr::from(([127, 0, 0, 1], node.port)), &node.name, p)?;
            }
        }
        Ok(cluster)
    }

    fn spawn(&mut self, i: usize) -> Result<()> {
        let routes: Vec<String> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, n)| format!("nats://127.0.0.1:{}", n.cluster_port))
            .collect();
        let clustered = self.nodes.len() > 1;
        let node = &mut self.nodes[i];
        let mut cmd = Command::new("nats-server");
        cmd.args(["-js", "-a", "127.0.0.1", "-p", &node.port.to_string()])
            .args(["-n", &node.name, "--store_dir"])
            .arg(&node.store_dir);
        if clustered {
            cmd.args([
                "--cluster_name",
                "ha1",
                "--cluster",
                &format!("nats://127.0.0.1:{}", node.cluster_port),
                "--routes",
                &routes.join(","),
            ]);
        }
        node.proc = Some(Proc::spawn(cmd)?);
        Ok(())
    }

    /// The `--nats-url` of the replicas: every server.
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("nats://127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Kills server `i` with SIGKILL.
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].proc = None;
    }

    /// Starts server `i` again (same ports, same store).
    pub fn restart(&mut self, i: usize) -> Result<()> {
        self.kill(i);
        self.spawn(i)?;
        let node = &mut self.nodes[i];
        match &mut node.proc {
            Some(p) => wait_listening(SocketAddr::from(([127, 0, 0, 1], node.port)), &node.name, p),
            None => bail!("{} did not start", node.name),
        }
    }
}

// ---------------------------------------------------------------------------------------
// TLS for HAProxy

/// The lab CA and HAProxy's certificate for 127.0.0.1, localhost and the lab's front address,
/// made with openssl.
pub struct LabCerts {
    pub ca_file: PathBuf,
    /// Certificate chain and key in one PEM, as HAProxy's `crt` takes it.
    pub haproxy_pem: PathBuf,
}

impl LabCerts {
    pub fn create(dir: &Path, front_ip: std::net::Ipv4Addr) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let p = |f: &str| dir.join(f);
        run(Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
            ])
            .arg("-keyout")
            .arg(p("ca.key"))
            .arg("-out")
            .arg(p("ca.crt"))
            .args(["-days", "30", "-subj", "/CN=plexsphere ha lab CA"])
            .args(["-addext", "basicConstraints=critical,CA:TRUE"])
            .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]))?;
        run(Command::new("openssl")
            .args([
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
            ])
            .arg("-keyout")
            .arg(p("server.key"))
            .arg("-out")
            .arg(p("server.csr"))
            .args(["-subj", "/CN=127.0.0.1"]))?;
        std::fs::write(
            p("server.ext"),
            format!(
                "subjectAltName=IP:127.0.0.1,IP:{front_ip},DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
            ),
        )?;
        run(Command::new("openssl")
            .args(["x509", "-req", "-in"])
            .arg(p("server.csr"))
            .arg("-CA")
            .arg(p("ca.crt"))
            .arg("-CAkey")
            .arg(p("ca.key"))
            .args(["-CAcreateserial", "-days", "30", "-out"])
            .arg(p("server.crt"))
            .arg("-extfile")
            .arg(p("server.ext")))?;
        let pem = format!(
            "{}{}",
            std::fs::read_to_string(p("server.crt"))?,
            std::fs::read_to_string(p("server.key"))?
        );
        std::fs::write(p("haproxy.pem"), pem)?;
        Ok(Self {
            ca_file: p("ca.crt"),
            haproxy_pem: p("haproxy.pem"),
        })
    }
}

// ---------------------------------------------------------------------------------------
// HAProxy

/// The HAProxy configuration of the lab: TLS at the front, the replicas behind over plain
/// HTTP with X-Forwarded-For, `/readyz` as the health check, long tunnels for event streams.
pub fn haproxy_config(front: SocketAddr, pem: &Path, backends: &[SocketAddr]) -> String {
    let servers: String = backends
        .iter()
        .enumerate()
        .map(|(i, a)| format!("    server replica{} {a} check\n", i + 1))
        .collect();
    format!(
        "global\n    maxconn 4000\n\n\
         defaults\n    mode http\n    option forwardfor\n    option http-server-close\n    timeout connect 2s\n    timeout client 60s\n    timeout server 60s\n    # event streams: long-lived answers, kept alive by the server's comments\n    timeout tunnel 1h\n    retries 2\n    option redispatch\n\n\
         frontend api\n    bind {front} ssl crt {pem} alpn h2,http/1.1\n    default_backend replicas\n\n\
         backend replicas\n    balance roundrobin\n    option httpchk GET /readyz\n    http-check expect status 200\n    default-server inter {HEALTH_CHECK_EVERY_MS}ms fall {HEALTH_CHECK_FALL} rise 1\n{servers}",
        pem = pem.display()
    )
}

/// HAProxy in the foreground (`-db`), killed on drop.
pub struct Haproxy {
    pub proc: Proc,
    pub front: SocketAddr,
}

impl Haproxy {
    pub fn start(
        dir: &Path,
        front: SocketAddr,
        pem: &Path,
        backends: &[SocketAddr],
    ) -> Result<Self> {
        let cfg = dir.join("haproxy.cfg");
        std::fs::write(&cfg, haproxy_config(front, pem, backends))?;
        let mut check = Command::new("haproxy");
        check.arg("-c").arg("-f").arg(&cfg);
        run(&mut check).context("haproxy -c refused the lab's configuration")?;
        let mut cmd = Command::new("haproxy");
        cmd.arg("-db").arg("-f").arg(&cfg);
        let mut proc = Proc::spawn(cmd)?;
        wait_listening(front, "haproxy", &mut proc)?;
        Ok(Self { proc, front })
    }
}

// ---------------------------------------------------------------------------------------
// The replicas

/// One `plexsphere serve` replica.
pub struct Replica {
    pub proc: Proc,
    pub addr: SocketAddr,
    pub data_dir: PathBuf,
}

impl Replica {
    /// `http://127.0.0.1:port`: the replica directly, bypassing HAProxy.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// What shapes a lab.
#[derive(Debug, Clone)]
pub struct LabOptions {
    pub replicas: usize,
    /// NATS servers (0: no `--nats-url`, the replicas poll the shared Postgres).
    pub nats_nodes: usize,
    /// More `plexsphere serve` flags for every replica.
    pub extra_args: Vec<String>,
    /// Where HAProxy listens (the nodes' `api_url`): loopback, or the host's address on a
    /// test bridge when plexd nodes in namespaces must reach it.
    pub front_ip: std::net::Ipv4Addr,
}

impl Default for LabOptions {
    fn default() -> Self {
        Self {
            replicas: 3,
            nats_nodes: 3,
            extra_args: Vec::new(),
            front_ip: std::net::Ipv4Addr::LOCALHOST,
        }
    }
}

/// What every replica is started with.
#[derive(Debug, Clone)]
struct ServeSpec {
    database_url: String,
    api_url: String,
    nats_urls: Option<String>,
    /// The key-encryption key every replica reads: the Domain key is sealed under it in the
    /// database, so all replicas sign with the one key the first of them created.
    kek_file: PathBuf,
    extra_args: Vec<String>,
}

impl ServeSpec {
    fn command(&self, data_dir: &Path, port: Option<u16>) -> Result<Command> {
        let mut cmd = Command::new(bin("plexsphere")?);
        cmd.env("PLEXSPHERE_NO_LOCAL_MACHINES", "1")
            .env_remove("PLEXSPHERE_NATS_URL")
            .arg("serve")
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--database-url", &self.database_url])
            .args(["--listen", &format!("127.0.0.1:{}", port.unwrap_or(0))])
            .args([
                "--tls-terminated-by-proxy",
                "--trusted-proxy",
                "127.0.0.1/32",
            ])
            .args(["--public-url", &self.api_url])
            .arg("--seed")
            .arg(lab_seed())
            .args(["--sse-keepalive-secs", &SSE_KEEPALIVE_SECS.to_string()])
            .arg("--key-encryption-key-file")
            .arg(&self.kek_file)
            .args(&self.extra_args);
        if let Some(urls) = &self.nats_urls {
            cmd.args(["--nats-url", urls]);
        }
        Ok(cmd)
    }

    fn spawn(&self, data_dir: &Path, port: Option<u16>) -> Result<Proc> {
        Proc::spawn(self.command(data_dir, port)?)
    }

    /// Waits for the replica's `listening on` line.
    fn ready(proc: Proc, data_dir: &Path) -> Result<Replica> {
        Ok(Replica {
            addr: listening_addr(&proc)?,
            proc,
            data_dir: data_dir.to_owned(),
        })
    }
}

/// The whole lab. Field order is drop order: HAProxy and the replicas go before NATS and
/// the database.
pub struct Lab {
    pub haproxy: Haproxy,
    pub replicas: Vec<Option<Replica>>,
    pub nats: Option<NatsCluster>,
    pub pg: Postgres,
    pub certs: LabCerts,
    /// `https://127.0.0.1:<front>`: the one `api_url` of every node.
    pub api_url: String,
    /// An admin operator token.
    pub operator_token: String,
    pub plexctl_config: PathBuf,
    pub root: PathBuf,
    spec: ServeSpec,
}

/// The Domain of the lab seed (control-plane/seeds/lab.yaml).
pub const LAB_DOMAIN_SLUG: &str = "lab";

fn lab_seed() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../control-plane/seeds/lab.yaml")
}

fn replica_dir(root: &Path, i: usize) -> PathBuf {
    root.join(format!("replica{}", i + 1))
}

impl Lab {
    /// Brings the lab up under `root` on the database `pg`.
    pub fn start(root: &Path, pg: Postgres, opts: LabOptions) -> Result<Self> {
        if opts.replicas == 0 {
            bail!("a lab needs at least one replica");
        }
        std::fs::create_dir_all(root)?;
        let certs = LabCerts::create(&root.join("tls"), opts.front_ip)?;
        let nats = match opts.nats_nodes {
            0 => None,
            n => Some(NatsCluster::start(&root.join("nats"), n)?),
        };
        let front = SocketAddr::from((opts.front_ip, free_port_on(opts.front_ip)?));
        let kek_file = root.join("key-encryption-key");
        write_private(&kek_file, &random_seed()?)?;
        let spec = ServeSpec {
            database_url: pg.url.clone(),
            api_url: format!("https://{front}"),
            nats_urls: nats.as_ref().map(NatsCluster::urls),
            kek_file,
            extra_args: opts.extra_args.clone(),
        };
        // One Domain key for every replica: the first creates it, sealed in the database under
        // the shared KEK; the others read that one back (none keeps a key file of its own).
        let dirs: Vec<PathBuf> = (0..opts.replicas).map(|i| replica_dir(root, i)).collect();
        for d in &dirs {
            create_private_dir(d)?;
        }
        // The first applies the migrations and the seed alone; the others then start at once.
        let mut replicas = vec![Some(ServeSpec::ready(
            spec.spawn(&dirs[0], None)?,
            &dirs[0],
        )?)];
        let rest: Vec<Proc> = dirs[1..]
            .iter()
            .map(|d| spec.spawn(d, None))
            .collect::<Result<_>>()?;
        for (proc, d) in rest.into_iter().zip(&dirs[1..]) {
            replicas.push(Some(ServeSpec::ready(proc, d)?));
        }
        let backends: Vec<SocketAddr> = replicas.iter().flatten().map(|r| r.addr).collect();
        let haproxy = Haproxy::start(root, front, &certs.haproxy_pem, &backends)?;
        let operator_token = create_operator_token(&dirs[0], &pg.url)?;
        let token_file = root.join("operator-token");
        write_private(&token_file, format!("{operator_token}\n").as_bytes())?;
        let plexctl_config = root.join("plexctl.yaml");
        std::fs::write(
            &plexctl_config,
            format!(
                "server: {}\ntoken_file: {}\nca_file: {}\n",
                spec.api_url,
                token_file.display(),
                certs.ca_file.display()
            ),
        )?;
        Ok(Self {
            haproxy,
            replicas,
            nats,
            pg,
            certs,
            api_url: spec.api_url.clone(),
            operator_token,
            plexctl_config,
            root: root.to_owned(),
            spec,
        })
    }

    /// Replica `i` (0-based), when it runs.
    pub fn replica(&self, i: usize) -> Result<&Replica> {
        self.replicas
            .get(i)
            .and_then(Option::as_ref)
            .with_context(|| format!("replica {} is not running", i + 1))
    }

    /// kill -9 of replica `i`; answers the address it listened on.
    pub fn kill_replica(&mut self, i: usize) -> Result<SocketAddr> {
        let r = self.replicas.get_mut(i).context("no such replica")?.take();
        let Some(r) = r else {
            bail!("replica {} is not running", i + 1)
        };
        r.proc.signal("KILL")?;
        Ok(r.addr)
    }

    /// Starts replica `i` again on `addr`, its old port (HAProxy's backend line names it).
    pub fn restart_replica(&mut self, i: usize, addr: SocketAddr) -> Result<()> {
        let dir = replica_dir(&self.root, i);
        let r = ServeSpec::ready(self.spec.spawn(&dir, Some(addr.port()))?, &dir)?;
        self.replicas[i] = Some(r);
        Ok(())
    }

    /// Waits until every running replica has logged that it consumes notices from NATS at
    /// least `times` times since it started (a reconnect logs it again).
    pub fn wait_bus_consuming(&self, times: usize) -> Result<()> {
        if self.nats.is_none() {
            return Ok(());
        }
        for r in self.replicas.iter().flatten() {
            let deadline = Instant::now() + STARTUP_BOUND;
            while r.proc.output().matches(BUS_CONSUMING).count() < times {
                if Instant::now() > deadline {
                    bail!(
                        "replica {} did not consume from NATS ({times} times):\n{}",
                        r.addr,
                        r.proc.output()
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// Runs plexctl against the lab (through HAProxy); insists it succeeded.
    pub fn plexctl(&self, args: &[&str]) -> Result<String> {
        run(Command::new(bin("plexctl")?)
            .env("PLEXCTL_CONFIG", &self.plexctl_config)
            .env_remove("PLEXCTL_SERVER")
            .env_remove("PLEXCTL_TOKEN")
            .args(args))
    }
}

/// What a replica logs each time its NATS consumer starts.
pub const BUS_CONSUMING: &str = "bus: consuming notices from NATS JetStream";

fn create_operator_token(data_dir: &Path, database_url: &str) -> Result<String> {
    let out = run(Command::new(bin("plexsphere")?)
        .args([
            "operator-token",
            "create",
            "--name",
            "ha-lab",
            "--scope",
            "admin",
        ])
        .args(["--expires-in", "never"])
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--database-url", database_url]))?;
    let token = out.trim().to_owned();
    if token.is_empty() || token.contains(char::is_whitespace) {
        bail!("plexsphere operator-token create printed {out:?}, not a token");
    }
    Ok(token)
}

/// The `http://127.0.0.1:port` of a replica's `listening on` line.
fn listening_addr(proc: &Proc) -> Result<SocketAddr> {
    let line = proc.wait_for_line(STARTUP_BOUND, |l| l.starts_with("listening on http://"))?;
    line.trim_start_matches("listening on http://")
        .trim()
        .parse()
        .with_context(|| format!("parsing {line:?}"))
}

fn random_seed() -> Result<[u8; 32]> {
    use std::io::Read as _;
    let mut seed = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut seed)?;
    Ok(seed)
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(bytes)?;
    Ok(())
}

/// A data directory (0700), as plexsphere keeps it.
fn create_private_dir(data_dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir_all(data_dir)?;
    std::fs::set_permissions(data_dir, std::fs::Permissions::from_mode(0o700))?;
    Ok(())
}
