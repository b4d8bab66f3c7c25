//! A minimal protocol, test-only, that proves the adapter seam: a
//! WebSocket path (`[echo] path`, default `/echo`; `HERALD_ECHO_PATH`,
//! `--echo-path`) where every text message a client sends is published
//! through the core to every client of the path, the sender included, as
//! a JSON string. Its config section, its environment variable and flag,
//! its route and its wire come through `herald_core::adapter` alone.

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use herald_core::adapter::{section, text, Adapter, Keys, Setting};
use herald_core::config::{invalid, Config, ConfigError};
use herald_core::connection::Connection;
use herald_core::frame::Frame;
use herald_core::hub::{Hub, SubscribeOptions};
use herald_core::namespace::Namespace;
use herald_core::node::Node;
use herald_core::publication::{json_string, Event, Publication, Tag, Wire};
use herald_core::session::{self, Closing, KeepAlive, Next, Why};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// The channel every echo client joins, in the echo namespace.
pub const CHANNEL: &str = "all";
/// The echo protocol's own space of channel names in the hub.
pub const NAMESPACE: Namespace = Namespace::new("echo");

/// The `[echo]` section.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct EchoConfig {
    /// The WebSocket path.
    pub path: String,
}

impl Default for EchoConfig {
    fn default() -> Self {
        EchoConfig {
            path: "/echo".into(),
        }
    }
}

fn load(config: &Config) -> Result<EchoConfig, ConfigError> {
    let c: EchoConfig = section(config, "echo")?;
    if !c.path.starts_with('/') || c.path.len() < 2 {
        return Err(invalid("echo.path", "must be a path such as /echo"));
    }
    Ok(c)
}

static SETTINGS: &[Setting] = &[Setting {
    key: "echo.path",
    flag: "echo-path",
    env: "HERALD_ECHO_PATH",
    help: "The echo protocol's WebSocket path (default /echo)",
    secret: false,
    parse: text,
}];

/// The adapter value.
pub struct Echo;

impl Adapter for Echo {
    fn name(&self) -> &'static str {
        "echo"
    }

    fn keys(&self) -> Keys {
        Keys {
            top: &["echo"],
            app: &[],
        }
    }

    fn settings(&self) -> &'static [Setting] {
        SETTINGS
    }

    fn config(&self, config: &Config) -> Result<serde_json::Value, ConfigError> {
        Ok(serde_json::json!({ "echo": load(config)? }))
    }

    fn routes(&self, node: &Arc<Node>) -> Router<Arc<Node>> {
        let (Ok(c), Some(app)) = (load(&node.config), node.config.apps.first()) else {
            return Router::new();
        };
        let Some(hub) = node.hub_by_id(&app.id) else {
            return Router::new();
        };
        Router::new()
            .route(&c.path, get(upgrade))
            .layer(Extension(hub))
    }
}

/// The wire: a publication's data is the frame's text.
struct EchoWire;

impl Wire for EchoWire {
    fn name(&self) -> &'static str {
        "echo"
    }

    fn publication(&self, p: &Publication, _tag: &str) -> Frame {
        Frame::text(p.data.get())
    }

    fn event(&self, _e: &Event<'_>, _tag: &str) -> Option<Frame> {
        None
    }
}

static WIRE: EchoWire = EchoWire;

async fn upgrade(
    State(node): State<Arc<Node>>,
    Extension(hub): Extension<Arc<Hub>>,
    req: Request,
) -> Response {
    if hub.admit().is_err() {
        return (axum::http::StatusCode::SERVICE_UNAVAILABLE, "full").into_response();
    }
    let compression = node.config.compression(&hub.config());
    herald_core::ws::upgrade(req, &[], compression, move |socket, _| async move {
        let (id, socket_id) = node.next_connection();
        let session::Opened {
            conn,
            settings,
            shutdown,
        } = session::open(&node, &hub, id, socket_id, &WIRE);
        let opts = SubscribeOptions {
            tag: Tag::default(),
            ..Default::default()
        };
        if node
            .subscribe(&hub, &conn, NAMESPACE, CHANNEL, opts)
            .await
            .is_err()
        {
            hub.release();
            return;
        }
        let handler = Session {
            node,
            hub,
            conn: conn.clone(),
            open: true,
        };
        session::run(socket, conn, handler, settings, shutdown).await;
    })
}

struct Session {
    node: Arc<Node>,
    hub: Arc<Hub>,
    conn: Arc<Connection>,
    open: bool,
}

impl session::Handler for Session {
    async fn on_text(&mut self, text: String) -> Next {
        let p = Publication::new(NAMESPACE, CHANNEL.into(), String::new(), json_string(&text));
        let _ = self.node.publish(&self.hub, p).await;
        Next::Continue
    }

    fn keepalive(&self) -> KeepAlive {
        KeepAlive::Every(Duration::from_secs(3600))
    }

    fn keepalive_frame(&mut self) -> Option<Frame> {
        None
    }

    fn closing(&mut self, _why: &Why) -> Closing {
        Closing {
            code: 1000,
            message: String::new(),
            last: None,
        }
    }

    async fn on_close(&mut self) {
        if std::mem::take(&mut self.open) {
            self.node.unsubscribe(
                &self.hub,
                &self.conn,
                NAMESPACE,
                CHANNEL,
                &Tag::default(),
                false,
            );
            self.hub.release();
        }
    }

    fn app_id(&self) -> &str {
        &self.hub.app.id
    }
}
