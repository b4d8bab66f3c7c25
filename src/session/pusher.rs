//! A Pusher Channels v7 session (`/app/{key}`): the connection handshake,
//! keep-alive, and the mapping from client commands to hub operations.

use super::{answer_close, close, write_batch, RateWindow};
use crate::connection::{Connection, QueueLimit};
use crate::fanout::{Frame, Publication};
use crate::hub::channel::{ChannelKind, SERVER_TO_USER_PREFIX};
use crate::hub::Hub;
use crate::metrics;
use crate::node::Node;
use crate::protocol::pusher::{self as wire, code, ClientMessage};
use crate::protocol::Protocol;
use crate::signing;
use axum::extract::ws::{Message, WebSocket};
use serde::Deserialize;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// What the client asked for in the URL.
#[derive(Debug, Default, Deserialize)]
pub struct ConnectParams {
    pub protocol: Option<String>,
}

/// The human-readable message for each close code Herald sends.
pub fn close_message(code: u16) -> &'static str {
    match code {
        code::APP_NOT_FOUND => "App key does not exist",
        code::APP_DISABLED => "App is disabled",
        code::OVER_CONNECTION_QUOTA => "App is over its connection quota",
        code::INVALID_VERSION => "Invalid protocol version",
        code::UNSUPPORTED_PROTOCOL => "Unsupported protocol version (Herald speaks 5 to 7)",
        code::NO_PROTOCOL_VERSION => "No protocol version supplied",
        code::UNAUTHORIZED => "Connection unauthorized",
        code::OVER_CAPACITY => "Client too slow or over its message rate; reconnect later",
        code::RECONNECT => "Server is restarting; reconnect",
        code::PONG_NOT_RECEIVED => "Pong reply not received",
        _ => "Connection closed",
    }
}

/// Check the `protocol` query parameter as Pusher does.
pub fn check_version(params: &ConnectParams) -> Result<(), u16> {
    let Some(v) = params.protocol.as_deref() else {
        return Err(code::NO_PROTOCOL_VERSION);
    };
    let version: u32 = v.parse().map_err(|_| code::INVALID_VERSION)?;
    if (wire::MIN_PROTOCOL_VERSION..=wire::PROTOCOL_VERSION).contains(&version) {
        Ok(())
    } else {
        Err(code::UNSUPPORTED_PROTOCOL)
    }
}

/// Refuse a connection after the upgrade, as Pusher clients expect: a
/// `pusher:error` with the code, then a close with the same code.
pub async fn refuse(mut socket: WebSocket, code: u16) {
    metrics::count(&metrics::CONNECTIONS_REFUSED);
    let message = close_message(code);
    close(
        &mut socket,
        Some(wire::error(Some(code), message)),
        code,
        message,
    )
    .await;
}

/// Per-connection state only the session touches.
struct Session {
    node: Arc<Node>,
    hub: Arc<Hub>,
    conn: Arc<Connection>,
    /// Subscribed channel names.
    channels: Vec<Box<str>>,
    /// Signed-in user id and watchlist.
    user: Option<(String, Vec<String>)>,
    inbound: RateWindow,
    client_events: RateWindow,
}

/// What the loop should do after handling a frame.
enum Next {
    Continue,
    /// Close with this code after telling the client why.
    Close(u16, String),
    /// The client closed; nothing more to say.
    Gone,
}

/// Run an admitted connection until it closes.
pub async fn run(node: Arc<Node>, hub: Arc<Hub>, mut socket: WebSocket) {
    let (id, socket_id) = node.next_connection();
    let limit = QueueLimit {
        frames: hub.app.outbound_queue,
        bytes: hub.app.outbound_bytes,
    };
    let (conn, mut rx) = Connection::new(id, socket_id, Protocol::Pusher, limit);
    let conn = Arc::new(conn);
    metrics::count(&metrics::CONNECTIONS_OPENED);
    let mut s = Session {
        node: node.clone(),
        hub: hub.clone(),
        conn: conn.clone(),
        channels: Vec::new(),
        user: None,
        inbound: RateWindow::new(),
        client_events: RateWindow::new(),
    };
    conn.send(wire::connection_established(&conn.socket_id, node.config.activity_timeout).into());

    let end = s.run_loop(&mut socket, &mut rx).await;
    // Leave channels first: the closing handshake may wait on the client.
    s.cleanup();
    if let Some((code, message)) = end {
        close(
            &mut socket,
            Some(wire::error(Some(code), &message)),
            code,
            &message,
        )
        .await;
    }
    // Dropping `s` releases the connection (see `Drop for Session`).
}

impl Session {
    /// The select loop. Returns the close to send, or `None` when the
    /// socket is already gone.
    async fn run_loop(
        &mut self,
        socket: &mut WebSocket,
        rx: &mut mpsc::Receiver<Frame>,
    ) -> Option<(u16, String)> {
        let activity = self.node.config.activity_timeout();
        let pong_wait = self.node.config.pong_timeout();
        let write_delay = self.node.config.write_delay();
        let mut last_seen = Instant::now();
        let mut ping_sent: Option<Instant> = None;
        let timer = tokio::time::sleep_until(last_seen + activity);
        tokio::pin!(timer);
        let conn = self.conn.clone();
        let node = self.node.clone();
        // Created once, not per loop turn: registering a waiter takes the
        // Notify's lock, and this loop turns once per delivered batch.
        let close_requested = conn.close_requested();
        tokio::pin!(close_requested);
        let shutdown = node.shutdown.cancelled();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                biased;
                code = &mut close_requested => {
                    return Some((code, close_message(code).into()));
                }
                _ = &mut shutdown => {
                    return Some((code::RECONNECT, close_message(code::RECONNECT).into()));
                }
                msg = socket.recv() => {
                    let msg = match msg {
                        Some(Ok(m)) => m,
                        Some(Err(e)) => return self.socket_error(e),
                        None => return None,
                    };
                    last_seen = Instant::now();
                    ping_sent = None;
                    match self.on_message(msg) {
                        Next::Continue => {}
                        Next::Close(code, message) => return Some((code, message)),
                        Next::Gone => {
                            answer_close(socket).await;
                            return None;
                        }
                    }
                }
                // After reads: a busy channel must not starve the client's pongs.
                frame = rx.recv() => {
                    let frame = frame?;
                    if write_batch(socket, &conn, frame, rx, write_delay).await.is_err() {
                        return None;
                    }
                }
                _ = &mut timer => {
                    let now = Instant::now();
                    match ping_sent {
                        Some(at) if now >= at + pong_wait => {
                            return Some((code::PONG_NOT_RECEIVED, close_message(code::PONG_NOT_RECEIVED).into()));
                        }
                        Some(at) => timer.as_mut().reset(at + pong_wait),
                        None if now >= last_seen + activity => {
                            conn.send(Frame::from_static(wire::ping()));
                            ping_sent = Some(now);
                            timer.as_mut().reset(now + pong_wait);
                        }
                        None => timer.as_mut().reset(last_seen + activity),
                    }
                }
            }
        }
    }

    /// A protocol-level error from the WebSocket layer: invalid UTF-8, a
    /// frame over the size limit, a broken handshake.
    fn socket_error(&self, e: axum::Error) -> Option<(u16, String)> {
        use tokio_tungstenite::tungstenite::Error as WsError;
        metrics::count(&metrics::BAD_MESSAGES);
        let inner = e.into_inner();
        match inner.downcast_ref::<WsError>() {
            Some(WsError::Capacity(c)) => Some((1009, format!("Message too large: {c}"))),
            Some(WsError::Utf8(_)) => Some((1007, "Text frame is not valid UTF-8".into())),
            Some(WsError::Protocol(p)) => Some((1002, format!("WebSocket protocol error: {p}"))),
            _ => None,
        }
    }

    fn on_message(&mut self, msg: Message) -> Next {
        if !self.inbound.allow(self.hub.app.max_messages_per_second) {
            metrics::count(&metrics::RATE_LIMITED);
            return Next::Close(
                code::OVER_CAPACITY,
                format!(
                    "Too many messages: the limit is {} per second",
                    self.hub.app.max_messages_per_second
                ),
            );
        }
        match msg {
            Message::Text(text) => self.on_text(&text),
            Message::Binary(_) => {
                metrics::count(&metrics::BAD_MESSAGES);
                Next::Close(1003, "Binary frames are not supported".into())
            }
            // WebSocket-level ping/pong count as activity; tungstenite answers pings.
            Message::Ping(_) | Message::Pong(_) => Next::Continue,
            Message::Close(_) => Next::Gone,
        }
    }

    fn error(&self, message: &str) {
        metrics::count(&metrics::BAD_MESSAGES);
        self.conn.send(wire::error(None, message).into());
    }

    fn on_text(&mut self, text: &str) -> Next {
        let msg = match wire::parse(text) {
            Ok(m) => m,
            Err(e) => {
                self.error(&e.to_string());
                return Next::Continue;
            }
        };
        match msg {
            ClientMessage::Ping => {
                self.conn.send(Frame::from_static(wire::pong()));
            }
            ClientMessage::Pong => {}
            ClientMessage::Subscribe {
                channel,
                auth,
                channel_data,
            } => self.subscribe(&channel, auth.as_deref(), channel_data.as_deref()),
            ClientMessage::Unsubscribe { channel } => {
                if self.hub.unsubscribe(&self.conn, &channel) {
                    self.channels.retain(|c| **c != *channel);
                }
            }
            ClientMessage::Signin { auth, user_data } => return self.signin(&auth, &user_data),
            ClientMessage::ClientEvent {
                event,
                channel,
                data,
            } => self.client_event(event, channel, data),
        }
        Next::Continue
    }

    fn subscribe(&mut self, channel: &str, auth: Option<&str>, channel_data: Option<&str>) {
        // pusher-js subscribes to its own `#server-to-user-{id}` after
        // sign-in. Delivery to users goes through the hub's user registry,
        // so this only needs confirming, and only for the signed-in user.
        if let Some(user) = channel.strip_prefix(SERVER_TO_USER_PREFIX) {
            if self.user.as_ref().is_some_and(|(id, _)| id == user) {
                self.conn.send(
                    crate::protocol::CoreEvent::SubscriptionSucceeded {
                        channel,
                        presence: None,
                    }
                    .encode(Protocol::Pusher),
                );
            } else {
                metrics::count(&metrics::SUBSCRIPTION_ERRORS);
                let shown: String = channel.chars().take(200).collect();
                self.conn.send(
                    wire::subscription_error(
                        &shown,
                        "AuthError",
                        "Only the signed-in user may subscribe to its #server-to-user channel",
                        401,
                    )
                    .into(),
                );
            }
            return;
        }
        let max = self.hub.app.max_subscriptions_per_connection as usize;
        let already = self.channels.iter().any(|c| **c == *channel);
        if !already && self.channels.len() >= max {
            metrics::count(&metrics::SUBSCRIPTION_ERRORS);
            let msg = format!("Subscription limit reached: at most {max} channels per connection");
            self.conn
                .send(wire::subscription_error(channel, "LimitReached", &msg, 403).into());
            return;
        }
        match self.hub.subscribe(&self.conn, channel, auth, channel_data) {
            Ok(true) => self.channels.push(channel.into()),
            Ok(false) => {}
            Err(e) => {
                metrics::count(&metrics::SUBSCRIPTION_ERRORS);
                // Echo a bounded copy of the name: it may be what was wrong.
                let shown: String = channel.chars().take(200).collect();
                self.conn.send(
                    wire::subscription_error(&shown, e.kind(), &e.to_string(), e.status()).into(),
                );
            }
        }
    }

    fn client_event(
        &mut self,
        event: String,
        channel: String,
        data: Box<serde_json::value::RawValue>,
    ) {
        let app = &self.hub.app;
        if !app.client_events {
            return self.error("Client events are disabled for this app");
        }
        if event.chars().count() > app.max_event_name {
            return self.error(&format!(
                "Event name is longer than {} characters",
                app.max_event_name
            ));
        }
        if data.get().len() > app.max_payload {
            return self.error(&format!(
                "Event data is larger than {} bytes",
                app.max_payload
            ));
        }
        let kind = ChannelKind::of(&channel);
        if !kind.allows_client_events() {
            return self.error(
                "Client events are only allowed on private and presence channels (not encrypted ones)",
            );
        }
        let Some(user_id) = self.hub.subscription(&self.conn, &channel) else {
            return self.error("Client events require a subscription to the channel");
        };
        if !self.client_events.allow(app.client_event_rate) {
            metrics::count(&metrics::RATE_LIMITED);
            self.conn.send(
                wire::error(
                    Some(code::CLIENT_EVENT_RATE_LIMIT),
                    &format!(
                        "Client event rejected: rate limit is {} per second",
                        app.client_event_rate
                    ),
                )
                .into(),
            );
            return;
        }
        self.hub.publish(Publication::new(
            channel,
            event,
            data,
            Some(self.conn.socket_id.to_string()),
            user_id.map(|u| u.to_string()),
        ));
    }

    fn signin(&mut self, auth: &str, user_data: &str) -> Next {
        let app = &self.hub.app;
        let message = signing::user_string(&self.conn.socket_id, user_data);
        if !signing::verify_token(&app.key, &app.secret, auth, &message) {
            return Next::Close(
                code::UNAUTHORIZED,
                "Sign-in failed: invalid signature".into(),
            );
        }
        let (user_id, watchlist) = match parse_user_data(user_data, app.max_presence_user_id) {
            Ok(v) => v,
            Err(e) => return Next::Close(code::UNAUTHORIZED, format!("Sign-in failed: {e}")),
        };
        if let Some((old, old_watch)) = self.user.take() {
            self.hub.sign_out(&self.conn, &old, &old_watch);
        }
        self.conn.send(wire::signin_success(user_data).into());
        let (online, offline) = self.hub.sign_in(&self.conn, &user_id, &watchlist);
        if !watchlist.is_empty() {
            self.conn.send(
                crate::protocol::CoreEvent::Watchlist {
                    online: &online,
                    offline: &offline,
                }
                .encode(Protocol::Pusher),
            );
        }
        self.user = Some((user_id, watchlist));
        Next::Continue
    }

    /// Leave every channel and sign out, so no registry keeps this socket.
    /// Idempotent: runs early (before the closing handshake) and again on drop.
    fn cleanup(&mut self) {
        for channel in std::mem::take(&mut self.channels) {
            self.hub.unsubscribe(&self.conn, &channel);
        }
        if let Some((user, watchlist)) = self.user.take() {
            self.hub.sign_out(&self.conn, &user, &watchlist);
        }
    }
}

/// Unregistering happens on drop, so even a session that ends abnormally
/// (a panic, an aborted task) leaves no stale entry in the hub and gives its
/// connection slot back.
impl Drop for Session {
    fn drop(&mut self) {
        self.cleanup();
        self.hub.release();
        metrics::count(&metrics::CONNECTIONS_CLOSED);
    }
}

/// Most users one watchlist may hold (Pusher's limit).
pub const MAX_WATCHLIST: usize = 100;

/// Parse `user_data` from `pusher:signin`: an object with a string `id`,
/// optional `user_info` and optional `watchlist` of user ids.
fn parse_user_data(text: &str, max_id: usize) -> Result<(String, Vec<String>), String> {
    let value: HashMap<String, Value> =
        serde_json::from_str(text).map_err(|e| format!("user_data is not a JSON object: {e}"))?;
    let id = match value.get("id") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => return Err("user_data.id must be a non-empty string".into()),
    };
    // Pusher counts characters, not bytes: a non-ASCII id is not penalized.
    if id.chars().count() > max_id {
        return Err(format!("user_data.id is longer than {max_id} characters"));
    }
    let watchlist = match value.get("watchlist") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => {
            if items.len() > MAX_WATCHLIST {
                return Err(format!("watchlist holds more than {MAX_WATCHLIST} users"));
            }
            items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Some(s.clone()),
                    Value::Number(n) => Some(n.to_string()),
                    _ => None,
                })
                .map(|id| match id {
                    Some(id) if !id.is_empty() && id.chars().count() <= max_id => Ok(id),
                    _ => Err("watchlist entries must be user ids".to_string()),
                })
                .collect::<Result<_, _>>()?
        }
        Some(_) => return Err("user_data.watchlist must be an array".into()),
    };
    Ok((id, watchlist))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        let p = |v: Option<&str>| ConnectParams {
            protocol: v.map(String::from),
        };
        assert_eq!(check_version(&p(Some("7"))), Ok(()));
        assert_eq!(check_version(&p(None)), Err(code::NO_PROTOCOL_VERSION));
        assert_eq!(check_version(&p(Some("x"))), Err(code::INVALID_VERSION));
        assert_eq!(
            check_version(&p(Some("8"))),
            Err(code::UNSUPPORTED_PROTOCOL)
        );
        assert_eq!(
            check_version(&p(Some("4"))),
            Err(code::UNSUPPORTED_PROTOCOL)
        );
    }

    #[test]
    fn user_data() {
        assert_eq!(
            parse_user_data(r#"{"id":"u1","watchlist":["a","b"]}"#, 128),
            Ok(("u1".into(), vec!["a".into(), "b".into()]))
        );
        assert!(parse_user_data(r#"{"user_info":{}}"#, 128).is_err());
        assert!(parse_user_data(r#"{"id":"u","watchlist":"a"}"#, 128).is_err());
        let many: Vec<String> = (0..101).map(|i| format!("\"{i}\"")).collect();
        let text = format!(r#"{{"id":"u","watchlist":[{}]}}"#, many.join(","));
        assert!(parse_user_data(&text, 128).is_err());
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn user_data_never_panics_and_respects_limits(text in any::<String>(), max in 1usize..200) {
                check_user_data(&text, max);
            }

            #[test]
            fn user_data_shaped_input(
                id in proptest::option::of(any::<String>()),
                num in proptest::option::of(any::<i64>()),
                watch in proptest::option::of(proptest::collection::vec(
                    prop_oneof![
                        any::<String>().prop_map(Value::String),
                        any::<i64>().prop_map(Value::from),
                        Just(Value::Null),
                    ],
                    0..105,
                )),
                max in 1usize..40,
            ) {
                let mut m = serde_json::Map::new();
                if let Some(id) = id { m.insert("id".into(), Value::String(id)); }
                if let Some(n) = num { m.insert("id".into(), Value::from(n)); }
                if let Some(w) = watch { m.insert("watchlist".into(), Value::Array(w)); }
                check_user_data(&Value::Object(m).to_string(), max);
            }

            #[test]
            fn numeric_ids_respect_limits(id in any::<i64>(), watch in proptest::collection::vec(any::<i64>(), 0..3), max in 1usize..24) {
                check_user_data(&serde_json::json!({ "id": id, "watchlist": watch }).to_string(), max);
            }
        }
    }

    fn check_user_data(text: &str, max: usize) {
        if let Ok((id, watchlist)) = parse_user_data(text, max) {
            assert!(!id.is_empty() && id.chars().count() <= max, "{id:?}");
            assert!(watchlist.len() <= MAX_WATCHLIST);
            for w in watchlist {
                assert!(
                    !w.is_empty() && w.chars().count() <= max,
                    "watchlist entry {w:?}"
                );
            }
        }
    }
}
