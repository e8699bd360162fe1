//! `plexsphere serve` as a child process (plain HTTP, as behind a proxy) on a given database:
//! the replicas of tests/lease.rs and tests/limits.rs.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::dev::BIN;

/// One `plexsphere serve` replica (plain HTTP, as behind a proxy), its log in a file.
pub struct Replica {
    child: Child,
    pub base: String,
    log: PathBuf,
}

/// The key-encryption key of the replicas sharing `data_dir` (32 random bytes, 0600),
/// written by the first of them.
fn shared_kek(data_dir: &Path) -> PathBuf {
    use std::io::{Read as _, Write as _};
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = data_dir.join("lm-kek");
    std::fs::create_dir_all(data_dir).unwrap();
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
    {
        let mut key = [0u8; 32];
        std::fs::File::open("/dev/urandom")
            .unwrap()
            .read_exact(&mut key)
            .unwrap();
        f.write_all(&key).unwrap();
    }
    path
}

impl Replica {
    /// Starts a replica on `database_url` with `extra` flags. The replicas of one test share
    /// `data_dir`: the local-directory substrate keeps its buckets there (it stands for a
    /// cloud every replica reaches), and the broker's sealing key lives there. The Domain
    /// keys are in the database, sealed under the key-encryption key every replica reads:
    /// the first replica of a data dir writes it there (`lm-kek`), the others read the same.
    pub fn start(
        name: &str,
        database_url: &str,
        data_dir: &Path,
        logs: &Path,
        extra: &[String],
    ) -> Self {
        let log = logs.join(format!("lm-{name}.log"));
        let kek = shared_kek(data_dir);
        let mut child = Command::new(BIN)
            .env("PLEXSPHERE_NO_LOCAL_MACHINES", "1")
            .env_remove("PLEXSPHERE_LOG")
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--tls-terminated-by-proxy",
            ])
            .arg("--database-url")
            .arg(database_url)
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--key-encryption-key-file")
            .arg(&kek)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut base = None;
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if let Some(url) = line.strip_prefix("listening on ") {
                base = Some(url.to_owned());
                break;
            }
        }
        let Some(base) = base else {
            panic!(
                "replica {name} exited before listening: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        };
        Self { child, base, log }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn leads(&self) -> usize {
        self.log()
            .matches("this replica now leads the broker's reconcile loop and maintenance")
            .count()
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig}");
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
