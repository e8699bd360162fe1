//! `plexctl node observations`: what a node reported through ingest (handshakes, traffic,
//! errors), newest first, as a table or as the server's JSON document.

use plexsphere_wire::admin::{ObservationList, ObservationView};
use plexsphere_wire::node::ObservationKind;
use time::OffsetDateTime;

use crate::output::{table, time};

/// The longest error message a table cell shows (`--output json` has it whole).
pub const MAX_MESSAGE_CHARS: usize = 200;

/// The table: TIME (the node's clock), KIND, PEER, DETAIL; then the dropped count.
pub fn render(list: &ObservationList) -> String {
    let rows: Vec<Vec<String>> = list.items.iter().map(row).collect();
    let mut out = table(&["TIME", "KIND", "PEER", "DETAIL"], &rows);
    out.push_str(&format!(
        "dropped by the node before sending: {}\n",
        list.dropped
    ));
    out
}

fn row(o: &ObservationView) -> Vec<String> {
    let at = OffsetDateTime::from_unix_timestamp(o.at).map_or_else(|_| o.at.to_string(), time);
    let (kind, peer, detail) = match &o.kind {
        ObservationKind::Handshake {
            peer_node_id,
            endpoint,
        } => (
            "handshake",
            peer_node_id.to_string(),
            match endpoint {
                Some(e) => format!("endpoint {e}"),
                None => "endpoint -".to_owned(),
            },
        ),
        ObservationKind::Traffic {
            peer_node_id,
            rx_bytes,
            tx_bytes,
        } => (
            "traffic",
            peer_node_id.to_string(),
            format!("rx {} tx {}", bytes(*rx_bytes), bytes(*tx_bytes)),
        ),
        ObservationKind::Error { message } => ("error", "-".to_owned(), printable(message)),
    };
    vec![at, kind.to_owned(), peer, detail]
}

/// Bytes for people: `512 B`, `4.0 KiB`, `1.5 MiB`, ... (binary units, one decimal).
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A node's text made safe for a terminal: control characters and the invisible format
/// characters that reorder or hide text (bidi overrides, zero-width marks) become escapes,
/// so a message cannot move the cursor, recolour the screen or spoof a table row; then it is
/// cut to [`MAX_MESSAGE_CHARS`] characters. An empty message is `-`.
pub fn printable(message: &str) -> String {
    if message.is_empty() {
        return "-".to_owned();
    }
    let mut out = String::new();
    for (i, c) in message.chars().enumerate() {
        if i == MAX_MESSAGE_CHARS {
            out.push_str("...");
            break;
        }
        let hidden = matches!(c,
            '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}');
        if c.is_control() || hidden {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use plexsphere_wire::admin::ObservationList;

    use super::*;

    #[test]
    fn the_table_shows_each_kind_newest_first_and_the_dropped_count() {
        let json = r#"{"node_id":"019a0816-0000-7000-8000-0000000000aa","dropped":4,"items":[
            {"received_at":"2026-11-30T10:00:05Z","at":1796032802,"type":"error","message":"wg: \u001b[2Jgone\nfake row"},
            {"received_at":"2026-11-30T10:00:05Z","at":1796032801,"type":"traffic","peer_node_id":"019a0816-0000-7000-8000-0000000000bb","rx_bytes":1536,"tx_bytes":20},
            {"received_at":"2026-11-30T10:00:05Z","at":1796032800,"type":"handshake","peer_node_id":"019a0816-0000-7000-8000-0000000000bb","endpoint":"192.0.2.7:51820"},
            {"received_at":"2026-11-30T10:00:05Z","at":-99999999999999,"type":"handshake","peer_node_id":"019a0816-0000-7000-8000-0000000000bb","endpoint":null}]}"#;
        let list: ObservationList = serde_json::from_str(json).unwrap();
        let want = "\
TIME                  KIND       PEER                                  DETAIL
2026-11-30T10:00:02Z  error      -                                     wg: \\u{1b}[2Jgone\\nfake row
2026-11-30T10:00:01Z  traffic    019a0816-0000-7000-8000-0000000000bb  rx 1.5 KiB tx 20 B
2026-11-30T10:00:00Z  handshake  019a0816-0000-7000-8000-0000000000bb  endpoint 192.0.2.7:51820
-99999999999999       handshake  019a0816-0000-7000-8000-0000000000bb  endpoint -
dropped by the node before sending: 4
";
        assert_eq!(render(&list), want);
    }

    #[test]
    fn an_empty_list_still_says_what_was_dropped() {
        let list = ObservationList {
            node_id: uuid::Uuid::nil(),
            dropped: 0,
            items: Vec::new(),
        };
        assert_eq!(
            render(&list),
            "TIME  KIND  PEER  DETAIL\ndropped by the node before sending: 0\n"
        );
    }

    #[test]
    fn messages_cannot_drive_the_terminal() {
        assert_eq!(printable(""), "-");
        assert_eq!(printable("plain text"), "plain text");
        assert_eq!(printable("a\tb\r\x07"), "a\\tb\\r\\u{7}");
        assert_eq!(printable("x\u{202E}y\u{200B}"), "x\\u{202e}y\\u{200b}");
        assert_eq!(printable("caf\u{e9}"), "caf\u{e9}");
        let long = "é".repeat(MAX_MESSAGE_CHARS + 5);
        let cut = printable(&long);
        assert_eq!(cut.chars().count(), MAX_MESSAGE_CHARS + 3);
        assert!(cut.ends_with("..."));
    }

    #[test]
    fn bytes_read_as_binary_units() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1024), "1.0 KiB");
        assert_eq!(bytes(3 * 1024 * 1024 / 2), "1.5 MiB");
        assert_eq!(bytes(u64::MAX), "16.0 EiB");
    }
}
