//! One query in, one answer out (pure): what docs/dns.md "What is answered" says, row for row.
//!
//! | query | answer |
//! |---|---|
//! | not a query (QR set: an answer, maybe looped back), shorter than a header | nothing (never answer an answer: no loops) |
//! | unparsable | FORMERR |
//! | opcode other than QUERY | NOTIMP |
//! | not exactly one question | FORMERR |
//! | EDNS version above 0 | BADVERS |
//! | class other than IN, no names in the state | REFUSED |
//! | `<name>.<suffix>` of the table: A, AAAA, ANY | its addresses (TTL [`NAME_TTL`]); none of the type: NOERROR, no answer, SOA |
//! | `<name>.<suffix>`, another type | NOERROR, no answer, SOA |
//! | the suffix itself | SOA for SOA (and ANY), else no answer with SOA |
//! | any other name under the suffix | NXDOMAIN with SOA |
//! | PTR of a mesh address with a name | the name |
//! | PTR of another mesh address | NXDOMAIN with SOA |
//! | a reverse prefix overlapping the mesh range | NOERROR, no answer, SOA |
//! | anything else | REFUSED |
//!
//! Every answer is authoritative (AA) for the suffix and the mesh's reverse zone, never
//! recursive (RA clear), echoes the question as asked (its case: 0x20 randomisation), and
//! over UDP fits the asker's EDNS size (at most [`UDP_PAYLOAD`]; 512 without EDNS) or is cut to
//! the question with TC set so the asker retries over TCP.

use std::net::IpAddr;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, PTR, SOA};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};

use super::zone::Zone;
use super::{NAME_TTL, UDP_PAYLOAD, reverse};

/// How the query came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

/// What a query is under the table.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    Records(Vec<Record>),
    /// NOERROR without records; the SOA of this zone in the authority section.
    NoData(Name),
    NxDomain(Name),
    Refused,
}

/// The answer to the wire-format `query`, or `None` when nothing may be sent back.
pub fn answer(zone: Option<&Zone>, query: &[u8], transport: Transport) -> Option<Vec<u8>> {
    // The header's first bytes: the id, and QR (never answer an answer).
    let [id_hi, id_lo, flags, ..] = *query else {
        return None;
    };
    if query.len() < 12 || flags & 0x80 != 0 {
        return None;
    }
    let id = u16::from_be_bytes([id_hi, id_lo]);
    let request = match Message::from_vec(query) {
        Ok(m) => m,
        Err(_) => {
            let op = OpCode::from_u8((flags >> 3) & 0x0f);
            return encode(Message::error_msg(id, op, ResponseCode::FormErr));
        }
    };
    let mut response = Message::response(id, request.metadata.op_code);
    response.metadata.recursion_desired = request.metadata.recursion_desired;
    response.metadata.checking_disabled = request.metadata.checking_disabled;
    response.metadata.recursion_available = false;
    let limit = match (&request.edns, transport) {
        (_, Transport::Tcp) => usize::from(u16::MAX),
        (Some(e), Transport::Udp) => usize::from(e.max_payload().clamp(512, UDP_PAYLOAD)),
        (None, Transport::Udp) => 512,
    };
    if let Some(req_edns) = &request.edns {
        let mut edns = Edns::new();
        edns.set_max_payload(UDP_PAYLOAD);
        edns.set_version(0);
        response.set_edns(edns);
        if req_edns.version() > 0 {
            response.add_queries(request.queries.iter().cloned());
            response.metadata.response_code = ResponseCode::BADVERS;
            return encode(response);
        }
    }
    if request.metadata.op_code != OpCode::Query {
        response.metadata.response_code = ResponseCode::NotImp;
        return encode(response);
    }
    let [question] = request.queries.as_slice() else {
        response.add_queries(request.queries.iter().take(1).cloned());
        response.metadata.response_code = ResponseCode::FormErr;
        return encode(response);
    };
    response.add_query(question.clone());
    let found = match zone {
        Some(zone) if question.query_class() == DNSClass::IN => find(zone, question),
        _ => Found::Refused,
    };
    match found {
        Found::Records(records) => {
            response.metadata.authoritative = true;
            response.add_answers(records);
        }
        Found::NoData(apex) => {
            response.metadata.authoritative = true;
            response.add_authority(soa(zone?, apex));
        }
        Found::NxDomain(apex) => {
            response.metadata.authoritative = true;
            response.metadata.response_code = ResponseCode::NXDomain;
            response.add_authority(soa(zone?, apex));
        }
        Found::Refused => response.metadata.response_code = ResponseCode::Refused,
    }
    let bytes = response.to_vec().ok()?;
    if bytes.len() <= limit {
        return Some(bytes);
    }
    encode(response.truncate())
}

fn encode(message: Message) -> Option<Vec<u8>> {
    debug_assert_eq!(message.metadata.message_type, MessageType::Response);
    message.to_vec().ok()
}

/// The query name's labels, lowercase, leftmost first.
fn lower_labels(name: &Name) -> Vec<Vec<u8>> {
    name.iter().map(|l| l.to_ascii_lowercase()).collect()
}

fn find(zone: &Zone, q: &Query) -> Found {
    let labels = lower_labels(q.name());
    let suffix = zone.suffix_labels();
    if labels.len() >= suffix.len() && labels[labels.len() - suffix.len()..] == *suffix {
        return find_name(zone, q, &labels[..labels.len() - suffix.len()]);
    }
    match reverse::parse(&labels) {
        Some(net) => find_reverse(zone, q, net),
        None => Found::Refused,
    }
}

/// A name under the suffix; `head` is what comes before it.
fn find_name(zone: &Zone, q: &Query, head: &[Vec<u8>]) -> Found {
    let apex = zone.suffix_name().clone();
    let qtype = q.query_type();
    match head {
        [] => match qtype {
            RecordType::SOA | RecordType::ANY => {
                Found::Records(vec![soa_at(zone, q.name().clone())])
            }
            _ => Found::NoData(apex),
        },
        [label] => match zone.lookup(label) {
            None => Found::NxDomain(apex),
            Some(addrs) => {
                let records: Vec<Record> = addrs
                    .iter()
                    .filter_map(|a| address_record(q.name(), *a, qtype))
                    .collect();
                if records.is_empty() {
                    Found::NoData(apex)
                } else {
                    Found::Records(records)
                }
            }
        },
        _ => Found::NxDomain(apex),
    }
}

fn address_record(name: &Name, addr: IpAddr, qtype: RecordType) -> Option<Record> {
    let rdata = match (addr, qtype) {
        (IpAddr::V4(a), RecordType::A | RecordType::ANY) => RData::A(A(a)),
        (IpAddr::V6(a), RecordType::AAAA | RecordType::ANY) => RData::AAAA(AAAA(a)),
        _ => return None,
    };
    Some(Record::from_rdata(name.clone(), NAME_TTL, rdata))
}

fn find_reverse(zone: &Zone, q: &Query, net: ipnet::IpNet) -> Found {
    let (mesh, rzone) = (zone.mesh(), zone.reverse_zone());
    let apex = zone.reverse_name().clone();
    if let Some(addr) = reverse::address(net) {
        if !mesh.contains(&addr) {
            return Found::Refused;
        }
        return match zone.ptr(addr) {
            None => Found::NxDomain(apex),
            Some(target) => match q.query_type() {
                RecordType::PTR | RecordType::ANY => Found::Records(vec![Record::from_rdata(
                    q.name().clone(),
                    NAME_TTL,
                    RData::PTR(PTR(target)),
                )]),
                _ => Found::NoData(apex),
            },
        };
    }
    // A prefix: ours when it lies inside the reverse zone and overlaps the mesh range.
    let inside = rzone.contains(&net);
    let overlaps = mesh.contains(&net) || net.contains(&mesh);
    if !inside || !overlaps {
        return Found::Refused;
    }
    if net == rzone && matches!(q.query_type(), RecordType::SOA | RecordType::ANY) {
        return Found::Records(vec![soa_at(zone, q.name().clone())]);
    }
    Found::NoData(apex)
}

/// The SOA of `apex` (negative answers' authority section; its minimum is the negative TTL).
fn soa(zone: &Zone, apex: Name) -> Record {
    soa_at(zone, apex)
}

fn soa_at(zone: &Zone, owner: Name) -> Record {
    let mname = zone.suffix_name().clone();
    let rname = Name::from_labels([b"hostmaster".as_slice()])
        .and_then(|h| h.append_domain(zone.suffix_name()))
        .unwrap_or_else(|_| zone.suffix_name().clone());
    let rdata = SOA::new(mname, rname, 1, 3600, 600, 86400, NAME_TTL);
    Record::from_rdata(owner, NAME_TTL, RData::SOA(rdata))
}
