//! The live dashboard (`/dashboard`), served only with `dashboard = true`
//! and a `dashboard_token`.
//!
//! The page and its assets are embedded in the binary (Preact through
//! `htm`'s standalone build, uPlot for the charts; no CDN) and hold no
//! data. Everything else is under `/dashboard/api/` and asks for the token
//! as `Authorization: Bearer <token>`, compared in constant time:
//!
//! ```text
//! GET  /dashboard/api/stats                  per app: connections, channels,
//!                                            subscriptions, messages in/out
//! GET  /dashboard/api/apps/{id}/channels     channels with subscriber counts
//! GET  /dashboard/api/apps/{id}/events       live console (server-sent events)
//! POST /dashboard/api/apps/{id}/events       send a test event
//! ```
//!
//! The console is fed by a node observer and sees publications only while
//! a console is open ([`Node::watch_publications`]); each viewer reads a
//! bounded broadcast channel, so a slow one skips events instead of
//! holding memory.

use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use herald_core::metrics;
use herald_core::namespace::Namespace;
use herald_core::node::Node;
use herald_core::observer::{Change, Observer};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::broadcast;

/// Console events kept for a slow viewer before it skips some. With data
/// cut to `MAX_SHOWN_DATA` characters and names bounded by the apps'
/// limits, the ring (one, shared by every viewer) holds a few MiB at most.
const FEED_CAPACITY: usize = 1024;

/// Console lines a slow viewer skipped (it is told how many).
static CONSOLE_SKIPPED: metrics::Counter = metrics::Counter::new(
    "herald_dashboard_console_skipped_total",
    "Dashboard console lines a slow viewer skipped (the console's ring holds 1024)",
);
/// Longest event data shown in the console, in characters.
const MAX_SHOWN_DATA: usize = 2000;

const INDEX: &str = include_str!("dashboard/index.html");
const APP_JS: &str = include_str!("dashboard/app.js");
const STYLE: &str = include_str!("dashboard/style.css");
const PREACT_HTM: &str = include_str!("dashboard/vendor/htm-preact-standalone.module.js");
const UPLOT_JS: &str = include_str!("dashboard/vendor/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("dashboard/vendor/uPlot.min.css");

/// What the dashboard routes share.
#[derive(Clone)]
struct Dash {
    node: Arc<Node>,
    feed: broadcast::Sender<Arc<(String, Value)>>,
    /// HMAC of the token under `key`: tokens are compared through it, in
    /// constant time.
    key: Arc<str>,
    expected: Arc<str>,
}

/// The dashboard's routes, or `None` when it is off.
pub fn router(node: &Arc<Node>) -> Option<Router> {
    let token = node.config.dashboard_token()?;
    metrics::register(&CONSOLE_SKIPPED);
    let (feed, _) = broadcast::channel(FEED_CAPACITY);
    node.observe(Arc::new(Feed(feed.clone())));
    let key: String = (0..4)
        .map(|_| format!("{:016x}", rand::random::<u64>()))
        .collect();
    let expected = herald_signing::sign(&key, token);
    let dash = Dash {
        node: node.clone(),
        feed,
        key: key.into(),
        expected: expected.into(),
    };
    let api = Router::new()
        .route("/dashboard/api/stats", get(stats))
        .route("/dashboard/api/apps/{app}/channels", get(channels))
        .route(
            "/dashboard/api/apps/{app}/events",
            get(console).post(send_test_event),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            dash.clone(),
            authorize,
        ))
        .with_state(dash);
    let pages = Router::new()
        .route("/dashboard", get(|| async { page(INDEX, "text/html") }))
        .route("/dashboard/", get(|| async { page(INDEX, "text/html") }))
        .route("/dashboard/assets/{file}", get(asset));
    Some(pages.merge(api))
}

fn page(body: &'static str, kind: &'static str) -> Response {
    let mut r = (
        [
            (header::CONTENT_TYPE, format!("{kind}; charset=utf-8")),
            (header::CACHE_CONTROL, "no-cache".into()),
        ],
        body,
    )
        .into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; \
             frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

async fn asset(Path(file): Path<String>) -> Response {
    let (body, kind) = match file.as_str() {
        "app.js" => (APP_JS, "text/javascript"),
        "style.css" => (STYLE, "text/css"),
        "htm-preact-standalone.module.js" => (PREACT_HTM, "text/javascript"),
        "uPlot.iife.min.js" => (UPLOT_JS, "text/javascript"),
        "uPlot.min.css" => (UPLOT_CSS, "text/css"),
        _ => return error(StatusCode::NOT_FOUND, "No such dashboard asset"),
    };
    page(body, kind)
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

/// Every API call needs the token.
async fn authorize(State(dash): State<Dash>, req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if !herald_signing::verify_hex(&dash.key, given, &dash.expected) {
        let mut r = error(
            StatusCode::UNAUTHORIZED,
            "Dashboard token missing or wrong (send Authorization: Bearer <dashboard_token>)",
        );
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"herald dashboard\""),
        );
        return r;
    }
    let mut r = next.run(req).await;
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

async fn stats(State(dash): State<Dash>) -> Json<Value> {
    let traffic = metrics::all_traffic();
    let mut apps: Vec<Value> = dash
        .node
        .hubs()
        .map(|hub| {
            let spaces = hub.namespace_figures();
            let (channels, subscriptions) = hub.channel_figures();
            let namespaces: Vec<Value> = spaces
                .iter()
                .map(|(ns, c, s)| json!({ "namespace": ns.as_str(), "channels": c, "subscriptions": s }))
                .collect();
            let mine = traffic.iter().filter(|t| *t.app == *hub.app.id);
            let (received, sent) = mine.fold((0, 0), |(r, s), t| {
                (r + t.messages_received(), s + t.messages_sent())
            });
            // Where the app came from and whether it serves; never its
            // secret or keys.
            json!({
                "id": hub.app.id,
                "source": dash.node.apps.source_of(&hub.app.id),
                "enabled": hub.config().enabled,
                "connections": hub.connection_count(),
                "channels": channels,
                "subscriptions": subscriptions,
                "namespaces": namespaces,
                "messages_received": received,
                "messages_sent": sent,
            })
        })
        .collect();
    apps.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    Json(json!({
        "time_ms": now_ms(),
        "node": dash.node.id.to_string(),
        "broker": dash.node.broker.name(),
        "apps": apps,
    }))
}

async fn channels(State(dash): State<Dash>, Path(app): Path<String>) -> Response {
    let Some(hub) = dash.node.hub_by_id(&app) else {
        return error(StatusCode::NOT_FOUND, "Unknown app id");
    };
    let list: Vec<Value> = dash
        .node
        .stats(
            &hub,
            None,
            herald_core::hub::StatsFilter::Prefix(String::new()),
        )
        .await
        .into_iter()
        .map(|c| {
            json!({
                "namespace": c.ns.as_str(),
                "name": c.name,
                "subscriptions": c.subscriptions,
                "users": c.users.len(),
            })
        })
        .collect();
    Json(json!({ "channels": list })).into_response()
}

/// The live console: this app's events as server-sent events.
async fn console(State(dash): State<Dash>, Path(app): Path<String>) -> Response {
    if dash.node.hub_by_id(&app).is_none() {
        return error(StatusCode::NOT_FOUND, "Unknown app id");
    }
    let watch = dash.node.watch_publications();
    let rx = dash.feed.subscribe();
    let stream = futures_util::stream::unfold((rx, watch), move |(mut rx, watch)| {
        let app = app.clone();
        async move {
            loop {
                match rx.recv().await {
                    Ok(ev) if ev.0 == app => {
                        let e = Event::default().json_data(&ev.1).ok()?;
                        return Some((Ok::<_, std::convert::Infallible>(e), (rx, watch)));
                    }
                    Ok(_) => continue,
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        metrics::add(&CONSOLE_SKIPPED, n);
                        let e = Event::default()
                            .json_data(
                                json!({ "type": "skipped", "count": n, "time_ms": now_ms() }),
                            )
                            .ok()?;
                        return Some((Ok(e), (rx, watch)));
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        }
    });
    let mut r = Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response();
    r.headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}

/// Send a test event, validated and published exactly as the HTTP API's
/// `POST /apps/{id}/events` does (body `{"channel", "name", "data"}`).
async fn send_test_event(
    State(dash): State<Dash>,
    Path(app): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(hub) = dash.node.hub_by_id(&app) else {
        return error(StatusCode::NOT_FOUND, "Unknown app id");
    };
    let json_body = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !json_body {
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Send the test event as application/json",
        );
    }
    if body.len() > dash.node.config.max_request_size {
        return error(StatusCode::PAYLOAD_TOO_LARGE, "Request body too large");
    }
    let ev = match herald_pusher::api::parse_event(&hub.config(), &body) {
        Ok(ev) => ev,
        Err(e) => {
            let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
            return error(status, &e.message);
        }
    };
    if let Err(full) = herald_pusher::api::publish(&dash.node, &hub, ev).await {
        return error(StatusCode::SERVICE_UNAVAILABLE, &full.to_string());
    }
    Json(json!({ "ok": true })).into_response()
}

/// Turns the node's changes into console lines.
struct Feed(broadcast::Sender<Arc<(String, Value)>>);

/// Event data as the console shows it: a JSON string's text (most
/// protocols carry data as a string), anything else as JSON; cut short.
fn shown(raw: &str) -> String {
    let text = serde_json::from_str::<String>(raw).unwrap_or_else(|_| raw.to_owned());
    if text.chars().count() <= MAX_SHOWN_DATA {
        return text;
    }
    let mut s: String = text.chars().take(MAX_SHOWN_DATA).collect();
    s.push('…');
    s
}

impl Observer for Feed {
    /// The console shows the cluster's occupancy and members on the nodes
    /// that keep the tally (the leader, which reports each for webhooks,
    /// and its successor); the others keep no tally to see them with.
    fn seen(&self, app_id: &str, ns: Namespace, change: &Change<'_>) {
        self.changed(app_id, ns, change);
    }

    fn changed(&self, app_id: &str, ns: Namespace, change: &Change<'_>) {
        if self.0.receiver_count() == 0 {
            return;
        }
        let t = now_ms();
        let line = match change {
            Change::Occupied { channel } => {
                json!({ "type": "channel_occupied", "channel": channel, "time_ms": t })
            }
            Change::Vacated { channel } => {
                json!({ "type": "channel_vacated", "channel": channel, "time_ms": t })
            }
            Change::MemberAdded { channel, user_id } => {
                json!({ "type": "member_added", "channel": channel, "user_id": user_id, "time_ms": t })
            }
            Change::MemberRemoved { channel, user_id } => {
                json!({ "type": "member_removed", "channel": channel, "user_id": user_id, "time_ms": t })
            }
            Change::CacheMiss { channel } => {
                json!({ "type": "cache_miss", "channel": channel, "time_ms": t })
            }
            Change::Published(p) => json!({
                "type": "event",
                "channel": p.channel,
                "event": p.event,
                "data": shown(p.data.get()),
                "user_id": p.user_id,
                "time_ms": t,
            }),
            // Counts change often and client events also pass as
            // publications: neither needs a line of its own.
            Change::SubscriptionCount { .. } | Change::ClientEvent(_) => return,
        };
        let mut line = line;
        line["namespace"] = json!(ns.as_str());
        let _ = self.0.send(Arc::new((app_id.to_owned(), line)));
    }
}
