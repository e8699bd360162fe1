//! A bare userspace WireGuard peer in a namespace, configured with `wg`: what the harness
//! tests punch through the routers with, before any plexd reach code is involved. The program
//! is `plexd-wg` (the data plane's own binary) or `wireguard-go`; both take
//! `-f <iface>` and serve /var/run/wireguard/<iface>.sock.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};

use crate::netns::{exec, in_netns};
use crate::{Proc, wait_until};

/// How long the userspace program may take to create its interface and socket.
const START_BOUND: Duration = Duration::from_secs(10);

/// One WireGuard interface served by a userspace program inside a namespace.
pub struct WgPeer {
    pub ns: String,
    pub iface: String,
    pub public_key: String,
    pub proc: Proc,
}

impl WgPeer {
    /// Starts `program -f <iface>` in `ns`, gives it a fresh key, `listen_port` and the tunnel
    /// address `addr` (with its prefix, e.g. `10.99.0.1/24`), and brings it up. The private key
    /// is written to `dir`.
    pub fn start(
        program: &Path,
        ns: &str,
        iface: &str,
        addr: &str,
        listen_port: u16,
        dir: &Path,
    ) -> Result<Self> {
        let mut cmd = Command::new(program);
        cmd.args(["-f", iface]).env("WG_PROCESS_FOREGROUND", "1");
        let proc = Proc::spawn(in_netns(ns, &cmd))?;
        let sock = PathBuf::from(format!("/var/run/wireguard/{iface}.sock"));
        wait_until(
            START_BOUND,
            &format!("{} serves {}", program.display(), sock.display()),
            || Ok(sock.exists().then_some(())),
        )
        .with_context(|| proc.output())?;
        let (key, public_key) = wg_keypair()?;
        let key_file = dir.join(format!("{iface}.key"));
        std::fs::write(&key_file, &key)?;
        let key_path = key_file.display().to_string();
        run(
            ns,
            "wg",
            &[
                "set",
                iface,
                "private-key",
                &key_path,
                "listen-port",
                &listen_port.to_string(),
            ],
        )?;
        run(ns, "ip", &["addr", "add", addr, "dev", iface])?;
        run(ns, "ip", &["link", "set", iface, "up"])?;
        Ok(Self {
            ns: ns.to_owned(),
            iface: iface.to_owned(),
            public_key,
            proc,
        })
    }

    /// Adds (or updates) a peer: its key, an endpoint, the allowed IPs and a persistent
    /// keepalive in seconds.
    pub fn set_peer(
        &self,
        public_key: &str,
        endpoint: Option<SocketAddr>,
        allowed_ips: &str,
        keepalive: Option<u16>,
    ) -> Result<()> {
        let mut args = vec![
            "set".to_owned(),
            self.iface.clone(),
            "peer".to_owned(),
            public_key.to_owned(),
            "allowed-ips".to_owned(),
            allowed_ips.to_owned(),
        ];
        if let Some(ep) = endpoint {
            args.extend(["endpoint".to_owned(), ep.to_string()]);
        }
        if let Some(k) = keepalive {
            args.extend(["persistent-keepalive".to_owned(), k.to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&self.ns, "wg", &args)
    }

    /// Whether any peer has completed a handshake (`wg show <iface> latest-handshakes`).
    pub fn has_handshake(&self) -> Result<bool> {
        let out = exec(&self.ns, "wg", &["show", &self.iface, "latest-handshakes"])?;
        ensure!(
            out.status.success(),
            "wg show {}: {}",
            self.iface,
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        Ok(text
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1))
            .any(|t| t != "0"))
    }

    /// The endpoint the interface currently sends to for its first peer.
    pub fn endpoint(&self) -> Result<Option<SocketAddr>> {
        let out = exec(&self.ns, "wg", &["show", &self.iface, "endpoints"])?;
        let text = String::from_utf8_lossy(&out.stdout);
        Ok(text
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1))
            .find_map(|e| e.parse().ok()))
    }
}

impl Drop for WgPeer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(format!("/var/run/wireguard/{}.sock", self.iface));
    }
}

/// A fresh WireGuard key pair (private, public), base64, from `wg genkey` and `wg pubkey`.
pub fn wg_keypair() -> Result<(String, String)> {
    let key = wg_tool(&["genkey"], None)?;
    let public_key = wg_tool(&["pubkey"], Some(&key))?;
    Ok((key, public_key))
}

/// `wg genkey` / `wg pubkey` (with `input` on stdin); the trimmed output.
fn wg_tool(args: &[&str], input: Option<&str>) -> Result<String> {
    let mut child = Command::new("wg")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running wg (wireguard-tools)")?;
    if let (Some(mut stdin), Some(text)) = (child.stdin.take(), input) {
        std::io::Write::write_all(&mut stdin, text.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "wg {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?.trim().to_owned())
}

fn run(ns: &str, program: &str, args: &[&str]) -> Result<()> {
    let out = exec(ns, program, args)?;
    ensure!(
        out.status.success(),
        "{program} {} in {ns}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}
