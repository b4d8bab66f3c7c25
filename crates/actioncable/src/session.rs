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
//! About 930 lines: the connect path, the commands and their RPC
//! answers share this one session state; the extended protocol's part
//! lives in `session/ext.rs` (history, restore) and `session/presence.rs`
//! (presence, whispers).

mod env;
mod ext;
mod presence;

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
use herald_core::ws::Socket;
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Action Cable's ping interval.
pub const PING_EVERY: Duration = Duration::from_secs(3);

/// Most streams one connection may follow (over all its subscriptions).
pub const MAX_STREAMS: usize = 1000;

/// Longest stream name, in bytes.
pub const MAX_STREAM_NAME: usize = 1024;

use env::SessionEnv;
pub use env::MAX_STATE_KEYS;

/// What the client's upgrade request tells the app.
struct Request0 {
    /// The URL, the client's address and the forwarded headers, as the
    /// session keeps them for every call.
    env: SessionEnv,
    /// A JWT from the `x-<param>` header or the `<param>` query parameter.
    token: Option<String>,
    /// Issue 19: the `sid` of a session to restore (`?sid=` or the
    /// `x-anycable-restore-sid` header, as anycable-go reads them).
    restore: Option<String>,
}

/// `/cable`: upgrade, then ask the app who this is.
pub async fn upgrade(
    State(node): State<Arc<Node>>,
    Extension(cable): Extension<Arc<Cable>>,
    req: Request,
) -> Response {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    if node.is_draining() {
        return (StatusCode::SERVICE_UNAVAILABLE, "Server is draining").into_response();
    }
    // A page the app does not list never reaches the app's `Connect`
    // (which would authenticate it by the visitor's cookies): HTTP 403 at
    // the upgrade, as AnyCable answers.
    let hub = &cable.hub;
    if !herald_core::origin::check(
        req.headers(),
        &hub.config().origins,
        &hub.app.id,
        "actioncable",
    ) {
        return (StatusCode::FORBIDDEN, herald_core::origin::REFUSED_MESSAGE).into_response();
    }
    let info = request_info(&node, &cable, req.headers(), req.uri(), peer);
    herald_core::ws::upgrade(req, wire::PROTOCOLS, move |socket, protocol| {
        let ext = protocol == Some(crate::ext::PROTOCOL);
        start(node, cable, socket, info, ext)
    })
}

/// A connection's life: its opening (who it is: a restored session, a
/// token or the app's `Connect`), then its session. The opening is boxed:
/// its state is larger than the session's (the request, the call, the
/// refusals); boxed, it is freed once the connection is open, and the task
/// keeps only the session. A client the app must `Connect` first waits
/// for its place behind `rpc.concurrency` here, before the opening is
/// built: in a reconnect storm thousands wait, each holding only its
/// request and this small future, not the opening (1.2 KB) and its call.
fn start(
    node: Arc<Node>,
    cable: Arc<Cable>,
    socket: Socket,
    info: Request0,
    ext: bool,
) -> impl std::future::Future<Output = ()> + Send {
    // Both stages boxed and built out here: what the block captures stays
    // in the task beside the session for the session's whole life.
    // It yields the opening unawaited on purpose: awaited inside, the
    // opening's state would be part of this small box.
    #[allow(clippy::async_yields_async)]
    let waiting = Box::pin(async move {
        let slot = match &cable.rpc {
            Some(rpc) if needs_connect(&cable, &info, ext) => Some(rpc.slot().await),
            _ => None,
        };
        Box::pin(open(node, cable, socket, info, ext, slot))
    });
    async move {
        let opening = waiting.await;
        // Not `if let`: its scrutinee would stay in the task beside the
        // session for the session's whole life.
        let Some(open) = opening.await else { return };
        open.run().await
    }
}

/// Whether the opening will call the app's `Connect`: not for a session
/// restored or a client identified by its token (either may still fall
/// back to `Connect`; the opening then waits for its slot itself).
fn needs_connect(cable: &Cable, info: &Request0, ext: bool) -> bool {
    let restoring = ext && info.restore.is_some();
    let token = cable.jwt.is_some() && info.token.is_some();
    !restoring && !token
}

/// An opened connection, ready for its session.
struct Open {
    socket: Socket,
    session: CableSession,
    opened: session::Opened,
}

impl Open {
    fn run(self) -> impl std::future::Future<Output = ()> + Send {
        let session::Opened {
            conn,
            settings,
            shutdown,
        } = self.opened;
        session::run(self.socket, conn, self.session, settings, shutdown)
    }
}

fn request_info(
    node: &Node,
    cable: &Cable,
    headers: &HeaderMap,
    uri: &axum::http::Uri,
    peer: Option<SocketAddr>,
) -> Request0 {
    let scheme = if node.config.tls_cert.is_some() {
        "https"
    } else {
        "http"
    };
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut forwarded: Vec<(&str, &str)> = Vec::new();
    for name in &cable.headers {
        if let Some(v) = headers.get(name.as_str()).and_then(|v| v.to_str().ok()) {
            if !v.is_empty() && !forwarded.iter().any(|(k, _)| *k == name) {
                forwarded.push((name, v));
            }
        }
    }
    let token = cable.jwt.as_ref().and_then(|j| {
        headers
            .get(j.header.as_str())
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .or_else(|| {
                form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
                    .find(|(k, _)| *k == j.param)
                    .map(|(_, v)| v.into_owned())
            })
            .filter(|t| !t.is_empty())
    });
    let restore = headers
        .get("x-anycable-restore-sid")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| {
            form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
                .find(|(k, _)| k == "sid")
                .map(|(_, v)| v.into_owned())
        })
        .filter(|s| !s.is_empty() && s.len() <= 128);
    Request0 {
        env: SessionEnv::new(
            format!("{scheme}://{host}{path}"),
            &forwarded,
            peer.map(|p| p.ip()),
        ),
        token,
        restore,
    }
}

/// Issue 32: who a restore request's own token says the client is. The
/// `sid` alone restores, as in AnyCable (no token: `Ok(None)`); a token
/// signed with the secret, even expired (a restore is what spares the
/// client a fresh one), must name the session's identity
/// (`Ok(Some(identifiers))`); a token that does not verify restores
/// nothing (`Err`): the connection then goes the token's usual way.
fn restore_claim(cable: &Cable, token: Option<&str>) -> Result<Option<String>, ()> {
    let (Some(j), Some(token)) = (&cable.jwt, token) else {
        return Ok(None);
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    match crate::jwt::identify(&j.secret, token, now) {
        crate::jwt::Identity::Valid(ids) | crate::jwt::Identity::Expired(Some(ids)) => {
            Ok(Some(ids))
        }
        _ => {
            metrics::count(&m::CABLE_RESTORES_REFUSED);
            Err(())
        }
    }
}

/// Write `frames` and a close, give the client a moment to read them, and
/// drop the socket (a connection refused before its session started).
/// Refuse the connection; nothing is left to run. Boxed: the opening's
/// future would otherwise be sized for the refusal's state too.
fn refuse(
    socket: Socket,
    frames: Vec<Frame>,
    code: u16,
    message: &'static str,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<Open>> + Send>> {
    Box::pin(async move {
        let mut all = frames;
        all.push(Frame::close(code, message));
        session::refuse(socket, &all).await;
        None
    })
}

fn text_frames(transmissions: &[String]) -> Vec<Frame> {
    transmissions.iter().map(|t| Frame::text(t)).collect()
}

async fn open(
    node: Arc<Node>,
    cable: Arc<Cable>,
    socket: Socket,
    info: Request0,
    ext: bool,
    slot: Option<Result<crate::rpc::Slot, RpcError>>,
) -> Option<Open> {
    let hub = cable.hub.clone();
    if hub.admit().is_err() {
        let bye = Frame::text(&wire::disconnect(reason::OVER_CAPACITY, true));
        return refuse(socket, vec![bye], 1013, "Over capacity").await;
    }
    let (id, sid) = node.next_connection();
    // Issue 19: a resumable session's sid carries a random part, so a
    // session cannot be restored by guessing its number.
    let sid = if ext {
        format!("{sid}.{:032x}", rand::random::<u128>())
    } else {
        sid
    };
    let mut env = info.env;
    let mut identifiers = String::new();
    let mut welcome = Vec::new();
    let mut authenticated = false;
    let mut identified = false;
    // Issue 19: a session restored from the cache skips JWT and Connect.
    let restored = match info.restore.as_deref() {
        Some(prev) if ext => match restore_claim(&cable, info.token.as_deref()) {
            Ok(claim) => cable.reliable.restore(&node, prev, claim.as_deref()).await,
            Err(()) => None,
        },
        _ => None,
    };
    if let Some(snap) = &restored {
        identifiers = snap.identifiers.clone();
        env.restore(&snap.cstate, &snap.istate);
        authenticated = snap.authenticated && cable.rpc.is_some();
        identified = true;
        metrics::count(&m::CABLE_SESSIONS_RESTORED);
        let ids: Vec<&str> = snap.subs.iter().map(|(i, _)| i.as_str()).collect();
        welcome.push(Frame::text(&crate::ext::welcome_restored(&sid, &ids)));
    } else if let Some(j) = &cable.jwt {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        match info
            .token
            .as_deref()
            .map(|t| crate::jwt::identify(&j.secret, t, now))
        {
            Some(crate::jwt::Identity::Valid(ids)) => {
                identifiers = ids;
                welcome.push(Frame::text(&wire::welcome(&sid)));
                // The app hears of the client when it leaves, as AnyCable does.
                authenticated = cable.rpc.is_some();
                identified = true;
            }
            None if !j.force => {}
            other => {
                hub.release();
                metrics::count(&m::CABLE_UNAUTHORIZED);
                let why = match other {
                    Some(crate::jwt::Identity::Expired(_)) => "token_expired",
                    _ => reason::UNAUTHORIZED,
                };
                tracing::debug!(sid, ?other, "JWT refused");
                let bye = Frame::text(&wire::disconnect(why, false));
                return refuse(socket, vec![bye], 1000, "Auth Failed").await;
            }
        }
    }
    if identified {
        // Identified by its token: no Connect call.
    } else if let Some(rpc) = &cable.rpc {
        let req = ConnectionRequest {
            env: Some(env.for_connect()),
        };
        let slot = match slot {
            Some(slot) => slot,
            None => Box::pin(rpc.slot()).await,
        };
        // Boxed: the call's future lives only while the call does.
        let answer = match slot {
            Ok(slot) => Box::pin(rpc.connect_in(slot, &sid, req)).await,
            Err(e) => Err(e),
        };
        match answer {
            Ok(res) => match status_of(res.status) {
                Status::Success => {
                    identifiers = res.identifiers;
                    if let Some(e) = &res.env {
                        env.merge_cstate(&e.cstate);
                    }
                    welcome = text_frames(&res.transmissions);
                    authenticated = true;
                }
                Status::Failure => {
                    hub.release();
                    metrics::count(&m::CABLE_UNAUTHORIZED);
                    // The app's own words (its `disconnect` message), as
                    // AnyCable passes them; no Disconnect call follows.
                    let mut frames = text_frames(&res.transmissions);
                    if frames.is_empty() {
                        frames.push(Frame::text(&wire::disconnect(reason::UNAUTHORIZED, false)));
                    }
                    return refuse(socket, frames, 1000, "Auth Failed").await;
                }
                Status::Error => {
                    hub.release();
                    metrics::count(&m::RPC_APP_ERRORS);
                    metrics::count(&m::CABLE_RPC_FAILURES);
                    tracing::warn!(sid, error = %res.error_msg.chars().take(200).collect::<String>(), "RPC Connect: the app answered ERROR");
                    let bye = Frame::text(&wire::disconnect(reason::RPC_ERROR, true));
                    return refuse(socket, vec![bye], 1011, "Auth Error").await;
                }
            },
            Err(e) => {
                hub.release();
                metrics::count(&m::CABLE_RPC_FAILURES);
                tracing::warn!(sid, error = %e, "RPC Connect failed");
                let bye = Frame::text(&wire::disconnect(reason::RPC_ERROR, true));
                return refuse(socket, vec![bye], 1011, "RPC unavailable").await;
            }
        }
    } else {
        welcome.push(Frame::text(&wire::welcome(&sid)));
    }
    let wire: &'static dyn herald_core::publication::Wire =
        if ext { &crate::ext::EXT_WIRE } else { &WIRE };
    let session::Opened {
        conn,
        settings,
        shutdown,
    } = session::open(&node, &hub, id, sid, wire);
    if ext {
        let gate = conn.with_gate();
        gate.allow_burst(cable.reliable.answer_room);
        if cable.reliable.history.shared() {
            gate.heal_with(healer(&cable.reliable.history, &conn));
        }
    }
    for f in welcome {
        conn.send(f);
    }
    // One copy of the identifiers, shared by the session and the
    // remote-command index.
    let identifiers: Arc<str> = Arc::from(identifiers);
    let indexed = cable.identities.add(&identifiers, &conn);
    let mut s = CableSession {
        cable,
        conn: conn.clone(),
        env,
        identifiers,
        subs: Box::default(),
        streams: 0,
        authenticated,
        ext,
        hold: false,
        rare: None,
        indexed,
        broker_away: false,
    };
    if let Some(snap) = restored {
        // Boxed: the restore's state would otherwise size the opening.
        Box::pin(s.restore(snap)).await;
    }
    s.save();
    Some(Open {
        socket,
        session: s,
        opened: session::Opened {
            conn,
            settings,
            shutdown,
        },
    })
}

/// Fills a gap in a reliable stream's live offsets (publications from
/// several nodes crossed, or the broker lost one) from the shared history,
/// off the fan-out worker. See `herald_core::connection::gate::Gate`.
fn healer(
    history: &Arc<dyn herald_core::history::History>,
    conn: &Arc<Connection>,
) -> herald_core::connection::gate::Healer {
    let history = history.clone();
    let conn = Arc::downgrade(conn);
    Box::new(move |gap| {
        let history = history.clone();
        let conn = conn.clone();
        tokio::spawn(async move {
            let read = history.after(&gap.channel, &gap.epoch, gap.after).await;
            let Some(conn) = conn.upgrade() else { return };
            let Some(gate) = conn.gate() else { return };
            metrics::count(if read.is_ok() {
                &m::CABLE_GAPS_FILLED
            } else {
                &m::CABLE_GAPS_UNFILLED
            });
            let identifier = gap.tag.as_deref().unwrap_or_default();
            gate.release(
                &conn,
                &gap.channel,
                &gap.tag,
                read.as_ref().ok(),
                |e, epoch| crate::ext::entry_frame(identifier, &gap.channel, epoch, e),
            );
        });
    })
}

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
    presence: crate::presence::ConnPresence,
    /// History requests left (`history_rate` per second).
    history: crate::presence::Bucket,
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
    // --- Issue 19 (`actioncable-v1-ext-json`).
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
                presence: crate::presence::ConnPresence::new(&cable.presence),
                history: crate::presence::Bucket::full(cable.reliable.history_rate),
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
        self.pubsub_state(&identifier, &stream, public);
        self.add_stream(&identifier, stream).await;
        if self.broker_away {
            // Not confirmed: the session ends, the client reconnects.
            return;
        }
        self.send(&wire::confirm(&identifier));
    }

    async fn unsubscribe(&mut self, identifier: &str) -> Next {
        let Some(at) = self.find(identifier) else {
            metrics::count(&metrics::BAD_MESSAGES);
            tracing::debug!(sid = %self.conn.socket_id, "unsubscribe from an unknown identifier");
            return Next::Continue;
        };
        let pubsub = !matches!(streams::request(identifier), StreamRequest::NotPubsub);
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
        if !matches!(streams::request(identifier), StreamRequest::NotPubsub) {
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
    fn snapshot(&self, subs: &[Sub]) -> crate::reliable::Snapshot {
        crate::reliable::Snapshot {
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
        let sessions = &self.cable.reliable.sessions;
        if self.ext && sessions.enabled() && sessions.durable() {
            let mut snap = self.snapshot(&self.subs);
            // Issue 32: not restorable while this node holds it.
            snap.live = Some(self.cable.node.id);
            self.cable.reliable.keep(&self.conn.socket_id, &snap);
        }
    }

    /// Leave every stream and, for a client the app connected, queue its
    /// Disconnect call. Idempotent: runs when the loop ends and on drop.
    fn cleanup(&mut self) {
        self.linger_presence();
        let subs = std::mem::take(&mut self.subs);
        // Issue 19: keep what a reconnecting client restores (once).
        if std::mem::take(&mut self.ext) && self.cable.reliable.sessions.enabled() {
            let snap = self.snapshot(&subs);
            self.cable.reliable.keep(&self.conn.socket_id, &snap);
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
