//! Server WebSocket frames, built once and shared.
//!
//! A server frame is never masked (RFC 6455 5.1), so its bytes, header
//! included, are the same for every subscriber that gets the same payload.
//! A [`Frame`] holds those finished bytes: fan-out clones it (a reference
//! count) into every queue, and the writer hands the bytes to the kernel as
//! they are, several frames per vectored write. Nothing is copied or
//! re-encoded per subscriber.
//!
//! A frame may come in two parts: a small per-subscriber `head` (its
//! WebSocket header and, say, a subscription id) written beside a `body`
//! shared by everyone. That is how a protocol whose frames differ per
//! subscriber still encodes the payload once.

use bytes::{BufMut, Bytes, BytesMut};

/// WebSocket opcodes Herald sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpCode {
    Text = 0x1,
    Binary = 0x2,
    Close = 0x8,
    Ping = 0x9,
    Pong = 0xA,
}

/// One complete server frame (header and payload), cheap to clone.
#[derive(Clone, PartialEq, Eq)]
pub struct Frame {
    /// Written first; empty for frames that are shared whole.
    head: Bytes,
    body: Bytes,
}

impl std::fmt::Debug for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Frame({:?})", String::from_utf8_lossy(&self.payload()))
    }
}

/// Bytes of the WebSocket header for a payload of `len` bytes.
pub fn header_len(len: usize) -> usize {
    match len {
        0..=125 => 2,
        126..=65535 => 4,
        _ => 10,
    }
}

/// RSV1: a permessage-deflate message (RFC 7692 6).
const RSV1: u8 = 0x40;

fn put_header(buf: &mut BytesMut, op: OpCode, len: usize) {
    put_header_bits(buf, 0x80 | op as u8, len);
}

fn put_header_bits(buf: &mut BytesMut, first: u8, len: usize) {
    buf.put_u8(first);
    match len {
        0..=125 => buf.put_u8(len as u8),
        126..=65535 => {
            buf.put_u8(126);
            buf.put_u16(len as u16);
        }
        _ => {
            buf.put_u8(127);
            buf.put_u64(len as u64);
        }
    }
}

impl Frame {
    /// A final frame carrying `payload`, in one allocation.
    pub fn new(op: OpCode, payload: &[u8]) -> Frame {
        let mut buf = BytesMut::with_capacity(header_len(payload.len()) + payload.len());
        put_header(&mut buf, op, payload.len());
        buf.put_slice(payload);
        Frame {
            head: Bytes::new(),
            body: buf.freeze(),
        }
    }

    /// A final frame whose payload is already compressed with
    /// permessage-deflate (RSV1 set), in one allocation.
    pub fn deflated(op: OpCode, compressed: &[u8]) -> Frame {
        let mut buf = BytesMut::with_capacity(header_len(compressed.len()) + compressed.len());
        put_header_bits(&mut buf, 0x80 | RSV1 | op as u8, compressed.len());
        buf.put_slice(compressed);
        Frame {
            head: Bytes::new(),
            body: buf.freeze(),
        }
    }

    /// This frame compressed for a connection that negotiated
    /// permessage-deflate, or `None` where it stays as it is: too small,
    /// not shrinking, already compressed, or not a data frame.
    pub fn compress(&self) -> Option<Frame> {
        let op = match self.opcode() {
            0x1 => OpCode::Text,
            0x2 => OpCode::Binary,
            _ => return None,
        };
        if self.is_compressed() {
            return None;
        }
        let compressed = crate::deflate::compress(&self.payload())?;
        Some(Frame::deflated(op, &compressed))
    }

    /// Whether the payload is permessage-deflate data (RSV1).
    pub fn is_compressed(&self) -> bool {
        self.first_byte() & RSV1 != 0
    }

    /// A subscriber's frame: `prefix` (its own bytes) before this shared
    /// frame's payload, the payload only referenced. A compressed frame
    /// gets the prefix as DEFLATE stored blocks ahead of the shared
    /// compressed data: each message starts with an empty window, so the
    /// shared data's back-references reach only its own bytes and read
    /// the same after the prefix (the prefix is written once per
    /// subscriber, the payload compressed once for all).
    pub fn with_prefix(&self, prefix: &[u8]) -> Frame {
        let Some(shared) = self.shared_payload() else {
            // Not reached: shared frames are built whole.
            let mut all = prefix.to_vec();
            all.extend_from_slice(&self.payload());
            return Frame::new(OpCode::Text, &all);
        };
        if !self.is_compressed() {
            return Frame::text_with_prefix(prefix, &shared);
        }
        // A stored block (BFINAL 0, BTYPE 00): one byte, LEN and NLEN
        // (little-endian), the bytes; at most 65,535 bytes a block.
        let blocks = prefix.len().div_ceil(65_535).max(1);
        let stored = blocks * 5 + prefix.len();
        let len = stored + shared.len();
        let mut head = BytesMut::with_capacity(header_len(len) + stored);
        put_header_bits(&mut head, self.first_byte(), len);
        let mut chunks = prefix.chunks(65_535).peekable();
        if chunks.peek().is_none() {
            head.put_slice(&[0, 0, 0, 0xff, 0xff]);
        }
        for c in chunks {
            let n = c.len() as u16;
            head.put_u8(0);
            head.put_u16_le(n);
            head.put_u16_le(!n);
            head.put_slice(c);
        }
        Frame {
            head: head.freeze(),
            body: shared,
        }
    }

    fn first_byte(&self) -> u8 {
        let first = if self.head.is_empty() {
            self.body.first()
        } else {
            self.head.first()
        };
        first.copied().unwrap_or(0)
    }

    /// A text frame. `text` is UTF-8 by its type.
    pub fn text(text: &str) -> Frame {
        Frame::new(OpCode::Text, text.as_bytes())
    }

    /// A close frame with `code` and a reason cut to fit the 125-byte limit
    /// of control frames (on a character boundary).
    pub fn close(code: u16, reason: &str) -> Frame {
        let mut end = reason.len().min(123);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        let mut payload = Vec::with_capacity(2 + end);
        payload.extend_from_slice(&code.to_be_bytes());
        payload.extend_from_slice(&reason.as_bytes()[..end]);
        Frame::new(OpCode::Close, &payload)
    }

    /// A text frame whose payload is `prefix` (per subscriber) followed by
    /// `shared` (the same bytes for everyone): the header and prefix are one
    /// small allocation, the shared part is only referenced.
    pub fn text_with_prefix(prefix: &[u8], shared: &Bytes) -> Frame {
        let len = prefix.len() + shared.len();
        let mut head = BytesMut::with_capacity(header_len(len) + prefix.len());
        put_header(&mut head, OpCode::Text, len);
        head.put_slice(prefix);
        Frame {
            head: head.freeze(),
            body: shared.clone(),
        }
    }

    /// Bytes on the wire.
    pub fn len(&self) -> usize {
        self.head.len() + self.body.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The parts to write, in order (one or two).
    pub fn parts(&self) -> [&Bytes; 2] {
        [&self.head, &self.body]
    }

    /// What is left of this frame once its first `n` bytes are written
    /// (a partial write): the same allocations, sliced.
    pub fn after(&self, n: usize) -> Frame {
        if n < self.head.len() {
            Frame {
                head: self.head.slice(n..),
                body: self.body.clone(),
            }
        } else {
            Frame {
                head: Bytes::new(),
                body: self
                    .body
                    .slice((n - self.head.len()).min(self.body.len())..),
            }
        }
    }

    /// The payload without the WebSocket header, copied (for tests and
    /// diagnostics; never on the hot path).
    pub fn payload(&self) -> Vec<u8> {
        let mut all = Vec::with_capacity(self.len());
        all.extend_from_slice(&self.head);
        all.extend_from_slice(&self.body);
        if all.len() < 2 {
            return Vec::new();
        }
        let skip = match all[1] & 0x7f {
            126 => 4,
            127 => 10,
            _ => 2,
        };
        all.get(skip..).map(<[u8]>::to_vec).unwrap_or_default()
    }

    /// The payload of a frame shared whole, without copying it (a slice of
    /// the same allocation); `None` for a frame with a per-subscriber head.
    pub fn shared_payload(&self) -> Option<Bytes> {
        if !self.head.is_empty() || self.body.len() < 2 {
            return None;
        }
        let skip = match self.body[1] & 0x7f {
            126 => 4,
            127 => 10,
            _ => 2,
        };
        (skip <= self.body.len()).then(|| self.body.slice(skip..))
    }

    /// The payload as text (tests and diagnostics).
    pub fn payload_text(&self) -> String {
        String::from_utf8_lossy(&self.payload()).into_owned()
    }

    /// The opcode of this frame.
    pub fn opcode(&self) -> u8 {
        self.first_byte() & 0x0f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_for_every_length_class() {
        for len in [0usize, 1, 125, 126, 65535, 65536, 70000] {
            let payload = vec![b'a'; len];
            let f = Frame::new(OpCode::Text, &payload);
            assert_eq!(f.len(), header_len(len) + len);
            assert_eq!(f.payload(), payload);
            assert_eq!(f.opcode(), 1);
        }
    }

    #[test]
    fn prefix_frames_share_the_body() {
        let shared = Bytes::from_static(b"{\"x\":1}}");
        let a = Frame::text_with_prefix(b"{\"id\":\"a\",\"e\":", &shared);
        let b = Frame::text_with_prefix(b"{\"id\":\"bb\",\"e\":", &shared);
        assert_eq!(a.payload_text(), "{\"id\":\"a\",\"e\":{\"x\":1}}");
        assert_eq!(b.payload_text(), "{\"id\":\"bb\",\"e\":{\"x\":1}}");
        // The body is the same allocation, not a copy.
        assert_eq!(a.parts()[1].as_ptr(), b.parts()[1].as_ptr());
    }

    #[test]
    fn what_is_left_after_a_partial_write() {
        let shared = Bytes::from_static(b"body");
        let f = Frame::text_with_prefix(b"pre", &shared);
        let all: Vec<u8> = f.parts().iter().flat_map(|b| b.iter().copied()).collect();
        for n in 0..=all.len() {
            let rest = f.after(n);
            let got: Vec<u8> = rest
                .parts()
                .iter()
                .flat_map(|b| b.iter().copied())
                .collect();
            assert_eq!(got, all[n..], "after {n} bytes");
        }
    }

    /// Inflate a compressed frame's payload as a client would.
    fn inflate(f: &Frame) -> Vec<u8> {
        crate::deflate::inflate(&f.payload(), 1 << 20).expect("inflates")
    }

    #[test]
    fn compressed_frames_and_their_prefixes() {
        let text = r#"{"id":1,"name":"item","price":"19.99"},"#.repeat(40);
        let plain = Frame::text(&text);
        let c = plain.compress().expect("compresses");
        assert!(c.is_compressed() && !plain.is_compressed());
        assert_eq!(c.opcode(), 1);
        assert!(c.len() * 3 < plain.len());
        assert_eq!(inflate(&c), text.as_bytes());
        assert!(c.compress().is_none(), "never twice");
        assert!(Frame::text("tiny").compress().is_none());
        assert!(Frame::close(1000, &"x".repeat(120)).compress().is_none());
        // A per-subscriber prefix beside the shared compressed body.
        for prefix in ["", "{\"id\":\"a\",\"e\":", &"p".repeat(70_000)] {
            let a = c.with_prefix(prefix.as_bytes());
            assert!(a.is_compressed());
            assert_eq!(a.parts()[1].as_ptr(), c.shared_payload().unwrap().as_ptr());
            assert_eq!(inflate(&a), format!("{prefix}{text}").as_bytes());
            let p = plain.with_prefix(prefix.as_bytes());
            assert!(!p.is_compressed());
            assert_eq!(p.payload(), format!("{prefix}{text}").as_bytes());
        }
    }

    #[test]
    fn close_reason_is_cut_on_a_char_boundary() {
        let f = Frame::close(4000, &"é".repeat(100));
        let p = f.payload();
        assert!(p.len() <= 125);
        assert_eq!(u16::from_be_bytes([p[0], p[1]]), 4000);
        assert!(std::str::from_utf8(&p[2..]).is_ok());
    }
}
