//! Server-Sent Events at `rpc.sse_path` (`/events`; AnyCable's `--sse`):
//! an `EventSource` subscribes with one GET and receives what an Action
//! Cable client would, as events.
//!
//! What the query asks for becomes `subscribe` commands: `channel` (an
//! identifier of the channel alone), `identifier` (a full identifier, JSON),
//! `stream` (a public stream), `signed_stream` (a signed stream name),
//! `turbo_signed_stream_name` (a Turbo Streams channel). The session behind
//! them is an ordinary `actioncable-v1-ext-json` session (the app's
//! `Connect` or a token, RPC `Command` subscriptions, signed and public
//! streams, limits, pings, the app's `Disconnect`), fed through an
//! in-process pipe instead of a socket; this module only writes its
//! commands and reads its frames back as events:
//!
//! - `welcome`, `confirm_subscription`, `ping`, `disconnect` go out as named
//!   events whose data is the frame; a `disconnect` that asks the client
//!   not to reconnect adds a `retry` of a year (EventSource has no other
//!   way to be told to stop).
//! - A message goes out as data alone (the `message` part of the frame,
//!   as AnyCable's GET clients receive it) and, on a reliable stream, with
//!   its position as the event's `id`: `<offset>/<stream>/<epoch>`.
//! - The position comes back when EventSource reconnects (`Last-Event-ID`,
//!   or the `last_event_id` parameter): the subscriptions ask the history
//!   for what follows it, as an extended-protocol client would, so the
//!   client gets exactly what it missed, from whichever node it reaches.
//!   `history_since` (Unix seconds) asks for everything since a time.
//!
//! The response starts once every subscription is confirmed: a refused
//! connection or a rejected subscription is `401`, as in AnyCable (and
//! EventSource stops there), a full server `503`.
//!
//! Limits are the session's: the app's `max_connections` (an SSE stream
//! is a connection), its outbound queue, the write timeout that drops a
//! client that stops reading, Action Cable's pings every 3 s (which also
//! keep proxies from timing the stream out). The pipe between the session
//! and the response holds at most [`PIPE_BYTES`].

use crate::metrics as m;
use crate::{session, Cable};
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use bytes::{Buf, Bytes, BytesMut};
use herald_core::frame::Frame;
use herald_core::metrics;
use herald_core::node::Node;
use herald_core::publication::{Event, Publication, Wire};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

/// The SSE path unless `rpc.sse_path` says otherwise.
pub const DEFAULT_PATH: &str = crate::config::DEFAULT_SSE_PATH;

/// Bytes the pipe between a session and its response holds each way:
/// past it the session's writes wait, and a client that stops reading is
/// dropped by the session's write timeout.
pub const PIPE_BYTES: usize = 16 * 1024;

/// Most subscriptions one request may ask for.
pub const MAX_SUBSCRIPTIONS: usize = 8;

/// How long the app may take to confirm the subscriptions before the
/// request is answered `503`.
const OPEN_TIMEOUT: Duration = Duration::from_secs(15);

/// The `retry` (milliseconds) sent with a `disconnect` that must not be
/// retried: a year.
const NO_RETRY_MS: u64 = 31_536_000_000;

/// The SSE transport's wire: the extended protocol's frames, under a name
/// of its own so its connections and traffic are counted apart.
pub struct SseWire;

pub static SSE_WIRE: SseWire = SseWire;

impl Wire for SseWire {
    fn name(&self) -> &'static str {
        "actioncable-sse"
    }

    fn publication(&self, p: &Publication, tag: &str) -> Frame {
        crate::ext::protocol::EXT_WIRE.publication(p, tag)
    }

    fn event(&self, e: &Event<'_>, tag: &str) -> Option<Frame> {
        crate::ext::protocol::EXT_WIRE.event(e, tag)
    }
}

/// What an SSE request asks for.
#[derive(Debug, PartialEq, Eq)]
pub struct Ask {
    /// Identifiers to subscribe, in order, without repeats.
    pub identifiers: Vec<String>,
    /// The position to resume after: (stream, epoch, offset).
    pub resume: Option<(String, String, u64)>,
    /// History since a Unix time in seconds.
    pub since: Option<u64>,
}

/// Read the query and the `Last-Event-ID` header. `Err` is the `400`
/// answer's text.
pub fn ask(query: &str, last_event_id: Option<&str>) -> Result<Ask, String> {
    let mut identifiers: Vec<String> = Vec::new();
    let mut since = None;
    let mut last = last_event_id.map(str::to_owned);
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        if v.is_empty() && k != "last_event_id" {
            return Err(format!("{k}: empty"));
        }
        let identifier = match &*k {
            "identifier" | "identifier[]" => {
                match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&v) {
                    Ok(_) => v.to_string(),
                    Err(_) => return Err("identifier: not a JSON object".into()),
                }
            }
            "channel" => serde_json::json!({ "channel": v }).to_string(),
            "stream" => serde_json::json!({ "channel": crate::streams::PUBSUB, "stream_name": v })
                .to_string(),
            "signed_stream" => serde_json::json!({
                "channel": crate::streams::PUBSUB,
                "signed_stream_name": v
            })
            .to_string(),
            "turbo_signed_stream_name" => serde_json::json!({
                "channel": crate::turbo::TURBO_CHANNEL,
                "signed_stream_name": v
            })
            .to_string(),
            "history_since" => {
                since = Some(
                    v.parse::<u64>()
                        .map_err(|_| "history_since: not a Unix time in seconds")?,
                );
                continue;
            }
            "last_event_id" => {
                last.get_or_insert_with(|| v.into_owned());
                continue;
            }
            _ => continue,
        };
        if !identifiers.contains(&identifier) {
            identifiers.push(identifier);
        }
        if identifiers.len() > MAX_SUBSCRIPTIONS {
            return Err(format!(
                "more than {MAX_SUBSCRIPTIONS} subscriptions in one request"
            ));
        }
    }
    if identifiers.is_empty() {
        return Err(
            "name what to subscribe to: channel, identifier, stream, signed_stream or \
             turbo_signed_stream_name"
                .into(),
        );
    }
    Ok(Ask {
        identifiers,
        // A position this server did not give (another server's ids, or
        // none) resumes nothing: the client starts from now.
        resume: last.as_deref().and_then(position),
        since,
    })
}

/// An event id (`<offset>/<stream>/<epoch>`) as (stream, epoch, offset).
pub fn position(id: &str) -> Option<(String, String, u64)> {
    let (offset, rest) = id.split_once('/')?;
    let (stream, epoch) = rest.rsplit_once('/')?;
    let offset = offset.parse().ok()?;
    (!stream.is_empty() && !epoch.is_empty()).then(|| (stream.to_owned(), epoch.to_owned(), offset))
}

/// The `subscribe` command for `identifier`, with the history request the
/// resume asks for.
fn subscribe(identifier: &str, ask: &Ask) -> String {
    let mut command = serde_json::json!({ "command": "subscribe", "identifier": identifier });
    let mut history = serde_json::Map::new();
    if let Some(since) = ask.since.filter(|s| *s > 0) {
        history.insert("since".into(), since.into());
    }
    if let Some((stream, epoch, offset)) = &ask.resume {
        history.insert(
            "streams".into(),
            serde_json::json!({ stream: { "epoch": epoch, "offset": offset } }),
        );
    }
    if !history.is_empty() {
        command["history"] = history.into();
    }
    command.to_string()
}

/// A client text frame, as the session's decoder requires (the core's
/// in-memory form: masked with a zero key).
fn client_frame(payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(payload.len() + 14);
    herald_core::relay::put_client_frame(&mut f, 1, payload);
    f
}

/// The next complete server frame in `buf`: its opcode and payload.
fn next_frame(buf: &mut BytesMut) -> Option<(u8, Bytes)> {
    if buf.len() < 2 {
        return None;
    }
    let op = buf[0] & 0x0f;
    let (len, at): (usize, usize) = match buf[1] & 0x7f {
        126 if buf.len() >= 4 => (u16::from_be_bytes([buf[2], buf[3]]) as usize, 4),
        127 if buf.len() >= 10 => {
            let mut n = [0u8; 8];
            n.copy_from_slice(&buf[2..10]);
            (usize::try_from(u64::from_be_bytes(n)).ok()?, 10)
        }
        126 | 127 => return None,
        n => (n as usize, 2),
    };
    if buf.len() < at.checked_add(len)? {
        return None;
    }
    buf.advance(at);
    Some((op, buf.split_to(len).freeze()))
}

#[derive(Deserialize)]
struct ServerMessage {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    identifier: Option<String>,
    #[serde(default)]
    message: Option<Box<RawValue>>,
    #[serde(default)]
    stream_id: Option<String>,
    #[serde(default)]
    epoch: Option<String>,
    #[serde(default)]
    offset: Option<u64>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    reconnect: Option<bool>,
}

/// What a frame was, for the opening to wait on.
#[derive(Debug, PartialEq, Eq)]
enum Kind {
    Confirmed(String),
    Rejected,
    /// The session said goodbye (its reason).
    Disconnect(String),
    Closed,
    Other,
}

/// Append the event for one server frame to `out`.
fn translate(op: u8, payload: &[u8], out: &mut Vec<u8>) -> Kind {
    if op == 0x8 {
        return Kind::Closed;
    }
    if op != 0x1 {
        return Kind::Other;
    }
    let Ok(text) = std::str::from_utf8(payload) else {
        return Kind::Other;
    };
    let Ok(msg) = serde_json::from_str::<ServerMessage>(text) else {
        return Kind::Other;
    };
    match msg.kind.as_deref() {
        Some(kind @ ("welcome" | "confirm_subscription" | "ping")) => {
            event(out, Some(kind), text, None, None);
            match kind {
                "confirm_subscription" => Kind::Confirmed(msg.identifier.unwrap_or_default()),
                _ => Kind::Other,
            }
        }
        Some("reject_subscription") => {
            event(out, Some("reject_subscription"), text, None, None);
            Kind::Rejected
        }
        Some("disconnect") => {
            let retry = (msg.reconnect == Some(false)).then_some(NO_RETRY_MS);
            event(out, Some("disconnect"), text, None, retry);
            Kind::Disconnect(msg.reason.unwrap_or_default())
        }
        // History confirmations, presence: nothing an EventSource asked for.
        Some(_) => Kind::Other,
        None => {
            let Some(message) = msg.message else {
                return Kind::Other;
            };
            let id = match (&msg.stream_id, &msg.epoch, msg.offset) {
                (Some(stream), Some(epoch), Some(offset)) => {
                    Some(format!("{offset}/{stream}/{epoch}"))
                }
                _ => None,
            };
            event(out, None, message.get(), id.as_deref(), None);
            Kind::Other
        }
    }
}

/// One event: its name, its data (one `data:` line per line), its id
/// (left out when a line break or NUL would break it), its retry.
fn event(out: &mut Vec<u8>, name: Option<&str>, data: &str, id: Option<&str>, retry: Option<u64>) {
    if let Some(name) = name {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.push(b'\n');
    }
    for line in data.split('\n') {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line.trim_end_matches('\r').as_bytes());
        out.push(b'\n');
    }
    if let Some(id) = id.filter(|id| !id.contains(['\n', '\r', '\0'])) {
        out.extend_from_slice(b"id: ");
        out.extend_from_slice(id.as_bytes());
        out.push(b'\n');
    }
    if let Some(ms) = retry {
        out.extend_from_slice(format!("retry: {ms}\n").as_bytes());
    }
    out.push(b'\n');
}

fn refused(status: StatusCode, text: String) -> Response {
    metrics::count(&m::SSE_REFUSED);
    (status, text).into_response()
}

/// `GET rpc.sse_path`.
pub async fn handle(
    State(node): State<Arc<Node>>,
    Extension(cable): Extension<Arc<Cable>>,
    req: Request,
) -> Response {
    if node.is_draining() {
        return refused(StatusCode::SERVICE_UNAVAILABLE, "Server is draining".into());
    }
    // A page the app does not list is refused before any session, as at
    // /cable's upgrade (an EventSource sends its page's Origin).
    let hub = &cable.hub;
    if !herald_core::origin::check(
        req.headers(),
        &hub.config().origins,
        &hub.app.id,
        "actioncable-sse",
    ) {
        return refused(
            StatusCode::FORBIDDEN,
            herald_core::origin::REFUSED_MESSAGE.into(),
        );
    }
    let last = req
        .headers()
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty());
    let ask = match ask(req.uri().query().unwrap_or(""), last) {
        Ok(ask) => ask,
        Err(e) => return refused(StatusCode::BAD_REQUEST, e),
    };
    let commands: Vec<String> = ask.identifiers.iter().map(|i| subscribe(i, &ask)).collect();
    if let Some(c) = commands
        .iter()
        .find(|c| c.len() > cable.hub.config().max_frame_size)
    {
        return refused(
            StatusCode::BAD_REQUEST,
            format!(
                "a subscription of {} bytes is over the app's max_frame_size ({})",
                c.len(),
                cable.hub.config().max_frame_size
            ),
        );
    }
    if ask.resume.is_some() {
        metrics::count(&m::SSE_RESUMES);
    }
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let (ours, theirs) = tokio::io::duplex(PIPE_BYTES);
    tokio::spawn(session::serve_sse(
        node.clone(),
        cable.clone(),
        theirs,
        req.headers(),
        req.uri(),
        peer,
    ));
    match tokio::time::timeout(OPEN_TIMEOUT, open(ours, &commands, &ask.identifiers)).await {
        Ok(Ok((pipe, prelude))) => {
            metrics::count(&m::SSE_OPENED);
            stream(pipe, prelude)
        }
        Ok(Err(refusal)) => refusal,
        Err(_) => refused(
            StatusCode::SERVICE_UNAVAILABLE,
            "the subscriptions were not confirmed in time".into(),
        ),
    }
}

/// A pipe to a session and the bytes read from it not yet framed.
struct Pipe {
    io: DuplexStream,
    buf: BytesMut,
}

/// Send the commands, then read the session's frames until every
/// subscription is confirmed: the events so far, or the refusal.
async fn open(
    mut io: DuplexStream,
    commands: &[String],
    identifiers: &[String],
) -> Result<(Pipe, Vec<u8>), Response> {
    let gone = || refused(StatusCode::SERVICE_UNAVAILABLE, "the session ended".into());
    for c in commands {
        if io.write_all(&client_frame(c.as_bytes())).await.is_err() {
            return Err(gone());
        }
    }
    let mut pending: Vec<&str> = identifiers.iter().map(String::as_str).collect();
    let mut pipe = Pipe {
        io,
        buf: BytesMut::new(),
    };
    let mut prelude = Vec::new();
    loop {
        while let Some((op, payload)) = next_frame(&mut pipe.buf) {
            match translate(op, &payload, &mut prelude) {
                Kind::Confirmed(id) => pending.retain(|p| *p != id),
                Kind::Rejected => {
                    return Err(refused(
                        StatusCode::UNAUTHORIZED,
                        "subscription rejected".into(),
                    ))
                }
                Kind::Disconnect(reason) if reason == crate::wire::reason::UNAUTHORIZED => {
                    return Err(refused(StatusCode::UNAUTHORIZED, "unauthorized".into()))
                }
                Kind::Disconnect(reason) => {
                    return Err(refused(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("disconnected: {reason}"),
                    ))
                }
                Kind::Closed => return Err(gone()),
                Kind::Other => {}
            }
        }
        if pending.is_empty() {
            return Ok((pipe, prelude));
        }
        match pipe.io.read_buf(&mut pipe.buf).await {
            Ok(0) | Err(_) => return Err(gone()),
            Ok(_) => {}
        }
    }
}

/// The event stream: the opening's events, then each frame's as the
/// session writes them, until it closes or the client goes (dropping the
/// pipe ends the session).
fn stream(pipe: Pipe, prelude: Vec<u8>) -> Response {
    let body =
        futures_util::stream::unfold((Some(pipe), Some(prelude)), |(pipe, prelude)| async move {
            if let Some(first) = prelude.filter(|p| !p.is_empty()) {
                return Some((Ok::<_, std::io::Error>(Bytes::from(first)), (pipe, None)));
            }
            let mut pipe = pipe?;
            loop {
                let mut out = Vec::new();
                let mut closed = false;
                while let Some((op, payload)) = next_frame(&mut pipe.buf) {
                    if translate(op, &payload, &mut out) == Kind::Closed {
                        closed = true;
                        break;
                    }
                }
                let next = (!closed).then_some(pipe);
                if !out.is_empty() {
                    return Some((Ok(Bytes::from(out)), (next, None)));
                }
                pipe = next?;
                match pipe.io.read_buf(&mut pipe.buf).await {
                    Ok(0) | Err(_) => return None,
                    Ok(_) => {}
                }
            }
        });
    let mut res = Body::from_stream(body).into_response();
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Proxies that buffer responses (nginx) would hold the events back.
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_become_subscriptions() {
        let a = ask(
            "stream=chat&signed_stream=abc--12&channel=Chat&history_since=5",
            None,
        )
        .unwrap();
        assert_eq!(
            a.identifiers,
            vec![
                r#"{"channel":"$pubsub","stream_name":"chat"}"#,
                r#"{"channel":"$pubsub","signed_stream_name":"abc--12"}"#,
                r#"{"channel":"Chat"}"#,
            ]
        );
        assert_eq!(a.since, Some(5));
        let id = r#"{"channel":"Room","id":1}"#;
        let q: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("identifier", id)
            .append_pair("identifier", id)
            .finish();
        assert_eq!(ask(&q, None).unwrap().identifiers, vec![id]);
        assert!(ask("", None).unwrap_err().contains("channel, identifier"));
        assert!(ask("identifier=nope", None).is_err());
        assert!(ask("stream=", None).is_err());
        assert!(ask("stream=a&history_since=x", None).is_err());
        let many: Vec<String> = (0..=MAX_SUBSCRIPTIONS)
            .map(|i| format!("stream=s{i}"))
            .collect();
        assert!(ask(&many.join("&"), None)
            .unwrap_err()
            .contains("more than"));
    }

    #[test]
    fn event_ids_resume_their_stream() {
        assert_eq!(
            position("7/chat/room/1/ep"),
            Some(("chat/room/1".into(), "ep".into(), 7))
        );
        for bad in ["", "7", "x/s/e", "7//e", "7/s/", "-1/s/e"] {
            assert_eq!(position(bad), None, "{bad}");
        }
        // The header wins over the parameter; a foreign id resumes nothing.
        let a = ask("stream=s&last_event_id=1/s/a", Some("2/s/b")).unwrap();
        assert_eq!(a.resume, Some(("s".into(), "b".into(), 2)));
        assert_eq!(ask("stream=s", Some("abc")).unwrap().resume, None);
        let c = subscribe("i", &a);
        let v: serde_json::Value = serde_json::from_str(&c).unwrap();
        assert_eq!(v["history"]["streams"]["s"]["offset"], 2);
        assert_eq!(v["history"]["streams"]["s"]["epoch"], "b");
    }

    #[test]
    fn frames_become_events() {
        let mut out = Vec::new();
        let k = translate(
            1,
            br#"{"type":"confirm_subscription","identifier":"i"}"#,
            &mut out,
        );
        assert_eq!(k, Kind::Confirmed("i".into()));
        translate(
            1,
            br#"{"identifier":"i","message":{"a":"x\ny"},"stream_id":"s","epoch":"e","offset":3}"#,
            &mut out,
        );
        translate(1, br#"{"identifier":"i","message":"two\nlines"}"#, &mut out);
        let k = translate(
            1,
            br#"{"type":"disconnect","reason":"remote","reconnect":false}"#,
            &mut out,
        );
        assert_eq!(k, Kind::Disconnect("remote".into()));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "event: confirm_subscription\ndata: {\"type\":\"confirm_subscription\",\"identifier\":\"i\"}\n\n\
             data: {\"a\":\"x\\ny\"}\nid: 3/s/e\n\n\
             data: \"two\\nlines\"\n\n\
             event: disconnect\ndata: {\"type\":\"disconnect\",\"reason\":\"remote\",\"reconnect\":false}\nretry: 31536000000\n\n"
        );
        let mut raw = Vec::new();
        event(&mut raw, None, "a\r\nb", Some("1/x\n/e"), None);
        assert_eq!(raw, b"data: a\ndata: b\n\n");
    }

    #[test]
    fn server_frames_are_read_whole() {
        for len in [5usize, 300, 70_000] {
            let text = "x".repeat(len);
            let f = Frame::text(&text);
            let bytes: Vec<u8> = f.parts().iter().flat_map(|p| p.iter().copied()).collect();
            let mut buf = BytesMut::from(&bytes[..bytes.len() - 1]);
            assert!(next_frame(&mut buf).is_none());
            buf.extend_from_slice(&bytes[bytes.len() - 1..]);
            let (op, payload) = next_frame(&mut buf).unwrap();
            assert_eq!((op, payload.len()), (1, len));
            assert!(buf.is_empty());
        }
    }
}
