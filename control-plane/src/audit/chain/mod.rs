//! The chain itself, as plain values: the canonical encoding a row's hash is taken over, the
//! keyed parts (row and head MACs, people's identifiers), and the verifier that walks a chain
//! and names what is wrong at which seq. No database and no clock here (docs/audit.md, "The
//! encoding", is the same text for an auditor who recomputes it).
//!
//! Imports nothing of the crate; the audit table and the HTTP API use it. Its tests (the
//! pinned encoding, each kind of tampering) are `tests.rs`.

use ring::{digest, hmac};
use serde::Serialize;

/// `prev_hash` of a chain's first row, and `head_hash` of an empty chain.
pub(crate) const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// The first line of every row's hash input; a new encoding gets a new tag.
pub(crate) const ENCODING_TAG: &str = "plexsphere-audit-v1";
/// The most problems one verification reports (the rest are counted, not listed).
pub(crate) const MAX_PROBLEMS: usize = 100;
/// How far (in seqs, either way) the verifier looks for the place a moved row was written at.
pub(crate) const REORDER_WINDOW: i64 = 1_000;

/// One stored row, every column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub chain_id: String,
    pub seq: i64,
    pub at: i64,
    pub actor_kind: String,
    pub actor_ref: String,
    pub actor_name: String,
    pub actor_subject: String,
    pub actor_email: String,
    pub how: String,
    pub action: String,
    pub target: String,
    pub detail: String,
    pub prev_hash: String,
    pub hash: String,
    pub mac: String,
}

impl Row {
    /// The canonical encoding of every field but `hash` and `mac`, with `seq` as given: the tag
    /// line, then each field as `<decimal byte length>:<bytes>\n` in the order of the table.
    pub(crate) fn encode_at(&self, seq: i64) -> Vec<u8> {
        let seq = seq.to_string();
        let at = self.at.to_string();
        let fields: [&str; 13] = [
            &self.chain_id,
            &seq,
            &at,
            &self.actor_kind,
            &self.actor_ref,
            &self.actor_name,
            &self.actor_subject,
            &self.actor_email,
            &self.how,
            &self.action,
            &self.target,
            &self.detail,
            &self.prev_hash,
        ];
        let mut out = Vec::with_capacity(256 + self.detail.len());
        out.extend_from_slice(ENCODING_TAG.as_bytes());
        out.push(b'\n');
        for f in fields {
            out.extend_from_slice(f.len().to_string().as_bytes());
            out.push(b':');
            out.extend_from_slice(f.as_bytes());
            out.push(b'\n');
        }
        out
    }

    /// Lowercase hex SHA-256 of [`Row::encode_at`] at `seq`.
    pub(crate) fn hash_at(&self, seq: i64) -> String {
        hex::encode(digest::digest(&digest::SHA256, &self.encode_at(seq)))
    }

    /// Fills `hash` and `mac` (what an append does last).
    pub(crate) fn seal(&mut self, key: &ChainKey) {
        self.hash = self.hash_at(self.seq);
        self.mac = key.row_mac(&self.hash);
    }
}

/// A chain's key: HMAC-SHA256 under the pepper over the chain id (docs/audit.md, "The pepper").
pub(crate) struct ChainKey(hmac::Key);

impl ChainKey {
    /// The key of `chain_id` under `pepper`.
    pub(crate) fn derive(pepper: &hmac::Key, chain_id: &str) -> Self {
        let tag = hmac::sign(pepper, chain_id.as_bytes());
        ChainKey(hmac::Key::new(hmac::HMAC_SHA256, tag.as_ref()))
    }

    fn context(&self, parts: &[&[u8]]) -> hmac::Context {
        let mut ctx = hmac::Context::with_key(&self.0);
        for p in parts {
            ctx.update(p);
        }
        ctx
    }

    fn tag(&self, parts: &[&[u8]]) -> String {
        hex::encode(self.context(parts).sign())
    }

    /// Whether `stored` (hex) is the tag of `parts`, compared in constant time.
    fn verify(&self, parts: &[&[u8]], stored: &str) -> bool {
        let Ok(stored) = hex::decode(stored) else {
            return false;
        };
        let data: Vec<u8> = parts.concat();
        hmac::verify(&self.0, &data, &stored).is_ok()
    }

    /// A person's identifier as stored: `kind` is `subject` (then `value` is
    /// `<issuer>\n<subject>`) or `email` (lowercased here).
    pub(crate) fn person(&self, kind: &str, value: &str) -> String {
        let value = if kind == "email" {
            value.trim().to_lowercase()
        } else {
            value.to_owned()
        };
        self.tag(&[kind.as_bytes(), b"\n", value.as_bytes()])
    }

    pub(crate) fn row_mac(&self, hash: &str) -> String {
        self.tag(&[b"row\n", hash.as_bytes()])
    }

    pub(crate) fn row_mac_ok(&self, hash: &str, mac: &str) -> bool {
        self.verify(&[b"row\n", hash.as_bytes()], mac)
    }

    pub(crate) fn head_mac(&self, seq: i64, hash: &str) -> String {
        self.tag(&[
            b"head\n",
            seq.to_string().as_bytes(),
            b"\n",
            hash.as_bytes(),
        ])
    }

    pub(crate) fn head_mac_ok(&self, head: &Head) -> bool {
        let seq = head.seq.to_string();
        self.verify(
            &[b"head\n", seq.as_bytes(), b"\n", head.hash.as_bytes()],
            &head.mac,
        )
    }
}

/// What kind of tampering a problem shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ProblemKind {
    Altered,
    Removed,
    Reordered,
    Inserted,
}

impl ProblemKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProblemKind::Altered => "altered",
            ProblemKind::Removed => "removed",
            ProblemKind::Reordered => "reordered",
            ProblemKind::Inserted => "inserted",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Problem {
    pub seq: i64,
    pub kind: ProblemKind,
    pub detail: String,
}

/// The chain head as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub seq: i64,
    pub hash: String,
    pub mac: String,
}

/// Walks one chain's rows in seq order ([`Verifier::push`]), then checks the tail against the
/// head ([`Verifier::finish`]).
pub(crate) struct Verifier<'k> {
    key: &'k ChainKey,
    expected_seq: i64,
    prev_hash: String,
    prev_flagged: bool,
    rows: u64,
    problems: Vec<Problem>,
    unlisted: u64,
}

/// The verdict on one chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub rows: u64,
    pub problems: Vec<Problem>,
    /// Problems found past [`MAX_PROBLEMS`].
    pub unlisted: u64,
}

impl Verdict {
    pub fn ok(&self) -> bool {
        self.problems.is_empty() && self.unlisted == 0
    }
}

impl<'k> Verifier<'k> {
    pub fn new(key: &'k ChainKey) -> Self {
        Self {
            key,
            expected_seq: 1,
            prev_hash: GENESIS.to_owned(),
            prev_flagged: false,
            rows: 0,
            problems: Vec::new(),
            unlisted: 0,
        }
    }

    fn report(&mut self, seq: i64, kind: ProblemKind, detail: String) {
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(Problem { seq, kind, detail });
        } else {
            self.unlisted += 1;
        }
    }

    /// The next row in seq order.
    pub fn push(&mut self, row: &Row) {
        self.rows += 1;
        let mut gap = false;
        if row.seq > self.expected_seq {
            gap = true;
            self.report(
                self.expected_seq,
                ProblemKind::Removed,
                missing(self.expected_seq, row.seq - 1),
            );
        }
        let flagged = if row.hash_at(row.seq) != row.hash {
            // Past the report limit the search for where the row belongs is skipped.
            let written_at = if self.problems.len() < MAX_PROBLEMS {
                self.written_at(row)
            } else {
                None
            };
            match written_at {
                Some(q) => self.report(
                    row.seq,
                    ProblemKind::Reordered,
                    format!("seq {} holds the row written as seq {q}", row.seq),
                ),
                None => self.report(
                    row.seq,
                    ProblemKind::Altered,
                    format!(
                        "seq {} ({} {}) does not match its hash: a field was changed",
                        row.seq, row.action, row.target
                    ),
                ),
            }
            true
        } else if !self.key.row_mac_ok(&row.hash, &row.mac) {
            self.report(
                row.seq,
                ProblemKind::Inserted,
                format!(
                    "seq {} ({} {}) was not written by plexsphere (its MAC does not verify under the chain's key): a row added, or one rewritten with a fresh hash",
                    row.seq, row.action, row.target
                ),
            );
            true
        } else if row.prev_hash != self.prev_hash && !gap && !self.prev_flagged {
            self.report(
                row.seq,
                ProblemKind::Removed,
                format!(
                    "seq {} does not follow the row before it (its prev_hash names another row): a row was removed before it",
                    row.seq
                ),
            );
            true
        } else {
            false
        };
        self.prev_flagged = flagged;
        self.prev_hash = row.hash.clone();
        self.expected_seq = self.expected_seq.max(row.seq + 1);
    }

    /// The seq near `row.seq` at which this row's content hashes to its stored hash.
    fn written_at(&self, row: &Row) -> Option<i64> {
        let lo = (row.seq - REORDER_WINDOW).max(1);
        let hi = row.seq.saturating_add(REORDER_WINDOW);
        (lo..=hi).find(|&q| q != row.seq && row.hash_at(q) == row.hash)
    }

    /// Checks the last row against the chain head; `head` is `None` for a chain never written.
    pub(crate) fn finish(mut self, head: Option<&Head>) -> Verdict {
        let last = self.expected_seq - 1;
        if let Some(head) = head {
            if !self.key.head_mac_ok(head) {
                self.report(
                    head.seq,
                    ProblemKind::Altered,
                    format!(
                        "the chain head (seq {}) was changed outside plexsphere: its MAC does not verify",
                        head.seq
                    ),
                );
            }
            if last < head.seq {
                self.report(
                    last + 1,
                    ProblemKind::Removed,
                    format!(
                        "{} (the tail was cut; the chain head is seq {})",
                        missing(last + 1, head.seq),
                        head.seq
                    ),
                );
            } else if last > head.seq {
                self.report(
                    head.seq + 1,
                    ProblemKind::Inserted,
                    format!(
                        "seq {}..{last} are beyond the chain head (seq {}): rows were added outside plexsphere",
                        head.seq + 1,
                        head.seq
                    ),
                );
            } else if head.seq > 0 && self.prev_hash != head.hash {
                self.report(
                    head.seq,
                    ProblemKind::Altered,
                    format!("seq {} is not the row the chain head names", head.seq),
                );
            }
        } else if last > 0 {
            self.report(
                1,
                ProblemKind::Inserted,
                format!("seq 1..{last} exist but the chain has no head: rows were added outside plexsphere"),
            );
        }
        Verdict {
            rows: self.rows,
            problems: self.problems,
            unlisted: self.unlisted,
        }
    }
}

fn missing(from: i64, to: i64) -> String {
    if from == to {
        format!("seq {from} is missing")
    } else {
        format!("seq {from}..{to} are missing")
    }
}

#[cfg(test)]
mod tests;
