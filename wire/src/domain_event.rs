//! Domain-wide event envelopes: one signature per event for every node of a Domain.
//!
//! A per-node [`Event`] names the node it is addressed to, so each node's copy is its own
//! signature. A [`DomainEvent`] names the Domain instead, with the same rule the control plane
//! uses to pick recipients (`target`, else every node but `subject`), so one signed copy serves
//! every stream of the Domain. A node asks for them with [`ENVELOPES_HEADER`]:
//! [`DOMAIN_ENVELOPES`] on `GET /v1/nodes/{id}/events`; a server that does not know the header
//! sends per-node events, and a node that does not send it never gets a Domain envelope.
//!
//! A frame's `data:` says which kind it holds ([`EventData`]); the outer shape only chooses the
//! signature context, which the signature covers, so relabelling a frame makes it fail to
//! verify. The node then checks the Domain, the recipient rule and the frame id, and applies it
//! as the [`Event`] addressed to itself.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::node::{Event, EventKind};
use crate::signed::SignedEnvelope;

/// The request header a node sends to receive Domain envelopes.
pub const ENVELOPES_HEADER: &str = "plexsphere-event-envelopes";
/// Its value: Domain envelopes are understood.
pub const DOMAIN_ENVELOPES: &str = "domain";

/// One event of a Domain, signed once for every node that receives it (context
/// `DomainEvent`). The SSE `id:` equals `seq`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainEvent {
    pub seq: u64,
    pub domain_id: Uuid,
    /// `Some`: only this node receives the event.
    pub target: Option<Uuid>,
    /// The node the event is about; with no target, every node of the Domain but this one
    /// receives it.
    pub subject: Uuid,
    #[serde(flatten)]
    pub kind: EventKind,
}

/// Whether `node_id` receives an event with this `target` and `subject`: its target, or with
/// no target every node but the subject (the one rule of the control plane's store and of a
/// node checking a Domain event).
pub fn is_recipient(target: Option<Uuid>, subject: Uuid, node_id: Uuid) -> bool {
    match target {
        Some(t) => t == node_id,
        None => subject != node_id,
    }
}

impl DomainEvent {
    /// Whether `node_id` receives this event.
    pub fn is_for(&self, node_id: Uuid) -> bool {
        is_recipient(self.target, self.subject, node_id)
    }

    /// The event as the per-node copy `node_id` would have received.
    pub fn addressed_to(self, node_id: Uuid) -> Event {
        Event {
            seq: self.seq,
            node_id,
            kind: self.kind,
        }
    }
}

/// The `data:` of an event frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EventData {
    /// `{"domain_event": {"payload": ..., "signature": ...}}`: a signed [`DomainEvent`].
    Domain(DomainEnvelope),
    /// `{"payload": ..., "signature": ...}`: a signed per-node [`Event`].
    Node(SignedEnvelope),
}

/// The wrapper that marks a Domain envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainEnvelope {
    pub domain_event: SignedEnvelope,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> SignedEnvelope {
        SignedEnvelope {
            payload: "cGF5".to_owned(),
            signature: "c2ln".to_owned(),
        }
    }

    #[test]
    fn the_frame_data_says_which_envelope_it_holds() {
        let node = serde_json::to_string(&EventData::Node(env())).unwrap();
        assert_eq!(node, r#"{"payload":"cGF5","signature":"c2ln"}"#);
        let domain = serde_json::to_string(&EventData::Domain(DomainEnvelope {
            domain_event: env(),
        }))
        .unwrap();
        assert_eq!(
            domain,
            r#"{"domain_event":{"payload":"cGF5","signature":"c2ln"}}"#
        );
        for text in [&node, &domain] {
            let back: EventData = serde_json::from_str(text).unwrap();
            assert_eq!(&serde_json::to_string(&back).unwrap(), text);
        }
        // Anything else is neither (unknown fields are refused by both shapes).
        for bad in [
            r#"{"payload":"a","signature":"b","extra":1}"#,
            r#"{"domain_event":{"payload":"a","signature":"b"},"payload":"a"}"#,
            r#"{"domain_event":"x"}"#,
            "[]",
        ] {
            assert!(serde_json::from_str::<EventData>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_domain_event_is_for_its_target_or_for_everyone_but_its_subject() {
        let (a, b, c) = (Uuid::from_u128(1), Uuid::from_u128(2), Uuid::from_u128(3));
        let mut ev = DomainEvent {
            seq: 7,
            domain_id: Uuid::from_u128(9),
            target: None,
            subject: a,
            kind: EventKind::NodeRevoked,
        };
        assert!(!ev.is_for(a) && ev.is_for(b) && ev.is_for(c));
        ev.target = Some(b);
        assert!(!ev.is_for(a) && ev.is_for(b) && !ev.is_for(c));
        let copy = ev.addressed_to(b);
        assert_eq!((copy.seq, copy.node_id), (7, b));
    }
}
