//! The WireGuard cross-platform userspace API (UAPI), as text: parse a request, format an
//! answer. No I/O here; `uapi_server` moves the text over the unix socket.
//!
//! A request is `get=1` or `set=1`, then `key=value` lines, then an empty line. The answer to
//! `get` lists the device and its peers; every answer ends with `errno=N` and an empty line,
//! where N is 0 or a negative errno, exactly as wireguard-go answers (checked against
//! wireguard-go 0.0.20220316): `-22` (EINVAL) for a bad key or value, `-71` (EPROTO) for a line
//! that is not `key=value`.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::UNIX_EPOCH;

use ipnet::IpNet;

use crate::config::{DeviceUpdate, PeerUpdate};
use crate::key::{PublicKey, SecretKey};
use crate::peer::DeviceSnapshot;

pub const EINVAL: i32 = 22;
pub(crate) const EPROTO: i32 = 71;
pub const EIO: i32 = 5;
pub(crate) const EADDRINUSE: i32 = 98;

/// A parsed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Get,
    Set(DeviceUpdate),
}

/// Why a request was refused; `errno()` is what the answer carries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UapiError {
    /// wireguard-go closes the connection without an answer for these.
    #[error("unknown UAPI operation (expected get=1 or set=1)")]
    UnknownOperation,
    #[error("UAPI line {line} is not key=value")]
    Protocol { line: usize },
    #[error("UAPI line {line}: {what}")]
    Invalid { line: usize, what: String },
}

impl UapiError {
    pub fn errno(&self) -> i32 {
        match self {
            UapiError::Protocol { .. } => -EPROTO,
            UapiError::UnknownOperation | UapiError::Invalid { .. } => -EINVAL,
        }
    }
}

/// The answer line for an error (or success with 0).
pub(crate) fn errno_answer(errno: i32) -> String {
    format!("errno={errno}\n\n")
}

/// Parses the lines of one request (without the terminating empty line).
pub fn parse_request<'a>(mut lines: impl Iterator<Item = &'a str>) -> Result<Request, UapiError> {
    match lines.next() {
        Some("get=1") => Ok(Request::Get),
        Some("set=1") => parse_set(lines).map(Request::Set),
        _ => Err(UapiError::UnknownOperation),
    }
}

fn invalid(line: usize, what: impl Into<String>) -> UapiError {
    UapiError::Invalid {
        line,
        what: what.into(),
    }
}

fn flag(line: usize, key: &str, value: &str) -> Result<bool, UapiError> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(invalid(line, format!("{key} must be true or false"))),
    }
}

fn secret(line: usize, key: &str, value: &str) -> Result<SecretKey, UapiError> {
    SecretKey::from_hex(value).map_err(|e| invalid(line, format!("{key}: {e}")))
}

fn number<T: std::str::FromStr>(line: usize, key: &str, value: &str) -> Result<T, UapiError> {
    value
        .parse()
        .map_err(|_| invalid(line, format!("{key} is not a valid number")))
}

/// Parses the `key=value` lines after `set=1`.
pub(crate) fn parse_set<'a>(
    lines: impl Iterator<Item = &'a str>,
) -> Result<DeviceUpdate, UapiError> {
    let mut update = DeviceUpdate::default();
    let mut peer: Option<PeerUpdate> = None;
    for (i, text) in lines.enumerate() {
        let line = i + 2; // 1-based, after the set=1 line
        let Some((key, value)) = text.split_once('=') else {
            return Err(UapiError::Protocol { line });
        };
        if key == "public_key" {
            let pk = PublicKey::from_hex(value)
                .map_err(|e| invalid(line, format!("public_key: {e}")))?;
            update.peers.extend(peer.replace(PeerUpdate::new(pk)));
            continue;
        }
        let Some(p) = peer.as_mut() else {
            match key {
                "private_key" => {
                    let k = secret(line, key, value)?;
                    update.private_key = Some((!k.is_zero()).then_some(k));
                }
                "listen_port" => update.listen_port = Some(number(line, key, value)?),
                "fwmark" => update.fwmark = Some(number(line, key, value)?),
                "replace_peers" => update.replace_peers = flag(line, key, value)?,
                _ => return Err(invalid(line, format!("unknown device key `{key}`"))),
            }
            continue;
        };
        match key {
            "update_only" => p.update_only = flag(line, key, value)?,
            "remove" => p.remove = flag(line, key, value)?,
            "preshared_key" => {
                let k = secret(line, key, value)?;
                p.preshared_key = Some((!k.is_zero()).then_some(k));
            }
            "endpoint" => {
                let ep: SocketAddr = value
                    .parse()
                    .map_err(|_| invalid(line, "endpoint must be ip:port or [ipv6]:port"))?;
                p.endpoint = Some(ep);
            }
            "persistent_keepalive_interval" => {
                p.persistent_keepalive = Some(number(line, key, value)?);
            }
            "replace_allowed_ips" => {
                if flag(line, key, value)? {
                    // Replacing drops what this request added before it, too.
                    p.replace_allowed_ips = true;
                    p.allowed_ips.clear();
                }
            }
            "allowed_ip" => {
                let net: IpNet = value
                    .parse()
                    .map_err(|_| invalid(line, "allowed_ip must be an address/prefix"))?;
                p.allowed_ips.push(net);
            }
            "protocol_version" => {
                if value != "1" {
                    return Err(invalid(line, "only protocol_version=1 exists"));
                }
            }
            _ => return Err(invalid(line, format!("unknown peer key `{key}`"))),
        }
    }
    update.peers.extend(peer);
    Ok(update)
}

/// The answer to `get=1`, ending with `errno=0` and an empty line.
pub(crate) fn format_get(snapshot: &DeviceSnapshot) -> String {
    let mut out = String::with_capacity(256 + 256 * snapshot.peers.len());
    // Writing to a String cannot fail.
    let _ = write_get(&mut out, snapshot);
    out
}

fn write_get(out: &mut String, s: &DeviceSnapshot) -> std::fmt::Result {
    if let Some(k) = &s.private_key {
        writeln!(out, "private_key={}", k.to_hex())?;
    }
    writeln!(out, "listen_port={}", s.listen_port)?;
    if s.fwmark != 0 {
        writeln!(out, "fwmark={}", s.fwmark)?;
    }
    for p in &s.peers {
        writeln!(out, "public_key={}", p.public_key.to_hex())?;
        let psk = p
            .preshared_key
            .as_ref()
            .map_or_else(|| "0".repeat(64), SecretKey::to_hex);
        writeln!(out, "preshared_key={psk}")?;
        writeln!(out, "protocol_version=1")?;
        if let Some(ep) = p.endpoint {
            writeln!(out, "endpoint={ep}")?;
        }
        let since = p
            .last_handshake
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .unwrap_or_default();
        writeln!(out, "last_handshake_time_sec={}", since.as_secs())?;
        writeln!(out, "last_handshake_time_nsec={}", since.subsec_nanos())?;
        writeln!(out, "tx_bytes={}", p.tx_bytes)?;
        writeln!(out, "rx_bytes={}", p.rx_bytes)?;
        writeln!(
            out,
            "persistent_keepalive_interval={}",
            p.persistent_keepalive
        )?;
        for net in &p.allowed_ips {
            writeln!(out, "allowed_ip={net}")?;
        }
    }
    out.push_str("errno=0\n\n");
    Ok(())
}

#[cfg(test)]
#[path = "uapi_tests.rs"]
mod tests;
