//! `actioncable-v1-ext-json` clients (`--protocol actioncable-ext`,
//! [`Proto::ActionCableExt`](super::proto::Proto::ActionCableExt)): Action
//! Cable with AnyCable's extended protocol, behaving as `@anycable/core`
//! 1.1 does across a reconnect (its `action_cable_ext` protocol and
//! `Monitor`, read for this):
//!
//! - it keeps the welcome's `sid` and, per stream, the position (`epoch`,
//!   `offset`) of the last message it received, and the time of the last
//!   ping (`restoreSince`, whole seconds);
//! - it reconnects to `/cable?sid=<sid>`; a welcome with `restored: true`
//!   brings its subscriptions back without the app's `Connect`, and it
//!   sends one `history` request per restored identifier (`since` and its
//!   streams' positions); a welcome without it is a fresh session, and it
//!   subscribes again with the same `history` in the `subscribe` command.
//!
//! The first subscribe carries no history (as `@anycable/core` with
//! `historyTimestamp: false`): the scenario publishes only once everyone
//! is subscribed, so there is nothing before it to catch up on.

use super::actioncable::{self, disconnected, type_of, DISCONNECT_EVENT};
use super::client::{next_text, string_field, ClientError, Conn};
use super::Target;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The subprotocol the clients ask for.
pub const SUBPROTOCOL: &str = "actioncable-v1-ext-json";

/// A stream position: the stream's epoch and the message's offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    pub epoch: String,
    pub offset: u64,
}

/// What a client keeps across reconnects.
#[derive(Debug, Clone, Default)]
pub struct Resume {
    /// The last welcome's `sid` (empty: the server sent none, nothing to
    /// restore).
    pub sid: String,
    /// The last position seen per stream.
    pub positions: BTreeMap<String, Position>,
    /// Unix seconds of the last ping (or of the first connect).
    pub since: u64,
}

/// How the server greeted a reconnect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Welcome {
    /// `restored: true`, with the identifiers it restored.
    Restored(Vec<String>),
    /// A new session (the app's `Connect` was called).
    Fresh,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Resume {
    pub fn new(sid: String) -> Resume {
        Resume {
            sid,
            positions: BTreeMap::new(),
            since: unix_now(),
        }
    }

    /// A frame arrived: a ping moves `since`, a stream message its
    /// stream's position. Cheap: string scans, no JSON parse.
    pub fn observe(&mut self, text: &str) {
        if text.starts_with(r#"{"type":"ping""#) {
            self.since = unix_now();
            return;
        }
        if let Some((stream, position)) = position_of(text) {
            match self.positions.get_mut(stream) {
                Some(p) => *p = position,
                None => {
                    self.positions.insert(stream.to_string(), position);
                }
            }
        }
    }

    /// The `history` field for a subscription: `since` and the positions
    /// of its streams (the client knows a subscription's streams from the
    /// messages it got on them; the bench's subscriptions have one each).
    pub fn history(&self, streams: &[String]) -> Value {
        let mut known = Map::new();
        for s in streams {
            if let Some(p) = self.positions.get(s) {
                known.insert(s.clone(), json!({ "epoch": p.epoch, "offset": p.offset }));
            }
        }
        json!({ "since": self.since, "streams": known })
    }
}

/// A stream message's `stream_id` and position, if it has them.
pub fn position_of(text: &str) -> Option<(&str, Position)> {
    let stream = string_field(text, "stream_id")?;
    let epoch = string_field(text, "epoch")?;
    let i = text.find(r#""offset":"#)? + r#""offset":"#.len();
    let digits = text[i..].trim_start();
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    let offset = digits[..end].parse().ok()?;
    Some((
        stream,
        Position {
            epoch: epoch.to_string(),
            offset,
        },
    ))
}

/// `/cable`, with `?sid=` when there is a session to restore.
pub fn url(target: &Target, sid: &str) -> String {
    let base = actioncable::url(target);
    if sid.is_empty() {
        return base;
    }
    let mut q = String::with_capacity(sid.len());
    for b in sid.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            q.push(b as char);
        } else {
            q.push_str(&format!("%{b:02X}"));
        }
    }
    format!("{base}?sid={q}")
}

/// Connect (restoring `sid` when not empty) and wait for the welcome.
/// The connection's `socket_id` is the new `sid`.
pub async fn open(
    target: &Target,
    source: Option<IpAddr>,
    sid: &str,
    timeout: Duration,
) -> Result<(Conn, Welcome), ClientError> {
    let (conn, welcome) =
        actioncable::open_as(target, source, url(target, sid), SUBPROTOCOL, timeout).await?;
    let v: Value = serde_json::from_str(&welcome).unwrap_or(Value::Null);
    let greeting = if v["restored"] == Value::Bool(true) {
        let ids = v["restored_ids"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|i| i.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        Welcome::Restored(ids)
    } else {
        Welcome::Fresh
    };
    Ok((conn, greeting))
}

/// The `history` command for `identifier`.
pub fn history_command(identifier: &str, history: &Value) -> String {
    json!({ "command": "history", "identifier": identifier, "history": history }).to_string()
}

/// Subscribe to `identifier` with `history` in the command and wait for
/// `confirm_subscription` (the missed messages and `confirm_history`
/// follow it, for the caller to read).
pub async fn subscribe_with_history(
    conn: &mut Conn,
    identifier: &str,
    history: &Value,
    timeout: Duration,
) -> Result<(), ClientError> {
    let command = json!({ "command": "subscribe", "identifier": identifier, "history": history });
    conn.send(command.to_string()).await?;
    let wait = async {
        loop {
            let text = next_text(&mut conn.ws).await?;
            match type_of(&text) {
                Some("confirm_subscription") => return Ok(()),
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
    };
    tokio::time::timeout(timeout, wait)
        .await
        .map_err(|_| ClientError::Timeout("waiting for confirm_subscription"))?
}

/// After a reconnect's `welcome`, ask for what `identifier` missed, as
/// `@anycable/core` does: a restored session that has the subscription
/// back gets a `history` request; otherwise the client subscribes again
/// with `history` in the command (and waits for the confirmation). The
/// missed messages and `confirm_history` or `reject_history` follow, for
/// the caller to read. True when the session was restored.
pub async fn catch_up(
    conn: &mut Conn,
    welcome: Welcome,
    identifier: &str,
    history: &Value,
    timeout: Duration,
) -> Result<bool, ClientError> {
    let restored = match welcome {
        Welcome::Restored(ids) => {
            if ids.iter().any(|i| i == identifier) {
                conn.send(history_command(identifier, history)).await?;
                return Ok(true);
            }
            true
        }
        Welcome::Fresh => false,
    };
    subscribe_with_history(conn, identifier, history, timeout).await?;
    Ok(restored)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_pings_and_history_requests() {
        // A message as anycable-go 1.6.16 sends it (observed), and as
        // Herald does.
        let id = r#"{\"channel\":\"BenchmarkChannel\",\"id\":\"storm-1\"}"#;
        let frame = format!(
            r#"{{"identifier":"{id}","message":{{"bench_t":1,"bench_s":1,"bench_q":4}},"stream_id":"allstorm-1","epoch":"zowb","offset":5}}"#
        );
        let (stream, p) = position_of(&frame).unwrap();
        assert_eq!(stream, "allstorm-1");
        assert_eq!(
            p,
            Position {
                epoch: "zowb".into(),
                offset: 5
            }
        );
        assert_eq!(position_of(r#"{"type":"confirm_history"}"#), None);
        let mut r = Resume::new("s.1".into());
        r.since = 7;
        r.observe(&frame);
        r.observe(&frame.replace(":5}", ":6}"));
        let h = r.history(&["allstorm-1".into(), "other".into()]);
        assert_eq!(
            h,
            json!({"since": 7, "streams": {"allstorm-1": {"epoch": "zowb", "offset": 6}}})
        );
        r.observe(r#"{"type":"ping","message":1700000000}"#);
        assert!(r.since > 7);
        let t = Target::new("ws://127.0.0.1:1", "a", "b", "c", false).unwrap();
        assert_eq!(url(&t, ""), "ws://127.0.0.1:1/cable");
        assert_eq!(url(&t, "a.1/+"), "ws://127.0.0.1:1/cable?sid=a.1%2F%2B");
        let cmd: Value = serde_json::from_str(&history_command("x", &h)).unwrap();
        assert_eq!(cmd["command"], "history");
        assert_eq!(cmd["history"]["streams"]["allstorm-1"]["offset"], 6);
    }
}
