//! From raw IP packet bytes to what the filter decides on: addresses, protocol, ports (or
//! the ICMP echo id, or the flow an ICMP error is about). Bounds-checked; never panics.
//!
//! Fragments: a first fragment (offset 0) is parsed like a whole packet and must carry
//! the whole transport header (a TCP first fragment shorter than 20 bytes is refused, RFC
//! 1858). A later fragment has no ports: it is [`L4::LaterFragment`], and the decision lets
//! it through from a known peer, because the host cannot reassemble it without the first
//! fragment, which was checked; a TCP fragment at offset 8 bytes (offset field 1) is
//! refused, as it could rewrite the checked header's flags (RFC 1858). Overlapping
//! fragments are the host stack's to refuse (Linux drops them).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::limits::MAX_IPV6_EXT_HEADERS;
use crate::ports::Proto;

/// The flow an ICMP error is about: the header of the packet that caused it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inner {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: Proto,
    /// Ports, or (for an ICMP echo) the echo id as `sport` and 0.
    pub sport: u16,
    pub dport: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Icmp {
    EchoRequest {
        id: u16,
    },
    EchoReply {
        id: u16,
    },
    /// Destination unreachable, packet too big, time exceeded, parameter problem; `None`
    /// when the quoted header does not parse.
    Error(Option<Inner>),
    Other {
        kind: u8,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L4 {
    Tcp {
        sport: u16,
        dport: u16,
    },
    Udp {
        sport: u16,
        dport: u16,
    },
    Icmp(Icmp),
    Other(u8),
    /// A fragment other than the first, of this IP protocol.
    LaterFragment(u8),
}

/// One parsed packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub l4: L4,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    #[error("the packet is empty")]
    Empty,
    #[error("IP version {0} is neither 4 nor 6")]
    Version(u8),
    #[error("the packet is shorter than its headers say")]
    Truncated,
    #[error("the IPv4 header length is below 20 bytes")]
    HeaderLength,
    #[error("a fragment too small to hold or to leave alone the transport header (RFC 1858)")]
    TinyFragment,
    #[error("more than {MAX_IPV6_EXT_HEADERS} IPv6 extension headers")]
    TooManyExtensionHeaders,
}

const TCP: u8 = 6;
const UDP: u8 = 17;
const ICMP4: u8 = 1;
const ICMP6: u8 = 58;

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn v4(b: &[u8], at: usize) -> Option<IpAddr> {
    let o: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
    Some(IpAddr::V4(Ipv4Addr::from(o)))
}

fn v6(b: &[u8], at: usize) -> Option<IpAddr> {
    let o: [u8; 16] = b.get(at..at + 16)?.try_into().ok()?;
    Some(IpAddr::V6(Ipv6Addr::from(o)))
}

/// The IP header: addresses, protocol, where the transport header starts, whether this is
/// a later fragment (and at which 8-byte offset).
struct Ip {
    src: IpAddr,
    dst: IpAddr,
    proto: u8,
    l4_at: usize,
    frag_offset: u16,
}

fn ip_header(b: &[u8], whole: bool) -> Result<(Ip, usize), PacketError> {
    let first = *b.first().ok_or(PacketError::Empty)?;
    match first >> 4 {
        4 => {
            let ihl = usize::from(first & 0x0f) * 4;
            if b.len() < 20 {
                return Err(PacketError::Truncated);
            }
            if ihl < 20 {
                return Err(PacketError::HeaderLength);
            }
            let total = usize::from(be16(b, 2).ok_or(PacketError::Truncated)?);
            let end = if whole {
                if total > b.len() || total < ihl {
                    return Err(PacketError::Truncated);
                }
                total
            } else {
                b.len()
            };
            if ihl > end {
                return Err(PacketError::Truncated);
            }
            let frag = be16(b, 6).ok_or(PacketError::Truncated)?;
            let ip = Ip {
                src: v4(b, 12).ok_or(PacketError::Truncated)?,
                dst: v4(b, 16).ok_or(PacketError::Truncated)?,
                proto: b[9],
                l4_at: ihl,
                frag_offset: frag & 0x1fff,
            };
            Ok((ip, end))
        }
        6 => {
            if b.len() < 40 {
                return Err(PacketError::Truncated);
            }
            let payload = usize::from(be16(b, 4).ok_or(PacketError::Truncated)?);
            let end = if whole {
                if 40 + payload > b.len() {
                    return Err(PacketError::Truncated);
                }
                40 + payload
            } else {
                b.len()
            };
            let (src, dst) = (
                v6(b, 8).ok_or(PacketError::Truncated)?,
                v6(b, 24).ok_or(PacketError::Truncated)?,
            );
            let mut next = b[6];
            let mut at = 40;
            let mut frag_offset = 0;
            let mut walked = 0;
            while matches!(next, 0 | 43 | 60 | 51 | 44) {
                walked += 1;
                if walked > MAX_IPV6_EXT_HEADERS {
                    return Err(PacketError::TooManyExtensionHeaders);
                }
                let h = b.get(at..(at + 8).min(end)).filter(|h| h.len() == 8);
                let h = h.ok_or(PacketError::Truncated)?;
                let len = match next {
                    44 => {
                        frag_offset = be16(h, 2).unwrap_or(0) >> 3;
                        8
                    }
                    51 => (usize::from(h[1]) + 2) * 4,
                    _ => (usize::from(h[1]) + 1) * 8,
                };
                next = h[0];
                at += len;
                if frag_offset > 0 {
                    break;
                }
            }
            let ip = Ip {
                src,
                dst,
                proto: next,
                l4_at: at,
                frag_offset,
            };
            Ok((ip, end))
        }
        v => Err(PacketError::Version(v)),
    }
}

/// Parses a whole packet as it came out of the tunnel (or goes into it).
pub fn parse_packet(b: &[u8]) -> Result<Packet, PacketError> {
    let (ip, end) = ip_header(b, true)?;
    let l4 = if ip.frag_offset > 0 {
        if ip.frag_offset == 1 && ip.proto == TCP {
            return Err(PacketError::TinyFragment);
        }
        L4::LaterFragment(ip.proto)
    } else {
        let t = b.get(ip.l4_at..end).ok_or(PacketError::Truncated)?;
        transport(ip.proto, t, ip.src.is_ipv6())?
    };
    Ok(Packet {
        src: ip.src,
        dst: ip.dst,
        l4,
    })
}

fn ports(t: &[u8], need: usize) -> Result<(u16, u16), PacketError> {
    if t.len() < need {
        return Err(PacketError::TinyFragment);
    }
    Ok((be16(t, 0).unwrap_or(0), be16(t, 2).unwrap_or(0)))
}

fn transport(proto: u8, t: &[u8], ipv6: bool) -> Result<L4, PacketError> {
    let icmp = if ipv6 { ICMP6 } else { ICMP4 };
    Ok(match proto {
        TCP => {
            let (sport, dport) = ports(t, 20)?;
            L4::Tcp { sport, dport }
        }
        UDP => {
            let (sport, dport) = ports(t, 8)?;
            L4::Udp { sport, dport }
        }
        p if p == icmp => {
            if t.len() < 8 {
                return Err(PacketError::Truncated);
            }
            let id = be16(t, 4).unwrap_or(0);
            L4::Icmp(match (ipv6, t[0]) {
                (false, 8) | (true, 128) => Icmp::EchoRequest { id },
                (false, 0) | (true, 129) => Icmp::EchoReply { id },
                (false, 3 | 11 | 12) | (true, 1..=4) => Icmp::Error(inner(&t[8..])),
                (_, kind) => Icmp::Other { kind },
            })
        }
        other => L4::Other(other),
    })
}

/// The quoted header in an ICMP error: an IP header and at least 8 bytes after it.
fn inner(b: &[u8]) -> Option<Inner> {
    let (ip, _) = ip_header(b, false).ok()?;
    if ip.frag_offset > 0 {
        return None;
    }
    let t = b.get(ip.l4_at..)?;
    let (proto, sport, dport) = match ip.proto {
        TCP | UDP => {
            let p = if ip.proto == TCP {
                Proto::Tcp
            } else {
                Proto::Udp
            };
            (p, be16(t, 0)?, be16(t, 2)?)
        }
        ICMP4 | ICMP6 => (Proto::Icmp, be16(t, 4)?, 0),
        other => (Proto::Other(other), 0, 0),
    };
    Some(Inner {
        src: ip.src,
        dst: ip.dst,
        proto,
        sport,
        dport,
    })
}

impl Packet {
    /// The protocol and the port a rule is checked against (the destination port; 0 for
    /// protocols without ports).
    pub fn proto_port(&self) -> (Proto, u16) {
        match self.l4 {
            L4::Tcp { dport, .. } => (Proto::Tcp, dport),
            L4::Udp { dport, .. } => (Proto::Udp, dport),
            L4::Icmp(_) => (Proto::Icmp, 0),
            L4::Other(p) => (Proto::Other(p), 0),
            L4::LaterFragment(p) => (proto_of(p), 0),
        }
    }
}

/// The policy's protocol for an IP protocol number.
pub fn proto_of(n: u8) -> Proto {
    match n {
        TCP => Proto::Tcp,
        UDP => Proto::Udp,
        ICMP4 | ICMP6 => Proto::Icmp,
        other => Proto::Other(other),
    }
}
