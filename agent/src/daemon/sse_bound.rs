//! Bounds on what the event stream may make plexd hold: the SSE parser (eventsource-client)
//! buffers a line, and an event's `data:` lines, until they end, so a server or a proxy that
//! never ends one would grow plexd's memory without limit. The transport feeds every chunk
//! through a [`FrameBound`] before the parser sees it, and drops the stream past a bound.

/// The longest line the stream may send, in bytes (a frame's `data:` line carries one signed
/// event of a few KiB).
pub const MAX_LINE: usize = 256 * 1024;
/// The most an event (every line up to the blank line that ends it) may hold, in bytes.
pub const MAX_EVENT: usize = 1024 * 1024;

/// Which bound a stream broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exceeded {
    Line,
    Event,
}

impl std::fmt::Display for Exceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exceeded::Line => write!(
                f,
                "the event stream sent a line longer than {} KiB; it was dropped (a broken or hostile server or proxy) and will be opened again",
                MAX_LINE / 1024
            ),
            Exceeded::Event => write!(
                f,
                "the event stream sent an event larger than {} KiB; it was dropped (a broken or hostile server or proxy) and will be opened again",
                MAX_EVENT / 1024
            ),
        }
    }
}

/// Where the stream stands: the length of the current line and event. Lines end with CRLF,
/// LF or CR, as SSE allows; a blank line ends an event.
#[derive(Debug, Default)]
pub struct FrameBound {
    line: usize,
    event: usize,
    after_cr: bool,
}

impl FrameBound {
    /// Takes the next chunk of the stream; an error once a bound is passed.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<(), Exceeded> {
        for &b in chunk {
            match b {
                b'\n' if self.after_cr => self.after_cr = false,
                b'\n' | b'\r' => {
                    if self.line == 0 {
                        self.event = 0;
                    }
                    self.line = 0;
                    self.after_cr = b == b'\r';
                }
                _ => {
                    self.after_cr = false;
                    self.line += 1;
                    self.event += 1;
                    if self.line > MAX_LINE {
                        return Err(Exceeded::Line);
                    }
                    if self.event > MAX_EVENT {
                        return Err(Exceeded::Event);
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_events_end_as_sse_ends_them() {
        let mut b = FrameBound::default();
        // Many events of many lines, every line ending, in chunks that split the endings.
        let line = "x".repeat(MAX_LINE);
        let event = format!("data: {}\ndata: {}\r\n\r\n", &line[6..], &line[6..]);
        for _ in 0..10 {
            let (a, c) = event.as_bytes().split_at(event.len() - 3);
            assert_eq!(b.feed(a), Ok(()));
            assert_eq!(b.feed(c), Ok(()));
        }
        // CR alone ends a line and a CR CR ends an event.
        let mut b = FrameBound::default();
        for _ in 0..10 {
            assert_eq!(
                b.feed(format!("data: {}\r\r", &line[6..]).as_bytes()),
                Ok(())
            );
        }
        // CRLF is one line ending, not a line and a blank one: four full lines fill the
        // event, and one more byte breaks it.
        let mut b = FrameBound::default();
        let quarter = "y".repeat(MAX_EVENT / 4);
        for _ in 0..4 {
            assert_eq!(b.feed(format!("{quarter}\r\n").as_bytes()), Ok(()));
        }
        assert_eq!(b.feed(b"z"), Err(Exceeded::Event));
    }

    #[test]
    fn a_line_that_never_ends_is_refused_past_the_bound() {
        let mut b = FrameBound::default();
        let chunk = vec![b'a'; 4096];
        let mut fed = 0;
        let err = loop {
            match b.feed(&chunk) {
                Ok(()) => fed += chunk.len(),
                Err(e) => break e,
            }
        };
        assert_eq!(err, Exceeded::Line);
        assert!(fed <= MAX_LINE, "{fed}");
        assert!(err.to_string().contains("256 KiB"), "{err}");
    }
}
