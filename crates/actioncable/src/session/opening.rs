//! How a `/cable` connection opens: the upgrade, what the client's request
//! tells the app, who the client is (a restored session, a token, or the
//! app's `Connect`), and the session it then runs (a child of `session`).

use super::*;

/// The subprotocols Herald accepts, in its order of preference.
pub const PROTOCOLS: &[&str] = &[
    "actioncable-v1-json",
    crate::ext::protocol::PROTOCOL,
    "actioncable-unsupported",
];

/// What a connection's bytes go through: the upgraded socket, or the SSE
/// transport's in-process pipe (`crate::sse`), which speaks the same
/// frames.
pub(crate) trait Transport:
    tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static
{
}

impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static> Transport for S {}

/// What the client's upgrade request tells the app.
pub(crate) struct ClientRequest {
    /// The URL, the client's address and the forwarded headers, as the
    /// session keeps them for every call.
    env: SessionEnv,
    /// A JWT from the `x-<param>` header or the `<param>` query parameter.
    token: Option<String>,
    /// Resumable sessions: the `sid` of a session to restore (`?sid=` or the
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
    let deflate = node.config.compression(&cable.hub.config());
    herald_core::ws::upgrade(req, PROTOCOLS, deflate, move |socket, protocol| {
        let ext = protocol == Some(crate::ext::protocol::PROTOCOL);
        start(node, cable, socket, info, ext, None)
    })
}

/// A session over the SSE transport (`crate::sse`): the request's URL,
/// headers and token as an upgrade's, the extended protocol (positions on
/// reliable streams, history), never a restored session, and its own wire
/// (its own connection and traffic metrics).
pub(crate) fn serve_sse<S: Transport>(
    node: Arc<Node>,
    cable: Arc<Cable>,
    socket: S,
    headers: &HeaderMap,
    uri: &axum::http::Uri,
    peer: Option<SocketAddr>,
) -> impl std::future::Future<Output = ()> + Send {
    let mut info = request_info(&node, &cable, headers, uri, peer);
    info.restore = None;
    start(node, cable, socket, info, true, Some(&crate::sse::SSE_WIRE))
}

/// A connection's life: its opening (who it is: a restored session, a
/// token or the app's `Connect`), then its session. The opening is boxed:
/// its state is larger than the session's (the request, the call, the
/// refusals); boxed, it is freed once the connection is open, and the task
/// keeps only the session. A client the app must `Connect` first waits
/// for its place behind `rpc.concurrency` here, before the opening is
/// built: in a reconnect storm thousands wait, each holding only its
/// request and this small future, not the opening (1.2 KB) and its call.
fn start<S: Transport>(
    node: Arc<Node>,
    cable: Arc<Cable>,
    socket: S,
    info: ClientRequest,
    ext: bool,
    wire: Option<&'static dyn herald_core::publication::Wire>,
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
        Box::pin(open(node, cable, socket, info, ext, wire, slot))
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
fn needs_connect(cable: &Cable, info: &ClientRequest, ext: bool) -> bool {
    let restoring = ext && info.restore.is_some();
    let token = cable.jwt.is_some() && info.token.is_some();
    !restoring && !token
}

/// An opened connection, ready for its session.
struct Open<S> {
    socket: S,
    session: CableSession,
    opened: session::Opened,
}

impl<S: Transport> Open<S> {
    fn run(self) -> impl std::future::Future<Output = ()> + Send {
        let session::Opened {
            conn,
            settings,
            shutdown,
        } = self.opened;
        session::run(self.socket, conn, self.session, settings, shutdown)
    }
}

pub(crate) fn request_info(
    node: &Node,
    cable: &Cable,
    headers: &HeaderMap,
    uri: &axum::http::Uri,
    peer: Option<SocketAddr>,
) -> ClientRequest {
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
    ClientRequest {
        env: SessionEnv::new(
            format!("{scheme}://{host}{path}"),
            &forwarded,
            peer.map(|p| p.ip()),
        ),
        token,
        restore,
    }
}

/// Who a restore request's own token says the client is (a session
/// restores only to its own identity). The
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
fn refuse<S: Transport>(
    socket: S,
    frames: Vec<Frame>,
    code: u16,
    message: &'static str,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<Open<S>>> + Send>> {
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

async fn open<S: Transport>(
    node: Arc<Node>,
    cable: Arc<Cable>,
    socket: S,
    info: ClientRequest,
    ext: bool,
    wire: Option<&'static dyn herald_core::publication::Wire>,
    slot: Option<Result<crate::rpc::Slot, RpcError>>,
) -> Option<Open<S>> {
    let hub = cable.hub.clone();
    if hub.admit().is_err() {
        let bye = Frame::text(&wire::disconnect(reason::OVER_CAPACITY, true));
        return refuse(socket, vec![bye], 1013, "Over capacity").await;
    }
    let (id, sid) = node.next_connection();
    // A resumable session's sid carries a random part, so a
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
    // A session restored from the cache skips JWT and Connect.
    let restored = match info.restore.as_deref() {
        Some(prev) if ext => match restore_claim(&cable, info.token.as_deref()) {
            Ok(claim) => cable.resumable.restore(&node, prev, claim.as_deref()).await,
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
        welcome.push(Frame::text(&crate::ext::protocol::welcome_restored(
            &sid, &ids,
        )));
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
    let wire: &'static dyn herald_core::publication::Wire = match wire {
        Some(wire) => wire,
        None if ext => &crate::ext::protocol::EXT_WIRE,
        None => &WIRE,
    };
    let session::Opened {
        conn,
        settings,
        shutdown,
    } = session::open(&node, &hub, id, sid, wire);
    if ext {
        let gate = conn.with_gate();
        gate.allow_burst(cable.history.answer_room);
        if cable.reliable.shared() {
            // A gap in a stream's live offsets is filled from the shared
            // history with the same frames as a history answer.
            gate.heal_with(cable.reliable.healer(
                &conn,
                |gap, e, epoch| {
                    let identifier = gap.tag.as_deref().unwrap_or_default();
                    crate::ext::protocol::entry_frame(identifier, &gap.channel, epoch, e)
                },
                |filled| {
                    metrics::count(if filled {
                        &m::CABLE_GAPS_FILLED
                    } else {
                        &m::CABLE_GAPS_UNFILLED
                    })
                },
            ));
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
