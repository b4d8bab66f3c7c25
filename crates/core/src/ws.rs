//! The WebSocket transport (RFC 6455), server side: the HTTP upgrade and a
//! decoder for client frames. Server frames are built by [`crate::frame`].
//!
//! Herald reads and writes frames itself rather than through a WebSocket
//! library for two reasons, both measured (bench/RESULTS.md): a library
//! copies every outgoing frame into its own buffer once per subscriber,
//! where Herald's frames are finished bytes shared by all subscribers; and a
//! library keeps a read buffer per connection, where Herald reads into one
//! scratch buffer per thread and keeps bytes per connection only while a
//! frame is incomplete, so an idle connection holds no buffer at all.

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use sha1::{Digest, Sha1};
use std::collections::VecDeque;

/// A WebSocket close code and its reason, as sent or received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseFrame {
    pub code: u16,
    pub reason: String,
}

/// A complete message from the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    Text(String),
    Binary(Vec<u8>),
    Ping(Vec<u8>),
    Pong,
    Close(Option<CloseFrame>),
}

/// Why the client's byte stream cannot be read further; each maps to the
/// close code RFC 6455 gives it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WsError {
    #[error("WebSocket protocol error: {0}")]
    Protocol(&'static str),
    #[error("Message too large: more than {0} bytes")]
    TooLarge(usize),
    #[error("Text frame is not valid UTF-8")]
    Utf8,
}

impl WsError {
    pub fn close_code(&self) -> u16 {
        match self {
            WsError::Protocol(_) => 1002,
            WsError::TooLarge(_) => 1009,
            WsError::Utf8 => 1007,
        }
    }
}

/// Close codes an endpoint may send, and so the only ones a close frame
/// may carry (RFC 6455 7.4.1 and IANA's registry: 1004-1006 and 1015 are
/// reserved, never on the wire; 1016-2999 unassigned; 5000 and up invalid).
pub fn is_valid_close_code(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999)
}

/// Incremental decoder of client frames. Holds bytes only while a frame or
/// a fragmented message is incomplete, or decoded messages wait to be
/// taken: all of that lives in one box that exists only then, so an idle
/// connection's decoder is two words (it is part of every connection's
/// task). With permessage-deflate negotiated it inflates compressed
/// messages (see [`crate::deflate`]) with no state of its own between them.
#[derive(Debug)]
pub struct Decoder {
    /// Largest message (and frame) accepted, compressed or inflated (in a
    /// u32 beside the flag: the decoder stays two words).
    max: u32,
    /// permessage-deflate was negotiated: RSV1 marks a compressed message.
    inflate: bool,
    pending: Option<Box<Pending>>,
}

impl Decoder {
    pub fn new(max_message: usize) -> Decoder {
        Decoder {
            max: max_message.min(u32::MAX as usize) as u32,
            inflate: false,
            pending: None,
        }
    }

    /// A decoder for a connection that negotiated permessage-deflate (or
    /// not, with `false`).
    pub fn inflating(mut self, on: bool) -> Decoder {
        self.inflate = on;
        self
    }

    /// Feed bytes read from the socket. Complete messages become available
    /// from [`Decoder::next`]; after an error nothing more is decoded.
    pub fn feed(&mut self, data: &[u8]) {
        let (max, inflate) = (self.max as usize, self.inflate);
        let p = self
            .pending
            .get_or_insert_with(|| Box::new(Pending::new(max, inflate)));
        p.feed(data);
        if p.is_empty() {
            self.pending = None;
        }
    }

    /// Whether [`Decoder::next`] has something (a message or the error)
    /// without reading more.
    pub fn has_next(&self) -> bool {
        self.pending
            .as_ref()
            .is_some_and(|p| !p.ready.is_empty() || p.error.is_some())
    }

    /// The next complete message, then (once messages are drained) the error
    /// that stopped decoding, if any.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Option<Result<Incoming, WsError>> {
        let p = self.pending.as_mut()?;
        let next = p.next();
        if p.is_empty() {
            self.pending = None;
        }
        next
    }
}

/// What a decoder holds between reads.
#[derive(Debug)]
struct Pending {
    /// Unconsumed bytes of an incomplete frame.
    partial: Vec<u8>,
    /// Payload of a fragmented message so far, and its opcode.
    message: Vec<u8>,
    fragmented: Option<u8>,
    /// The fragmented message's first frame had RSV1 (compressed).
    compressed: bool,
    max: usize,
    inflate: bool,
    ready: VecDeque<Incoming>,
    error: Option<WsError>,
}

impl Pending {
    fn new(max_message: usize, inflate: bool) -> Pending {
        Pending {
            partial: Vec::new(),
            message: Vec::new(),
            fragmented: None,
            compressed: false,
            max: max_message,
            inflate,
            ready: VecDeque::new(),
            error: None,
        }
    }

    /// Nothing held: the box can go.
    fn is_empty(&self) -> bool {
        self.partial.is_empty()
            && self.message.is_empty()
            && self.fragmented.is_none()
            && self.ready.is_empty()
            && self.error.is_none()
    }

    fn feed(&mut self, data: &[u8]) {
        if self.error.is_some() {
            return;
        }
        if self.partial.is_empty() {
            let used = self.decode(data);
            if used < data.len() && self.error.is_none() {
                self.partial.extend_from_slice(&data[used..]);
            }
        } else {
            let mut buf = std::mem::take(&mut self.partial);
            buf.extend_from_slice(data);
            let used = self.decode(&buf);
            if used < buf.len() && self.error.is_none() {
                buf.drain(..used);
                self.partial = buf;
            }
        }
    }

    fn next(&mut self) -> Option<Result<Incoming, WsError>> {
        if let Some(m) = self.ready.pop_front() {
            return Some(Ok(m));
        }
        self.error.take().map(Err)
    }

    /// Decode as many whole frames from `buf` as it holds; returns the bytes
    /// consumed.
    fn decode(&mut self, buf: &[u8]) -> usize {
        let mut at = 0;
        loop {
            match self.frame(&buf[at..]) {
                Ok(Some(used)) => at += used,
                Ok(None) => return at,
                Err(e) => {
                    self.error = Some(e);
                    self.partial = Vec::new();
                    self.message = Vec::new();
                    return buf.len();
                }
            }
        }
    }

    /// Decode one frame from the front of `b`: `None` if it is incomplete.
    fn frame(&mut self, b: &[u8]) -> Result<Option<usize>, WsError> {
        if b.len() < 2 {
            return Ok(None);
        }
        let fin = b[0] & 0x80 != 0;
        let op = b[0] & 0x0f;
        // RSV1 is permessage-deflate's, on a message's first frame only.
        let rsv1 = b[0] & 0x40 != 0;
        if b[0] & 0x30 != 0 || (rsv1 && !self.inflate) {
            return Err(WsError::Protocol(
                "reserved bits set without a negotiated extension",
            ));
        }
        if rsv1 && !matches!(op, 0x1 | 0x2) {
            return Err(WsError::Protocol(
                "RSV1 set on a control or continuation frame",
            ));
        }
        if b[1] & 0x80 == 0 {
            return Err(WsError::Protocol("client frames must be masked"));
        }
        let (len, mut at) = match b[1] & 0x7f {
            126 => {
                if b.len() < 4 {
                    return Ok(None);
                }
                (u16::from_be_bytes([b[2], b[3]]) as u64, 4)
            }
            127 => {
                if b.len() < 10 {
                    return Ok(None);
                }
                let mut n = [0u8; 8];
                n.copy_from_slice(&b[2..10]);
                (u64::from_be_bytes(n), 10)
            }
            n => (n as u64, 2),
        };
        let control = op & 0x08 != 0;
        match op {
            0x0 | 0x1 | 0x2 | 0x8 | 0x9 | 0xA => {}
            _ => return Err(WsError::Protocol("unknown opcode")),
        }
        if control && (!fin || len > 125) {
            return Err(WsError::Protocol(
                "control frames must be final and at most 125 bytes",
            ));
        }
        // Refuse an oversized message from its header, before buffering it.
        if !control && (self.message.len() as u64).saturating_add(len) > self.max as u64 {
            return Err(WsError::TooLarge(self.max));
        }
        let len = len as usize;
        if b.len() < at + 4 + len {
            return Ok(None);
        }
        let mask = [b[at], b[at + 1], b[at + 2], b[at + 3]];
        at += 4;
        let mut payload = b[at..at + len].to_vec();
        for (i, byte) in payload.iter_mut().enumerate() {
            *byte ^= mask[i & 3];
        }
        let used = at + len;
        match op {
            0x8 => {
                let close = match payload.len() {
                    0 => None,
                    1 => return Err(WsError::Protocol("close frame with a 1-byte payload")),
                    _ => {
                        let code = u16::from_be_bytes([payload[0], payload[1]]);
                        if !is_valid_close_code(code) {
                            // RFC 6455 7.4: reserved or unassigned (999,
                            // 1005, 5000 ...) is a protocol error, 1002.
                            return Err(WsError::Protocol("invalid close code"));
                        }
                        let reason =
                            String::from_utf8(payload[2..].to_vec()).map_err(|_| WsError::Utf8)?;
                        Some(CloseFrame { code, reason })
                    }
                };
                self.ready.push_back(Incoming::Close(close));
            }
            0x9 => self.ready.push_back(Incoming::Ping(payload)),
            0xA => self.ready.push_back(Incoming::Pong),
            0x0 => {
                let Some(first) = self.fragmented else {
                    return Err(WsError::Protocol("continuation frame without a message"));
                };
                self.message.extend_from_slice(&payload);
                if fin {
                    self.fragmented = None;
                    let whole = std::mem::take(&mut self.message);
                    let compressed = std::mem::take(&mut self.compressed);
                    self.complete(first, whole, compressed)?;
                }
            }
            _ => {
                if self.fragmented.is_some() {
                    return Err(WsError::Protocol(
                        "new message before the fragmented one ended",
                    ));
                }
                if fin {
                    self.complete(op, payload, rsv1)?;
                } else {
                    self.fragmented = Some(op);
                    self.compressed = rsv1;
                    self.message = payload;
                }
            }
        }
        Ok(Some(used))
    }

    fn complete(&mut self, op: u8, payload: Vec<u8>, compressed: bool) -> Result<(), WsError> {
        let payload = if compressed {
            // The inflated size counts against the same limit.
            crate::deflate::inflate(&payload, self.max).map_err(|e| match e {
                crate::deflate::InflateError::TooLarge => WsError::TooLarge(self.max),
                crate::deflate::InflateError::Invalid => {
                    WsError::Protocol("invalid compressed message")
                }
            })?
        } else {
            payload
        };
        let m = if op == 0x1 {
            Incoming::Text(String::from_utf8(payload).map_err(|_| WsError::Utf8)?)
        } else {
            Incoming::Binary(payload)
        };
        self.ready.push_back(m);
        Ok(())
    }
}

/// What an upgrade request asked for, checked.
pub struct Handshake {
    accept: String,
    /// The subprotocol chosen from the client's list, if any.
    pub protocol: Option<&'static str>,
    /// permessage-deflate accepted (see [`crate::deflate`]).
    pub deflate: bool,
}

/// Check a WebSocket upgrade request (RFC 6455 4.2.1) and pick the first of
/// the client's subprotocols that `supported` holds (in the client's order).
/// A request that is not a WebSocket upgrade gets a 400 or 426 answer.
// The error is the HTTP answer itself, built once on a refused upgrade: not
// worth a box on the accepted path.
#[allow(clippy::result_large_err)]
pub fn handshake(headers: &HeaderMap, supported: &[&'static str]) -> Result<Handshake, Response> {
    let has = |name: header::HeaderName, token: &str| {
        headers.get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    if !has(header::UPGRADE, "websocket") || !has(header::CONNECTION, "upgrade") {
        return Err((
            StatusCode::UPGRADE_REQUIRED,
            [(header::UPGRADE, "websocket")],
            "This endpoint speaks WebSocket: send an Upgrade: websocket request",
        )
            .into_response());
    }
    if headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .and_then(|v| v.to_str().ok())
        != Some("13")
    {
        return Err((
            StatusCode::BAD_REQUEST,
            [(header::SEC_WEBSOCKET_VERSION, "13")],
            "Unsupported Sec-WebSocket-Version (13 is required)",
        )
            .into_response());
    }
    let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY) else {
        return Err((StatusCode::BAD_REQUEST, "Missing Sec-WebSocket-Key").into_response());
    };
    let mut sha = Sha1::new();
    sha.update(key.as_bytes());
    sha.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    let accept = base64::engine::general_purpose::STANDARD.encode(sha.finalize());
    let protocol = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .find_map(|p| supported.iter().find(|s| **s == p).copied());
    Ok(Handshake {
        accept,
        protocol,
        deflate: false,
    })
}

impl Handshake {
    /// The `101 Switching Protocols` answer.
    pub fn response(&self) -> Response {
        let mut res = Response::new(axum::body::Body::empty());
        *res.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let h = res.headers_mut();
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        if let Ok(v) = HeaderValue::from_str(&self.accept) {
            h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
        }
        if let Some(p) = self.protocol {
            h.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(p));
        }
        if self.deflate {
            h.insert(
                header::SEC_WEBSOCKET_EXTENSIONS,
                HeaderValue::from_static(crate::deflate::RESPONSE),
            );
        }
        res
    }
}

/// The descriptor of a plain TCP connection, put in its requests'
/// extensions by the listener (not for TLS): what lets a session allow
/// direct writes (see [`crate::connection`]).
#[derive(Debug, Clone, Copy)]
pub struct RawSocket(pub i32);

/// An upgraded client socket, and its descriptor if it is plain TCP.
pub struct Socket {
    io: hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>,
    fd: i32,
    /// permessage-deflate was negotiated at the upgrade.
    deflate: bool,
    /// The connection allowed to write to `fd` directly, if any: detached
    /// when the socket drops, before the descriptor closes, however the
    /// session ended (a panic included), so a direct write can never reach
    /// the descriptor's next owner.
    attached: Option<std::sync::Arc<crate::connection::Connection>>,
}

impl Socket {
    /// Whether permessage-deflate was negotiated on this socket.
    pub fn deflate(&self) -> bool {
        self.deflate
    }

    /// A decoder of this socket's client frames, inflating them where
    /// permessage-deflate was negotiated.
    pub fn decoder(&self, max_message: usize) -> Decoder {
        Decoder::new(max_message).inflating(self.deflate)
    }

    /// Let `conn`'s senders write to this socket directly (plain TCP only;
    /// see [`crate::connection`]); returns whether they may.
    pub fn attach(
        &mut self,
        conn: &std::sync::Arc<crate::connection::Connection>,
        coalesce_from: u32,
        traffic: std::sync::Arc<crate::metrics::Traffic>,
    ) -> bool {
        if self.fd < 0 {
            return false;
        }
        conn.attach(self.fd, coalesce_from, traffic);
        self.attached = Some(conn.clone());
        true
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        if let Some(conn) = self.attached.take() {
            conn.detach();
        }
    }
}

impl tokio::io::AsyncRead for Socket {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Socket {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Let hyper's HTTP read buffer (about 14 KiB a connection) go now rather
/// than at the session's first read. hyper hands it to the upgraded socket
/// for the bytes a client may have sent behind its request, and frees it
/// only when a read finds it empty; a session that first waits on its app
/// (an RPC `Connect`, queued behind thousands in a reconnect storm) would
/// hold it for the whole wait. A read into a zero-length buffer drops it
/// when empty and leaves any early bytes where they are.
fn release_read_buffer(socket: &mut Socket) {
    use tokio::io::AsyncRead;
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut empty = tokio::io::ReadBuf::new(&mut []);
    let _ = std::pin::Pin::new(socket).poll_read(&mut cx, &mut empty);
}

/// Answer a WebSocket upgrade request and, once the client switched
/// protocols, run `then` with the socket and the chosen subprotocol on its
/// own task. A request that is not a valid upgrade gets its HTTP error.
/// permessage-deflate is accepted when `compression` allows it (the
/// server's and the app's `websocket_compression`) and the client offers
/// it in a form Herald takes ([`crate::deflate::accepts`]).
pub fn upgrade<F, Fut>(
    mut req: axum::extract::Request,
    supported: &[&'static str],
    compression: bool,
    then: F,
) -> Response
where
    F: FnOnce(Socket, Option<&'static str>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut hs = match handshake(req.headers(), supported) {
        Ok(h) => h,
        Err(r) => return r,
    };
    hs.deflate = compression && crate::deflate::accepts(req.headers());
    let deflate = hs.deflate;
    let on = hyper::upgrade::on(&mut req);
    let protocol = hs.protocol;
    let fd = req.extensions().get::<RawSocket>().map_or(-1, |s| s.0);
    tokio::spawn(async move {
        if let Ok(upgraded) = on.await {
            let mut socket = Socket {
                io: hyper_util::rt::TokioIo::new(upgraded),
                fd,
                deflate,
                attached: None,
            };
            release_read_buffer(&mut socket);
            // The session on a task of its own, this one ending here: a
            // task's memory is its largest state for its whole life, and
            // the session then does not carry this wait (nor `then`).
            tokio::spawn(then(socket, protocol));
        }
    });
    hs.response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A masked client frame.
    pub fn client_frame(fin: bool, op: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![if fin { 0x80 } else { 0 } | op];
        let len = payload.len();
        if len < 126 {
            f.push(0x80 | len as u8);
        } else if len < 65536 {
            f.push(0x80 | 126);
            f.extend_from_slice(&(len as u16).to_be_bytes());
        } else {
            f.push(0x80 | 127);
            f.extend_from_slice(&(len as u64).to_be_bytes());
        }
        let mask = [1u8, 2, 3, 4];
        f.extend_from_slice(&mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i & 3]));
        f
    }

    fn all(d: &mut Decoder) -> Vec<Result<Incoming, WsError>> {
        std::iter::from_fn(|| d.next()).collect()
    }

    #[test]
    fn decodes_byte_by_byte_and_frees_buffers() {
        let mut bytes = client_frame(true, 1, b"hello");
        bytes.extend(client_frame(false, 1, b"wor"));
        bytes.extend(client_frame(true, 9, b"p"));
        bytes.extend(client_frame(true, 0, b"ld"));
        bytes.extend(client_frame(true, 8, &[0x03, 0xe8, b'b']));
        let mut d = Decoder::new(1024);
        for b in &bytes {
            d.feed(std::slice::from_ref(b));
        }
        assert_eq!(
            all(&mut d),
            vec![
                Ok(Incoming::Text("hello".into())),
                Ok(Incoming::Ping(b"p".to_vec())),
                Ok(Incoming::Text("world".into())),
                Ok(Incoming::Close(Some(CloseFrame {
                    code: 1000,
                    reason: "b".into()
                }))),
            ]
        );
        assert!(d.pending.is_none(), "an emptied decoder holds nothing");
    }

    #[test]
    fn protocol_errors() {
        let cases: Vec<(Vec<u8>, u16)> = vec![
            (vec![0x81, 0x02, b'h', b'i'], 1002), // unmasked
            (
                {
                    let mut f = client_frame(true, 1, b"x");
                    f[0] |= 0x40;
                    f
                },
                1002,
            ), // RSV1
            (client_frame(true, 3, b""), 1002),   // unknown opcode
            (client_frame(false, 9, b""), 1002),  // fragmented ping
            (client_frame(true, 0, b"x"), 1002),  // stray continuation
            (client_frame(true, 1, &[0xff, 0xfe]), 1007),
            (client_frame(true, 1, &[b'a'; 2000]), 1009),
        ];
        // Close codes nobody may send are a protocol error (1002).
        let mut cases = cases;
        for code in [0u16, 999, 1004, 1005, 1006, 1015, 1016, 2999, 5000, 65535] {
            cases.push((client_frame(true, 8, &code.to_be_bytes()), 1002));
        }
        for (bytes, code) in cases {
            let mut d = Decoder::new(1024);
            d.feed(&bytes);
            let got = all(&mut d);
            assert_eq!(got.len(), 1, "{bytes:?}");
            assert_eq!(got[0].as_ref().unwrap_err().close_code(), code, "{bytes:?}");
        }
    }

    #[test]
    fn valid_close_codes_are_read() {
        for code in [1000u16, 1001, 1003, 1007, 1011, 1014, 3000, 4999] {
            let mut d = Decoder::new(1024);
            d.feed(&client_frame(true, 8, &code.to_be_bytes()));
            assert_eq!(
                all(&mut d),
                vec![Ok(Incoming::Close(Some(CloseFrame {
                    code,
                    reason: String::new()
                })))]
            );
        }
    }

    /// `text` compressed as a client sends it (the tail stripped).
    fn deflated(text: &[u8]) -> Vec<u8> {
        let mut c = flate2::Compress::new(flate2::Compression::default(), false);
        let mut out = Vec::with_capacity(text.len() / 2 + 1024);
        c.compress_vec(text, &mut out, flate2::FlushCompress::Sync)
            .unwrap();
        out.truncate(out.len() - 4);
        out
    }

    #[test]
    fn compressed_messages_are_inflated_and_bounded() {
        let text = "{\"event\":\"client-x\",\"data\":{}}".repeat(20);
        let z = deflated(text.as_bytes());
        // One frame, and the same message in two fragments (RSV1 on the
        // first only).
        let mut one = client_frame(true, 1, &z);
        one[0] |= 0x40;
        let mut two = client_frame(false, 1, &z[..3]);
        two[0] |= 0x40;
        two.extend(client_frame(true, 0, &z[3..]));
        for bytes in [one.clone(), two] {
            let mut d = Decoder::new(1024).inflating(true);
            d.feed(&bytes);
            d.feed(&client_frame(true, 1, b"plain"));
            assert_eq!(
                all(&mut d),
                vec![
                    Ok(Incoming::Text(text.clone())),
                    Ok(Incoming::Text("plain".into()))
                ]
            );
            assert!(d.pending.is_none());
        }
        // Without the extension, RSV1 is a protocol error.
        let mut d = Decoder::new(1024);
        d.feed(&one);
        assert_eq!(all(&mut d)[0].as_ref().unwrap_err().close_code(), 1002);
        // The inflated size counts: 700 bytes of text over a 512-byte limit.
        let mut d = Decoder::new(512).inflating(true);
        d.feed(&one);
        assert_eq!(all(&mut d), vec![Err(WsError::TooLarge(512))]);
        // A bomb: 16 MiB of zeros in about 16 KiB, against 64 KiB.
        let bomb = deflated(&vec![0u8; 16 << 20]);
        assert!(bomb.len() < 64 << 10);
        let mut f = client_frame(true, 2, &bomb);
        f[0] |= 0x40;
        let mut d = Decoder::new(64 << 10).inflating(true);
        d.feed(&f);
        assert_eq!(d.next().unwrap().unwrap_err().close_code(), 1009);
        // RSV1 on a control frame or a continuation; RSV2; bad data.
        let mut ping = client_frame(true, 9, b"");
        ping[0] |= 0x40;
        let mut cont = client_frame(false, 1, &z[..3]);
        let mut rest = client_frame(true, 0, &z[3..]);
        rest[0] |= 0x40;
        cont.extend(rest);
        let mut rsv2 = client_frame(true, 1, b"x");
        rsv2[0] |= 0x20;
        let mut junk = client_frame(true, 1, &[0xff; 8]);
        junk[0] |= 0x40;
        for bytes in [ping, cont, rsv2, junk] {
            let mut d = Decoder::new(1024).inflating(true);
            d.feed(&bytes);
            let got = all(&mut d);
            assert_eq!(got.last().unwrap().as_ref().unwrap_err().close_code(), 1002);
        }
    }

    #[test]
    fn oversized_length_is_refused_from_the_header() {
        let mut d = Decoder::new(1024);
        // A 64-bit length of 2^40 without its payload: refused at once.
        let mut f = vec![0x81, 0xff];
        f.extend_from_slice(&(1u64 << 40).to_be_bytes());
        d.feed(&f);
        assert_eq!(d.next(), Some(Err(WsError::TooLarge(1024))));
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn never_panics(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..8)) {
                let mut d = Decoder::new(256).inflating(chunks.len() % 2 == 0);
                for c in &chunks {
                    d.feed(c);
                    while d.next().is_some() {}
                }
            }

            #[test]
            fn texts_roundtrip_in_any_split(texts in proptest::collection::vec(".{0,40}", 1..5), split in 1usize..50) {
                let mut bytes = Vec::new();
                for t in &texts {
                    bytes.extend(client_frame(true, 1, t.as_bytes()));
                }
                let mut d = Decoder::new(1 << 16);
                for c in bytes.chunks(split) {
                    d.feed(c);
                }
                let got: Vec<_> = std::iter::from_fn(|| d.next()).collect();
                let want: Vec<_> = texts.iter().map(|t| Ok(Incoming::Text(t.clone()))).collect();
                prop_assert_eq!(got, want);
            }
        }
    }
}
