//! `plexd bugreport`: what goes in the tarball, and the redaction every entry passes.
//!
//! | entry | what |
//! |-------|------|
//! | `summary.json` | when, which plexd, which files were read, what was left out and why |
//! | `config.yaml` | the config as plexd parsed it (it holds paths, never secrets) |
//! | `identity.json` | node id, mesh IP and range, Domain, Project, API, registration time; not the credential |
//! | `status.json` | `plexd status --output json`, or why the daemon did not answer |
//! | `peers.txt` | a `wg show`-like dump of the peers from the daemon's view (public keys, endpoints, handshakes, bytes) |
//! | `versions.txt` | plexd, the kernel (`/proc/version`), `/etc/os-release` |
//! | `interface.txt` | `ip addr`/`link`/`route` of the mesh interface |
//! | `state-dir.txt` | the state dir's file names, sizes and modes (no contents) |
//! | `journal.txt` | `journalctl -u plexd -n` [`JOURNAL_LINES`], when journalctl exists |
//! | `netcheck.json` | `plexd netcheck --output json` |
//!
//! Secrets never get in: the token file, the WireGuard key and the node credential are read
//! only to be searched for, every entry has each of them (and any `pxbt_`/`pxnk_` token-shaped
//! word) replaced by [`REDACTED`] before it is written, and no entry copies a secret file.
//! Every entry is at most [`MAX_ENTRY_BYTES`] and the tarball's contents at most
//! [`MAX_TOTAL_BYTES`] (a cut entry ends with a line saying so).

use std::fmt::Write as _;

use serde::Serialize;

use crate::daemon::status::StatusReport;

/// The journal lines the report takes (the newest).
pub(crate) const JOURNAL_LINES: u32 = 2000;
/// The most bytes one entry keeps; the rest is cut with a note.
pub(crate) const MAX_ENTRY_BYTES: usize = 4 * 1024 * 1024;
/// The most bytes all entries together keep (before compression).
pub(crate) const MAX_TOTAL_BYTES: usize = 16 * 1024 * 1024;
/// What a secret is replaced with.
pub(crate) const REDACTED: &str = "<redacted>";
/// Secrets shorter than this are not searched for (they would match by accident, and no real
/// token, key or credential is this short).
const MIN_SECRET_LEN: usize = 16;
/// The prefixes of plexsphere's token-shaped secrets (bootstrap tokens, node credentials,
/// operator tokens).
const SECRET_PREFIXES: [&str; 3] = ["pxbt_", "pxnk_", "pxop_"];

/// One file of the tarball.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub bytes: Vec<u8>,
}

impl Entry {
    pub fn new(name: &str, bytes: impl Into<Vec<u8>>) -> Self {
        Self {
            name: name.to_owned(),
            bytes: bytes.into(),
        }
    }
}

/// What `plexd bugreport` prints (and `--output json` as JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub file: String,
    pub bytes: u64,
    pub entries: Vec<String>,
    /// Entries cut at [`MAX_ENTRY_BYTES`] or left out at [`MAX_TOTAL_BYTES`].
    pub truncated: Vec<String>,
    pub secrets_redacted: usize,
}

impl Summary {
    pub fn render(&self) -> String {
        let mut out = format!(
            "wrote {} ({} bytes): {}\n",
            self.file,
            self.bytes,
            self.entries.join(", ")
        );
        if !self.truncated.is_empty() {
            let _ = writeln!(out, "cut to the size bound: {}", self.truncated.join(", "));
        }
        let _ = writeln!(
            out,
            "secrets replaced with {REDACTED}: {}; tokens, credentials and private keys are never included",
            self.secrets_redacted
        );
        out
    }
}

/// Replaces every secret and every token-shaped word in every entry; answers how many
/// replacements were made.
pub fn redact(entries: &mut [Entry], secrets: &[Vec<u8>]) -> usize {
    let mut secrets: Vec<&[u8]> = secrets
        .iter()
        .map(|s| s.trim_ascii())
        .filter(|s| s.len() >= MIN_SECRET_LEN)
        .collect();
    // Longest first, so a secret that contains another goes whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut count = 0;
    for e in entries.iter_mut() {
        for s in &secrets {
            count += replace_all(&mut e.bytes, s, REDACTED.as_bytes());
        }
        count += redact_token_words(&mut e.bytes);
    }
    count
}

fn replace_all(hay: &mut Vec<u8>, needle: &[u8], with: &[u8]) -> usize {
    if needle.is_empty() || hay.len() < needle.len() {
        return 0;
    }
    let mut out = Vec::with_capacity(hay.len());
    let mut i = 0;
    let mut n = 0;
    while i < hay.len() {
        if hay[i..].starts_with(needle) {
            out.extend_from_slice(with);
            i += needle.len();
            n += 1;
        } else {
            out.push(hay[i]);
            i += 1;
        }
    }
    if n > 0 {
        *hay = out;
    }
    n
}

/// `pxbt_...`/`pxnk_...` words (letters, digits, `_`, `-`) become `pxbt_<redacted>`.
fn redact_token_words(hay: &mut Vec<u8>) -> usize {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'-';
    let mut out = Vec::with_capacity(hay.len());
    let mut i = 0;
    let mut n = 0;
    while i < hay.len() {
        let at_word_start = i == 0 || !word(hay[i - 1]);
        let prefix = SECRET_PREFIXES
            .iter()
            .find(|p| at_word_start && hay[i..].starts_with(p.as_bytes()));
        match prefix {
            Some(p) => {
                let start = i + p.len();
                let end = hay[start..]
                    .iter()
                    .position(|b| !word(*b))
                    .map_or(hay.len(), |k| start + k);
                if end > start && hay[start..end] != *REDACTED.as_bytes() {
                    out.extend_from_slice(p.as_bytes());
                    out.extend_from_slice(REDACTED.as_bytes());
                    n += 1;
                } else {
                    out.extend_from_slice(&hay[i..end]);
                }
                i = end;
            }
            None => {
                out.push(hay[i]);
                i += 1;
            }
        }
    }
    if n > 0 {
        *hay = out;
    }
    n
}

/// Cuts entries to [`MAX_ENTRY_BYTES`] each and drops what does not fit in
/// [`MAX_TOTAL_BYTES`]; answers the names of the cut and dropped ones.
pub fn bound(entries: &mut Vec<Entry>) -> Vec<String> {
    bound_to(entries, MAX_ENTRY_BYTES, MAX_TOTAL_BYTES)
}

fn bound_to(entries: &mut Vec<Entry>, per_entry: usize, total: usize) -> Vec<String> {
    let mut cut = Vec::new();
    let mut used = 0usize;
    let mut kept = Vec::new();
    for mut e in entries.drain(..) {
        let room = per_entry.min(total.saturating_sub(used));
        if e.bytes.len() > room {
            let note = format!(
                "\n[cut at {room} of {} bytes by plexd bugreport's size bound]\n",
                e.bytes.len()
            );
            e.bytes.truncate(room.saturating_sub(note.len()));
            e.bytes.extend_from_slice(note.as_bytes());
            e.bytes.truncate(room);
            cut.push(e.name.clone());
        }
        if e.bytes.is_empty() && room == 0 {
            continue;
        }
        used += e.bytes.len();
        kept.push(e);
    }
    *entries = kept;
    cut
}

/// `peers.txt`: a `wg show`-like dump of the daemon's peers (no private key; none is known
/// to the status report).
pub(crate) fn peers_text(r: &StatusReport) -> String {
    let mut out = format!(
        "interface: {}\n  backend: {}\n  mesh ip: {}\n\n",
        r.interface, r.backend, r.mesh_ip
    );
    for p in &r.peers {
        let _ = writeln!(out, "peer: {}", p.public_key);
        let _ = writeln!(out, "  name: {} (node {})", p.hostname, p.node_id);
        let endpoint = p
            .endpoint
            .map_or_else(|| "(none)".to_owned(), |e| e.to_string());
        let _ = writeln!(out, "  endpoint: {endpoint}");
        let _ = writeln!(out, "  allowed ips: {}", p.mesh_ip);
        let _ = writeln!(out, "  path: {} ({})", p.path, p.reason);
        let hs = p
            .last_handshake_age_secs
            .map_or_else(|| "never".to_owned(), |s| format!("{s} seconds ago"));
        let _ = writeln!(out, "  latest handshake: {hs}");
        let _ = writeln!(
            out,
            "  transfer: {} B received, {} B sent\n",
            p.rx_bytes, p.tx_bytes
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_and_token_shaped_words_are_replaced_everywhere() {
        let key = b"yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=\n".to_vec();
        let mut entries = vec![
            Entry::new(
                "journal.txt",
                "joined with yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk= and pxbt_lab_node_1f2e_Zm9vYmFy end",
            ),
            Entry::new(
                "config.yaml",
                "token: pxnk_019a0816000070008000000000000003_c2VjcmV0c2VjcmV0\nshort: abc\n",
            ),
        ];
        let n = redact(&mut entries, &[key, b"abc".to_vec()]);
        assert_eq!(n, 3);
        let j = String::from_utf8(entries[0].bytes.clone()).unwrap();
        assert_eq!(j, "joined with <redacted> and pxbt_<redacted> end");
        let c = String::from_utf8(entries[1].bytes.clone()).unwrap();
        assert_eq!(c, "token: pxnk_<redacted>\nshort: abc\n");
        // Redacting again finds nothing new.
        assert_eq!(redact(&mut entries, &[]), 0);
    }

    #[test]
    fn entries_are_bounded_one_by_one_and_in_total() {
        let mut entries = vec![
            Entry::new("a", vec![b'a'; 500]),
            Entry::new("b", vec![b'b'; 100]),
            Entry::new("c", vec![b'c'; 400]),
            Entry::new("d", vec![b'd'; 10]),
        ];
        let cut = bound_to(&mut entries, 300, 600);
        // a and c are cut, d (no room left) is dropped.
        assert_eq!(cut, vec!["a".to_owned(), "c".to_owned(), "d".to_owned()]);
        let sizes: Vec<(String, usize)> = entries
            .iter()
            .map(|e| (e.name.clone(), e.bytes.len()))
            .collect();
        assert_eq!(
            sizes,
            vec![("a".into(), 300), ("b".into(), 100), ("c".into(), 200)]
        );
        assert!(String::from_utf8_lossy(&entries[0].bytes).ends_with("size bound]\n"));
        assert!(entries.iter().map(|e| e.bytes.len()).sum::<usize>() <= 600);
    }
}
