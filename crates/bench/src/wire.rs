//! The clients' socket: TCP, counted, and optionally offering
//! permessage-deflate (`--deflate`).
//!
//! The WebSocket library the clients use (tungstenite) has no
//! permessage-deflate, so with `--deflate` the socket does the extension's
//! receiving side itself, below the library: it adds the offer to the
//! upgrade request, reads the answer, and rewrites each compressed server
//! message (RSV1) into the plain frame the library expects. The client's
//! own messages go uncompressed (the RFC lets each message choose).
//!
//! Every byte read from the network is counted ([`bytes_read`]) before any
//! inflation: what the server put on the wire.

use flate2::{Decompress, FlushDecompress, Status};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The extension offer: what browsers and the `ws` package send, asking
/// for no context takeover so each message inflates on its own.
pub const OFFER: &str = "permessage-deflate; client_max_window_bits";

static DEFLATE: AtomicBool = AtomicBool::new(false);
static BYTES_READ: AtomicU64 = AtomicU64::new(0);

/// Offer permessage-deflate on every WebSocket the bench opens from now.
pub fn offer_deflate(on: bool) {
    DEFLATE.store(on, Relaxed);
}

/// Whether the bench offers permessage-deflate.
pub fn deflate_offered() -> bool {
    DEFLATE.load(Relaxed)
}

/// Bytes read from every client socket so far (on the wire: compressed).
pub fn bytes_read() -> u64 {
    BYTES_READ.load(Relaxed)
}

/// A client's socket.
pub struct Socket {
    tcp: TcpStream,
    /// Present when deflate was offered: the frame rewriter.
    inflate: Option<Box<Inflate>>,
}

impl Socket {
    pub fn new(tcp: TcpStream) -> Socket {
        Socket {
            tcp,
            inflate: deflate_offered().then(|| Box::new(Inflate::new())),
        }
    }
}

/// The receiving side of permessage-deflate, between the socket and the
/// WebSocket library.
struct Inflate {
    /// Still in the HTTP answer to the upgrade (its bytes pass through).
    in_head: bool,
    head: Vec<u8>,
    /// The server accepted the extension.
    on: bool,
    /// The server keeps its window between messages (no
    /// `server_no_context_takeover`): the inflater is not reset.
    takeover: bool,
    /// Bytes read and not yet rewritten (an incomplete frame).
    raw: Vec<u8>,
    /// Rewritten bytes for the library.
    out: Vec<u8>,
    out_at: usize,
    /// A compressed message in fragments: its opcode and data so far.
    message: Option<(u8, Vec<u8>)>,
    inflater: Decompress,
}

impl Inflate {
    fn new() -> Inflate {
        Inflate {
            in_head: true,
            head: Vec::new(),
            on: false,
            takeover: true,
            raw: Vec::new(),
            out: Vec::new(),
            out_at: 0,
            message: None,
            inflater: Decompress::new(false),
        }
    }

    /// Take bytes read from the socket.
    fn take(&mut self, mut data: &[u8]) -> io::Result<()> {
        if self.in_head {
            // The answer's head passes through as it is; the frames after
            // it are rewritten.
            let before = self.head.len();
            self.head.extend_from_slice(data);
            let Some(end) = self.head.windows(4).position(|w| w == b"\r\n\r\n") else {
                self.out.extend_from_slice(data);
                return Ok(());
            };
            let end = end + 4;
            self.out.extend_from_slice(&data[..end - before]);
            let head = String::from_utf8_lossy(&self.head[..end]).to_ascii_lowercase();
            for line in head.lines() {
                if let Some(v) = line.strip_prefix("sec-websocket-extensions:") {
                    if v.contains("permessage-deflate") {
                        self.on = true;
                        self.takeover = !v.contains("server_no_context_takeover");
                    }
                }
            }
            self.in_head = false;
            self.head = Vec::new();
            data = &data[end - before..];
        }
        if !self.on {
            self.out.extend_from_slice(data);
            return Ok(());
        }
        let mut raw = std::mem::take(&mut self.raw);
        raw.extend_from_slice(data);
        let mut at = 0;
        while let Some(used) = self.frame(&raw[at..])? {
            at += used;
        }
        raw.drain(..at);
        self.raw = raw;
        Ok(())
    }

    /// Rewrite one whole server frame from the front of `b`: `None` if it
    /// is incomplete.
    fn frame(&mut self, b: &[u8]) -> io::Result<Option<usize>> {
        if b.len() < 2 {
            return Ok(None);
        }
        let (len, at) = match b[1] & 0x7f {
            126 if b.len() >= 4 => (u16::from_be_bytes([b[2], b[3]]) as usize, 4),
            127 if b.len() >= 10 => {
                let mut n = [0u8; 8];
                n.copy_from_slice(&b[2..10]);
                (u64::from_be_bytes(n) as usize, 10)
            }
            126 | 127 => return Ok(None),
            n => (n as usize, 2),
        };
        if b.len() < at + len {
            return Ok(None);
        }
        let (fin, rsv1, op) = (b[0] & 0x80 != 0, b[0] & 0x40 != 0, b[0] & 0x0f);
        let payload = &b[at..at + len];
        if rsv1 || (op == 0 && self.message.is_some()) {
            let (first, mut data) = self.message.take().unwrap_or((op, Vec::new()));
            data.extend_from_slice(payload);
            if fin {
                let plain = self.inflate(&data)?;
                put_frame(&mut self.out, first, &plain);
            } else {
                self.message = Some((first, data));
            }
        } else {
            self.out.extend_from_slice(&b[..at + len]);
        }
        Ok(Some(at + len))
    }

    fn inflate(&mut self, data: &[u8]) -> io::Result<Vec<u8>> {
        if !self.takeover {
            self.inflater.reset(false);
        }
        let mut input = data.to_vec();
        input.extend_from_slice(&[0, 0, 0xff, 0xff]);
        let mut out = Vec::with_capacity(data.len() * 4 + 64);
        let mut at = 0;
        loop {
            if out.len() == out.capacity() {
                out.reserve(out.capacity());
            }
            let (was_in, was_out) = (self.inflater.total_in(), out.len());
            let status = self
                .inflater
                .decompress_vec(&input[at..], &mut out, FlushDecompress::Sync)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            at += (self.inflater.total_in() - was_in) as usize;
            let done = at == input.len() && out.len() < out.capacity();
            if status == Status::StreamEnd || done {
                return Ok(out);
            }
            if self.inflater.total_in() == was_in && out.len() == was_out {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a compressed message that does not inflate",
                ));
            }
        }
    }
}

/// An unmasked, final frame with `op` and `payload`.
fn put_frame(out: &mut Vec<u8>, op: u8, payload: &[u8]) {
    out.push(0x80 | op);
    match payload.len() {
        n @ 0..=125 => out.push(n as u8),
        n @ 126..=65535 => {
            out.push(126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(payload);
}

impl std::os::fd::AsRawFd for Socket {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.tcp.as_raw_fd()
    }
}

impl AsyncRead for Socket {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let Some(inf) = this.inflate.as_mut() else {
            let before = buf.filled().len();
            let r = Pin::new(&mut this.tcp).poll_read(cx, buf);
            BYTES_READ.fetch_add((buf.filled().len() - before) as u64, Relaxed);
            return r;
        };
        loop {
            if inf.out_at < inf.out.len() {
                let n = (inf.out.len() - inf.out_at).min(buf.remaining());
                buf.put_slice(&inf.out[inf.out_at..inf.out_at + n]);
                inf.out_at += n;
                if inf.out_at == inf.out.len() {
                    inf.out.clear();
                    inf.out_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 16 * 1024];
            let mut rb = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.tcp).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) => {
                    let got = rb.filled();
                    if got.is_empty() {
                        return Poll::Ready(Ok(())); // end of stream
                    }
                    BYTES_READ.fetch_add(got.len() as u64, Relaxed);
                    inf.take(got)?;
                }
                other => return other,
            }
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compressed_frames_are_rewritten_plain() {
        let text = b"{\"event\":\"e\",\"data\":\"hello hello hello hello\"}";
        let mut c = flate2::Compress::new(flate2::Compression::default(), false);
        let mut z = Vec::with_capacity(256);
        c.compress_vec(text, &mut z, flate2::FlushCompress::Sync)
            .unwrap();
        z.truncate(z.len() - 4);
        let mut inf = Inflate::new();
        let mut wire = b"HTTP/1.1 101 Switching Protocols\r\nSec-WebSocket-Extensions: permessage-deflate; server_no_context_takeover\r\n\r\n".to_vec();
        let head_len = wire.len();
        let mut f = Vec::new();
        put_frame(&mut f, 1, &z);
        f[0] |= 0x40;
        wire.extend_from_slice(&f);
        put_frame(&mut wire, 1, b"plain");
        for b in wire.chunks(7) {
            inf.take(b).unwrap();
        }
        let mut want = wire[..head_len].to_vec();
        put_frame(&mut want, 1, text);
        put_frame(&mut want, 1, b"plain");
        assert_eq!(inf.out, want);
    }
}
