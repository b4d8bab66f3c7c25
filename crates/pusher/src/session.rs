//! A Pusher Channels v7 session (`/app/{key}`): the connection handshake,
//! and the mapping from client commands to the node: subscriptions with
//! Pusher's channel rules and HMAC auth, client events, sign-in and
//! watchlists. The socket itself (reading, keep-alive, writing, closing) is
//! the core's session loop; this is its Pusher [`Handler`].

use crate::names::{validate_name, ChannelKind, NAMESPACE, SERVER_TO_USER_PREFIX};
use crate::presence_data::{self, MemberLimits};
use crate::signing;
use crate::wire::{self as wire, code, ClientMessage, NAME as WIRE_NAME, WIRE};
use axum::extract::{Path, Query, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures_util::future::Either;
use herald_core::connection::{Connection, Reason};
use herald_core::frame::Frame;
use herald_core::hub::presence::Member;
use herald_core::hub::{Hub, Refused, SubscribeOptions};
use herald_core::metrics;
use herald_core::node::Node;
use herald_core::observer::Change;
use herald_core::origin;
use herald_core::publication::Publication;
use herald_core::session::{self, Closing, Handler, KeepAlive, Next, RateWindow, Why};
use herald_core::ws::Socket;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

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
        code::INACTIVE => "Closed after inactivity",
        _ => "Connection closed",
    }
}

/// Check the `protocol` query parameter. A connection without one is
/// taken as protocol 7, as Pusher itself and soketi, sockudo, Reverb and
/// AnyCable do (soketi's benchmark script connects that way); a version
/// that is given must be a number Herald speaks.
pub fn check_version(params: &ConnectParams) -> Result<(), u16> {
    let Some(v) = params.protocol.as_deref() else {
        return Ok(());
    };
    let version: u32 = v.parse().map_err(|_| code::INVALID_VERSION)?;
    if (wire::MIN_PROTOCOL_VERSION..=wire::PROTOCOL_VERSION).contains(&version) {
        Ok(())
    } else {
        Err(code::UNSUPPORTED_PROTOCOL)
    }
}

/// `/app/{key}`: upgrade first, then refuse with a Pusher error code if the
/// app or protocol version is wrong, because Pusher clients act on close
/// codes (an HTTP error would make them retry forever).
pub async fn upgrade(
    State(node): State<Arc<Node>>,
    Path(key): Path<String>,
    Query(params): Query<ConnectParams>,
    req: Request,
) -> Response {
    if node.is_draining() {
        return (StatusCode::SERVICE_UNAVAILABLE, "Server is draining").into_response();
    }
    // A page the app does not list is refused as Reverb does (4009),
    // before anything is counted or opened.
    let foreign = node
        .hub_by_key(&key)
        .is_some_and(|h| !origin::check(req.headers(), &h.config().origins, &h.app.id, WIRE_NAME));
    // The closure decides synchronously and returns either future: an
    // `async` block would keep `key`, `params` and the socket twice in every
    // connection's task for its whole life.
    let compression = node
        .hub_by_key(&key)
        .is_some_and(|hub| node.config.compression(&hub.config()));
    herald_core::ws::upgrade(req, &[], compression, move |socket, _| {
        let admitted = match foreign {
            true => Err((code::UNAUTHORIZED, origin::REFUSED_MESSAGE)),
            false => admit(&node, &key, &params).map_err(|c| (c, close_message(c))),
        };
        match admitted {
            Ok(hub) => Either::Left(run(node, hub, socket)),
            // Boxed: a refusal's state is larger than a session's.
            Err((code, message)) => Either::Right(Box::pin(refuse(socket, code, message))),
        }
    })
}

/// The app of `key`, if it exists, speaks this protocol version and takes
/// one more connection; else the Pusher error code to close with.
pub(crate) fn admit(node: &Node, key: &str, params: &ConnectParams) -> Result<Arc<Hub>, u16> {
    let hub = node.hub_by_key(key).ok_or(code::APP_NOT_FOUND)?;
    check_version(params)?;
    hub.admit().map_err(|e| match e {
        Refused::OverLimit(_) => code::OVER_CONNECTION_QUOTA,
        _ => code::APP_DISABLED,
    })?;
    Ok(hub)
}

/// Refuse a connection after the upgrade, as Pusher clients expect: a
/// `pusher:error` with the code, then a close with the same code.
async fn refuse(socket: Socket, code: u16, message: &'static str) {
    let frames = [
        Frame::text(&wire::error(Some(code), message)),
        Frame::close(code, message),
    ];
    session::refuse(socket, &frames).await;
}

/// Run an admitted connection until it closes, on an upgraded socket or on
/// an HTTP transport's relay (`crate::xhr`): the session is the same.
pub(crate) fn run<S>(node: Arc<Node>, hub: Arc<Hub>, socket: S) -> impl Future<Output = ()> + Send
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (id, socket_id) = node.next_connection();
    let session::Opened {
        conn,
        settings,
        shutdown,
    } = session::open(&node, &hub, id, socket_id, &WIRE);
    conn.send(Frame::text(&wire::connection_established(
        &conn.socket_id,
        node.config.activity_timeout,
    )));
    let s = PusherSession {
        node,
        hub,
        conn: conn.clone(),
        channels: Vec::new(),
        user: None,
        client_events: RateWindow::new(),
    };
    // Dropping the session releases the connection (see `Drop`).
    session::run(socket, conn, s, settings, shutdown)
}

/// Per-connection state only the session touches.
struct PusherSession {
    node: Arc<Node>,
    hub: Arc<Hub>,
    conn: Arc<Connection>,
    /// Subscribed channel names.
    channels: Vec<Box<str>>,
    /// Signed-in user id and watchlist (boxed: most connections never
    /// sign in, and this struct is part of every connection's task).
    user: Option<Box<(String, Vec<String>)>>,
    client_events: RateWindow,
}

impl Handler for PusherSession {
    async fn on_text(&mut self, text: String) -> Next {
        let msg = match wire::parse(&text) {
            Ok(m) => m,
            Err(e) => {
                self.error(&e.to_string());
                return Next::Continue;
            }
        };
        match msg {
            ClientMessage::Ping => {
                self.conn.send(Frame::text(wire::pong()));
            }
            ClientMessage::Pong => {}
            ClientMessage::Subscribe {
                channel,
                auth,
                channel_data,
            } => {
                self.subscribe(&channel, auth.as_deref(), channel_data.as_deref())
                    .await
            }
            ClientMessage::Unsubscribe { channel } => {
                if self
                    .node
                    .unsubscribe(&self.hub, &self.conn, NAMESPACE, &channel, &None, false)
                {
                    self.channels.retain(|c| **c != *channel);
                }
            }
            ClientMessage::Signin { auth, user_data } => return self.signin(&auth, &user_data),
            ClientMessage::ClientEvent {
                event,
                channel,
                data,
            } => self.client_event(event, channel, data).await,
        }
        Next::Continue
    }

    fn keepalive(&self) -> KeepAlive {
        KeepAlive::WhenIdle {
            idle: self.node.config.activity_timeout(),
            wait: self.node.config.pong_timeout(),
        }
    }

    fn keepalive_frame(&mut self) -> Option<Frame> {
        Some(Frame::text(wire::ping()))
    }

    fn closing(&mut self, why: &Why) -> Closing {
        let (code, message) = match why {
            Why::Reason(Reason::SlowConsumer) => (
                code::OVER_CAPACITY,
                close_message(code::OVER_CAPACITY).to_owned(),
            ),
            Why::Reason(Reason::Terminated) => (
                code::UNAUTHORIZED,
                close_message(code::UNAUTHORIZED).to_owned(),
            ),
            Why::Reason(Reason::ShuttingDown) => {
                (code::RECONNECT, close_message(code::RECONNECT).to_owned())
            }
            // Disabled or removed while open: as a disabled app's refusal.
            Why::Reason(Reason::AppClosed) => (
                code::APP_DISABLED,
                close_message(code::APP_DISABLED).to_owned(),
            ),
            Why::Reason(Reason::KeepAliveTimeout) => (
                code::PONG_NOT_RECEIVED,
                close_message(code::PONG_NOT_RECEIVED).to_owned(),
            ),
            Why::Reason(Reason::RateLimited) => (
                code::OVER_CAPACITY,
                format!(
                    "Too many messages: the limit is {} per second",
                    self.hub.config().max_messages_per_second
                ),
            ),
            // Pusher sessions are never idle-closed (pings decide), but
            // the reason has Pusher's own code.
            Why::Reason(Reason::Idle) => (code::INACTIVE, close_message(code::INACTIVE).to_owned()),
            Why::Reason(Reason::Code(c)) => (*c, close_message(*c).to_owned()),
            Why::Protocol(e) => (e.close_code(), e.to_string()),
            Why::Binary => (1003, "Binary frames are not supported".to_owned()),
            Why::Said(c, m) => (*c, m.clone()),
        };
        Closing {
            last: Some(Frame::text(&wire::error(Some(code), &message))),
            code,
            message,
        }
    }

    async fn on_close(&mut self) {
        self.cleanup();
    }

    fn app_id(&self) -> &str {
        &self.hub.app.id
    }
}

impl PusherSession {
    fn error(&self, message: &str) {
        metrics::count(&metrics::BAD_MESSAGES);
        self.conn.send(Frame::text(&wire::error(None, message)));
    }

    fn reject_client_event(&self, reason: &'static str, message: &str) {
        metrics::client_event_rejected(&self.hub.app.id, WIRE_NAME, reason);
        self.error(message);
    }

    fn subscription_error(&self, channel: &str, kind: &str, message: &str, status: u16) {
        metrics::count(&metrics::SUBSCRIPTION_ERRORS);
        // Echo a bounded copy of the name: it may be what was wrong.
        let shown: String = channel.chars().take(200).collect();
        self.conn.send(Frame::text(&wire::subscription_error(
            &shown, kind, message, status,
        )));
    }

    async fn subscribe(&mut self, channel: &str, auth: Option<&str>, channel_data: Option<&str>) {
        // pusher-js subscribes to its own `#server-to-user-{id}` after
        // sign-in. Delivery to users goes through the users registry, so
        // this only needs confirming, and only for the signed-in user.
        if let Some(user) = channel.strip_prefix(SERVER_TO_USER_PREFIX) {
            if self.user.as_ref().is_some_and(|u| u.0 == user) {
                // Events for the user from other nodes come through the
                // broker: confirmed, like any subscription, only while it
                // holds the node's interest (bounded wait, then retryable).
                let broker = &self.node.broker;
                if !broker.holding()
                    && !broker.held(self.node.config.broker.confirm_timeout()).await
                {
                    metrics::count(&metrics::CONFIRMATIONS_REFUSED);
                    let msg =
                        "The cluster's broker is not reachable from this node; subscribe again";
                    return self.subscription_error(channel, "ServiceUnavailable", msg, 503);
                }
                self.conn
                    .send(Frame::text(&wire::subscription_succeeded(channel, None)));
            } else {
                self.subscription_error(
                    channel,
                    "AuthError",
                    "Only the signed-in user may subscribe to its #server-to-user channel",
                    401,
                );
            }
            return;
        }
        let max = self.hub.config().max_subscriptions_per_connection as usize;
        let already = self.channels.iter().any(|c| **c == *channel);
        if !already && self.channels.len() >= max {
            let msg = format!("Subscription limit reached: at most {max} channels per connection");
            return self.subscription_error(channel, "LimitReached", &msg, 403);
        }
        let opts = match self.check(channel, auth, channel_data) {
            Ok(o) => o,
            Err((kind, message, status)) => {
                return self.subscription_error(channel, kind, &message, status)
            }
        };
        match self
            .node
            .subscribe(&self.hub, &self.conn, NAMESPACE, channel, opts)
            .await
        {
            Ok(j) if j.new => self.channels.push(channel.into()),
            Ok(_) => {}
            Err(e) => {
                let (kind, status) = match &e {
                    Refused::Unauthorized(_) => ("AuthError", 401),
                    Refused::Invalid(_) | Refused::NotFound(_) => ("InvalidChannel", 400),
                    Refused::OverLimit(_) => ("LimitReached", 403),
                    // Retryable: subscribe again (pusher-js does on its
                    // next connection; an app may at once).
                    Refused::Unavailable(_) => ("ServiceUnavailable", 503),
                };
                self.subscription_error(channel, kind, &e.to_string(), status);
            }
        }
    }

    /// Pusher's rules for a subscription: a valid name, a valid signature
    /// for private and presence channels, valid `channel_data`. Gives the
    /// core's options, or the error's type, message and status.
    fn check(
        &self,
        channel: &str,
        auth: Option<&str>,
        channel_data: Option<&str>,
    ) -> Result<SubscribeOptions, (&'static str, String, u16)> {
        let app = self.hub.config();
        validate_name(channel, app.max_channel_name)
            .map_err(|e| ("InvalidChannel", e.to_string(), 400))?;
        let kind = ChannelKind::of(channel);
        let mut member = None;
        if kind.needs_auth {
            let auth = auth.ok_or_else(|| {
                (
                    "AuthError",
                    format!("subscribing to {channel} requires auth"),
                    401,
                )
            })?;
            let data = if kind.presence {
                Some(channel_data.ok_or_else(|| {
                    (
                        "InvalidChannelData",
                        "presence channels require channel_data".to_owned(),
                        400,
                    )
                })?)
            } else {
                None
            };
            let message = signing::channel_string(&self.conn.socket_id, channel, data);
            if !signing::verify_token(&app.key, &app.secret, auth, &message) {
                return Err(("AuthError", format!("invalid signature for {channel}"), 401));
            }
            if let Some(text) = data {
                let limits = MemberLimits {
                    max_user_id: app.max_presence_user_id,
                    max_user_info: app.max_presence_user_info,
                };
                let m = presence_data::parse_channel_data(text, &limits)
                    .map_err(|e| ("InvalidChannelData", e, 400))?;
                member = Some(Member {
                    user_id: m.user_id,
                    info: m.user_info,
                });
            }
        }
        Ok(SubscribeOptions {
            tag: None,
            pattern: false,
            member,
            max_members: app.max_presence_members,
            cache: kind.cache,
            count: app.subscription_count && !kind.presence,
        })
    }

    async fn client_event(
        &mut self,
        event: String,
        channel: String,
        data: Box<serde_json::value::RawValue>,
    ) {
        let app = self.hub.config();
        if !app.client_events {
            return self.reject_client_event("disabled", "Client events are disabled for this app");
        }
        if event.chars().count() > app.max_event_name {
            return self.reject_client_event(
                "too_large",
                &format!(
                    "Event name is longer than {} characters",
                    app.max_event_name
                ),
            );
        }
        if data.get().len() > app.max_payload {
            return self.reject_client_event(
                "too_large",
                &format!("Event data is larger than {} bytes", app.max_payload),
            );
        }
        let kind = ChannelKind::of(&channel);
        if !kind.allows_client_events() {
            return self.reject_client_event(
                "channel_type",
                "Client events are only allowed on private and presence channels (not encrypted ones)",
            );
        }
        let Some(user_id) = self
            .hub
            .subscription(&self.conn, NAMESPACE, &channel, &None)
        else {
            return self.reject_client_event(
                "not_subscribed",
                "Client events require a subscription to the channel",
            );
        };
        if !self.client_events.allow(app.client_event_rate) {
            metrics::count(&metrics::RATE_LIMITED);
            metrics::client_event_rejected(&app.id, WIRE_NAME, "rate_limited");
            let rate = app.client_event_rate;
            self.conn.send(Frame::text(&wire::error(
                Some(code::CLIENT_EVENT_RATE_LIMIT),
                &format!("Client event rejected: rate limit is {rate} per second"),
            )));
            return;
        }
        let p = Publication::new(NAMESPACE, channel, event, data)
            .sent_by(self.conn.socket_id.to_string())
            .from_user(user_id.map(|u| u.to_string()))
            .cached(kind.cache);
        self.node
            .notify(&self.hub, NAMESPACE, &Change::ClientEvent(&p));
        // A client event has no acknowledgement: refused (the broker's
        // outbox full), it is counted (herald_broker_refused_total).
        let _ = self.node.publish(&self.hub, p).await;
    }

    fn signin(&mut self, auth: &str, user_data: &str) -> Next {
        let app = self.hub.config();
        let message = signing::user_string(&self.conn.socket_id, user_data);
        if !signing::verify_token(&app.key, &app.secret, auth, &message) {
            return Next::Close(Why::Said(
                code::UNAUTHORIZED,
                "Sign-in failed: invalid signature".into(),
            ));
        }
        let (user_id, watchlist) = match parse_user_data(user_data, app.max_presence_user_id) {
            Ok(v) => v,
            Err(e) => {
                return Next::Close(Why::Said(
                    code::UNAUTHORIZED,
                    format!("Sign-in failed: {e}"),
                ))
            }
        };
        if let Some(signed) = self.user.take() {
            let (old, old_watch) = *signed;
            self.node.sign_out(&self.hub, &self.conn, &old, &old_watch);
        }
        self.conn
            .send(Frame::text(&wire::signin_success(user_data)));
        let (online, offline) = self
            .node
            .sign_in(&self.hub, &self.conn, &user_id, &watchlist);
        if !watchlist.is_empty() {
            self.conn.send(Frame::text(&wire::watchlist_events(&[
                ("online", &online),
                ("offline", &offline),
            ])));
        }
        self.user = Some(Box::new((user_id, watchlist)));
        Next::Continue
    }

    /// Leave every channel and sign out, so no registry keeps this socket.
    /// Idempotent: runs when the loop ends and again on drop.
    fn cleanup(&mut self) {
        for channel in std::mem::take(&mut self.channels) {
            self.node
                .unsubscribe(&self.hub, &self.conn, NAMESPACE, &channel, &None, false);
        }
        if let Some(signed) = self.user.take() {
            let (user, watchlist) = *signed;
            self.node.sign_out(&self.hub, &self.conn, &user, &watchlist);
        }
    }
}

/// Unregistering happens on drop, so even a session that ends abnormally
/// (a panic, an aborted task) leaves no stale entry in the hub and gives its
/// connection slot back.
impl Drop for PusherSession {
    fn drop(&mut self) {
        self.cleanup();
        self.hub.release();
    }
}

/// Most users one watchlist may hold (Pusher's limit).
pub const MAX_WATCHLIST: usize = 100;

/// Parse `user_data` from `pusher:signin`: an object with a string `id`,
/// optional `user_info` and optional `watchlist` of user ids.
fn parse_user_data(text: &str, max_id: usize) -> Result<(String, Vec<String>), String> {
    // Ids as raw JSON, so numbers keep every digit (see presence_data).
    let value: HashMap<String, Box<RawValue>> =
        serde_json::from_str(text).map_err(|e| format!("user_data is not a JSON object: {e}"))?;
    let id = match value.get("id").and_then(|v| presence_data::id_text(v)) {
        Some(s) if !s.is_empty() => s,
        _ => return Err("user_data.id must be a non-empty string".into()),
    };
    // Pusher counts characters, not bytes: a non-ASCII id is not penalized.
    if id.chars().count() > max_id {
        return Err(format!("user_data.id is longer than {max_id} characters"));
    }
    let watchlist = match value.get("watchlist").map(|v| v.get()) {
        None | Some("null") => Vec::new(),
        Some(list) => {
            let items: Vec<Box<RawValue>> = serde_json::from_str(list)
                .map_err(|_| "user_data.watchlist must be an array".to_string())?;
            if items.len() > MAX_WATCHLIST {
                return Err(format!("watchlist holds more than {MAX_WATCHLIST} users"));
            }
            items
                .iter()
                .map(|v| match presence_data::id_text(v) {
                    Some(id) if !id.is_empty() && id.chars().count() <= max_id => Ok(id),
                    _ => Err("watchlist entries must be user ids".to_string()),
                })
                .collect::<Result<_, _>>()?
        }
    };
    Ok((id, watchlist))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn signin_ids_keep_every_digit() {
        let text = r#"{"id":1180591620717411303424,"watchlist":[9007199254740993,"b"]}"#;
        let (id, watchlist) = parse_user_data(text, 128).unwrap();
        assert_eq!(id, "1180591620717411303424");
        assert_eq!(watchlist, ["9007199254740993", "b"]);
        assert!(parse_user_data("[1,2]", 128).is_err());
        assert!(parse_user_data(r#"{"id":"u","watchlist":"u2"}"#, 128).is_err());
    }

    #[test]
    fn versions() {
        let p = |v: Option<&str>| ConnectParams {
            protocol: v.map(String::from),
        };
        assert_eq!(check_version(&p(Some("7"))), Ok(()));
        // No version at all: protocol 7, as Pusher and its peers take it.
        assert_eq!(check_version(&p(None)), Ok(()));
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
