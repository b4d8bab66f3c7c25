//! One benchmark client: a Pusher WebSocket connection (connect from a
//! chosen source address, subscribe with locally signed auth, read frames)
//! and an HTTP API publisher. Frames on the hot path are scanned for the
//! few fields the bench needs instead of being parsed into JSON values.

use super::ledger::MsgId;
use super::Target;
use futures_util::{SinkExt, StreamExt};
use herald_signing as signing;
use serde_json::Value;
use std::fmt;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::time::Duration;
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Error as WsError, Message, Utf8Bytes};
use tokio_tungstenite::WebSocketStream;

/// Why a client failed. [`ClientError::kind`] is the short label errors are
/// counted under; [`ClientError::explain`] is the sentence shown to people.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientError {
    /// The TCP connection failed (nothing listening, or refused).
    Connect(String),
    /// A step did not finish in time.
    Timeout(&'static str),
    /// The HTTP upgrade was answered with something other than 101.
    Handshake(String),
    /// The server answered, but not with `pusher:connection_established`.
    NotPusher(String),
    /// A `pusher:error` with a code (4001 unknown key, 4004 quota, ...).
    Rejected { code: Option<u16>, message: String },
    /// `pusher:subscription_error`.
    Subscription {
        status: Option<u16>,
        message: String,
    },
    /// The server closed the connection.
    Closed(String),
    /// Any other I/O or WebSocket error.
    Io(String),
    /// An HTTP API call failed.
    Http {
        status: Option<u16>,
        message: String,
    },
}

impl ClientError {
    pub fn kind(&self) -> &'static str {
        match self {
            ClientError::Connect(_) => "connect",
            ClientError::Timeout(_) => "timeout",
            ClientError::Handshake(_) => "handshake",
            ClientError::NotPusher(_) => "not_pusher",
            ClientError::Rejected { .. } => "rejected",
            ClientError::Subscription { .. } => "subscription",
            ClientError::Closed(_) => "closed",
            ClientError::Io(_) => "io",
            ClientError::Http { .. } => "http",
        }
    }

    /// A sentence that says what is probably wrong and which flag to check.
    pub fn explain(&self, t: &Target) -> String {
        match self {
            ClientError::Connect(e) if e.contains("os error 24") => format!(
                "the bench ran out of file descriptors ({e}); raise its open-file limit (ulimit -n)"
            ),
            ClientError::Connect(e) if e.contains("os error 99") => format!(
                "no free local port/address to connect from ({e})"
            ),
            ClientError::Connect(e) => format!(
                "cannot connect to {} ({e}): is the server running there? check --url",
                t.url
            ),
            ClientError::Timeout(step) => format!(
                "{}: no answer while {step} (server overloaded or out of file descriptors, \
                 or not a Pusher server at this --url)",
                t.url
            ),
            ClientError::Handshake(e) => format!(
                "{} did not accept a WebSocket at /app/{}: {e}; it does not look like a Pusher \
                 server (check --url, and --key)",
                t.url, t.key
            ),
            ClientError::NotPusher(e) => format!(
                "{} accepted the WebSocket but does not speak the Pusher protocol: {e}",
                t.url
            ),
            ClientError::Rejected {
                code: Some(4001),
                message,
            } => format!(
                "the server does not know app key {:?} ({message}, code 4001): check --key",
                t.key
            ),
            ClientError::Rejected { code, message } => format!(
                "the server refused the connection: {message} (code {})",
                code.map_or("none".to_string(), |c| c.to_string())
            ),
            ClientError::Subscription {
                status: Some(401),
                message,
            } => format!(
                "the server rejected the locally signed channel auth ({message}): check --secret \
                 (and --key)"
            ),
            ClientError::Subscription { status, message } => format!(
                "subscription refused: {message} (status {})",
                status.map_or("none".to_string(), |c| c.to_string())
            ),
            ClientError::Closed(e) => format!("the server closed the connection: {e}"),
            ClientError::Io(e) => format!("connection error: {e}"),
            ClientError::Http {
                status: Some(401),
                message,
            } => format!(
                "the HTTP API rejected the request signature ({message}): check --key and --secret"
            ),
            ClientError::Http {
                status: Some(404),
                message,
            } => format!(
                "the HTTP API answered 404 ({message}): check --app-id (and that {} serves the Pusher HTTP API)",
                t.url
            ),
            ClientError::Http { status, message } => format!(
                "HTTP API publish failed: {message}{}",
                status.map_or(String::new(), |s| format!(" (HTTP {s})"))
            ),
        }
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

/// The few fields of a server frame the bench looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scan<'a> {
    pub event: &'a str,
    pub channel: Option<&'a str>,
    /// The sender's `bench_t` (microseconds on the bench clock), if any.
    pub stamp: Option<u64>,
    /// The message's id (`bench_s`, `bench_q`), if any.
    pub id: Option<MsgId>,
}

/// The string value of the first `"name": "..."` in `text`. Pusher
/// envelopes put `event` and `channel` before `data`, and inside a `data`
/// string the quotes are escaped, so the first match is the envelope's.
pub(crate) fn string_field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let mut from = 0;
    while let Some(i) = text[from..].find(name) {
        let start = from + i;
        from = start + name.len();
        let before = text.as_bytes()[..start].last();
        let after = text[from..].trim_start();
        if before != Some(&b'"') || !after.starts_with('"') {
            continue;
        }
        let after = after[1..].trim_start();
        let Some(after) = after.strip_prefix(':') else {
            continue;
        };
        let after = after.trim_start();
        let value = after.strip_prefix('"')?;
        return value.find('"').map(|end| &value[..end]);
    }
    None
}

/// The data of every message the bench sends: its send time and its id.
/// `bench_t` is microseconds on the bench clock, `bench_s` the sender and
/// `bench_q` the sender's sequence number ([`MsgId`]).
pub fn bench_data(stamp: u64, id: MsgId) -> String {
    format!(
        "{{\"bench_t\":{stamp},\"bench_s\":{},\"bench_q\":{}}}",
        id.sender, id.seq
    )
}

/// [`bench_data`] padded to about `bytes` bytes (0: not padded) with an
/// order and its line items, the kind of JSON an app sends: repeated keys,
/// numbers and words that vary from message to message, so compression
/// sees what it would in production rather than a repeated string.
pub fn padded_data(stamp: u64, id: MsgId, bytes: usize) -> String {
    let ids = bench_data(stamp, id);
    if bytes <= ids.len() {
        return ids;
    }
    const STATUS: [&str; 4] = ["pending", "paid", "shipped", "delivered"];
    const NAMES: [&str; 6] = [
        "Espresso beans 1 kg",
        "Ceramic mug",
        "Milk frother",
        "Paper filters (100)",
        "Grinder burr set",
        "Travel tumbler",
    ];
    let seed = id.seq.wrapping_mul(2_654_435_761).wrapping_add(id.sender);
    let mut s = format!(
        "{{\"type\":\"order.updated\",\"order\":{{\"id\":\"ord_{:08x}\",\"customer_id\":{},\"status\":\"{}\",\"currency\":\"EUR\",\"updated_at\":\"2026-11-28T17:{:02}:{:02}Z\"}},\"items\":[",
        seed & 0xffff_ffff,
        10_000 + seed % 90_000,
        STATUS[(seed % 4) as usize],
        seed % 60,
        (seed / 60) % 60
    );
    let mut i = 0u64;
    while s.len() + ids.len() + 120 < bytes {
        let r = seed.wrapping_add(i.wrapping_mul(40_503));
        if i > 0 {
            s.push(',');
        }
        s.push_str(&format!(
            "{{\"sku\":\"SKU-{:05}\",\"name\":\"{}\",\"quantity\":{},\"unit_price\":{}.{:02},\"in_stock\":{}}}",
            r % 100_000,
            NAMES[(r % 6) as usize],
            1 + r % 5,
            3 + r % 60,
            r % 100,
            !r.is_multiple_of(3)
        ));
        i += 1;
    }
    s.push_str("],");
    // The ids last, where `bench_fields` looks first.
    s.push_str(&ids[1..]);
    s
}

/// The numbers after `bench_t`, `bench_s` and `bench_q`, whether `data` is
/// an object (client events) or a JSON-encoded string (HTTP API events,
/// quotes escaped), in any order. One backward byte loop from the end,
/// where `data` usually is: `str::find` sets up a substring searcher per
/// call, which showed in profiles.
pub(crate) fn bench_fields(text: &str) -> (Option<u64>, Option<MsgId>) {
    const NEEDLE: &[u8] = b"bench_";
    let b = text.as_bytes();
    if b.len() <= NEEDLE.len() {
        return (None, None);
    }
    let (mut t, mut s, mut q) = (None, None, None);
    let mut i = b.len() - NEEDLE.len() - 1;
    loop {
        if b[i] == b'b' && b[i..].starts_with(NEEDLE) {
            let field = match b.get(i + NEEDLE.len()) {
                Some(b't') => Some(&mut t),
                Some(b's') => Some(&mut s),
                Some(b'q') => Some(&mut q),
                _ => None,
            };
            // Only after one of our field letters (ASCII): slicing after
            // any other byte could cut a character in two.
            if let Some(field @ None) = field {
                *field = number_after(&b[i + NEEDLE.len() + 1..]);
            }
            if t.is_some() && s.is_some() && q.is_some() {
                break;
            }
        }
        if i == 0 {
            break;
        }
        i -= 1;
    }
    let id = match (s, q) {
        (Some(sender), Some(seq)) => Some(MsgId { sender, seq }),
        _ => None,
    };
    (t, id)
}

/// Only the frame's `event`, without looking for the bench's fields: what
/// [`Conn::recv`] needs to answer pings. Scanning every frame twice (once
/// here, once by the scenario) showed in the generator's profile.
pub fn event_of(text: &str) -> &str {
    if let Some(rest) = text.strip_prefix("{\"event\":\"") {
        if let Some(end) = rest.find('"') {
            return &rest[..end];
        }
    }
    string_field(text, "event").unwrap_or("")
}

/// The decimal number after a field name's closing quote and colon (with
/// any escaping backslashes, quotes and spaces between); `None` when there
/// are no digits or the number does not fit in a u64. Bytes, not `str`
/// methods: this runs for every frame the generator receives.
fn number_after(b: &[u8]) -> Option<u64> {
    let start = b
        .iter()
        .position(|c| !matches!(c, b'\\' | b'"' | b':' | b' '))?;
    let mut value: u64 = 0;
    let mut digits = 0;
    for &c in &b[start..] {
        if !c.is_ascii_digit() {
            break;
        }
        value = value.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
        digits += 1;
    }
    (digits > 0).then_some(value)
}

pub fn scan(text: &str) -> Scan<'_> {
    // Fast path for the common compact envelope `{"event":"…","channel":"…"`.
    if let Some(rest) = text.strip_prefix("{\"event\":\"") {
        if let Some(end) = rest.find('"') {
            let event = &rest[..end];
            let channel = rest[end..]
                .strip_prefix("\",\"channel\":\"")
                .and_then(|c| c.find('"').map(|e| &c[..e]));
            if let Some(channel) = channel {
                let (stamp, id) = bench_fields(text);
                return Scan {
                    event,
                    channel: Some(channel),
                    stamp,
                    id,
                };
            }
        }
    }
    let (stamp, id) = bench_fields(text);
    Scan {
        event: string_field(text, "event").unwrap_or(""),
        channel: string_field(text, "channel"),
        stamp,
        id,
    }
}

/// The `data` of a server frame as a JSON value, whether the server sent it
/// as an object or as a JSON-encoded string. Only for the cold path.
pub fn data_value(text: &str) -> Value {
    let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    match v.get("data") {
        Some(Value::String(s)) => serde_json::from_str(s).unwrap_or(Value::String(s.clone())),
        Some(other) => other.clone(),
        None => Value::Null,
    }
}

fn error_of(text: &str) -> ClientError {
    let d = data_value(text);
    let message = d
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("(no message)")
        .to_string();
    let code = d.get("code").and_then(Value::as_u64).map(|c| c as u16);
    ClientError::Rejected { code, message }
}

fn subscription_error_of(text: &str) -> ClientError {
    let d = data_value(text);
    let message = d
        .get("error")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| d.to_string());
    let status = d.get("status").and_then(Value::as_u64).map(|s| s as u16);
    ClientError::Subscription { status, message }
}

pub(crate) fn ws_error(e: WsError) -> ClientError {
    match e {
        WsError::Http(resp) => ClientError::Handshake(format!("HTTP {}", resp.status())),
        WsError::Io(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            ClientError::Connect(e.to_string())
        }
        WsError::ConnectionClosed | WsError::AlreadyClosed => {
            ClientError::Closed("connection closed".into())
        }
        other => ClientError::Io(other.to_string()),
    }
}

/// Small buffers: tungstenite's defaults (128 KiB read buffer) would cost
/// gigabytes at tens of thousands of connections. tungstenite also
/// zero-fills the free part of the read buffer before every read, including
/// the read that finds the socket empty, so a 4 KiB buffer cost two 4 KiB
/// `memset`s per ~130-byte frame (2.7 % of the generator at the broadcast
/// peak). Longer frames still work: the buffer grows to a frame's length.
pub(crate) fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(1024)
        .write_buffer_size(0)
        .max_message_size(Some(1024 * 1024))
        .max_frame_size(Some(1024 * 1024))
}

/// Open a TCP connection and upgrade it to a WebSocket at `url`, asking
/// for `subprotocol` when given, all within `timeout`.
pub(crate) async fn ws_open(
    target: &Target,
    source: Option<IpAddr>,
    url: String,
    subprotocol: Option<&str>,
    timeout: Duration,
) -> Result<WebSocketStream<super::wire::Socket>, ClientError> {
    let open = async {
        let stream = tcp_connect(target, source)
            .await
            .map_err(|e| ClientError::Connect(e.to_string()))?;
        let mut req = url
            .into_client_request()
            .map_err(|e| ClientError::Handshake(e.to_string()))?;
        if let Some(p) = subprotocol {
            req.headers_mut().insert(
                "sec-websocket-protocol",
                HeaderValue::from_str(p).map_err(|e| ClientError::Handshake(e.to_string()))?,
            );
        }
        if super::wire::deflate_offered() {
            req.headers_mut().insert(
                "sec-websocket-extensions",
                HeaderValue::from_static(super::wire::OFFER),
            );
        }
        let stream = super::wire::Socket::new(stream);
        let (ws, _) = tokio_tungstenite::client_async_with_config(req, stream, Some(ws_config()))
            .await
            .map_err(|e| match ws_error(e) {
                // Anything else going wrong in the upgrade means the peer
                // is not a WebSocket server at this path.
                ClientError::Io(m) => ClientError::Handshake(m),
                other => other,
            })?;
        Ok::<_, ClientError>(ws)
    };
    tokio::time::timeout(timeout, open)
        .await
        .map_err(|_| ClientError::Timeout("connecting"))?
}

/// An HTTP request that got no answer: `waiting` names what for.
pub(crate) fn http_error(e: reqwest::Error, waiting: &'static str) -> ClientError {
    if e.is_connect() {
        ClientError::Connect(e.to_string())
    } else if e.is_timeout() {
        ClientError::Timeout(waiting)
    } else {
        ClientError::Http {
            status: None,
            message: e.to_string(),
        }
    }
}

/// Open a TCP connection from `source` (port chosen at connect time, so
/// each source address has its own ~28k ports) to the target.
pub(crate) async fn tcp_connect(
    target: &Target,
    source: Option<IpAddr>,
) -> std::io::Result<TcpStream> {
    let socket = if target.addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(ip) = source {
        let one: libc::c_int = 1;
        // SAFETY: a valid fd and a pointer to a c_int of the given size.
        // IP_BIND_ADDRESS_NO_PORT defers the port choice to connect(), so
        // ports are shared across destinations; failure is harmless.
        unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::IPPROTO_IP,
                libc::IP_BIND_ADDRESS_NO_PORT,
                &one as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        socket.bind((ip, 0).into())?;
    }
    let stream = socket.connect(target.addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// One connected Pusher client.
pub struct Conn {
    pub ws: WebSocketStream<super::wire::Socket>,
    pub socket_id: String,
}

impl Conn {
    /// Connect and wait for `pusher:connection_established`.
    pub async fn open(
        target: &Target,
        source: Option<IpAddr>,
        timeout: Duration,
    ) -> Result<Conn, ClientError> {
        let mut ws = ws_open(target, source, target.ws_url(), None, timeout).await?;
        let first = tokio::time::timeout(timeout, next_text(&mut ws))
            .await
            .map_err(|_| ClientError::Timeout("waiting for pusher:connection_established"))?
            .map_err(|e| match e {
                ClientError::Closed(why) => ClientError::NotPusher(format!(
                    "closed before pusher:connection_established ({why})"
                )),
                other => other,
            })?;
        let s = scan(&first);
        match s.event {
            "pusher:connection_established" => {
                let socket_id = data_value(&first)
                    .get("socket_id")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .ok_or_else(|| {
                        ClientError::NotPusher("connection_established without socket_id".into())
                    })?;
                Ok(Conn { ws, socket_id })
            }
            "pusher:error" => Err(error_of(&first)),
            _ => {
                let shown: String = first.chars().take(120).collect();
                Err(ClientError::NotPusher(format!(
                    "first frame was {shown:?}, expected pusher:connection_established"
                )))
            }
        }
    }

    /// Subscribe to `channels` (signing `private-` ones with the app secret)
    /// and wait until every one is confirmed.
    pub async fn subscribe(
        &mut self,
        target: &Target,
        channels: &[&str],
        timeout: Duration,
    ) -> Result<(), ClientError> {
        for channel in channels {
            let frame = if channel.starts_with("private-") {
                let auth = signing::token(
                    &target.key,
                    &target.secret,
                    &signing::channel_string(&self.socket_id, channel, None),
                );
                serde_json::json!({"event":"pusher:subscribe","data":{"channel":channel,"auth":auth}})
            } else {
                serde_json::json!({"event":"pusher:subscribe","data":{"channel":channel}})
            };
            self.send(frame.to_string()).await?;
        }
        let mut pending = channels.len();
        let wait = async {
            while pending > 0 {
                let text = self.recv().await?;
                let s = scan(&text);
                match s.event {
                    "pusher_internal:subscription_succeeded" => pending -= 1,
                    "pusher:subscription_error" => return Err(subscription_error_of(&text)),
                    "pusher:error" => return Err(error_of(&text)),
                    _ => {}
                }
            }
            Ok(())
        };
        tokio::time::timeout(timeout, wait)
            .await
            .map_err(|_| ClientError::Timeout("waiting for subscription_succeeded"))?
    }

    pub async fn send(&mut self, text: String) -> Result<(), ClientError> {
        self.ws.send(Message::text(text)).await.map_err(ws_error)
    }

    /// The next text frame, answering `pusher:ping` on the way.
    pub async fn recv(&mut self) -> Result<Utf8Bytes, ClientError> {
        loop {
            let text = next_text(&mut self.ws).await?;
            if event_of(&text) == "pusher:ping" {
                self.send(r#"{"event":"pusher:pong","data":{}}"#.into())
                    .await?;
                continue;
            }
            return Ok(text);
        }
    }

    /// Close politely, waiting briefly for the server's close.
    pub async fn close(mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            if self.ws.close(None).await.is_ok() {
                while let Some(Ok(_)) = self.ws.next().await {}
            }
        })
        .await;
    }
}

/// The next text frame; pings, pongs and binary frames are skipped (the
/// library answers WebSocket pings itself).
pub(crate) async fn next_text(
    ws: &mut WebSocketStream<super::wire::Socket>,
) -> Result<Utf8Bytes, ClientError> {
    loop {
        match ws.next().await {
            Some(Ok(Message::Text(t))) => return Ok(t),
            Some(Ok(Message::Close(frame))) => {
                let why = frame.map_or("no close frame".to_string(), |f| {
                    format!("code {} {}", u16::from(f.code), f.reason)
                });
                return Err(ClientError::Closed(why));
            }
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err(ws_error(e)),
            None => return Err(ClientError::Closed("connection reset".into())),
        }
    }
}

/// Publishes through the Pusher HTTP API with signed requests.
#[derive(Clone)]
pub struct HttpPublisher {
    client: reqwest::Client,
    base: String,
    path: String,
    key: String,
    secret: String,
}

/// The HTTP client publishers use: 10 s per request, up to 64 idle
/// connections kept.
pub(crate) fn publish_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(64)
        .build()
        .expect("an HTTP client with default settings builds")
}

impl HttpPublisher {
    pub fn new(target: &Target) -> HttpPublisher {
        HttpPublisher {
            client: publish_client(),
            base: target.http_base(),
            path: format!("/apps/{}/events", target.app_id),
            key: target.key.clone(),
            secret: target.secret.clone(),
        }
    }

    /// `POST /apps/{id}/events` with `data` as the event's data string.
    pub async fn publish(
        &self,
        channel: &str,
        event: &str,
        data: &str,
        exclude_socket: Option<&str>,
    ) -> Result<(), ClientError> {
        let mut body = serde_json::json!({"name": event, "channel": channel, "data": data});
        if let Some(s) = exclude_socket {
            body["socket_id"] = Value::String(s.to_string());
        }
        let body = body.to_string();
        let query = signing::sign_query(
            &self.key,
            &self.secret,
            "POST",
            &self.path,
            body.as_bytes(),
            &[],
        );
        let url = format!("{}{}?{query}", self.base, self.path);
        let resp = self
            .client
            .post(url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| http_error(e, "waiting for the HTTP API"))?;
        let status = resp.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(());
        }
        let text = resp.text().await.unwrap_or_default();
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_string))
            .unwrap_or_else(|| text.chars().take(200).collect());
        Err(ClientError::Http {
            status: Some(status),
            message,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_data_is_json_of_the_asked_size_with_its_ids() {
        let id = MsgId { sender: 3, seq: 99 };
        let d = padded_data(777, id, 2048);
        let v: Value = serde_json::from_str(&d).unwrap();
        assert!(v["items"].as_array().unwrap().len() > 10);
        assert!((1900..=2048).contains(&d.len()), "{}", d.len());
        let s = scan(&d);
        assert_eq!((s.stamp, s.id), (Some(777), Some(id)));
        assert_eq!(padded_data(777, id, 0), bench_data(777, id));
    }

    #[test]
    fn stray_bench_prefixes_do_not_panic() {
        for text in [
            "bench_",
            "xbench_",
            "{\"bench_é\":1}",
            "bench_t",
            "bench_t:",
            "bench_é",
        ] {
            assert_eq!(scan(text).id, None, "{text}");
        }
        assert_eq!(scan(r#"{"bench_é":1,"bench_t":5}"#).stamp, Some(5));
        assert_eq!(scan(r#"{"bench_t":}"#).stamp, None);
        assert_eq!(scan(r#"{"bench_t":99999999999999999999}"#).stamp, None);
        assert_eq!(scan(r#"{"bench_t" : 42 }"#).stamp, Some(42));
    }

    #[test]
    fn scans_client_and_api_events() {
        let id = MsgId { sender: 42, seq: 7 };
        let data = bench_data(12345, id);
        let client = format!(
            r#"{{"event":"client-broadcast","channel":"private-benchmark","data":{data}}}"#
        );
        assert_eq!(
            scan(&client),
            Scan {
                event: "client-broadcast",
                channel: Some("private-benchmark"),
                stamp: Some(12345),
                id: Some(id),
            }
        );
        // HTTP API events: data is a string, quotes escaped.
        let api = serde_json::json!({"event": "bench", "channel": "benchmark-fanout-3",
                                     "data": bench_data(987, id)})
        .to_string();
        assert_eq!(scan(&api).stamp, Some(987));
        assert_eq!(scan(&api).id, Some(id));
        assert_eq!(scan(&api).channel, Some("benchmark-fanout-3"));
        // A server that re-serialises data with its keys sorted.
        let sorted = r#"{"event":"e","channel":"c","data":{"bench_q":3,"bench_s":2,"bench_t":1}}"#;
        assert_eq!(scan(sorted).stamp, Some(1));
        assert_eq!(scan(sorted).id, Some(MsgId { sender: 2, seq: 3 }));
        // A stamp without an id.
        let old = r#"{"event":"e","channel":"c","data":{"bench_t":5}}"#;
        assert_eq!((scan(old).stamp, scan(old).id), (Some(5), None));
        assert_eq!(scan("").stamp, None);
        assert_eq!(scan("bench_").id, None);
        let spaced = r#"{ "data" : "{\"channel\":\"x\"}", "event" : "e", "channel" : "c" }"#;
        assert_eq!(scan(spaced).event, "e");
        assert_eq!(scan(spaced).channel, Some("c"));
        assert_eq!(scan(spaced).stamp, None);
        assert_eq!(event_of(&client), "client-broadcast");
        assert_eq!(event_of(spaced), "e");
        assert_eq!(
            event_of(r#"{"event":"pusher:ping","data":{}}"#),
            "pusher:ping"
        );
        assert_eq!(event_of("{}"), "");
        let est = r#"{"event":"pusher:connection_established","data":"{\"socket_id\":\"1.2\",\"activity_timeout\":120}"}"#;
        assert_eq!(scan(est).event, "pusher:connection_established");
        assert_eq!(data_value(est)["socket_id"], "1.2");
    }

    #[test]
    fn errors_are_read_from_either_data_form() {
        let e =
            r#"{"event":"pusher:error","data":{"code":4001,"message":"App key does not exist"}}"#;
        assert_eq!(
            error_of(e),
            ClientError::Rejected {
                code: Some(4001),
                message: "App key does not exist".into()
            }
        );
        let s = r#"{"event":"pusher:subscription_error","channel":"private-x","data":"{\"type\":\"AuthError\",\"error\":\"Invalid signature\",\"status\":401}"}"#;
        assert_eq!(
            subscription_error_of(s),
            ClientError::Subscription {
                status: Some(401),
                message: "Invalid signature".into()
            }
        );
    }
}
