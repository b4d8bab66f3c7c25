//! Action Cable clients (`--protocol actioncable`,
//! [`Proto::ActionCable`](super::proto::Proto::ActionCable))
//! over `/cable` (subprotocol `actioncable-v1-json`), subscribed to the
//! `BenchmarkChannel` that `herald bench rpc-server` serves. The server
//! under test is Herald or any AnyCable-compatible server with the bench's
//! RPC server as its app.
//!
//! `broadcast` and `connect` subscribe to the channel itself (subscribing
//! streams `all`; the `broadcast` action broadcasts its data to the stream
//! and transmits it back to the sender as `broadcastResult`): a broadcast
//! reaches every subscriber, its sender included, and a receiver ignores
//! its own messages (the ledger never expects them). `storm`, `slow` and
//! `soak` subscribe once per bench channel, with its name as the `id`
//! param ([`identifier_for`]), and publish to its stream ([`stream_of`])
//! through the HTTP broadcast API (see [`super::proto`]).

use super::client::{bench_fields, next_text, string_field, ws_open, ClientError, Conn, Scan};
use super::Target;
use serde_json::Value;
use std::net::IpAddr;
use std::time::Duration;

/// The Action Cable mount path (Herald's and AnyCable's default).
pub const PATH: &str = "/cable";
/// The subprotocol the clients ask for.
pub const SUBPROTOCOL: &str = "actioncable-v1-json";
/// The subscription identifier: `herald bench rpc-server`'s channel.
pub const IDENTIFIER: &str = r#"{"channel":"BenchmarkChannel"}"#;
/// `IDENTIFIER` as a JSON string literal, as it appears in commands.
const IDENTIFIER_JSON: &str = r#""{\"channel\":\"BenchmarkChannel\"}""#;
/// The event name [`scan`] gives a broadcast (the `broadcast` action's
/// data coming back through the stream): the broadcast scenario's
/// `API_EVENT`.
pub const BROADCAST_EVENT: &str = "broadcast";
/// The event name of the sender's own `broadcastResult` transmission.
pub const RESULT_EVENT: &str = "broadcastResult";
/// The event name of a server's `disconnect` frame.
pub const DISCONNECT_EVENT: &str = "disconnect";

/// `ws://host:port/cable`.
pub fn url(target: &Target) -> String {
    format!("ws://{}{PATH}", target.host)
}

/// Connect to `/cable` and wait for `welcome`. The connection's
/// `socket_id` is the welcome's `sid` when the server sends one.
pub async fn open(
    target: &Target,
    source: Option<IpAddr>,
    timeout: Duration,
) -> Result<Conn, ClientError> {
    open_as(target, source, url(target), SUBPROTOCOL, timeout)
        .await
        .map(|(conn, _)| conn)
}

/// Connect to `url` asking for `subprotocol` and wait for `welcome`;
/// returns the connection (its `socket_id` the welcome's `sid`) and the
/// welcome frame itself.
pub async fn open_as(
    target: &Target,
    source: Option<IpAddr>,
    url: String,
    subprotocol: &str,
    timeout: Duration,
) -> Result<(Conn, String), ClientError> {
    let ws = ws_open(target, source, url, Some(subprotocol), timeout).await?;
    let mut conn = Conn {
        ws,
        socket_id: String::new(),
    };
    let wait = async {
        loop {
            let text = next_text(&mut conn.ws).await.map_err(|e| match e {
                ClientError::Closed(why) => {
                    ClientError::NotPusher(format!("closed before welcome ({why})"))
                }
                other => other,
            })?;
            match type_of(&text) {
                Some("welcome") => return Ok(text.to_string()),
                Some("ping") => continue,
                Some(DISCONNECT_EVENT) => return Err(disconnected(&text)),
                _ => {
                    let shown: String = text.chars().take(120).collect();
                    return Err(ClientError::NotPusher(format!(
                        "first frame was {shown:?}, expected {{\"type\":\"welcome\"}}"
                    )));
                }
            }
        }
    };
    let welcome = tokio::time::timeout(timeout, wait)
        .await
        .map_err(|_| ClientError::Timeout("waiting for welcome"))??;
    conn.socket_id = sid_of(&welcome);
    Ok((conn, welcome))
}

/// How many `Connect` calls `herald bench rpc-server` has answered, asked
/// through its `BenchmarkChannel` `stats` action over one Action Cable
/// connection (whose own `Connect` is counted). `None` when the app does
/// not answer it (not the bench's app, or an older one).
pub async fn connect_calls(target: &Target, timeout: Duration) -> Option<u64> {
    let mut conn = open(target, None, timeout).await.ok()?;
    subscribe(&mut conn, timeout).await.ok()?;
    let command = format!(
        r#"{{"command":"message","identifier":{IDENTIFIER_JSON},"data":"{{\"action\":\"stats\"}}"}}"#
    );
    conn.send(command).await.ok()?;
    let wait = async {
        loop {
            let text = next_text(&mut conn.ws).await.ok()?;
            if action_of(&text) == Some("stats") {
                let v: Value = serde_json::from_str(&text).ok()?;
                return v["message"]["connects"].as_u64();
            }
        }
    };
    let n = tokio::time::timeout(timeout, wait).await.ok().flatten();
    conn.close().await;
    n
}

/// Subscribe to `BenchmarkChannel` and wait for `confirm_subscription`.
pub async fn subscribe(conn: &mut Conn, timeout: Duration) -> Result<(), ClientError> {
    subscribe_identifiers(conn, &[IDENTIFIER.to_string()], timeout).await
}

/// The identifier of `BenchmarkChannel` with `id` param `name`: its
/// subscription streams `all<name>` (see [`stream_of`]).
pub fn identifier_for(name: &str) -> String {
    serde_json::json!({"channel": "BenchmarkChannel", "id": name}).to_string()
}

/// The stream `herald bench rpc-server` subscribes `identifier_for(name)`
/// to, where a broadcast to bench channel `name` goes.
pub fn stream_of(name: &str) -> String {
    format!("all{name}")
}

/// Subscribe to every identifier and wait until each is confirmed.
pub async fn subscribe_identifiers(
    conn: &mut Conn,
    identifiers: &[String],
    timeout: Duration,
) -> Result<(), ClientError> {
    for identifier in identifiers {
        let command = serde_json::json!({"command": "subscribe", "identifier": identifier});
        conn.send(command.to_string()).await?;
    }
    let mut pending = identifiers.len();
    let wait = async {
        while pending > 0 {
            let text = next_text(&mut conn.ws).await?;
            match type_of(&text) {
                Some("confirm_subscription") => pending -= 1,
                Some("reject_subscription") => {
                    return Err(ClientError::Subscription {
                        status: None,
                        message: "reject_subscription".into(),
                    })
                }
                Some(DISCONNECT_EVENT) => return Err(disconnected(&text)),
                _ => continue,
            }
        }
        Ok(())
    };
    tokio::time::timeout(timeout, wait)
        .await
        .map_err(|_| ClientError::Timeout("waiting for confirm_subscription"))?
}

/// A stream message (`{"identifier":..,"message":..}`, no `type`) as
/// `event`, its channel the identifier's `id` param (the bench channel's
/// name); any other frame, and a message of one of `BenchmarkChannel`'s
/// actions (its `broadcast` and `broadcastResult`, with the channel's
/// event names), as [`scan`] reads it.
pub fn scan_stream<'a>(text: &'a str, event: &'static str) -> Scan<'a> {
    if text.starts_with(r#"{"type":"#)
        || !text.contains(r#""message":"#)
        || type_of(text).is_some()
        || action_of(text).is_some()
    {
        return scan(text);
    }
    // The identifier is a JSON string, so its quotes are escaped.
    const ID: &str = r#"\"id\":\""#;
    let channel = text.find(ID).and_then(|i| {
        let rest = &text[i + ID.len()..];
        rest.find('\\').map(|end| &rest[..end])
    });
    let (stamp, id) = bench_fields(text);
    Scan {
        event,
        channel,
        stamp,
        id,
    }
}

/// The `message` command performing `BenchmarkChannel`'s `broadcast`
/// action with `data` (the bench's JSON object, see
/// [`super::client::bench_data`]) plus `"action":"broadcast"`.
pub fn broadcast_command(data: &str) -> String {
    let inner = data.strip_prefix('{').unwrap_or(data);
    let action = format!(r#"{{"action":"broadcast",{inner}"#);
    format!(
        r#"{{"command":"message","identifier":{IDENTIFIER_JSON},"data":{}}}"#,
        serde_json::to_string(&action).expect("a string serializes")
    )
}

/// A frame's `type` (`welcome`, `ping`, `confirm_subscription`,
/// `disconnect`, ...), if it has one.
pub(crate) fn type_of(text: &str) -> Option<&str> {
    if let Some(rest) = text.strip_prefix(r#"{"type":""#) {
        return rest.find('"').map(|end| &rest[..end]);
    }
    string_field(text, "type")
}

fn sid_of(text: &str) -> String {
    serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| v.get("sid").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_default()
}

pub(crate) fn disconnected(text: &str) -> ClientError {
    let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    let reason = v.get("reason").and_then(Value::as_str).unwrap_or("none");
    let reconnect = v.get("reconnect").and_then(Value::as_bool);
    ClientError::Rejected {
        code: None,
        message: format!(
            "disconnect, reason {reason:?}{}",
            reconnect.map_or(String::new(), |r| format!(", reconnect {r}"))
        ),
    }
}

/// The value of the first `action` field, whether the message is an
/// object (`"action":"x"`) or a JSON-encoded string (`\"action\":\"x\"`).
fn action_of(text: &str) -> Option<&str> {
    let i = text.find("action")?;
    let rest = &text.as_bytes()[i + "action".len()..];
    let start = rest
        .iter()
        .position(|c| !matches!(c, b'\\' | b'"' | b':' | b' '))?;
    let len = rest[start..]
        .iter()
        .position(|c| matches!(c, b'\\' | b'"'))?;
    std::str::from_utf8(&rest[start..start + len]).ok()
}

/// The fields of an Action Cable frame the scenarios read: a message
/// whose `action` is `broadcast` is [`BROADCAST_EVENT`] with the bench's
/// stamp and id, the sender's transmission is [`RESULT_EVENT`]; other
/// frames are their `type` (`ping`, `confirm_subscription`, `disconnect`).
pub fn scan(text: &str) -> Scan<'_> {
    if !text.starts_with(r#"{"type":"#) {
        if let Some(action) = action_of(text) {
            let (stamp, id) = bench_fields(text);
            return Scan {
                event: match action {
                    "broadcast" => BROADCAST_EVENT,
                    "broadcastResult" => RESULT_EVENT,
                    _ => "message",
                },
                channel: None,
                stamp,
                id,
            };
        }
    }
    Scan {
        event: type_of(text).unwrap_or(""),
        channel: None,
        stamp: None,
        id: None,
    }
}

/// What probably went wrong, for people.
pub fn explain(e: &ClientError, t: &Target) -> String {
    let at = url(t);
    match e {
        ClientError::Connect(_) | ClientError::Io(_) | ClientError::Closed(_) => e.explain(t),
        ClientError::Timeout(step) => format!(
            "{at}: no answer while {step} (server overloaded, its RPC app slow or down, or not an \
             Action Cable server at this --url)"
        ),
        ClientError::Handshake(m) => format!(
            "{at} did not accept an Action Cable WebSocket ({SUBPROTOCOL}): {m}; check --url"
        ),
        ClientError::NotPusher(m) => {
            format!("{at} accepted the WebSocket but does not speak Action Cable: {m}")
        }
        ClientError::Rejected { message, .. } => format!(
            "the server refused the connection ({message}): is its RPC app `herald bench \
             rpc-server`, and is the server pointed at it?"
        ),
        ClientError::Subscription { message, .. } => format!(
            "the server refused the subscription to BenchmarkChannel ({message}): is its RPC app \
             `herald bench rpc-server`?"
        ),
        ClientError::Http { .. } => e.explain(t),
    }
}

/// Check, with one client, that the target speaks Action Cable with a
/// BenchmarkChannel app; with `broadcast`, also that the channel's
/// `broadcast` action comes back through the stream (so the RPC server's
/// `--broadcast-url` reaches this server), instead of thousands of clients
/// failing or every message going missing.
pub async fn preflight(target: &Target, broadcast: bool) -> Result<(), String> {
    let timeout = Duration::from_secs(10);
    let mut conn = open(target, None, timeout)
        .await
        .map_err(|e| explain(&e, target))?;
    subscribe(&mut conn, timeout)
        .await
        .map_err(|e| explain(&e, target))?;
    if broadcast {
        conn.send(broadcast_command(r#"{"preflight":1}"#))
            .await
            .map_err(|e| explain(&e, target))?;
        let wait = async {
            let (mut result, mut delivered) = (false, false);
            while !(result && delivered) {
                let text = next_text(&mut conn.ws).await?;
                match scan(&text).event {
                    RESULT_EVENT => result = true,
                    BROADCAST_EVENT => delivered = true,
                    DISCONNECT_EVENT => return Err(disconnected(&text)),
                    _ => {}
                }
            }
            Ok::<_, ClientError>(())
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(explain(&e, target)),
            Err(_) => {
                return Err(format!(
                    "{}: BenchmarkChannel's broadcast action did not come back through the \
                     stream within {timeout:?}: start `herald bench rpc-server` with \
                     --broadcast-url pointing at this server's broadcast endpoint (Herald: \
                     http://host:port/_broadcast; AnyCable: its --http_broadcast_port), and \
                     --broadcast-key if it has one",
                    url(target)
                ))
            }
        }
    }
    conn.close().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::bench_data;
    use crate::ledger::MsgId;

    #[test]
    fn commands_and_frames() {
        let id = MsgId { sender: 4, seq: 9 };
        let cmd = broadcast_command(&bench_data(123, id));
        let v: Value = serde_json::from_str(&cmd).unwrap();
        assert_eq!(v["command"], "message");
        assert_eq!(v["identifier"], IDENTIFIER);
        let data: Value = serde_json::from_str(v["data"].as_str().unwrap()).unwrap();
        assert_eq!(data["action"], "broadcast");
        assert_eq!(data["bench_t"], 123);
        assert_eq!(data["bench_s"], 4);
        assert_eq!(data["bench_q"], 9);

        // A broadcast as Herald and AnyCable send it (message an object),
        // keys in any order, and with the message a JSON-encoded string.
        let message =
            serde_json::json!({"action": "broadcast", "bench_t": 123, "bench_s": 4, "bench_q": 9});
        for frame in [
            serde_json::json!({"identifier": IDENTIFIER, "message": message}).to_string(),
            serde_json::json!({"identifier": IDENTIFIER, "message": message.to_string()})
                .to_string(),
        ] {
            let s = scan(&frame);
            assert_eq!(
                (s.event, s.stamp, s.id),
                (BROADCAST_EVENT, Some(123), Some(id)),
                "{frame}"
            );
        }
        let mut result = message.clone();
        result["action"] = "broadcastResult".into();
        let frame = serde_json::json!({"identifier": IDENTIFIER, "message": result}).to_string();
        assert_eq!(scan(&frame).event, RESULT_EVENT);
        // The actions' messages scan alike as stream messages.
        assert_eq!(scan_stream(&frame, "e").event, RESULT_EVENT);
        let frame = serde_json::json!({"identifier": IDENTIFIER, "message": message}).to_string();
        let s = scan_stream(&frame, "e");
        assert_eq!(
            (s.event, s.channel, s.stamp, s.id),
            (BROADCAST_EVENT, None, Some(123), Some(id))
        );
        assert_eq!(
            scan(r#"{"type":"ping","message":1700000000}"#).event,
            "ping"
        );
        let confirm =
            format!(r#"{{"identifier":{IDENTIFIER_JSON},"type":"confirm_subscription"}}"#);
        assert_eq!(scan(&confirm).event, "confirm_subscription");
        assert_eq!(
            scan(r#"{"type":"disconnect","reason":"unauthorized","reconnect":false}"#).event,
            DISCONNECT_EVENT
        );
        assert_eq!(scan("").event, "");
        assert_eq!(scan("action").event, "");
        assert_eq!(sid_of(r#"{"type":"welcome","sid":"abc"}"#), "abc");
        assert_eq!(sid_of(r#"{"type":"welcome"}"#), "");
        assert!(matches!(
            disconnected(r#"{"type":"disconnect","reason":"unauthorized","reconnect":false}"#),
            ClientError::Rejected { message, .. } if message.contains("unauthorized")
        ));
    }
}
