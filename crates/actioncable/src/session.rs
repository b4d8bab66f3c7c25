//! An Action Cable session (`/cable`): the app's `Connect` before the
//! welcome, then client commands mapped to RPC `Command` calls and their
//! answers applied to the node (streams to core channels, the subscription
//! identifier as the tag), and a queued `Disconnect` when the client leaves.
//! The socket itself (reading, pings, writing, closing) is the core's
//! session loop; this is its Action Cable [`Handler`].
//!
//! Connection state (`cstate`) and each subscription's state (`istate`)
//! are kept here and sent with every call, as AnyCable does: a command
//! carries its own subscription's state, a disconnect every subscription's
//! (identifier → JSON object).
//!
//! Its children extend the one session state: `opening` (the upgrade and
//! who the client is: a restored session, a token, or the app's
//! `Connect`), `env` (what every call tells the app), and the extended
//! protocol's commands: `history` (history answers, restore) and
//! `membership` (presence, whispers).

mod env;
mod history;
mod membership;
mod opening;

pub(crate) use opening::serve_sse;
pub use opening::upgrade;

use crate::ext::resume::Snapshot;
use crate::metrics as m;
use crate::proto::{
    status_of, CommandMessage, CommandResponse, ConnectionRequest, DisconnectRequest, EnvResponse,
    Status,
};
use crate::rpc::RpcError;
use crate::streams::{self, Request as StreamRequest};
use crate::wire::{self, reason, Command, WIRE};
use crate::{Cable, NAMESPACE};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use herald_core::connection::{Connection, Reason};
use herald_core::frame::Frame;
use herald_core::hub::SubscribeOptions;
use herald_core::metrics;
use herald_core::node::Node;
use herald_core::session::{self, Closing, Handler, KeepAlive, Next, Why};
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Action Cable's ping interval.
pub const PING_EVERY: Duration = Duration::from_secs(3);

pub use crate::config::{MAX_STREAMS, MAX_STREAM_NAME};

use env::SessionEnv;
pub use env::MAX_STATE_KEYS;

/// A confirmed subscription and the streams it follows.
///
/// Its lists are boxed to their length: nearly every connection has one
/// subscription of one stream, a `Vec`'s first growth makes room for four
/// (160 bytes of `Sub`s, 96 of stream names, per idle connection), and a
/// boxed list and name are 8 bytes smaller than a `Vec` and a `String`
/// (bench/RESULTS.md "Idle memory"). They change only on the app's
/// answers.
struct Sub {
    identifier: Arc<str>,
    streams: Box<[Box<str>]>,
}

/// Push onto a list boxed to its length.
fn push_boxed<T>(list: &mut Box<[T]>, x: T) {
    let mut v = std::mem::take(list).into_vec();
    v.reserve_exact(1);
    v.push(x);
    *list = v.into_boxed_slice();
}

/// Take element `at` out of a list boxed to its length.
fn remove_boxed<T>(list: &mut Box<[T]>, at: usize) -> T {
    let mut v = std::mem::take(list).into_vec();
    let x = v.remove(at);
    *list = v.into_boxed_slice();
    x
}

/// What few connections use, made on first use: an idle connection would
/// otherwise carry it (about 100 bytes) in its task for its whole life.
struct Rare {
    presence: crate::ext::presence::ConnPresence,
    /// History requests left (`history_rate` per second).
    history: crate::ext::presence::Bucket,
}

/// Every connection's task holds one for the connection's life, so it is
/// kept small: a task is allocated in steps of 128 bytes, and 48 bytes
/// less here (no second `Hub` handle, the index place a flag, the stream
/// count a `u32`) made an idle connection's task one step smaller
/// (bench/RESULTS.md "Idle memory"). The task's future is now exactly at
/// the top of its step (664 bytes; 672 take the next): a field added here
/// costs 128 bytes per connection unless another goes.
struct CableSession {
    /// The node is `cable.node`: a handle of its own here would be 8 more
    /// bytes in every connection's task.
    cable: Arc<Cable>,
    conn: Arc<Connection>,
    env: SessionEnv,
    /// The app's connection identifiers (opaque JSON), echoed in calls;
    /// the remote-command index holds the same text.
    identifiers: Arc<str>,
    /// Boxed to its length, not a `Vec`: 8 bytes less in every task, and
    /// subscriptions change rarely (each change is a call to the app).
    subs: Box<[Sub]>,
    /// Streams followed, over all subscriptions (at most [`MAX_STREAMS`]).
    streams: u32,
    /// Connected through the app: it hears of the disconnect.
    authenticated: bool,
    // --- The extended protocol (`actioncable-v1-ext-json`).
    /// Speaks the extended protocol: positions, history, resumption.
    ext: bool,
    /// Hold live publications of streams added now (a history answer
    /// follows): see `herald_core::connection::gate::Gate`.
    hold: bool,
    /// Presence memberships and the buckets of whispers, presence
    /// commands and history requests, once the client uses one of them.
    rare: Option<Box<Rare>>,
    /// In the index remote disconnects look in, by `identifiers` and
    /// `conn.id`: taken out when dropped.
    indexed: bool,
    /// A stream could not be followed: the cluster's broker did not hold
    /// its interest within `broker.confirm_timeout`. Nothing is confirmed
    /// any more; the session ends with a `disconnect` that asks the client
    /// to reconnect (Action Cable's one retryable answer: its
    /// `reject_subscription` is final).
    broker_away: bool,
}

/// The close "reason" of a session whose stream the broker did not hold
/// in time (see `broker_away`); mapped to a `disconnect` with
/// `reconnect: true` and close 1013, the number never leaves the process.
const CLOSE_BROKER_AWAY: u16 = 4002;

fn broker_away() -> Next {
    metrics::count(&m::CABLE_BROKER_AWAY);
    Next::Close(Why::Reason(Reason::Code(CLOSE_BROKER_AWAY)))
}

impl Handler for CableSession {
    fn app_id(&self) -> &str {
        &self.cable.hub.app.id
    }

    async fn on_text(&mut self, text: String) -> Next {
        if self.broker_away {
            return broker_away();
        }
        let command = match wire::parse(&text) {
            Ok(c) => c,
            Err(e) => {
                // Action Cable has no error message: Rails and AnyCable log
                // and ignore a command they cannot read. So does Herald,
                // counting it (the rate limit bounds a flood of them).
                metrics::count(&metrics::BAD_MESSAGES);
                tracing::debug!(sid = %self.conn.socket_id, error = %e, "ignored client command");
                return Next::Continue;
            }
        };
        // What a restore brings back may change with any of these.
        let mutates = !matches!(
            command,
            Command::Pong
                | Command::History { .. }
                | Command::PresenceInfo { .. }
                | Command::Whisper { .. }
        );
        let next = match command {
            Command::Subscribe { identifier } if self.ext => {
                let next = Box::pin(self.subscribe_with_history(identifier.clone(), &text)).await;
                // A client subscribing again after a reconnect names its
                // member in the subscribe (AnyCable's client does).
                if text.contains("\"presence\"") && self.find(&identifier).is_some() {
                    Box::pin(self.join(&identifier, &text)).await;
                }
                next
            }
            Command::Subscribe { identifier } => self.subscribe(identifier).await,
            Command::History { identifier } => self.history(&identifier, &text).await,
            Command::Pong => Next::Continue,
            // Boxed, the rarer commands: their futures (presence changes
            // publish to the stream) would size every command's future,
            // and a command waits behind `rpc.concurrency` in a storm.
            Command::Unsubscribe { identifier } => Box::pin(self.unsubscribe(&identifier)).await,
            Command::Message { identifier, data } => self.perform(&identifier, data).await,
            Command::Join { identifier } => Box::pin(self.join(&identifier, &text)).await,
            Command::Leave { identifier } => Box::pin(self.leave_presence(&identifier)).await,
            Command::PresenceInfo { identifier } => self.presence_info(&identifier, &text).await,
            Command::Whisper { identifier, data } => {
                Box::pin(self.whisper(&identifier, data)).await
            }
        };
        if mutates {
            self.save();
        }
        if self.broker_away {
            return broker_away();
        }
        next
    }

    fn keepalive(&self) -> KeepAlive {
        KeepAlive::Every(PING_EVERY)
    }

    fn keepalive_frame(&mut self) -> Option<Frame> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Some(Frame::text(&wire::ping(now)))
    }

    fn closing(&mut self, why: &Why) -> Closing {
        let (reason, reconnect, code, message) = match why {
            Why::Reason(Reason::ShuttingDown) => {
                (reason::SERVER_RESTART, true, 1001, "Server restart".into())
            }
            Why::Reason(Reason::SlowConsumer) => {
                (reason::TOO_SLOW, true, 1013, "Client too slow".into())
            }
            Why::Reason(Reason::Terminated) => {
                (reason::REMOTE, false, 1000, "Closed remotely".into())
            }
            // The app was disabled or removed: reconnecting cannot help.
            Why::Reason(Reason::AppClosed) => {
                (reason::UNAUTHORIZED, false, 1000, "App is disabled".into())
            }
            Why::Reason(Reason::KeepAliveTimeout) => {
                (reason::REMOTE, true, 1000, "Keep-alive timeout".into())
            }
            Why::Reason(Reason::RateLimited) => (
                reason::OVER_CAPACITY,
                true,
                1008,
                format!(
                    "Too many messages: the limit is {} per second",
                    self.cable.hub.config().max_messages_per_second
                ),
            ),
            // Not idle-closed today (see `Handler::idle`); mapped anyway.
            Why::Reason(Reason::Idle) => (reason::REMOTE, true, 1000, "Idle".into()),
            // A remote disconnect (crate::remote), as anycable-go sends it.
            Why::Reason(Reason::Code(crate::remote::CLOSE_REMOTE)) => {
                (reason::REMOTE, false, 1000, "Closed remotely".into())
            }
            Why::Reason(Reason::Code(crate::remote::CLOSE_REMOTE_RECONNECT)) => {
                (reason::REMOTE, true, 1000, "Closed remotely".into())
            }
            // 1013: "try again later".
            Why::Reason(Reason::Code(CLOSE_BROKER_AWAY)) => (
                reason::BROKER_UNAVAILABLE,
                true,
                1013,
                "Broker unavailable".into(),
            ),
            Why::Reason(Reason::Code(c)) => (reason::REMOTE, false, *c, "Closed".into()),
            Why::Protocol(e) => (
                reason::INVALID_REQUEST,
                false,
                e.close_code(),
                e.to_string(),
            ),
            Why::Binary => (
                reason::INVALID_REQUEST,
                false,
                1003,
                "Binary frames are not supported".into(),
            ),
            // The app asked to close (`disconnect` in a command answer): it
            // sent its own `disconnect` message among its transmissions.
            Why::Said(c, msg) => {
                return Closing {
                    code: *c,
                    message: msg.clone(),
                    last: None,
                }
            }
        };
        Closing {
            last: Some(Frame::text(&wire::disconnect(reason, reconnect))),
            code,
            message,
        }
    }

    async fn on_close(&mut self) {
        self.cleanup();
    }
}

impl CableSession {
    fn rare(&mut self) -> &mut Rare {
        let cable = &self.cable;
        self.rare.get_or_insert_with(|| {
            Box::new(Rare {
                presence: crate::ext::presence::ConnPresence::new(&cable.presence),
                history: crate::ext::presence::Bucket::full(cable.history.rate),
            })
        })
    }

    /// Presence memberships: (subscription identifier, stream, member id).
    fn joined(&self) -> &[(Arc<str>, String, String)] {
        self.rare.as_ref().map_or(&[], |r| &r.presence.joined)
    }

    fn take_joined(&mut self) -> Vec<(Arc<str>, String, String)> {
        self.rare
            .as_mut()
            .map(|r| std::mem::take(&mut r.presence.joined))
            .unwrap_or_default()
    }

    fn find(&self, identifier: &str) -> Option<usize> {
        self.subs.iter().position(|s| &*s.identifier == identifier)
    }

    fn send(&self, text: &str) {
        self.conn.send(Frame::text(text));
    }

    fn reject(&self, identifier: &str) {
        metrics::count(&metrics::SUBSCRIPTION_ERRORS);
        self.send(&wire::reject(identifier));
    }

    async fn subscribe(&mut self, identifier: String) -> Next {
        if self.find(&identifier).is_some() {
            // Rails and AnyCable ignore a second subscribe (no answer).
            metrics::count(&metrics::BAD_MESSAGES);
            tracing::debug!(sid = %self.conn.socket_id, "already subscribed");
            return Next::Continue;
        }
        let max = self.cable.hub.config().max_subscriptions_per_connection as usize;
        if self.subs.len() >= max {
            tracing::debug!(sid = %self.conn.socket_id, max, "subscription limit reached");
            self.reject(&identifier);
            return Next::Continue;
        }
        match streams::request(&identifier) {
            StreamRequest::NotPubsub => {}
            other => {
                // Boxed: a `$pubsub` stream's path would size the future of
                // every subscribe waiting for the app.
                Box::pin(self.subscribe_stream(identifier, other)).await;
                return Next::Continue;
            }
        }
        if let Some(stream) = self.cable.signed.check(&identifier) {
            Box::pin(self.subscribe_verified(identifier, stream, None)).await;
            return Next::Continue;
        }
        let Some(rpc) = self.cable.rpc.clone() else {
            // Without an RPC server only `$pubsub` streams exist.
            self.reject(&identifier);
            return Next::Continue;
        };
        let req = CommandMessage {
            command: "subscribe".into(),
            identifier: identifier.clone(),
            connection_identifiers: self.identifiers.to_string(),
            data: String::new(),
            env: Some(self.env.for_channel(&identifier)),
        };
        let res = match self.call(&rpc, req).await {
            Some(r) => r,
            None => {
                metrics::count(&m::CABLE_RPC_FAILURES);
                self.reject(&identifier);
                return Next::Continue;
            }
        };
        if status_of(res.status) == Status::Success {
            push_boxed(
                &mut self.subs,
                Sub {
                    identifier: Arc::from(identifier.as_str()),
                    streams: Box::default(),
                },
            );
            self.apply(&identifier, res, true).await
        } else {
            metrics::count(&metrics::SUBSCRIPTION_ERRORS);
            self.apply(&identifier, res, false).await
        }
    }

    /// A `$pubsub` subscription, decided here without the app.
    async fn subscribe_stream(&mut self, identifier: String, req: StreamRequest) {
        let public = matches!(req, StreamRequest::Public(_));
        let stream = match req {
            StreamRequest::Public(s) if self.cable.public_streams => Some(s),
            StreamRequest::Signed(s) => self
                .cable
                .streams_key
                .as_deref()
                .and_then(|k| streams::verify(k, &s)),
            _ => None,
        };
        self.subscribe_verified(identifier, stream, Some(public))
            .await;
    }

    /// A stream subscription the server decided: `stream` verified (or
    /// `None`: rejected); `pubsub` says whether it is a `$pubsub` one
    /// (and public), whose state enables presence and whispers.
    async fn subscribe_verified(
        &mut self,
        identifier: String,
        stream: Option<String>,
        pubsub: Option<bool>,
    ) {
        let Some(stream) = stream else {
            return self.reject(&identifier);
        };
        if stream.len() > MAX_STREAM_NAME || self.streams as usize >= MAX_STREAMS {
            return self.reject(&identifier);
        }
        push_boxed(
            &mut self.subs,
            Sub {
                identifier: Arc::from(identifier.as_str()),
                streams: Box::default(),
            },
        );
        if let Some(public) = pubsub {
            self.pubsub_state(&identifier, &stream, public);
        }
        self.add_stream(&identifier, stream).await;
        if self.broker_away {
            // Not confirmed: the session ends, the client reconnects.
            return;
        }
        self.send(&wire::confirm(&identifier));
    }

    /// A subscription the server decided without the app (`$pubsub`,
    /// Turbo Streams, CableReady): its commands never reach the app.
    fn decided_here(&self, identifier: &str) -> bool {
        !matches!(streams::request(identifier), StreamRequest::NotPubsub)
            || self.cable.signed.handles(identifier)
    }

    async fn unsubscribe(&mut self, identifier: &str) -> Next {
        let Some(at) = self.find(identifier) else {
            metrics::count(&metrics::BAD_MESSAGES);
            tracing::debug!(sid = %self.conn.socket_id, "unsubscribe from an unknown identifier");
            return Next::Continue;
        };
        let pubsub = self.decided_here(identifier);
        let answer = match (&self.cable.rpc, pubsub) {
            (Some(rpc), false) => {
                let rpc = rpc.clone();
                let req = CommandMessage {
                    command: "unsubscribe".into(),
                    identifier: identifier.to_owned(),
                    connection_identifiers: self.identifiers.to_string(),
                    data: String::new(),
                    env: Some(self.env.for_channel(identifier)),
                };
                self.call(&rpc, req).await
            }
            _ => None,
        };
        // The client is gone from this subscription whatever the app says
        // (Action Cable's unsubscribe has no answer to wait for).
        let sub = remove_boxed(&mut self.subs, at);
        for stream in &sub.streams {
            self.leave(&sub.identifier, stream);
        }
        self.leave_joined(identifier).await;
        self.env.forget(identifier);
        match answer {
            Some(res) => self.finish(res),
            None => Next::Continue,
        }
    }

    async fn perform(&mut self, identifier: &str, data: String) -> Next {
        if self.find(identifier).is_none() {
            metrics::count(&metrics::BAD_MESSAGES);
            tracing::debug!(sid = %self.conn.socket_id, "message for an unknown identifier");
            return Next::Continue;
        }
        let Some(rpc) = self.cable.rpc.clone() else {
            return Next::Continue;
        };
        if self.decided_here(identifier) {
            return Next::Continue;
        }
        let req = CommandMessage {
            command: "message".into(),
            identifier: identifier.to_owned(),
            connection_identifiers: self.identifiers.to_string(),
            data,
            env: Some(self.env.for_channel(identifier)),
        };
        match self.call(&rpc, req).await {
            Some(res) => self.apply(identifier, res, true).await,
            None => {
                metrics::count(&m::CABLE_RPC_FAILURES);
                Next::Continue
            }
        }
    }

    /// One RPC command; `None` when it failed (logged and counted), and
    /// for an answer with status ERROR, which AnyCable does not apply either.
    ///
    /// It waits for its place behind `rpc.concurrency`
    /// holding only its request and the wait; the call itself is boxed
    /// once it has the place, as is [`Self::apply`]: inline, both would
    /// size every command's future for the whole wait (3.5 KB per client
    /// in a reconnect storm's queue; bench/RESULTS.md "Idle memory").
    /// Not an `async fn`: that would keep the request twice.
    #[allow(clippy::manual_async_fn)]
    fn call<'a>(
        &'a self,
        rpc: &'a crate::rpc::Rpc,
        req: CommandMessage,
    ) -> impl Future<Output = Option<CommandResponse>> + Send + 'a {
        async move {
            let command = req.command.clone();
            let result = match rpc.slot().await {
                Ok(slot) => Box::pin(rpc.command_in(slot, &self.conn.socket_id, req)).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(res) if status_of(res.status) == Status::Error => {
                    metrics::count(&m::RPC_APP_ERRORS);
                    tracing::warn!(sid = %self.conn.socket_id, command, error = %res.error_msg.chars().take(200).collect::<String>(), "RPC Command: the app answered ERROR");
                    None
                }
                Ok(res) => Some(res),
                Err(e) => {
                    tracing::warn!(sid = %self.conn.socket_id, command, error = %e, "RPC Command failed");
                    log_rpc_error(&e);
                    None
                }
            }
        }
    }

    /// Apply a command's answer for `identifier`: streams (only for a
    /// confirmed subscription), state, transmissions, disconnect.
    fn apply<'a>(
        &'a mut self,
        identifier: &'a str,
        res: CommandResponse,
        streams: bool,
    ) -> Pin<Box<impl Future<Output = Next> + Send + 'a>> {
        Box::pin(self.apply_inner(identifier, res, streams))
    }

    async fn apply_inner(
        &mut self,
        identifier: &str,
        mut res: CommandResponse,
        streams: bool,
    ) -> Next {
        let presence = res.presence.take().filter(|_| streams);
        if streams && self.find(identifier).is_some() {
            if res.stop_streams {
                if let Some(at) = self.find(identifier) {
                    let id = self.subs[at].identifier.clone();
                    let old = std::mem::take(&mut self.subs[at].streams);
                    for s in &old {
                        self.leave(&id, s);
                    }
                }
            } else {
                for s in &res.stopped_streams {
                    self.stop_stream(identifier, s);
                }
            }
            for s in &res.streams {
                self.add_stream(identifier, s.clone()).await;
            }
            if self.broker_away {
                // The app's confirmation would not be true: it is not
                // sent; the session ends, the client reconnects.
                return broker_away();
            }
            if let Some(EnvResponse { istate, .. }) = &res.env {
                if !istate.is_empty() && self.find(identifier).is_some() {
                    self.env.merge_istate(identifier, istate);
                }
            }
        }
        let next = self.finish(res);
        // After the transmissions: a joiner sees its own join after its
        // `confirm_subscription`.
        if let Some(p) = presence {
            self.app_presence(identifier, p).await;
        }
        next
    }

    /// Connection state, transmissions and `disconnect` of an answer.
    fn finish(&mut self, res: CommandResponse) -> Next {
        if let Some(e) = &res.env {
            self.env.merge_cstate(&e.cstate);
        }
        for t in &res.transmissions {
            self.send(t);
        }
        if res.disconnect {
            return Next::Close(Why::Said(1000, "Command Failed".into()));
        }
        Next::Continue
    }

    async fn add_stream(&mut self, identifier: &str, stream: String) {
        if self.broker_away {
            return;
        }
        let Some(at) = self.find(identifier) else {
            return;
        };
        if self.subs[at].streams.iter().any(|s| **s == *stream) {
            return;
        }
        if stream.len() > MAX_STREAM_NAME || self.streams as usize >= MAX_STREAMS {
            tracing::warn!(sid = %self.conn.socket_id, "stream refused: name too long or too many streams");
            return;
        }
        let tag = Some(self.subs[at].identifier.clone());
        let channel = stream.clone();
        if self.ext {
            // Reliable on the engine before the confirmation goes out (a
            // publication on another node right after it gets a position).
            self.cable.reliable.follow(&channel).await;
            if self.hold {
                self.conn.with_gate().hold(&channel, &tag);
            }
        }
        let opts = SubscribeOptions {
            tag: tag.clone(),
            ..SubscribeOptions::default()
        };
        match self
            .cable
            .node
            .subscribe(&self.cable.hub, &self.conn, NAMESPACE, &stream, opts)
            .await
        {
            Ok(_) => {
                push_boxed(&mut self.subs[at].streams, stream.into_boxed_str());
                self.streams += 1;
            }
            Err(e) => {
                if let Some(g) = self.conn.gate() {
                    g.forget(&channel, &tag);
                    self.cable.reliable.unfollow(&channel);
                }
                if matches!(e, herald_core::hub::Refused::Unavailable(_)) {
                    self.broker_away = true;
                }
                tracing::warn!(sid = %self.conn.socket_id, error = %e, "stream refused")
            }
        }
    }

    fn stop_stream(&mut self, identifier: &str, stream: &str) {
        let Some(at) = self.find(identifier) else {
            return;
        };
        if let Some(i) = self.subs[at].streams.iter().position(|s| &**s == stream) {
            remove_boxed(&mut self.subs[at].streams, i);
            let id = self.subs[at].identifier.clone();
            self.leave(&id, stream);
        }
    }

    fn leave(&mut self, identifier: &Arc<str>, stream: &str) {
        let channel = stream.to_owned();
        self.cable.node.unsubscribe(
            &self.cable.hub,
            &self.conn,
            NAMESPACE,
            stream,
            &Some(identifier.clone()),
            false,
        );
        // Only extended-protocol connections have a gate, and follow.
        if let Some(g) = self.conn.gate() {
            g.forget(&channel, &Some(identifier.clone()));
            self.cable.reliable.unfollow(&channel);
        }
        self.streams = self.streams.saturating_sub(1);
    }

    /// What a restore of this session would bring back.
    fn snapshot(&self, subs: &[Sub]) -> Snapshot {
        Snapshot {
            identifiers: self.identifiers.to_string(),
            cstate: self.env.cstate(),
            istate: self.env.istate(),
            subs: subs
                .iter()
                .map(|s| {
                    let streams = s.streams.iter().map(|x| x.to_string()).collect();
                    (s.identifier.to_string(), streams)
                })
                .collect(),
            authenticated: self.authenticated,
            live: None,
        }
    }

    /// Where sessions outlive the process (a cluster engine), write the
    /// snapshot now, so a node killed without closing it loses nothing.
    fn save(&self) {
        let sessions = &self.cable.resumable.sessions;
        if self.ext && sessions.enabled() && sessions.durable() {
            let mut snap = self.snapshot(&self.subs);
            // A live session: not restorable while this node holds it.
            snap.live = Some(self.cable.node.id);
            self.cable.resumable.keep(&self.conn.socket_id, &snap);
        }
    }

    /// Leave every stream and, for a client the app connected, queue its
    /// Disconnect call. Idempotent: runs when the loop ends and on drop.
    fn cleanup(&mut self) {
        self.linger_presence();
        let subs = std::mem::take(&mut self.subs);
        // Keep what a reconnecting client restores (once).
        if std::mem::take(&mut self.ext) && self.cable.resumable.sessions.enabled() {
            let snap = self.snapshot(&subs);
            self.cable.resumable.keep(&self.conn.socket_id, &snap);
        }
        for sub in &subs {
            for s in &sub.streams {
                self.leave(&sub.identifier, s);
            }
        }
        if std::mem::take(&mut self.authenticated) {
            if let Some(queue) = &self.cable.disconnects {
                let req = DisconnectRequest {
                    identifiers: self.identifiers.to_string(),
                    subscriptions: subs.iter().map(|s| s.identifier.to_string()).collect(),
                    env: Some(self.env.for_disconnect()),
                };
                queue.enqueue(&self.cable.node, self.conn.socket_id.to_string(), req);
            }
        }
    }
}

fn log_rpc_error(e: &RpcError) {
    tracing::debug!(error = %e, "RPC error");
}

impl Drop for CableSession {
    fn drop(&mut self) {
        self.cleanup();
        if self.indexed {
            self.cable.identities.remove(&self.identifiers, &self.conn);
        }
        self.cable.hub.release();
    }
}
