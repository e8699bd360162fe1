//! The event-stream bounds (`FrameBound`): fed the stream in arbitrary chunks, it breaks a bound
//! exactly when a plain model of SSE lines says so, whatever the chunking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plexd::daemon::sse_bound::{Exceeded, FrameBound, MAX_EVENT, MAX_LINE};

/// The model: SSE lines end with CRLF, LF or CR; a blank line ends an event. Returns the first
/// bound broken, with the lengths counted the simple way.
fn model(stream: &[u8]) -> Option<Exceeded> {
    let (mut line, mut event) = (0usize, 0usize);
    let mut i = 0;
    while i < stream.len() {
        match stream[i] {
            b'\r' | b'\n' => {
                if stream[i] == b'\r' && stream.get(i + 1) == Some(&b'\n') {
                    i += 1;
                }
                if line == 0 {
                    event = 0;
                }
                line = 0;
            }
            _ => {
                line += 1;
                event += 1;
                if line > MAX_LINE {
                    return Some(Exceeded::Line);
                }
                if event > MAX_EVENT {
                    return Some(Exceeded::Event);
                }
            }
        }
        i += 1;
    }
    None
}

fuzz_target!(|data: &[u8]| {
    // The input is a recipe, to reach the bounds with small inputs: pairs of (byte, repeat).
    let (cuts, recipe) = plexsphere_fuzz::split_at_marker(data);
    let mut stream = Vec::new();
    for pair in recipe.chunks(2) {
        let byte = pair[0];
        let repeat = pair.get(1).map_or(1, |&r| {
            if r >= 0x80 {
                usize::from(r) * 4096
            } else {
                usize::from(r) + 1
            }
        });
        stream.extend(std::iter::repeat_n(byte, repeat));
        if stream.len() > 4 * MAX_EVENT {
            break;
        }
    }
    let expected = model(&stream);

    let mut bound = FrameBound::default();
    let mut got = None;
    let mut at = 0;
    let mut cuts = cuts.iter().map(|&c| usize::from(c) * 97 + 1).cycle();
    while at < stream.len() {
        let len = cuts.next().unwrap_or(stream.len()).min(stream.len() - at);
        if let Err(e) = bound.feed(&stream[at..at + len]) {
            got = Some(e);
            break;
        }
        at += len;
    }
    assert_eq!(got, expected);
});
