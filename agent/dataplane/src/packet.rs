//! Building plain IP packets, for tests and benches: compiled only for this crate's tests and
//! with the `test-support` feature (its integration tests and benches/ turn it on), so plexd
//! never ships it.
//!
//! The data plane itself only reads a packet's version, length and addresses (boringtun does);
//! these builders write valid IPv4 (with header checksum) and IPv6 headers around a UDP
//! payload so a real kernel would take them too.

use std::net::{Ipv4Addr, Ipv6Addr};

const UDP: u8 = 17;

/// An IPv4/UDP packet from `src` to `dst` carrying `payload`, ports 9 (discard) both ways.
pub fn ipv4_udp(src: Ipv4Addr, dst: Ipv4Addr, payload: &[u8]) -> Vec<u8> {
    let total = 20 + 8 + payload.len();
    let total16 = u16::try_from(total).unwrap_or(u16::MAX);
    let mut p = Vec::with_capacity(total);
    p.extend_from_slice(&[0x45, 0]);
    p.extend_from_slice(&total16.to_be_bytes());
    p.extend_from_slice(&[0, 0, 0x40, 0, 64, UDP, 0, 0]);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    let sum = checksum(&p[..20]);
    p[10..12].copy_from_slice(&sum.to_be_bytes());
    push_udp(&mut p, payload);
    p
}

/// An IPv6/UDP packet from `src` to `dst` carrying `payload`.
pub fn ipv6_udp(src: Ipv6Addr, dst: Ipv6Addr, payload: &[u8]) -> Vec<u8> {
    let len = u16::try_from(8 + payload.len()).unwrap_or(u16::MAX);
    let mut p = Vec::with_capacity(40 + 8 + payload.len());
    p.extend_from_slice(&[0x60, 0, 0, 0]);
    p.extend_from_slice(&len.to_be_bytes());
    p.extend_from_slice(&[UDP, 64]);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    push_udp(&mut p, payload);
    p
}

fn push_udp(p: &mut Vec<u8>, payload: &[u8]) {
    let len = u16::try_from(8 + payload.len()).unwrap_or(u16::MAX);
    p.extend_from_slice(&9u16.to_be_bytes());
    p.extend_from_slice(&9u16.to_be_bytes());
    p.extend_from_slice(&len.to_be_bytes());
    // A zero UDP checksum means "none" over IPv4; fine for tests over IPv6 too.
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(payload);
}

/// The Internet checksum of an IPv4 header.
fn checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    // Folded above, so this fits.
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_header_checksum_verifies_and_lengths_match() {
        let p = ipv4_udp(
            Ipv4Addr::new(10, 64, 0, 1),
            Ipv4Addr::new(10, 64, 0, 2),
            b"hi",
        );
        assert_eq!(p.len(), 30);
        assert_eq!(u16::from_be_bytes([p[2], p[3]]), 30);
        assert_eq!(checksum(&p[..20]), 0, "a valid header sums to zero");
        let q = ipv6_udp(Ipv6Addr::LOCALHOST, Ipv6Addr::LOCALHOST, b"hi");
        assert_eq!(q.len(), 50);
        assert_eq!(u16::from_be_bytes([q[4], q[5]]), 10);
    }
}
