//! What a TCP connection's reader does with the bytes it read: every whole frame of a read is
//! handled under one hold of the core's lock and one reading of the clocks, and the `recv`s
//! for nodes over UDP leave together, as the UDP threads send theirs (`crate::mmsg`: runs to
//! one node as one UDP GSO send, the rest with `sendmmsg`), not with a system call each.
//!
//! A registered connection's `send` takes the fast path the UDP threads take: its `recv` is
//! written straight from the read buffer, without decoding the frame into an allocation. The
//! rest is decoded and handed to the core as before; before the registration only `hello` and
//! `register` are handled (the rest is dropped and counted).

use std::net::SocketAddr;

use plexsphere_wire::reach::RELAY_MAGIC;
use plexsphere_wire::reach::relay::{Frame, RECV, SEND, prefix};

use crate::core::{ConnId, Core, Now, Peer, To, Transmit};
use crate::limits::MAX_STREAM_FRAME;
use crate::shared::{Shared, push_tcp, transmit};

/// The most bytes one read takes.
const READ_CHUNK: usize = 64 * 1024;
/// The `recv`s for UDP nodes gathered before they are sent (then the lock is let go, they
/// leave, and the rest of the read follows).
const BATCH: usize = 64;
/// Type and key prefix: the head of a stream `send` or `recv` after its length.
const HEAD: usize = 1 + 8;
/// Frames handled under one hold of the core's lock at most: a read of tiny frames (64 KiB
/// of empty `send`s is some 6,000) lets the UDP threads in between.
const FRAMES_PER_LOCK: usize = 256;

/// A frame that ends the connection.
#[derive(Debug)]
pub(crate) enum BadFrame {
    /// Longer than [`MAX_STREAM_FRAME`].
    TooLong(usize),
    /// It does not decode.
    Malformed,
}

/// A connection reader's buffers; see the module docs.
pub(crate) struct Inbound {
    /// Bytes read and not yet handled (a frame cut by the end of a read waits here).
    buf: Vec<u8>,
    have: usize,
    /// The `recv`s for UDP nodes (magic, type, source prefix, datagram), one a slot.
    slots: Vec<Vec<u8>>,
    /// (slot, length, node) of each gathered `recv`.
    forwards: Vec<(usize, usize, SocketAddr)>,
    sender: crate::mmsg::Sender,
    /// The connection registered (from then on its `send`s take the fast path).
    pub(crate) registered: bool,
}

impl Inbound {
    pub(crate) fn new() -> Self {
        Self {
            // Room for a read after a frame cut short at the longest.
            buf: vec![0; READ_CHUNK + 2 + MAX_STREAM_FRAME],
            have: 0,
            slots: vec![Vec::new(); BATCH],
            forwards: Vec::with_capacity(BATCH),
            sender: crate::mmsg::Sender::new(),
            registered: false,
        }
    }

    /// Where the next read goes.
    pub(crate) fn space(&mut self) -> &mut [u8] {
        &mut self.buf[self.have..]
    }

    /// Handles the `n` bytes just read into [`Self::space`]: every whole frame, in order.
    pub(crate) fn handle_read(
        &mut self,
        n: usize,
        shared: &Shared,
        id: ConnId,
    ) -> Result<(), BadFrame> {
        self.have += n;
        let mut at = 0;
        loop {
            let done = self.frames(&mut at, shared, id);
            self.flush(shared);
            if done? {
                break;
            }
        }
        self.buf.copy_within(at..self.have, 0);
        self.have -= at;
        Ok(())
    }

    /// Handles whole frames from `at` under one hold of the lock until none is left (true), or
    /// the batch of `recv`s is full or [`FRAMES_PER_LOCK`] were handled (false); `at` moves
    /// past what was handled.
    fn frames(&mut self, at: &mut usize, shared: &Shared, id: ConnId) -> Result<bool, BadFrame> {
        let now = Now::system();
        let mut core = shared.core();
        for _ in 0..FRAMES_PER_LOCK {
            if self.forwards.len() == BATCH {
                return Ok(false);
            }
            let rest = &self.buf[*at..self.have];
            if rest.len() < 2 {
                return Ok(true);
            }
            let len = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
            if len > MAX_STREAM_FRAME {
                return Err(BadFrame::TooLong(len));
            }
            if rest.len() < 2 + len {
                return Ok(true);
            }
            let (start, end) = (*at + 2, *at + 2 + len);
            *at = end;
            if self.registered && len >= HEAD && self.buf[start] == SEND {
                self.send(&mut core, shared, id, (start, end), now);
                continue;
            }
            let frame = Frame::decode(&self.buf[start..end]).map_err(|_| BadFrame::Malformed)?;
            if !self.registered && !matches!(frame, Frame::Hello { .. } | Frame::Register { .. }) {
                // Before its registration a connection is answered nothing but the exchange.
                shared.counters.dropped_unregistered.inc();
                continue;
            }
            core.handle_frame(frame, Peer::Tcp(id), now);
            while let Some(out) = core.poll_transmit() {
                transmit(shared, out);
            }
            // Registered (its answer may be sealed: the core knows, not the frame's type).
            self.registered |= core.is_registered(Peer::Tcp(id));
        }
        Ok(false)
    }

    /// The fast path of a registered connection's `send` at `start..end` of the buffer.
    fn send(
        &mut self,
        core: &mut Core,
        shared: &Shared,
        id: ConnId,
        (start, end): (usize, usize),
        now: Now,
    ) {
        let mut dst = [0u8; 8];
        dst.copy_from_slice(&self.buf[start + 1..start + HEAD]);
        let payload = start + HEAD..end;
        core.handle_send(&dst, payload.len(), Peer::Tcp(id), now);
        while let Some(out) = core.poll_transmit() {
            match out {
                Transmit::Forward {
                    to: To::Udp(node),
                    src,
                } => {
                    // Without a UDP socket there is nothing to send it from (as `deliver`).
                    if shared.udp.is_none() {
                        continue;
                    }
                    let slot = self.forwards.len();
                    let d = &mut self.slots[slot];
                    d.clear();
                    d.extend_from_slice(&RELAY_MAGIC);
                    d.push(RECV);
                    d.extend_from_slice(&prefix(&src));
                    d.extend_from_slice(&self.buf[payload.clone()]);
                    self.forwards.push((slot, d.len(), node));
                }
                Transmit::Forward {
                    to: To::Tcp(tx),
                    src,
                } => {
                    let body = HEAD + payload.len();
                    let mut frame = Vec::with_capacity(2 + body);
                    // At most MAX_STREAM_FRAME, like the frame it came in.
                    frame.extend_from_slice(&(body as u16).to_be_bytes());
                    frame.push(RECV);
                    frame.extend_from_slice(&prefix(&src));
                    frame.extend_from_slice(&self.buf[payload.clone()]);
                    push_tcp(shared, &tx, frame, payload.len());
                }
                other => transmit(shared, other),
            }
        }
    }

    /// Sends the gathered `recv`s (after the lock is let go).
    fn flush(&mut self, shared: &Shared) {
        if self.forwards.is_empty() {
            return;
        }
        if let Some(socket) = &shared.udp {
            let sent = self.sender.send(socket, &self.slots, &self.forwards);
            shared.counters.forwarded_frames.add(sent.frames);
            shared.counters.forwarded_bytes.add(sent.payload);
        }
        self.forwards.clear();
    }
}
