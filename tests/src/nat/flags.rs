//! The command lines of the relay and the control plane's reach flags, in one place: the
//! pieces the reach work adds are spelled here only, so a renamed flag is one edit.

use std::net::SocketAddr;
use std::path::Path;

/// `plexsphere relay keygen --key-file F`: writes a key, prints the public key (base64).
pub fn relay_keygen(key_file: &Path) -> Vec<String> {
    vec![
        "relay".into(),
        "keygen".into(),
        "--key-file".into(),
        key_file.display().to_string(),
    ]
}

/// `plexsphere relay --name N --key-file F --udp A --tls A --tls-cert C --tls-key K
/// --domain-key B64`.
pub struct RelayRun<'a> {
    pub name: &'a str,
    pub key_file: &'a Path,
    pub udp: SocketAddr,
    pub tls: SocketAddr,
    pub tls_cert: &'a Path,
    pub tls_key: &'a Path,
    pub domain_key: &'a str,
}

pub fn relay_run(r: &RelayRun<'_>) -> Vec<String> {
    vec![
        "relay".into(),
        "--name".into(),
        r.name.into(),
        "--key-file".into(),
        r.key_file.display().to_string(),
        "--udp".into(),
        r.udp.to_string(),
        "--tls".into(),
        r.tls.to_string(),
        "--tls-cert".into(),
        r.tls_cert.display().to_string(),
        "--tls-key".into(),
        r.tls_key.display().to_string(),
        "--domain-key".into(),
        r.domain_key.into(),
    ]
}

/// `--relay 'name=r1,key=B64,udp=IP:PORT,tls=IP:PORT,sni=NAME'` on `plexsphere dev`/`serve`.
pub fn cp_relay(name: &str, key: &str, udp: SocketAddr, tls: SocketAddr) -> [String; 2] {
    [
        "--relay".into(),
        format!("name={name},key={key},udp={udp},tls={tls},sni={RELAY_SNI}"),
    ]
}

/// `--stun-advertise IP:PORT` on `plexsphere dev`/`serve`: a STUN server nodes are told of.
pub fn cp_stun(addr: SocketAddr) -> [String; 2] {
    ["--stun-advertise".into(), addr.to_string()]
}

/// The TLS name of every relay: a SAN of the lab certificate the relays serve.
pub const RELAY_SNI: &str = "relay.reach.test";
/// The relays' UDP port (relayed WireGuard and STUN).
pub const RELAY_UDP_PORT: u16 = 3478;
/// The relays' TCP/TLS port.
pub const RELAY_TLS_PORT: u16 = 443;
/// The control plane's port on the public segment.
pub const CP_PORT: u16 = 8443;

/// The relay `plexsphere dev` embeds (in the control plane's own process), and its default
/// ports on the listen address.
pub const DEV_RELAY_NAME: &str = "dev";
pub const DEV_RELAY_UDP_PORT: u16 = 3479;
pub const DEV_RELAY_TLS_PORT: u16 = 8444;
