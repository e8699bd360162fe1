//! The reach flags of `plexsphere serve` and `plexsphere dev` (part of the node API's knobs,
//! `NodeApiArgs`): the relays and STUN servers every node's signed state lists.
//!
//! `--relay 'name=r1,key=<base64 X25519 public key>,udp=203.0.113.5:3479,tls=203.0.113.5:443,sni=relay1.example'`
//! (repeatable): `name` and `key` are required, then at least one of `udp` and `tls`; `sni`
//! is the name the relay's TLS certificate is checked against and needs `tls`.
//! `--stun-advertise 203.0.113.5:3478` (repeatable): a STUN server besides the relays.

use std::net::SocketAddr;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use clap::Args;
use plexsphere_wire::node::RelaySpec;

/// The longest relay name, in characters.
pub(crate) const MAX_RELAY_NAME: usize = 63;
/// The most relays (`--relay`) and, separately, STUN servers (`--stun-advertise`) one server
/// lists: every state carries them all, so they stay few.
pub(crate) const MAX_LISTED: usize = 16;

#[derive(Debug, Clone, Default, Args)]
pub struct ReachArgs {
    /// A relay nodes may use, listed in every node's signed state (repeatable):
    /// `name=r1,key=<base64 X25519 public key>,udp=IP:PORT,tls=IP:PORT,sni=NAME` with at
    /// least one of udp and tls.
    #[arg(
        long = "relay",
        env = "PLEXSPHERE_RELAYS",
        value_name = "SPEC",
        value_delimiter = ';',
        value_parser = parse_relay
    )]
    pub relays: Vec<RelaySpec>,
    /// A STUN server (IP:PORT) nodes learn their reflexive address from, besides the relays'
    /// UDP ports (repeatable).
    #[arg(
        long = "stun-advertise",
        env = "PLEXSPHERE_STUN_ADVERTISE",
        value_name = "IP:PORT",
        value_delimiter = ','
    )]
    pub stun_advertise: Vec<SocketAddr>,
}

impl ReachArgs {
    /// Checks what one flag cannot check alone: unique names, the counts, no port 0.
    pub fn check(&self) -> Result<(), String> {
        if self.relays.len() > MAX_LISTED {
            return Err(format!(
                "--relay is given {} times; at most {MAX_LISTED} relays are listed",
                self.relays.len()
            ));
        }
        if self.stun_advertise.len() > MAX_LISTED {
            return Err(format!(
                "--stun-advertise is given {} times; at most {MAX_LISTED} STUN servers are listed",
                self.stun_advertise.len()
            ));
        }
        for (i, r) in self.relays.iter().enumerate() {
            if self.relays[..i].iter().any(|o| o.name == r.name) {
                return Err(format!(
                    "--relay name={} is given twice; relay names must be unique (nodes name their home relay by it)",
                    r.name
                ));
            }
        }
        if let Some(a) = self.stun_advertise.iter().find(|a| a.port() == 0) {
            return Err(format!(
                "--stun-advertise {a}: port 0 is not a port nodes can send to"
            ));
        }
        Ok(())
    }
}

/// One `--relay` value.
pub fn parse_relay(spec: &str) -> Result<RelaySpec, String> {
    let (mut name, mut key, mut udp, mut tls, mut sni) = (None, None, None, None, None);
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((k, v)) = part.split_once('=') else {
            return Err(format!(
                "{part:?} is not key=value; a relay is name=...,key=...,udp=IP:PORT,tls=IP:PORT,sni=NAME"
            ));
        };
        let slot = match k.trim() {
            "name" => &mut name,
            "key" => &mut key,
            "udp" => &mut udp,
            "tls" => &mut tls,
            "sni" => &mut sni,
            other => {
                return Err(format!(
                    "{other}= is not a relay field; the fields are name, key, udp, tls and sni"
                ));
            }
        };
        if slot.is_some() {
            return Err(format!("{k}= is given twice"));
        }
        *slot = Some(v.trim());
    }
    let name = name.ok_or("name= is missing (a unique name nodes call the relay by)")?;
    if name.is_empty()
        || name.chars().count() > MAX_RELAY_NAME
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(format!(
            "name={name:?} must be 1-{MAX_RELAY_NAME} of letters, digits, '-', '_' and '.'"
        ));
    }
    let key = key.ok_or("key= is missing (the relay's X25519 public key, standard base64)")?;
    match STANDARD.decode(key) {
        Ok(bytes) if bytes.len() == 32 => {}
        Ok(bytes) => {
            return Err(format!(
                "key= must be 32 bytes of standard base64 (an X25519 public key), not {} bytes",
                bytes.len()
            ));
        }
        Err(e) => {
            return Err(format!(
                "key= is not standard base64 ({e}); give the relay's X25519 public key"
            ));
        }
    }
    let udp = udp.map(|v| address("udp", v)).transpose()?;
    let tls = tls.map(|v| address("tls", v)).transpose()?;
    if udp.is_none() && tls.is_none() {
        return Err("give udp=IP:PORT, tls=IP:PORT or both: a relay needs one way in".into());
    }
    if sni.is_some() && tls.is_none() {
        return Err("sni= is the name of the relay's TLS certificate and needs tls=IP:PORT".into());
    }
    if sni.is_some_and(str::is_empty) {
        return Err("sni= is empty; give the name the relay's certificate is for".into());
    }
    Ok(RelaySpec {
        name: name.to_owned(),
        public_key: key.to_owned(),
        udp,
        tls,
        tls_server_name: sni.map(str::to_owned),
    })
}

fn address(field: &str, value: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = value.parse().map_err(|_| {
        format!("{field}={value:?} is not IP:PORT (like 203.0.113.5:3479 or [2001:db8::5]:443)")
    })?;
    if addr.port() == 0 {
        return Err(format!(
            "{field}={value}: port 0 is not a port nodes can send to"
        ));
    }
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=";

    #[test]
    fn a_full_relay_spec_parses() {
        let r = parse_relay(&format!(
            "name=r1,key={KEY},udp=203.0.113.5:3479,tls=203.0.113.5:443,sni=relay1.example"
        ))
        .unwrap();
        assert_eq!(r.name, "r1");
        assert_eq!(r.public_key, KEY);
        assert_eq!(r.udp, Some("203.0.113.5:3479".parse().unwrap()));
        assert_eq!(r.tls, Some("203.0.113.5:443".parse().unwrap()));
        assert_eq!(r.tls_server_name.as_deref(), Some("relay1.example"));
        let udp_only = parse_relay(&format!("name=r2,key={KEY},udp=[2001:db8::5]:3479")).unwrap();
        assert_eq!((udp_only.tls, udp_only.tls_server_name), (None, None));
    }

    #[test]
    fn bad_relay_specs_name_the_bad_part() {
        for (spec, says) in [
            (format!("key={KEY},udp=1.2.3.4:1"), "name= is missing"),
            (format!("name=r 1,key={KEY},udp=1.2.3.4:1"), "name=\"r 1\""),
            ("name=r1,udp=1.2.3.4:1".to_owned(), "key= is missing"),
            ("name=r1,key=AAAA,udp=1.2.3.4:1".to_owned(), "32 bytes"),
            (
                "name=r1,key=!!,udp=1.2.3.4:1".to_owned(),
                "not standard base64",
            ),
            (format!("name=r1,key={KEY}"), "one way in"),
            (
                format!("name=r1,key={KEY},udp=relay.example:3479"),
                "udp=\"relay.example:3479\"",
            ),
            (
                format!("name=r1,key={KEY},tls=1.2.3.4:0"),
                "tls=1.2.3.4:0: port 0",
            ),
            (
                format!("name=r1,key={KEY},udp=1.2.3.4:1,sni=x"),
                "needs tls=",
            ),
            (
                format!("name=r1,key={KEY},udp=1.2.3.4:1,port=3"),
                "port= is not a relay field",
            ),
            (
                format!("name=r1,name=r2,key={KEY},udp=1.2.3.4:1"),
                "name= is given twice",
            ),
            (format!("name=r1,key={KEY},udp"), "\"udp\" is not key=value"),
        ] {
            let err = parse_relay(&spec).unwrap_err();
            assert!(err.contains(says), "{spec}: {err}");
        }
    }

    #[test]
    fn relay_names_are_unique_and_stun_ports_not_zero() {
        let r = |n: &str| parse_relay(&format!("name={n},key={KEY},udp=1.2.3.4:5")).unwrap();
        let ok = ReachArgs {
            relays: vec![r("a"), r("b")],
            stun_advertise: vec!["203.0.113.5:3478".parse().unwrap()],
        };
        assert_eq!(ok.check(), Ok(()));
        let twice = ReachArgs {
            relays: vec![r("a"), r("b"), r("a")],
            ..ReachArgs::default()
        };
        assert!(twice.check().unwrap_err().contains("name=a is given twice"));
        let zero = ReachArgs {
            stun_advertise: vec!["203.0.113.5:0".parse().unwrap()],
            ..ReachArgs::default()
        };
        assert!(zero.check().unwrap_err().contains("port 0"));
    }
}
