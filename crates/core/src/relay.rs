//! A session socket for transports that carry messages rather than a byte
//! stream: HTTP fallbacks (pusher-js's `xhr_streaming` and `xhr_polling`),
//! where a client's messages arrive as separate HTTP requests and the
//! server's leave as the bodies of others.
//!
//! The session loop ([`crate::session::run`]) runs on anything that reads
//! and writes bytes, and speaks WebSocket frames on it. A [`Relay`] is such
//! a thing held in memory: the loop writes its finished server frames into
//! it, and the relay keeps their messages (texts, and the close code and
//! reason) in a bounded outbox that the transport takes from and puts in
//! its own framing; the transport hands it the client's messages, which the
//! loop reads as masked client frames. So an HTTP session is the same
//! session as a WebSocket one (its protocol handler, keep-alive, rate
//! limits, bounded queue, slow-client and shutdown closes) and no protocol
//! is written twice. What the relay costs over a socket (a frame header
//! parsed and the payload copied per message) is small beside an HTTP
//! request per message.
//!
//! Bounds: the outbox holds at most `out_limit` bytes (past that the
//! session's writes wait, and its queue and write timeout decide as for a
//! socket that is not read); the inbox at most `in_limit` bytes (past that
//! [`Relay::push_text`] refuses, and the transport answers the client so).

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A message from the session to its client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Out {
    Text(String),
    /// The session closed with this code and reason; nothing follows.
    Close(u16, String),
}

/// What [`Relay::poll_take`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Taken {
    /// Messages were moved into the caller's buffer (the last may be a
    /// [`Out::Close`]).
    Some,
    /// The session is over and everything it said was taken.
    Ended,
}

/// The inbox is full: the client sends faster than its session reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

#[derive(Default)]
struct State {
    out: VecDeque<Out>,
    out_bytes: usize,
    /// Bytes of a server frame not yet complete.
    partial: Vec<u8>,
    /// The session wrote its close frame: it reads nothing more.
    closed: bool,
    /// The session's end of the relay was dropped: the session is over.
    ended: bool,
    /// Masked client frames waiting to be read by the session.
    inbox: Vec<u8>,
    /// The client went away: the session reads the end of its stream.
    gone: bool,
    /// The transport waiting for messages.
    taker: Option<Waker>,
    /// The session waiting to read, or waiting for room to write.
    reader: Option<Waker>,
    writer: Option<Waker>,
}

/// The state shared by the session's end ([`RelaySocket`]) and the
/// transport's end (this).
pub struct Relay {
    state: Mutex<State>,
    out_limit: usize,
    in_limit: usize,
}

impl Relay {
    /// A relay and the socket end to run a session on.
    pub fn new(out_limit: usize, in_limit: usize) -> (Arc<Relay>, RelaySocket) {
        let relay = Arc::new(Relay {
            state: Mutex::new(State::default()),
            out_limit,
            in_limit,
        });
        (relay.clone(), RelaySocket(relay))
    }

    /// Hand the session a text message from the client.
    pub fn push_text(&self, text: &str) -> Result<(), Full> {
        self.push(0x1, text.as_bytes())
    }

    /// Client traffic without a message (a transport's heartbeat): the
    /// session reads a ping, which counts as the client being alive (and
    /// against its message rate) as a WebSocket ping does.
    pub fn push_ping(&self) -> Result<(), Full> {
        self.push(0x9, b"")
    }

    fn push(&self, op: u8, payload: &[u8]) -> Result<(), Full> {
        let mut s = self.state.lock();
        if s.gone || s.closed || s.ended {
            // Nobody will read it; not the client's fault.
            return Ok(());
        }
        if s.inbox.len() + payload.len() + 14 > self.in_limit {
            return Err(Full);
        }
        put_client_frame(&mut s.inbox, op, payload);
        if let Some(w) = s.reader.take() {
            w.wake();
        }
        Ok(())
    }

    /// The client is gone (its transport timed out): the session reads
    /// the end of its stream and ends as for a dropped socket.
    pub fn client_gone(&self) {
        let mut s = self.state.lock();
        s.gone = true;
        if let Some(w) = s.reader.take() {
            w.wake();
        }
        if let Some(w) = s.writer.take() {
            w.wake();
        }
    }

    /// Move every queued message into `into`; `Pending` (and a wake-up
    /// later) when there is none and the session goes on. One taker at a
    /// time: a second one's waker replaces the first's.
    pub fn poll_take(&self, cx: &mut Context<'_>, into: &mut Vec<Out>) -> Poll<Taken> {
        let mut s = self.state.lock();
        if !s.out.is_empty() {
            into.extend(s.out.drain(..));
            s.out_bytes = 0;
            if let Some(w) = s.writer.take() {
                w.wake();
            }
            return Poll::Ready(Taken::Some);
        }
        if s.ended || s.closed {
            return Poll::Ready(Taken::Ended);
        }
        s.taker = Some(cx.waker().clone());
        Poll::Pending
    }

    /// Take what is queued now, without waiting.
    pub fn take_now(&self, into: &mut Vec<Out>) -> Taken {
        let mut s = self.state.lock();
        if s.out.is_empty() && (s.ended || s.closed) {
            return Taken::Ended;
        }
        into.extend(s.out.drain(..));
        s.out_bytes = 0;
        if let Some(w) = s.writer.take() {
            w.wake();
        }
        Taken::Some
    }

    /// Whether the session is over (its close, if any, may still wait to
    /// be taken).
    pub fn ended(&self) -> bool {
        let s = self.state.lock();
        s.ended || s.closed
    }

    /// Whether the session is over and all it said was taken.
    pub fn finished(&self) -> bool {
        let s = self.state.lock();
        (s.ended || s.closed) && s.out.is_empty()
    }

    /// Bytes waiting in the outbox (for tests and the bench).
    pub fn queued_bytes(&self) -> usize {
        self.state.lock().out_bytes
    }

    /// Parse complete server frames out of `bytes` (appended to what a
    /// previous write left incomplete).
    fn written(&self, s: &mut State, bytes: &[u8]) {
        s.partial.extend_from_slice(bytes);
        let mut at = 0;
        while let Some((op, start, end)) = server_frame(&s.partial[at..]) {
            let payload = &s.partial[at + start..at + end];
            match op {
                0x1 => {
                    let text = String::from_utf8_lossy(payload).into_owned();
                    s.out_bytes += text.len();
                    s.out.push_back(Out::Text(text));
                }
                0x8 => {
                    let (code, reason) = if payload.len() >= 2 {
                        (
                            u16::from_be_bytes([payload[0], payload[1]]),
                            String::from_utf8_lossy(&payload[2..]).into_owned(),
                        )
                    } else {
                        (1000, String::new())
                    };
                    s.out.push_back(Out::Close(code, reason));
                    s.closed = true;
                }
                // Pongs answer the client's heartbeats: the transport's
                // own heartbeats already show the client we are alive.
                _ => {}
            }
            at += end;
        }
        s.partial.drain(..at);
        if s.closed {
            s.partial = Vec::new();
        }
        if let Some(w) = s.taker.take() {
            w.wake();
        }
    }
}

/// The opcode and the payload's bounds of the first whole server frame
/// (unmasked, final) in `b`, if it holds one.
fn server_frame(b: &[u8]) -> Option<(u8, usize, usize)> {
    if b.len() < 2 {
        return None;
    }
    let op = b[0] & 0x0f;
    let (len, at): (usize, usize) = match b[1] & 0x7f {
        126 => {
            if b.len() < 4 {
                return None;
            }
            (u16::from_be_bytes([b[2], b[3]]) as usize, 4)
        }
        127 => {
            if b.len() < 10 {
                return None;
            }
            let mut n = [0u8; 8];
            n.copy_from_slice(&b[2..10]);
            (u64::from_be_bytes(n) as usize, 10)
        }
        n => (n as usize, 2),
    };
    let end = at.checked_add(len)?;
    (b.len() >= end).then_some((op, at, end))
}

/// Append a final client frame (masked, as RFC 6455 requires of clients,
/// with a zero key: the relay is in memory and the decoder only checks the
/// bit). Other in-memory transports that feed a session loop use it too.
pub fn put_client_frame(buf: &mut Vec<u8>, op: u8, payload: &[u8]) {
    buf.push(0x80 | op);
    let len = payload.len();
    if len < 126 {
        buf.push(0x80 | len as u8);
    } else if len < 65536 {
        buf.push(0x80 | 126);
        buf.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        buf.push(0x80 | 127);
        buf.extend_from_slice(&(len as u64).to_be_bytes());
    }
    buf.extend_from_slice(&[0, 0, 0, 0]);
    buf.extend_from_slice(payload);
}

/// The session's end of a [`Relay`]: what the session loop reads from and
/// writes to. Dropping it (the session is over) tells the transport.
pub struct RelaySocket(Arc<Relay>);

impl Drop for RelaySocket {
    fn drop(&mut self) {
        let mut s = self.0.state.lock();
        s.ended = true;
        s.inbox = Vec::new();
        if let Some(w) = s.taker.take() {
            w.wake();
        }
    }
}

impl AsyncRead for RelaySocket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let mut s = self.0.state.lock();
        if !s.inbox.is_empty() && !s.closed {
            let n = s.inbox.len().min(buf.remaining());
            buf.put_slice(&s.inbox[..n]);
            s.inbox.drain(..n);
            if s.inbox.is_empty() {
                s.inbox = Vec::new();
            }
            return Poll::Ready(Ok(()));
        }
        // After its close the session waits for the client's: there is
        // none to come over HTTP, so the stream ends.
        if s.gone || s.closed {
            return Poll::Ready(Ok(()));
        }
        s.reader = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl AsyncWrite for RelaySocket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    /// Takes every slice whole, or none while the outbox is full.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let relay = &self.0;
        let mut s = relay.state.lock();
        if s.gone {
            return Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()));
        }
        if s.out_bytes >= relay.out_limit {
            s.writer = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let mut n = 0;
        for b in bufs {
            relay.written(&mut s, b);
            n += b.len();
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::Frame;
    use crate::ws::{Decoder, Incoming};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A frame's bytes as they go on the wire.
    fn wire(f: &Frame) -> Vec<u8> {
        f.parts().iter().flat_map(|b| b.iter().copied()).collect()
    }

    #[tokio::test]
    async fn frames_become_messages_and_back() {
        let (relay, mut socket) = Relay::new(1024, 1024);
        let frames = [Frame::text("hello"), Frame::text(&"x".repeat(300))];
        crate::session::write_frames(&mut socket, &frames)
            .await
            .unwrap();
        // A frame split across writes is kept until whole.
        let close = Frame::close(4009, "bye");
        let bytes = wire(&close);
        socket.write_all(&bytes[..3]).await.unwrap();
        let mut got = Vec::new();
        assert_eq!(relay.take_now(&mut got), Taken::Some);
        assert_eq!(got.len(), 2);
        socket.write_all(&bytes[3..]).await.unwrap();
        got.clear();
        relay.take_now(&mut got);
        assert_eq!(got, vec![Out::Close(4009, "bye".into())]);
        assert!(relay.finished());

        let (relay, mut socket) = Relay::new(1024, 64);
        relay.push_text("hi").unwrap();
        relay.push_ping().unwrap();
        assert_eq!(relay.push_text(&"y".repeat(60)), Err(Full));
        let mut buf = vec![0u8; 256];
        let n = socket.read(&mut buf).await.unwrap();
        let mut d = Decoder::new(1024);
        d.feed(&buf[..n]);
        assert_eq!(d.next(), Some(Ok(Incoming::Text("hi".into()))));
        assert_eq!(d.next(), Some(Ok(Incoming::Ping(Vec::new()))));
        relay.client_gone();
        assert_eq!(socket.read(&mut buf).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn a_full_outbox_holds_the_writer() {
        let (relay, mut socket) = Relay::new(10, 64);
        socket
            .write_all(&wire(&Frame::text("0123456789")))
            .await
            .unwrap();
        let more = wire(&Frame::text("a"));
        let blocked = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            socket.write_all(&more),
        )
        .await;
        assert!(blocked.is_err(), "a full outbox takes no more");
        let mut got = Vec::new();
        relay.take_now(&mut got);
        socket.write_all(&more).await.unwrap();
        drop(socket);
        got.clear();
        assert_eq!(relay.take_now(&mut got), Taken::Some);
        assert_eq!(relay.take_now(&mut got), Taken::Ended);
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Whatever the session writes, split however the writes
            /// fall, the transport takes the same messages in order.
            #[test]
            fn messages_survive_any_split(texts in proptest::collection::vec(".{0,300}", 1..6), split in 1usize..400) {
                let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
                rt.block_on(async {
                    let (relay, mut socket) = Relay::new(1 << 20, 64);
                    let mut bytes = Vec::new();
                    for t in &texts {
                        bytes.extend(wire(&Frame::text(t)));
                    }
                    bytes.extend(wire(&Frame::close(4200, "bye")));
                    for c in bytes.chunks(split) {
                        socket.write_all(c).await.unwrap();
                    }
                    let mut got = Vec::new();
                    relay.take_now(&mut got);
                    let mut want: Vec<Out> = texts.iter().map(|t| Out::Text(t.clone())).collect();
                    want.push(Out::Close(4200, "bye".into()));
                    assert_eq!(got, want);
                    assert!(relay.finished());
                });
            }
        }
    }
}
