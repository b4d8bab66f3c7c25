//! pusher-js's HTTP transports, `xhr_streaming` and `xhr_polling`: what a
//! client falls back to when WebSockets are blocked on its network.
//!
//! pusher-js speaks SockJS-style framing over POSTs under
//! `/pusher/app/{key}/{server}/{session}/` (`{server}/{session}` is the
//! client's random session id):
//!
//! ```text
//! xhr_streaming   a response held open: frames as they come, one a line
//! xhr             a poll: held until there is something, then answered
//! xhr_send        the client's messages, a JSON array of strings (`[]` is
//!                 a heartbeat)
//! frames          o              the session is open (its first answer)
//!                 a["m1","m2"]   Pusher messages, each a JSON string
//!                 h              heartbeat (the server is alive)
//!                 c[code,"why"]  the session closed with this Pusher code
//! ```
//!
//! The session behind them is the WebSocket's own (`crate::session`): it
//! runs on a [`Relay`] instead of a socket, so every Pusher feature, limit,
//! error and keep-alive is the same whichever transport carries it. This
//! module only maps requests to the relay: it opens a session on the first
//! receiving request, hands `xhr_send` bodies to it, and answers polls and
//! streams with what it said.
//!
//! Bounds: a session's outbox ([`OUTBOX`] bytes, then its queue as for any
//! connection), its inbox (twice the largest body), a body at most twice
//! the app's `max_frame_size` (JSON escaping), the session's message rate
//! as on a WebSocket, sessions per node (`http_max_sessions`), and a
//! session without a receiving request for `http_session_timeout_ms` is
//! closed. One node holds a session: a balancer must send every request of
//! a session (the `{server}/{session}` segments) to the same node.

use crate::config::HttpSettings;
use crate::session::{self as pusher_session, close_message, ConnectParams};
use crate::wire::{self, code, NAME as WIRE_NAME};
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use herald_core::node::Node;
use herald_core::relay::{Out, Relay, Taken};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::poll_fn;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Bytes of messages a session keeps for a client between its polls
/// (beyond them the session's own queue, bounded by the app's
/// `outbound_queue` and `outbound_bytes`, takes over).
pub const OUTBOX: usize = 64 * 1024;

/// Longest `{server}` or `{session}` path segment.
const MAX_SEGMENT: usize = 64;

/// pusher-js ends a stream and opens a new one on the same session once it
/// has read more than this many characters (UTF-16 code units, as
/// JavaScript counts) of it. What the server wrote past that point, before
/// the client let go, would be lost: a stream stops taking messages once
/// it has sent this much, and the new stream takes them.
const STREAM_LIMIT: usize = 256 * 1024;

/// What pusher-js polls or streams with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Streaming,
    Polling,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Streaming => "xhr_streaming",
            Transport::Polling => "xhr_polling",
        }
    }
}

/// The routes, when `http_fallback` is on.
pub fn router(node: &Arc<Node>, settings: HttpSettings) -> Router<Arc<Node>> {
    if !settings.http_fallback {
        return Router::new();
    }
    describe();
    let activity = node.config.activity_timeout().as_millis() as u64;
    let heartbeat = Duration::from_millis(settings.http_heartbeat_ms.min(activity / 2).max(100));
    let sessions = Arc::new(Sessions {
        node: node.clone(),
        timeout: Duration::from_millis(settings.http_session_timeout_ms),
        heartbeat,
        max: settings.http_max_sessions,
        map: Mutex::new(HashMap::new()),
        sweeper: std::sync::Once::new(),
    });
    let base = "/pusher/app/{key}/{server}/{session}";
    Router::new()
        .route(
            &format!("{base}/xhr_streaming"),
            post(streaming).options(preflight),
        )
        .route(&format!("{base}/xhr"), post(polling).options(preflight))
        .route(&format!("{base}/xhr_send"), post(send).options(preflight))
        .with_state(sessions)
}

/// This node's HTTP sessions.
struct Sessions {
    node: Arc<Node>,
    timeout: Duration,
    heartbeat: Duration,
    max: usize,
    /// By `{key}/{server}/{session}`.
    map: Mutex<HashMap<String, Arc<HttpSession>>>,
    sweeper: std::sync::Once,
}

/// One client's session: its relay and who receives from it.
struct HttpSession {
    relay: Arc<Relay>,
    transport: Transport,
    /// Largest `xhr_send` body.
    max_body: usize,
    receiver: Mutex<Receiving>,
    /// Woken when a newer receiving request takes over.
    superseded: Notify,
}

struct Receiving {
    /// The current receiving request's number.
    current: u64,
    attached: bool,
    /// Since when no request has been receiving.
    since: Instant,
}

impl HttpSession {
    /// A new receiving request takes over; the previous one ends.
    fn attach(&self) -> u64 {
        let mut r = self.receiver.lock();
        r.current += 1;
        r.attached = true;
        self.superseded.notify_waiters();
        r.current
    }

    fn detach(&self, number: u64) {
        let mut r = self.receiver.lock();
        if r.current == number {
            r.attached = false;
            r.since = Instant::now();
        }
    }

    fn current(&self, number: u64) -> bool {
        self.receiver.lock().current == number
    }

    /// Idle for longer than `timeout`: no receiving request since then.
    fn idle(&self, timeout: Duration) -> bool {
        let r = self.receiver.lock();
        !r.attached && r.since.elapsed() >= timeout
    }
}

/// Why a request about HTTP sessions was refused, for the metric.
fn refused(reason: &'static str) {
    metrics::counter!("herald_pusher_http_refused_total", "reason" => reason).increment(1);
}

fn describe() {
    metrics::describe_gauge!(
        "herald_pusher_http_sessions",
        "pusher-js HTTP sessions (xhr_streaming, xhr_polling) this node holds"
    );
    metrics::describe_counter!(
        "herald_pusher_http_sessions_opened_total",
        "pusher-js HTTP sessions opened, by transport"
    );
    metrics::describe_counter!(
        "herald_pusher_http_sessions_expired_total",
        "pusher-js HTTP sessions closed because no receiving request came for http_session_timeout_ms"
    );
    metrics::describe_counter!(
        "herald_pusher_http_refused_total",
        "pusher-js HTTP requests refused, by reason (session_limit, app, not_found, too_large, bad_body, flood, bad_session)"
    );
}

impl Sessions {
    fn get(&self, id: &str) -> Option<Arc<HttpSession>> {
        self.map.lock().get(id).cloned()
    }

    fn remove(&self, id: &str) {
        if let Some(s) = self.map.lock().remove(id) {
            metrics::gauge!("herald_pusher_http_sessions", "transport" => s.transport.name())
                .decrement(1.0);
        }
    }

    /// The session `id`, or a new one for the client's first receiving
    /// request (`Ok((session, true))`); or the answer refusing it.
    // The error is the HTTP answer itself, built once on a refusal.
    #[allow(clippy::result_large_err)]
    fn open(
        self: &Arc<Self>,
        id: &str,
        key: &str,
        params: &ConnectParams,
        transport: Transport,
        headers: &HeaderMap,
    ) -> Result<(Arc<HttpSession>, bool), Response> {
        let mut map = self.map.lock();
        if let Some(s) = map.get(id) {
            return Ok((s.clone(), false));
        }
        if self.node.is_draining() {
            return Err(text(StatusCode::SERVICE_UNAVAILABLE, "Server is draining"));
        }
        if map.len() >= self.max {
            refused("session_limit");
            return Err(text(
                StatusCode::SERVICE_UNAVAILABLE,
                "Too many HTTP sessions on this node (http_max_sessions); retry later",
            ));
        }
        // A page the app does not list: refused as on the WebSocket
        // (4009), before anything is counted.
        let foreign = self.node.hub_by_key(key).is_some_and(|h| {
            !herald_core::origin::check(headers, &h.config().origins, &h.app.id, WIRE_NAME)
        });
        let admitted = match foreign {
            true => Err((code::UNAUTHORIZED, herald_core::origin::REFUSED_MESSAGE)),
            false => {
                pusher_session::admit(&self.node, key, params).map_err(|c| (c, close_message(c)))
            }
        };
        let hub = match admitted {
            Ok(hub) => hub,
            Err((code, message)) => {
                refused("app");
                // Opened, then told why and closed: pusher-js acts on the
                // code (an HTTP error would only make it retry).
                let mut body = String::from("o\n");
                encode(
                    &[
                        Out::Text(wire::error(Some(code), message)),
                        Out::Close(code, message.to_owned()),
                    ],
                    &mut body,
                );
                return Err(frames(body.into()));
            }
        };
        let max_body = hub
            .config()
            .max_frame_size
            .saturating_mul(2)
            .saturating_add(1024);
        let (relay, socket) = Relay::new(OUTBOX, max_body.saturating_mul(2));
        let session = Arc::new(HttpSession {
            relay,
            transport,
            max_body,
            receiver: Mutex::new(Receiving {
                current: 0,
                attached: false,
                since: Instant::now(),
            }),
            superseded: Notify::new(),
        });
        tokio::spawn(pusher_session::run(self.node.clone(), hub, socket));
        map.insert(id.to_owned(), session.clone());
        drop(map);
        metrics::gauge!("herald_pusher_http_sessions", "transport" => transport.name())
            .increment(1.0);
        metrics::counter!("herald_pusher_http_sessions_opened_total", "transport" => transport.name())
            .increment(1);
        let weak = Arc::downgrade(self);
        self.sweeper.call_once(|| {
            tokio::spawn(sweep(weak));
        });
        Ok((session, true))
    }
}

/// Close sessions no request has received from for the timeout, and
/// forget those that are over and said all.
async fn sweep(sessions: Weak<Sessions>) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(sessions) = sessions.upgrade() else {
            return;
        };
        let mut gone = Vec::new();
        {
            let map = sessions.map.lock();
            for (id, s) in map.iter() {
                if s.idle(sessions.timeout) {
                    if !s.relay.ended() {
                        metrics::counter!("herald_pusher_http_sessions_expired_total").increment(1);
                        s.relay.client_gone();
                    }
                    gone.push(id.clone());
                } else if s.relay.finished() && !s.receiver.lock().attached {
                    gone.push(id.clone());
                }
            }
        }
        for id in gone {
            sessions.remove(&id);
        }
    }
}

/// The id of a session from its path, if its segments are well formed.
fn session_id(key: &str, server: &str, session: &str) -> Option<String> {
    let ok = |s: &str| {
        !s.is_empty()
            && s.len() <= MAX_SEGMENT
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    (ok(server) && ok(session) && key.len() <= 256).then(|| format!("{key}/{server}/{session}"))
}

fn bad_session() -> Response {
    refused("bad_session");
    text(
        StatusCode::BAD_REQUEST,
        "Invalid session path: /pusher/app/{key}/{server}/{session}/..., segments of letters, digits, - and _ (at most 64)",
    )
}

/// `POST .../xhr_streaming`.
async fn streaming(
    State(sessions): State<Arc<Sessions>>,
    Path((key, server, session)): Path<(String, String, String)>,
    Query(params): Query<ConnectParams>,
    headers: HeaderMap,
) -> Response {
    let at = (key, server, session);
    receive(sessions, at, params, Transport::Streaming, &headers)
}

/// `POST .../xhr`.
async fn polling(
    State(sessions): State<Arc<Sessions>>,
    Path((key, server, session)): Path<(String, String, String)>,
    Query(params): Query<ConnectParams>,
    headers: HeaderMap,
) -> Response {
    let at = (key, server, session);
    receive(sessions, at, params, Transport::Polling, &headers)
}

/// A receiving request: opens the session if it is new; then a poll is
/// answered with what the session has (waiting for it, up to a
/// heartbeat), a stream with everything it says until it closes or a newer
/// receiving request takes over.
fn receive(
    sessions: Arc<Sessions>,
    (key, server, session): (String, String, String),
    params: ConnectParams,
    transport: Transport,
    headers: &HeaderMap,
) -> Response {
    let Some(id) = session_id(&key, &server, &session) else {
        return bad_session();
    };
    let (s, new) = match sessions.open(&id, &key, &params, transport, headers) {
        Ok(v) => v,
        Err(r) => return r,
    };
    if new && transport == Transport::Polling {
        // The first poll only learns that the session is open.
        return frames(Bytes::from_static(b"o\n"));
    }
    let number = s.attach();
    let r = Receiver {
        heartbeat: sessions.heartbeat,
        sessions,
        id,
        session: s,
        number,
        streaming: transport == Transport::Streaming,
        first: new.then_some(Bytes::from_static(b"o\n")),
        done: false,
        sent: 0,
    };
    let body = futures_util::stream::unfold(r, |mut r| async move {
        let chunk = r.next().await?;
        Some((Ok::<_, std::convert::Infallible>(chunk), r))
    });
    frames_body(Body::from_stream(body))
}

/// One receiving request's side of a session.
struct Receiver {
    sessions: Arc<Sessions>,
    id: String,
    session: Arc<HttpSession>,
    number: u64,
    streaming: bool,
    heartbeat: Duration,
    first: Option<Bytes>,
    done: bool,
    /// Characters of this response so far, as pusher-js counts them.
    sent: usize,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.session.detach(self.number);
    }
}

impl Receiver {
    /// The next chunk of the response, or its end.
    async fn next(&mut self) -> Option<Bytes> {
        let chunk = self.chunk().await?;
        self.sent += utf16_len(&chunk);
        Some(chunk)
    }

    async fn chunk(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        if let Some(first) = self.first.take() {
            return Some(first);
        }
        let session = self.session.clone();
        let superseded = session.superseded.notified();
        tokio::pin!(superseded);
        superseded.as_mut().enable();
        if !session.current(self.number) {
            return None;
        }
        if self.streaming && self.sent > STREAM_LIMIT {
            // pusher-js has read it all and opens its next stream now;
            // a client that does not is let go after a heartbeat's wait.
            tokio::select! {
                _ = &mut superseded => {}
                _ = tokio::time::sleep(self.heartbeat) => {}
            }
            return None;
        }
        let mut out = Vec::new();
        let relay = &session.relay;
        let taken = tokio::select! {
            // A newer request first: what this one took would go to a
            // client that stopped listening to it.
            biased;
            _ = &mut superseded => return None,
            t = poll_fn(|cx| relay.poll_take(cx, &mut out)) => t,
            _ = tokio::time::sleep(self.heartbeat) => {
                self.done = !self.streaming;
                return Some(Bytes::from_static(b"h\n"));
            }
        };
        let mut body = String::new();
        match taken {
            Taken::Some => encode(&out, &mut body),
            // Over without a close of its own (its client was given up):
            // pusher-js reconnects on this code.
            Taken::Ended => encode(
                &[Out::Close(
                    wire::code::RECONNECT,
                    "Session ended; reconnect".into(),
                )],
                &mut body,
            ),
        }
        if taken == Taken::Ended || matches!(out.last(), Some(Out::Close(..))) {
            self.done = true;
            self.sessions.remove(&self.id);
        } else {
            self.done = !self.streaming;
        }
        Some(body.into())
    }
}

/// The length of `text` as JavaScript counts it (UTF-16 code units).
fn utf16_len(text: &[u8]) -> usize {
    // UTF-8 lead bytes: one unit per character, two for four-byte ones.
    text.iter()
        .map(|&b| match b {
            0x80..=0xBF => 0,
            0xF0..=0xFF => 2,
            _ => 1,
        })
        .sum()
}

/// Append the frames of `out` to `body`: runs of messages as one `a`
/// frame, a close as a `c` frame.
fn encode(out: &[Out], body: &mut String) {
    let mut open = false;
    for o in out {
        match o {
            Out::Text(t) => {
                body.push_str(if open { "," } else { "a[" });
                open = true;
                body.push_str(&serde_json::to_string(t).unwrap_or_default());
            }
            Out::Close(code, reason) => {
                if open {
                    body.push_str("]\n");
                    open = false;
                }
                body.push_str(&format!(
                    "c[{code},{}]\n",
                    serde_json::to_string(reason).unwrap_or_default()
                ));
            }
        }
    }
    if open {
        body.push_str("]\n");
    }
}

/// `POST .../xhr_send`: the client's messages, a JSON array of strings.
async fn send(
    State(sessions): State<Arc<Sessions>>,
    Path((key, server, session)): Path<(String, String, String)>,
    req: Request,
) -> Response {
    let Some(id) = session_id(&key, &server, &session) else {
        return bad_session();
    };
    let Some(s) = sessions.get(&id) else {
        refused("not_found");
        return text(StatusCode::NOT_FOUND, "Session not found");
    };
    let body = match axum::body::to_bytes(req.into_body(), s.max_body).await {
        Ok(b) => b,
        Err(_) => {
            refused("too_large");
            return text(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!(
                    "Body larger than {} bytes (twice the app's max_frame_size)",
                    s.max_body
                ),
            );
        }
    };
    let messages: Vec<String> = match serde_json::from_slice(&body) {
        Ok(m) => m,
        Err(_) => {
            refused("bad_body");
            return text(
                StatusCode::BAD_REQUEST,
                "Body must be a JSON array of strings (Pusher messages)",
            );
        }
    };
    let pushed = if messages.is_empty() {
        s.relay.push_ping()
    } else {
        messages.iter().try_for_each(|m| s.relay.push_text(m))
    };
    if pushed.is_err() {
        refused("flood");
        return text(
            StatusCode::TOO_MANY_REQUESTS,
            "Session is not keeping up with its client's messages; slow down",
        );
    }
    let mut res = StatusCode::NO_CONTENT.into_response();
    cors(&mut res);
    res
}

/// The CORS preflight of a browser's cross-origin POST.
async fn preflight() -> Response {
    let mut res = StatusCode::NO_CONTENT.into_response();
    cors(&mut res);
    let h = res.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("POST, OPTIONS"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("Content-Type"),
    );
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("86400"),
    );
    res
}

/// pusher-js sends no credentials: any page may read the answers (the
/// session id, which only its client knows, is what it is keyed by).
fn cors(res: &mut Response) {
    res.headers_mut().insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
}

fn frames(body: Bytes) -> Response {
    frames_body(Body::from(body))
}

fn frames_body(body: Body) -> Response {
    let mut res = Response::new(body);
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/javascript; charset=UTF-8"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-store, no-cache, must-revalidate, max-age=0"),
    );
    cors(&mut res);
    res
}

fn text(status: StatusCode, message: &str) -> Response {
    let mut res = (status, message.to_owned()).into_response();
    cors(&mut res);
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_as_pusher_js_reads_them() {
        let mut body = String::new();
        encode(
            &[
                Out::Text(r#"{"event":"a","data":"x\"y"}"#.into()),
                Out::Text("{}".into()),
                Out::Close(4009, "Connection unauthorized".into()),
            ],
            &mut body,
        );
        assert_eq!(
            body,
            "a[\"{\\\"event\\\":\\\"a\\\",\\\"data\\\":\\\"x\\\\\\\"y\\\"}\",\"{}\"]\nc[4009,\"Connection unauthorized\"]\n"
        );
    }

    #[test]
    fn lengths_as_javascript_counts_them() {
        assert_eq!(utf16_len("a\u{e9}\u{2713}\u{1F600}".as_bytes()), 5);
        assert_eq!(utf16_len(b"o\n"), 2);
    }

    #[test]
    fn session_paths() {
        assert_eq!(
            session_id("k", "123", "ab_c-9").as_deref(),
            Some("k/123/ab_c-9")
        );
        assert!(session_id("k", "", "a").is_none());
        assert!(session_id("k", "1", "a.b").is_none());
        assert!(session_id("k", "1", &"a".repeat(65)).is_none());
    }
}
