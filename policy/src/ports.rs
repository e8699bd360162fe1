//! Protocols and ports: what a rule allows (`tcp`, `udp`, `icmp`, `any`; `5432`,
//! `8000-8100`, `*`) as normalized range lists, with the set operations the compiler, the
//! diff and explain need.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The protocol of one packet, as far as the policy cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    Tcp,
    Udp,
    /// ICMPv4 or ICMPv6.
    Icmp,
    /// Any other IP protocol (its number): allowed only by `proto: any`.
    Other(u8),
}

impl Proto {
    /// The IP protocol number (ICMP as 1; ICMPv6 is 58 on the wire).
    pub fn number(self) -> u8 {
        match self {
            Proto::Tcp => 6,
            Proto::Udp => 17,
            Proto::Icmp => 1,
            Proto::Other(n) => n,
        }
    }

    /// Whether ports mean something for this protocol.
    pub fn has_ports(self) -> bool {
        matches!(self, Proto::Tcp | Proto::Udp)
    }

    /// `tcp`, `udp`, `icmp` (what a test or `explain` names).
    pub fn parse(s: &str) -> Option<Proto> {
        match s {
            "tcp" => Some(Proto::Tcp),
            "udp" => Some(Proto::Udp),
            "icmp" => Some(Proto::Icmp),
            _ => None,
        }
    }
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Proto::Tcp => f.write_str("tcp"),
            Proto::Udp => f.write_str("udp"),
            Proto::Icmp => f.write_str("icmp"),
            Proto::Other(n) => write!(f, "ip-proto-{n}"),
        }
    }
}

/// The protocols a rule names: `any` is all four bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ProtoSet(u8);

impl ProtoSet {
    pub const TCP: ProtoSet = ProtoSet(1);
    pub const UDP: ProtoSet = ProtoSet(2);
    pub const ICMP: ProtoSet = ProtoSet(4);
    pub const OTHER: ProtoSet = ProtoSet(8);
    pub const ANY: ProtoSet = ProtoSet(15);

    pub fn union(self, o: ProtoSet) -> ProtoSet {
        ProtoSet(self.0 | o.0)
    }

    pub fn contains(self, p: Proto) -> bool {
        let bit = match p {
            Proto::Tcp => Self::TCP,
            Proto::Udp => Self::UDP,
            Proto::Icmp => Self::ICMP,
            Proto::Other(_) => Self::OTHER,
        };
        self.0 & bit.0 != 0
    }

    pub fn has(self, o: ProtoSet) -> bool {
        self.0 & o.0 == o.0
    }

    /// Whether it names a protocol without ports (icmp or any).
    pub fn portless(self) -> bool {
        self.0 & (Self::ICMP.0 | Self::OTHER.0) != 0
    }

    /// `tcp`, `udp`, `icmp` or `any`.
    pub fn parse(s: &str) -> Option<ProtoSet> {
        match s {
            "tcp" => Some(Self::TCP),
            "udp" => Some(Self::UDP),
            "icmp" => Some(Self::ICMP),
            "any" => Some(Self::ANY),
            _ => None,
        }
    }
}

/// Inclusive port range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    pub const ALL: PortRange = PortRange {
        first: 0,
        last: u16::MAX,
    };

    /// `5432`, `8000-8100` or `*`; the error says what is wrong.
    pub fn parse(s: &str) -> Result<PortRange, String> {
        let s = s.trim();
        if s == "*" {
            return Ok(Self::ALL);
        }
        let port = |p: &str| -> Result<u16, String> {
            p.trim().parse::<u16>().map_err(|_| {
                format!("`{p}` is not a port: write a number from 0 to 65535, a range like 8000-8100, or *")
            })
        };
        match s.split_once('-') {
            Some((a, b)) => {
                let (first, last) = (port(a)?, port(b)?);
                if first > last {
                    return Err(format!(
                        "the range `{s}` runs backwards: write the smaller port first ({last}-{first})"
                    ));
                }
                Ok(PortRange { first, last })
            }
            None => {
                let p = port(s)?;
                Ok(PortRange { first: p, last: p })
            }
        }
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Self::ALL {
            f.write_str("*")
        } else if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

/// A set of ports as sorted, disjoint, non-adjacent ranges (so equal sets compare equal).
/// Deserializing normalizes (and drops backwards ranges).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(from = "Vec<PortRange>")]
pub struct PortSet(Vec<PortRange>);

impl PortSet {
    pub fn empty() -> PortSet {
        PortSet(Vec::new())
    }

    pub fn all() -> PortSet {
        PortSet(vec![PortRange::ALL])
    }

    pub fn from_ranges(ranges: impl IntoIterator<Item = PortRange>) -> PortSet {
        let mut v: Vec<PortRange> = ranges.into_iter().filter(|r| r.first <= r.last).collect();
        v.sort();
        let mut out: Vec<PortRange> = Vec::with_capacity(v.len());
        for r in v {
            match out.last_mut() {
                Some(l) if u32::from(r.first) <= u32::from(l.last) + 1 => {
                    l.last = l.last.max(r.last);
                }
                _ => out.push(r),
            }
        }
        PortSet(out)
    }

    pub fn ranges(&self) -> &[PortRange] {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn is_all(&self) -> bool {
        self.0 == [PortRange::ALL]
    }

    /// Scans the ranges: for the plain evaluator and explain, never per packet.
    pub fn contains(&self, port: u16) -> bool {
        self.0.iter().any(|r| r.first <= port && port <= r.last)
    }

    pub fn union(&self, o: &PortSet) -> PortSet {
        PortSet::from_ranges(self.0.iter().chain(o.0.iter()).copied())
    }

    /// The ports in `self` and not in `o`.
    pub fn minus(&self, o: &PortSet) -> PortSet {
        let mut out = Vec::new();
        for r in &self.0 {
            let mut start = u32::from(r.first);
            let end = u32::from(r.last);
            for x in &o.0 {
                let (xf, xl) = (u32::from(x.first), u32::from(x.last));
                if xl < start || xf > end {
                    continue;
                }
                if xf > start {
                    out.push(range(start, xf - 1));
                }
                start = xl + 1;
                if start > end {
                    break;
                }
            }
            if start <= end {
                out.push(range(start, end));
            }
        }
        PortSet(out)
    }
}

impl From<Vec<PortRange>> for PortSet {
    fn from(v: Vec<PortRange>) -> PortSet {
        PortSet::from_ranges(v)
    }
}

fn range(first: u32, last: u32) -> PortRange {
    PortRange {
        first: u16::try_from(first).unwrap_or(u16::MAX),
        last: u16::try_from(last).unwrap_or(u16::MAX),
    }
}

impl fmt::Display for PortSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

/// What one node may send another: per protocol, the ports (tcp and udp) or a yes/no.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Access {
    pub tcp: PortSet,
    pub udp: PortSet,
    pub icmp: bool,
    /// Every other IP protocol (only `proto: any` grants it).
    pub other: bool,
}

impl Access {
    pub fn is_empty(&self) -> bool {
        self.tcp.is_empty() && self.udp.is_empty() && !self.icmp && !self.other
    }

    /// Adds what one rule grants.
    pub fn add(&mut self, protos: ProtoSet, ports: &PortSet) {
        if protos.contains(Proto::Tcp) {
            self.tcp = self.tcp.union(ports);
        }
        if protos.contains(Proto::Udp) {
            self.udp = self.udp.union(ports);
        }
        self.icmp |= protos.contains(Proto::Icmp);
        self.other |= protos.has(ProtoSet::OTHER);
    }

    /// Adds everything `o` grants.
    pub fn add_access(&mut self, o: &Access) {
        if !o.tcp.is_empty() {
            self.tcp = self.tcp.union(&o.tcp);
        }
        if !o.udp.is_empty() {
            self.udp = self.udp.union(&o.udp);
        }
        self.icmp |= o.icmp;
        self.other |= o.other;
    }

    pub fn allows(&self, proto: Proto, port: u16) -> bool {
        match proto {
            Proto::Tcp => self.tcp.contains(port),
            Proto::Udp => self.udp.contains(port),
            Proto::Icmp => self.icmp,
            Proto::Other(_) => self.other,
        }
    }

    /// What `self` has and `o` lacks.
    pub fn minus(&self, o: &Access) -> Access {
        Access {
            tcp: self.tcp.minus(&o.tcp),
            udp: self.udp.minus(&o.udp),
            icmp: self.icmp && !o.icmp,
            other: self.other && !o.other,
        }
    }
}

impl fmt::Display for Access {
    /// `tcp 22,5432; udp 53; icmp; other protocols`, or `nothing`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if !self.tcp.is_empty() {
            parts.push(format!("tcp {}", self.tcp));
        }
        if !self.udp.is_empty() {
            parts.push(format!("udp {}", self.udp));
        }
        if self.icmp {
            parts.push("icmp".to_string());
        }
        if self.other {
            parts.push("other IP protocols".to_string());
        }
        if parts.is_empty() {
            f.write_str("nothing")
        } else {
            f.write_str(&parts.join("; "))
        }
    }
}
