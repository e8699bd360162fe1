//! The status socket `<run_dir>/plexd.sock` (dir 0700, socket 0600): one JSON request line
//! and one JSON answer per connection. The server hands each request to the loop.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

use super::core::protocol::{Answer, Request};
use super::input::Input;
use crate::exit::ExitCode;
use crate::fsutil;

pub const SOCKET_NAME: &str = "plexd.sock";
pub const DEFAULT_RUN_DIR: &str = "/run/plexd";
/// The longest request line the server reads.
const MAX_REQUEST: u64 = 4096;
/// How long a client waits for an answer (a leave waits for the DELETE).
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(45);

pub fn socket_path(run_dir: &Path) -> PathBuf {
    run_dir.join(SOCKET_NAME)
}

/// Binds the socket: creates the run dir 0700, replaces a stale socket, sets 0600.
pub fn bind(run_dir: &Path) -> Result<UnixListener, String> {
    fsutil::ensure_dir(run_dir, 0o700).map_err(|e| e.to_string())?;
    let path = socket_path(run_dir);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(format!(
                "cannot remove the old socket {}: {e}",
                path.display()
            ));
        }
    }
    let listener =
        UnixListener::bind(&path).map_err(|e| format!("cannot bind {}: {e}", path.display()))?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("cannot set the mode of {}: {e}", path.display()))?;
    Ok(listener)
}

/// Accepts connections until the task is aborted. Every connection's task holds a clone of
/// `alive`, so the daemon can wait for answers in flight (a leave's) before it exits.
pub async fn serve(listener: UnixListener, tx: mpsc::Sender<Input>, alive: mpsc::Sender<()>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let tx = tx.clone();
        let alive = alive.clone();
        tokio::spawn(async move {
            let _alive = alive;
            if let Err(e) = handle(stream, tx).await {
                tracing::debug!(error = %e, "status socket client");
            }
        });
    }
}

async fn handle(stream: UnixStream, tx: mpsc::Sender<Input>) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    BufReader::new(read.take(MAX_REQUEST))
        .read_line(&mut line)
        .await?;
    let answer = match serde_json::from_str::<Request>(line.trim()) {
        Err(e) => Answer::error(
            format!("not a request plexd understands: {e}"),
            ExitCode::Usage,
        ),
        Ok(req) => {
            let (atx, arx) = oneshot::channel();
            if tx.send(Input::Control(req, atx)).await.is_err() {
                return Ok(());
            }
            match arx.await {
                Ok(a) => a,
                Err(_) => Answer::error("plexd is stopping", ExitCode::NotRunning),
            }
        }
    };
    let mut json = serde_json::to_vec(&answer).map_err(std::io::Error::other)?;
    json.push(b'\n');
    write.write_all(&json).await?;
    write.shutdown().await
}

/// Why the client got no answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing listens (no socket, connection refused): the daemon is not running.
    #[error("plexd is not running (no answer on {path}); start it with systemctl start plexd")]
    NotRunning { path: String },
    #[error("the daemon on {path} did not answer properly: {reason}")]
    Broken { path: String, reason: String },
}

/// Sends one request to the daemon and reads its answer.
pub async fn ask(run_dir: &Path, req: Request) -> Result<Answer, ClientError> {
    let path = socket_path(run_dir);
    let p = path.display().to_string();
    let mut stream = UnixStream::connect(&path)
        .await
        .map_err(|_| ClientError::NotRunning { path: p.clone() })?;
    let broken = |reason: String| ClientError::Broken {
        path: p.clone(),
        reason,
    };
    let exchange = async {
        let mut line = serde_json::to_vec(&req).map_err(|e| e.to_string())?;
        line.push(b'\n');
        stream.write_all(&line).await.map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        stream
            .read_to_end(&mut buf)
            .await
            .map_err(|e| e.to_string())?;
        serde_json::from_slice::<Answer>(&buf).map_err(|e| e.to_string())
    };
    tokio::time::timeout(CLIENT_TIMEOUT, exchange)
        .await
        .map_err(|_| broken(format!("no answer within {} s", CLIENT_TIMEOUT.as_secs())))?
        .map_err(broken)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn request_and_answer_over_a_real_socket() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run/plexd");
        let listener = bind(&run).unwrap();
        assert_eq!(fsutil::mode_of(&run).unwrap(), 0o700);
        assert_eq!(fsutil::mode_of(&socket_path(&run)).unwrap(), 0o600);
        let (tx, mut rx) = mpsc::channel(4);
        let (alive, _alive_rx) = mpsc::channel(1);
        tokio::spawn(serve(listener, tx, alive));
        tokio::spawn(async move {
            while let Some(Input::Control(req, answer)) = rx.recv().await {
                let _ = answer.send(Answer::Left {
                    message: format!("{req:?}"),
                });
            }
        });
        let a = ask(&run, Request::Leave).await.unwrap();
        assert_eq!(
            a,
            Answer::Left {
                message: "Leave".into()
            }
        );
        // a stale socket file is replaced on the next bind
        drop(bind(&run).unwrap());
    }

    #[tokio::test]
    async fn no_daemon_reads_not_running() {
        let dir = tempfile::tempdir().unwrap();
        let e = ask(dir.path(), Request::Status).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "plexd is not running (no answer on {}/plexd.sock); start it with systemctl start plexd",
                dir.path().display()
            )
        );
    }
}
