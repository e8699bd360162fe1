//! `plexd netcheck`: the checks' verdicts, their hints, the report and its rendering. Pure:
//! `netcheck_probe.rs` measures, these functions judge.
//!
//! | check | ok | warn | fail |
//! |-------|----|------|------|
//! | `tcp` | the API's host:port accepts a TCP connection | | DNS fails, refused, timed out |
//! | `tls` | the TLS handshake with the configured trust completes | | the certificate is not trusted, the handshake breaks |
//! | `udp` | at least one STUN server answered | | none answered: UDP blocked |
//! | `nat` | no NAT, or an endpoint-independent mapping | endpoint-dependent mapping; fewer than two answers (unknown) | |
//! | `mtu` | the mesh MTU plus WireGuard's overhead fits the path MTU the kernel knows | it does not fit | |
//!
//! A check that cannot run because an earlier one failed (TLS without TCP) is `skipped`.
//! Any `fail` makes `plexd netcheck` exit 1.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use plexsphere_wire::node::NatMapping;
use serde::Serialize;

use crate::reach::stun;

/// WireGuard's overhead on every packet over IPv4 (20 IP + 8 UDP + 32 WireGuard).
pub(crate) const WG_OVERHEAD_V4: u16 = 60;
/// The same over IPv6 (40-byte IP header).
pub(crate) const WG_OVERHEAD_V6: u16 = 80;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Ok,
    Warn,
    Fail,
    Skipped,
}

impl Verdict {
    fn label(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
            Verdict::Skipped => "skipped",
        }
    }
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub verdict: Verdict,
    pub detail: String,
    /// What to do about a warn or fail.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

impl Check {
    fn new(name: &'static str, verdict: Verdict, detail: impl Into<String>) -> Self {
        Self {
            name,
            verdict,
            detail: detail.into(),
            hint: None,
        }
    }

    fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

/// What one STUN server saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StunAnswer {
    pub server: SocketAddr,
    /// The reflexive address it saw (`None`: no answer after every try).
    pub mapped: Option<SocketAddr>,
}

/// The MTUs netcheck knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MtuFacts {
    /// The interface traffic to the STUN server or API leaves by, and its MTU.
    pub egress_interface: Option<String>,
    pub interface_mtu: Option<u32>,
    /// The kernel's path MTU to that destination (`IP_MTU`: the route's MTU, lowered when an
    /// ICMP "fragmentation needed" came back). plexd does not probe for black holes.
    pub path_mtu: Option<u32>,
    /// `wireguard.mtu`.
    pub mesh_mtu: u16,
    /// Whether the outer packets are IPv6.
    pub outer_v6: bool,
}

/// The whole result (`--output json` prints it).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NetcheckReport {
    pub api_url: String,
    /// Where the STUN servers came from (`--stun`, the cached state, a guess).
    pub stun_source: String,
    pub stun: Vec<StunAnswer>,
    /// The first reflexive address (what peers would see).
    pub reflexive_address: Option<SocketAddr>,
    pub nat_mapping: NatMapping,
    pub udp_blocked: bool,
    pub mtu: MtuFacts,
    pub checks: Vec<Check>,
}

impl NetcheckReport {
    /// Whether any check failed (the exit status is 1 then).
    pub fn failed(&self) -> bool {
        self.checks.iter().any(|c| c.verdict == Verdict::Fail)
    }

    /// The lines for people.
    pub fn render(&self) -> String {
        let mut out = format!("netcheck against {}\n", self.api_url);
        for c in &self.checks {
            let _ = writeln!(out, "{:<4} {:<7} {}", c.name, c.verdict.label(), c.detail);
            if let Some(h) = &c.hint {
                let _ = writeln!(out, "             hint: {h}");
            }
        }
        let _ = writeln!(out, "stun servers ({}):", self.stun_source);
        for s in &self.stun {
            let seen = s
                .mapped
                .map_or_else(|| "no answer".to_owned(), |m| format!("saw {m}"));
            let _ = writeln!(out, "  {:<22} {seen}", s.server.to_string());
        }
        out
    }
}

/// The TCP check from the connection attempt's outcome (`Ok`: the address connected to, in ms).
pub(crate) fn tcp_check(target: &str, outcome: &Result<(SocketAddr, u128), String>) -> Check {
    match outcome {
        Ok((addr, ms)) => Check::new("tcp", Verdict::Ok, format!("connected to {target} ({addr}) in {ms} ms")),
        Err(e) => Check::new("tcp", Verdict::Fail, format!("cannot connect to {target}: {e}")).hint(
            "check DNS, the address in api_url, routes and that outbound TCP to that port is open (firewall, proxy)",
        ),
    }
}

/// How a TLS handshake failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TlsFailure {
    /// The certificate chain is not trusted (or does not name the host).
    NotTrusted(String),
    /// Anything else: reset, an alert, not TLS at all (plain HTTP on the port), a timeout.
    Handshake(String),
    /// The trust settings themselves are unusable (a CA file that does not load).
    Setup(String),
}

/// The TLS check; `None`: TCP failed, so TLS was not tried.
pub(crate) fn tls_check(outcome: Option<&Result<(String, u128), TlsFailure>>) -> Check {
    match outcome {
        None => Check::new("tls", Verdict::Skipped, "not tried (no TCP connection)"),
        Some(Ok((version, ms))) => Check::new("tls", Verdict::Ok, format!("handshake done ({version}) in {ms} ms, certificate trusted")),
        Some(Err(TlsFailure::NotTrusted(e))) => Check::new("tls", Verdict::Fail, format!("the server's certificate is not trusted: {e}"))
            .hint("install the control plane's CA as /etc/plexd/ca.crt (or tls.ca_file / --ca-file), or check tls.ca_sha256; a TLS-intercepting proxy needs its CA trusted"),
        Some(Err(TlsFailure::Handshake(e))) => Check::new("tls", Verdict::Fail, format!("the TLS handshake failed: {e}"))
            .hint("something on the port does not speak TLS (plain HTTP, a proxy) or drops the connection; check api_url's port"),
        Some(Err(TlsFailure::Setup(e))) => Check::new("tls", Verdict::Fail, format!("the trust settings do not load: {e}"))
            .hint("fix the CA file named in the message"),
    }
}

/// The TLS check of an `http://` api_url (`allow_insecure_http`): nothing to check.
pub(crate) fn plain_http_check() -> Check {
    Check::new(
        "tls",
        Verdict::Skipped,
        "api_url is http:// (allow_insecure_http): no TLS to check here",
    )
}

/// The UDP and NAT checks from the STUN answers; `local` are this host's addresses and
/// `port` the local port every request left from.
pub(crate) fn udp_and_nat(
    answers: &[StunAnswer],
    local: &[IpAddr],
    port: u16,
) -> (Check, Check, Option<SocketAddr>, NatMapping, bool) {
    let seen: Vec<(SocketAddr, SocketAddr)> = answers
        .iter()
        .filter_map(|a| a.mapped.map(|m| (a.server, m)))
        .collect();
    let (_, nat) = stun::nat_report(&seen, local, port);
    let reflexive = seen.first().map(|(_, m)| *m);
    let asked = answers.len();
    let udp = if asked == 0 {
        Check::new("udp", Verdict::Skipped, "no STUN server known")
            .hint("pass --stun IP:PORT (the control plane's STUN responder, UDP 3478 by default)")
    } else if nat.udp_blocked {
        Check::new("udp", Verdict::Fail, format!("UDP blocked: none of {asked} STUN servers answered from local port {port}"))
            .hint("outbound UDP is blocked (firewall, NAT) or the STUN servers are down; direct paths need UDP, so peers will use a relay over TCP/TLS")
    } else {
        let mapped = reflexive.map_or_else(String::new, |r| format!(", reflexive address {r}"));
        Check::new(
            "udp",
            Verdict::Ok,
            format!("{} of {asked} STUN servers answered{mapped}", seen.len()),
        )
    };
    let nat_check = match (nat.udp_blocked, nat.mapping) {
        (true, _) => Check::new("nat", Verdict::Skipped, "not measured (no STUN answer)"),
        (false, NatMapping::None) => Check::new("nat", Verdict::Ok, "no NAT: the servers saw this host's own address and port"),
        (false, NatMapping::EndpointIndependent) => Check::new(
            "nat",
            Verdict::Ok,
            format!("endpoint-independent mapping: {} servers saw the same address from one local port; direct paths can be punched", seen.len()),
        ),
        (false, NatMapping::EndpointDependent) => Check::new(
            "nat",
            Verdict::Warn,
            "endpoint-dependent mapping (symmetric NAT): each server saw another port from one local port",
        )
        .hint("peers behind another NAT reach this node through a relay; a port forward or a NAT with endpoint-independent mapping (full cone) allows direct paths"),
        (false, NatMapping::Unknown) => Check::new("nat", Verdict::Warn, "unknown: fewer than two STUN servers answered, nothing to compare")
            .hint("the NAT's mapping needs answers from two servers (pass a second --stun)"),
    };
    (udp, nat_check, reflexive, nat.mapping, nat.udp_blocked)
}

/// The MTU check.
pub(crate) fn mtu_check(m: &MtuFacts) -> Check {
    let overhead = if m.outer_v6 {
        WG_OVERHEAD_V6
    } else {
        WG_OVERHEAD_V4
    };
    let need = u32::from(m.mesh_mtu) + u32::from(overhead);
    let iface = match (&m.egress_interface, m.interface_mtu) {
        (Some(i), Some(mtu)) => format!("{i} mtu {mtu}"),
        (Some(i), None) => format!("{i} (mtu unknown)"),
        _ => "egress interface unknown".to_owned(),
    };
    let known = m.path_mtu.or(m.interface_mtu);
    match known {
        None => Check::new("mtu", Verdict::Skipped, format!("{iface}; no path MTU known")),
        Some(path) if need <= path => Check::new(
            "mtu",
            Verdict::Ok,
            format!("{iface}, path MTU {path} (as the kernel knows it; not probed), mesh MTU {} + {overhead} WireGuard overhead = {need} fits", m.mesh_mtu),
        ),
        Some(path) => Check::new(
            "mtu",
            Verdict::Warn,
            format!("{iface}, path MTU {path}: mesh MTU {} + {overhead} WireGuard overhead = {need} does not fit; large packets over the mesh are fragmented or dropped", m.mesh_mtu),
        )
        .hint(format!("set wireguard.mtu to at most {} in the config", path.saturating_sub(u32::from(overhead)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn nat_kinds_and_blocked_udp_get_their_verdicts() {
        let local: Vec<IpAddr> = vec!["10.200.0.10".parse().unwrap()];
        let (s1, s2) = (a("203.0.113.10:3478"), a("203.0.113.11:3479"));
        let eim = [
            StunAnswer {
                server: s1,
                mapped: Some(a("203.0.113.100:40000")),
            },
            StunAnswer {
                server: s2,
                mapped: Some(a("203.0.113.100:40000")),
            },
        ];
        let (udp, nat, refl, mapping, blocked) = udp_and_nat(&eim, &local, 40000);
        assert_eq!(
            (udp.verdict, nat.verdict, mapping, blocked),
            (
                Verdict::Ok,
                Verdict::Ok,
                NatMapping::EndpointIndependent,
                false
            )
        );
        assert_eq!(refl, Some(a("203.0.113.100:40000")));
        assert!(
            nat.detail.starts_with("endpoint-independent"),
            "{}",
            nat.detail
        );
        let edm = [
            StunAnswer {
                server: s1,
                mapped: Some(a("203.0.113.100:1024")),
            },
            StunAnswer {
                server: s2,
                mapped: Some(a("203.0.113.100:2999")),
            },
        ];
        let (_, nat, _, mapping, _) = udp_and_nat(&edm, &local, 40000);
        assert_eq!(
            (nat.verdict, mapping),
            (Verdict::Warn, NatMapping::EndpointDependent)
        );
        assert!(nat.detail.contains("symmetric NAT") && nat.hint.is_some());
        let none = [
            StunAnswer {
                server: s1,
                mapped: None,
            },
            StunAnswer {
                server: s2,
                mapped: None,
            },
        ];
        let (udp, nat, refl, _, blocked) = udp_and_nat(&none, &local, 40000);
        assert_eq!(
            (udp.verdict, nat.verdict, refl, blocked),
            (Verdict::Fail, Verdict::Skipped, None, true)
        );
        assert!(
            udp.detail
                .starts_with("UDP blocked: none of 2 STUN servers answered"),
            "{}",
            udp.detail
        );
        let direct = [
            StunAnswer {
                server: s1,
                mapped: Some(a("10.200.0.10:40000")),
            },
            StunAnswer {
                server: s2,
                mapped: Some(a("10.200.0.10:40000")),
            },
        ];
        assert_eq!(udp_and_nat(&direct, &local, 40000).3, NatMapping::None);
        let one = [StunAnswer {
            server: s1,
            mapped: Some(a("203.0.113.100:1")),
        }];
        assert_eq!(udp_and_nat(&one, &local, 40000).1.verdict, Verdict::Warn);
        assert_eq!(udp_and_nat(&[], &local, 40000).0.verdict, Verdict::Skipped);
    }

    #[test]
    fn tcp_and_tls_failures_fail_with_hints_and_tls_waits_for_tcp() {
        let t = tcp_check("cp.example:443", &Err("connection refused".into()));
        assert_eq!(t.verdict, Verdict::Fail);
        assert!(t.detail.contains("cp.example:443: connection refused") && t.hint.is_some());
        assert_eq!(tls_check(None).verdict, Verdict::Skipped);
        assert_eq!(plain_http_check().verdict, Verdict::Skipped);
        let bad = tls_check(Some(&Err(TlsFailure::NotTrusted("UnknownIssuer".into()))));
        assert_eq!(bad.verdict, Verdict::Fail);
        assert!(bad.hint.as_deref().unwrap_or_default().contains("ca.crt"));
        let ok = tls_check(Some(&Ok(("TLSv1.3".into(), 4))));
        assert_eq!(ok.verdict, Verdict::Ok);
    }

    #[test]
    fn mtu_fits_or_says_what_to_set() {
        let mut m = MtuFacts {
            egress_interface: Some("eth0".into()),
            interface_mtu: Some(1500),
            path_mtu: Some(1500),
            mesh_mtu: 1420,
            outer_v6: false,
        };
        assert_eq!(mtu_check(&m).verdict, Verdict::Ok);
        m.outer_v6 = true;
        assert_eq!(mtu_check(&m).verdict, Verdict::Ok);
        m.path_mtu = Some(1400);
        let c = mtu_check(&m);
        assert_eq!(c.verdict, Verdict::Warn);
        assert_eq!(
            c.hint.as_deref(),
            Some("set wireguard.mtu to at most 1320 in the config")
        );
        m.path_mtu = None;
        m.interface_mtu = None;
        assert_eq!(mtu_check(&m).verdict, Verdict::Skipped);
    }

    #[test]
    fn the_report_renders_one_line_per_check_and_fails_on_any_failure() {
        let r = NetcheckReport {
            api_url: "https://cp.example".into(),
            stun_source: "--stun".into(),
            stun: vec![StunAnswer {
                server: a("203.0.113.10:3478"),
                mapped: None,
            }],
            reflexive_address: None,
            nat_mapping: NatMapping::Unknown,
            udp_blocked: true,
            mtu: MtuFacts {
                egress_interface: None,
                interface_mtu: None,
                path_mtu: None,
                mesh_mtu: 1420,
                outer_v6: false,
            },
            checks: vec![
                Check::new("tcp", Verdict::Ok, "connected"),
                Check::new("udp", Verdict::Fail, "UDP blocked").hint("open UDP"),
            ],
        };
        assert!(r.failed());
        assert_eq!(
            r.render(),
            "netcheck against https://cp.example\ntcp  ok      connected\nudp  FAIL    UDP blocked\n             hint: open UDP\nstun servers (--stun):\n  203.0.113.10:3478      no answer\n"
        );
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["checks"][1]["verdict"], "fail");
        assert_eq!(v["nat_mapping"], "unknown");
    }
}
