//! Whether a state document or an event may be applied: signed by the Domain key the node
//! pinned (at registration, or by following a rotation) or by the next key a document signed
//! with the pinned key announced, addressed to this node, not older than what is applied, and
//! (for events) carrying the same `seq` as the SSE frame's `id:`. An event comes either as the
//! node's own copy or as its Domain's one signed copy for every node
//! ([`plexsphere_wire::domain_event`]): then it must name this node's Domain and this node as a
//! recipient. Pure; a refusal says why, for
//! the log. What a verified document means for the keys (an announcement, a promotion) is the
//! core's to decide: each accepted document says which key signed it ([`SignedBy`]).

use plexsphere_wire::domain_event::{DomainEvent, EventData};
use plexsphere_wire::node::{Event, NodeState};
use plexsphere_wire::signed::{DomainVerifier, SignContext, SignedEnvelope, VerifyError};
use plexsphere_wire::signing_keys::SigningKey;
use serde::de::DeserializeOwned;
use uuid::Uuid;

/// Why a document was refused. The daemon logs it at warn and keeps the last good state.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("it is not a signed envelope: {0}")]
    NotAnEnvelope(String),
    #[error("{0}")]
    Signature(#[from] VerifyError),
    #[error("it is addressed to node {got}, not to this node {own}")]
    OtherNode { got: Uuid, own: Uuid },
    #[error("it is an event of Domain {got}, not of this node's Domain {own}")]
    OtherDomain { got: Uuid, own: Uuid },
    #[error(
        "it is a Domain event this node does not receive (target {target:?}, about node {subject})"
    )]
    NotARecipient { target: Option<Uuid>, subject: Uuid },
    #[error("it is a Domain event, and this node's Domain is not known to check it against")]
    NoDomain,
    #[error("its version {got} is older than the applied version {applied}")]
    Older { got: u64, applied: u64 },
    #[error("its signed seq {signed} differs from the frame id `{frame_id}`")]
    SeqMismatch { signed: u64, frame_id: String },
    #[error("the frame has no usable `id:` (`{0}`)")]
    BadFrameId(String),
    #[error(
        "it was issued {age_secs} s ago, more than the {max_secs} s a fresh answer may be old (a replay, or this host's clock is wrong)"
    )]
    Stale { age_secs: u64, max_secs: u64 },
}

/// Which of the node's Domain keys verified a document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignedBy {
    /// The pinned key.
    Pinned,
    /// The announced next key: the rotation's overlap is over, the node moves to it.
    Next,
}

/// The Domain keys a node trusts: the pinned one, and the next one while an overlap lasts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainKeys {
    /// The pinned public key, standard base64.
    pub pinned: String,
    /// Its generation, when known (a key pinned at registration has none).
    pub generation: Option<u64>,
    pub next: Option<SigningKey>,
}

/// What a document is checked against.
#[derive(Clone)]
pub struct Acceptor {
    verifier: DomainVerifier,
    keys: DomainKeys,
    /// The announced next key's verifier (`keys.next` decoded).
    next: Option<DomainVerifier>,
    node_id: Uuid,
    /// The node's Domain: Domain events must name it (none known: they are refused).
    domain_id: Option<Uuid>,
}

impl Acceptor {
    /// The keys as the identity file keeps them; an error names the bad one.
    pub fn with_keys(keys: DomainKeys, node_id: Uuid) -> Result<Self, String> {
        let verifier = DomainVerifier::from_b64(&keys.pinned)
            .map_err(|e| format!("domain_signing_public_key: {e}"))?;
        let next = match &keys.next {
            Some(k) => Some(
                DomainVerifier::from_b64(&k.public_key)
                    .map_err(|e| format!("next_signing_key: {e}"))?,
            ),
            None => None,
        };
        Ok(Self {
            verifier,
            keys,
            next,
            node_id,
            domain_id: None,
        })
    }

    /// Accepts Domain events of `domain_id` (the node's Domain).
    pub fn in_domain(mut self, domain_id: Uuid) -> Self {
        self.domain_id = Some(domain_id);
        self
    }

    /// The identity's keys (pinned and next).
    pub fn from_identity(id: &crate::identity::Identity) -> Result<Self, String> {
        Self::with_keys(
            DomainKeys {
                pinned: id.domain_signing_public_key.clone(),
                generation: id.domain_signing_key_generation,
                next: id.next_signing_key.clone(),
            },
            id.node_id,
        )
        .map(|a| a.in_domain(id.domain_id))
    }

    pub fn keys(&self) -> &DomainKeys {
        &self.keys
    }

    /// Trusts `next` beside the pinned key (a document signed by the pinned key announced
    /// it). `false` when nothing changed (the same key again, or the pinned key itself).
    pub fn announce(&mut self, next: &SigningKey) -> Result<bool, String> {
        if next.public_key == self.keys.pinned || self.keys.next.as_ref() == Some(next) {
            return Ok(false);
        }
        let v = DomainVerifier::from_b64(&next.public_key).map_err(|e| {
            format!(
                "the announced next signing key (generation {}): {e}",
                next.generation
            )
        })?;
        self.next = Some(v);
        self.keys.next = Some(next.clone());
        Ok(true)
    }

    /// The next key becomes the pinned one; the old key is refused from now on. Answers the
    /// key promoted (`None`: there was no next key).
    pub fn promote(&mut self) -> Option<SigningKey> {
        let key = self.keys.next.take()?;
        let v = self.next.take()?;
        self.verifier = v;
        self.keys.pinned = key.public_key.clone();
        self.keys.generation = Some(key.generation);
        Some(key)
    }

    /// Pins `key` (reached by following the key chain from the pinned key), with `next` (a
    /// later link of the same chain, still in its overlap) beside it.
    pub fn adopt(&mut self, key: &SigningKey, next: Option<&SigningKey>) -> Result<(), String> {
        let keys = DomainKeys {
            pinned: key.public_key.clone(),
            generation: Some(key.generation),
            next: next.cloned(),
        };
        *self = Self {
            domain_id: self.domain_id,
            ..Self::with_keys(keys, self.node_id)?
        };
        Ok(())
    }

    /// Which of my keys verifies this: the pinned key, else the announced next key, else the
    /// pinned key's refusal (never a key the node did not pin or was not announced).
    fn open<T: DeserializeOwned>(
        &self,
        ctx: SignContext,
        env: &SignedEnvelope,
    ) -> Result<(T, SignedBy), VerifyError> {
        match self.verifier.open(ctx, env) {
            Ok(doc) => Ok((doc, SignedBy::Pinned)),
            Err(VerifyError::BadSignature) if self.next.is_some() => match &self.next {
                Some(next) => next
                    .open(ctx, env)
                    .map(|doc| (doc, SignedBy::Next))
                    .map_err(|_| VerifyError::BadSignature),
                None => Err(VerifyError::BadSignature),
            },
            Err(e) => Err(e),
        }
    }

    /// A state document (the body of `GET /state`, or the cache): signed, ours, and not
    /// older than `applied` (the same version again is fine).
    pub fn state(&self, env: &SignedEnvelope, applied: Option<u64>) -> Result<NodeState, Refusal> {
        self.state_by(env, applied).map(|(s, _)| s)
    }

    /// [`Self::state`], and which key signed it.
    pub fn state_by(
        &self,
        env: &SignedEnvelope,
        applied: Option<u64>,
    ) -> Result<(NodeState, SignedBy), Refusal> {
        let (state, by): (NodeState, _) = self.open(SignContext::NodeState, env)?;
        if state.node_id != self.node_id {
            return Err(Refusal::OtherNode {
                got: state.node_id,
                own: self.node_id,
            });
        }
        if let Some(applied) = applied
            && state.version < applied
        {
            return Err(Refusal::Older {
                got: state.version,
                applied,
            });
        }
        Ok((state, by))
    }

    /// Whether a state from the API is fresh: issued at most `max_age` before `wall`.
    pub fn fresh(
        &self,
        state: &NodeState,
        wall: std::time::SystemTime,
        max_age: std::time::Duration,
    ) -> Result<(), Refusal> {
        let now = wall
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let issued = u64::try_from(state.issued_at).unwrap_or(0);
        let age = now.saturating_sub(issued);
        if age > max_age.as_secs() {
            return Err(Refusal::Stale {
                age_secs: age,
                max_secs: max_age.as_secs(),
            });
        }
        Ok(())
    }

    /// A state body as JSON text.
    pub fn state_json(
        &self,
        body: &[u8],
        applied: Option<u64>,
    ) -> Result<(NodeState, SignedEnvelope, SignedBy), Refusal> {
        let env: SignedEnvelope =
            serde_json::from_slice(body).map_err(|e| Refusal::NotAnEnvelope(e.to_string()))?;
        let (state, by) = self.state_by(&env, applied)?;
        Ok((state, env, by))
    }

    /// An SSE frame: `data:` is a signed envelope of an [`Event`] for this node, or of a
    /// [`DomainEvent`] of this node's Domain that this node receives, whose `seq` equals `id:`.
    /// Either is answered as the event addressed to this node.
    pub fn event(&self, frame_id: Option<&str>, data: &str) -> Result<(Event, SignedBy), Refusal> {
        let data: EventData =
            serde_json::from_str(data).map_err(|e| Refusal::NotAnEnvelope(e.to_string()))?;
        let (event, by) = match data {
            EventData::Node(env) => {
                let (event, by): (Event, _) = self.open(SignContext::Event, &env)?;
                if event.node_id != self.node_id {
                    return Err(Refusal::OtherNode {
                        got: event.node_id,
                        own: self.node_id,
                    });
                }
                (event, by)
            }
            EventData::Domain(d) => {
                let own = self.domain_id.ok_or(Refusal::NoDomain)?;
                let (event, by): (DomainEvent, _) =
                    self.open(SignContext::DomainEvent, &d.domain_event)?;
                if event.domain_id != own {
                    return Err(Refusal::OtherDomain {
                        got: event.domain_id,
                        own,
                    });
                }
                if !event.is_for(self.node_id) {
                    return Err(Refusal::NotARecipient {
                        target: event.target,
                        subject: event.subject,
                    });
                }
                (event.addressed_to(self.node_id), by)
            }
        };
        let id = frame_id.unwrap_or("");
        let parsed: u64 = id
            .trim()
            .parse()
            .map_err(|_| Refusal::BadFrameId(id.chars().take(40).collect()))?;
        if parsed != event.seq {
            return Err(Refusal::SeqMismatch {
                signed: event.seq,
                frame_id: id.chars().take(40).collect(),
            });
        }
        Ok((event, by))
    }
}

/// Whether a refusal is the signature matching none of the node's keys (what sends a node
/// to the key chain).
pub fn is_unknown_signer(r: &Refusal) -> bool {
    matches!(r, Refusal::Signature(VerifyError::BadSignature))
}
