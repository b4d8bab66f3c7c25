//! The generic pub/sub GraphQL API over WebSocket (`/graphql`,
//! `/graphql/realtime`, subprotocol `graphql-ws`, AppSync's dialect):
//! `connection_init` → `connection_ack` + `ka`; `start` (its
//! `payload.data` a JSON string holding `{query, variables}`) →
//! `start_ack`, then `data` per publish; `stop` → `complete`; anything
//! else an `error`. Only `subscribe` subscriptions are served here:
//! mutations go to `POST /graphql`.

use crate::auth;
use crate::graphql::{self, Operation, Request};
use crate::session::{check_id, parse_message, Base};
use crate::wire;
use herald_core::frame::Frame;
use herald_core::metrics;
use herald_core::namespace::Namespace;
use herald_core::session::{Closing, Handler, KeepAlive, Next, Why};
use serde::Deserialize;
use serde_json::{json, Value};

/// The hub namespace of the GraphQL API's channels (`subscribe(name)` /
/// `publish(name)`): their own, so a name never meets an Events path or
/// another protocol's channel of the same name.
pub const NAMESPACE: Namespace = Namespace::new("appsync-graphql");

#[derive(Deserialize)]
struct Message {
    #[serde(rename = "type")]
    ty: Option<String>,
    id: Option<Value>,
    payload: Option<Value>,
}

pub struct GraphqlSession {
    base: Base,
}

impl GraphqlSession {
    pub fn new(base: Base) -> GraphqlSession {
        GraphqlSession { base }
    }

    fn error(&self, id: Option<&str>, error_type: &str, message: &str) {
        metrics::count(&metrics::BAD_MESSAGES);
        self.base.send(&wire::graphql_error(
            id,
            vec![wire::error_object(error_type, message)],
        ));
    }

    async fn start(&mut self, m: Message) {
        let id = match check_id(m.id.as_ref()) {
            Ok(id) => id.to_owned(),
            Err(e) => return self.error(None, "BadRequestException", e),
        };
        let fail = |s: &Self, error_type: &str, message: &str| {
            metrics::count(&metrics::SUBSCRIPTION_ERRORS);
            s.base.send(&wire::graphql_error(
                Some(&id),
                vec![wire::error_object(error_type, message)],
            ));
        };
        let Some(Value::Object(payload)) = m.payload else {
            return fail(self, "BadRequestException", "Missing `payload`");
        };
        let own = payload
            .get("extensions")
            .and_then(|e| e.get("authorization"))
            .and_then(Value::as_object)
            .and_then(auth::api_key_of);
        if self.base.keys.auth.configured {
            // Other modes: the start's own authorization, else the
            // connection's; a SigV4 signature covers the request string.
            let own_headers = payload
                .get("extensions")
                .and_then(|e| e.get("authorization"))
                .and_then(Value::as_object);
            let body = payload.get("data").and_then(Value::as_str).unwrap_or("");
            let none = serde_json::Map::new();
            let cred = crate::auth_modes::Credential {
                headers: own_headers
                    .or(self.base.auth_headers.as_deref())
                    .unwrap_or(&none),
                method: "POST",
                path: "/graphql",
                query: "",
                body: body.as_bytes(),
            };
            let op = crate::auth_modes::Op::Subscribe;
            if let Err(d) =
                crate::auth_modes::authorize(&self.base.keys, &cred, op, None, None).await
            {
                return fail(self, d.error_type, &d.message);
            }
        } else if let Some(k) = &own {
            if !auth::key_in(self.base.keys.effective_api_keys(), k) {
                return fail(self, auth::UNAUTHORIZED, auth::UNAUTHORIZED_MESSAGE);
            }
        }
        // `data` is a string holding the request; an object is taken too.
        let request: Result<Request, String> = match payload.get("data") {
            Some(Value::String(s)) => serde_json::from_str(s).map_err(|e| e.to_string()),
            Some(v @ Value::Object(_)) => {
                serde_json::from_value(v.clone()).map_err(|e| e.to_string())
            }
            _ => Err("`payload.data` must be a JSON string holding {query, variables}".into()),
        };
        let request = match request {
            Ok(r) => r,
            Err(e) => {
                return fail(
                    self,
                    "BadRequestException",
                    &format!("Invalid payload.data: {e}"),
                )
            }
        };
        let op = match graphql::parse(&request) {
            Ok(op) => op,
            Err(e) => {
                metrics::count(&metrics::SUBSCRIPTION_ERRORS);
                return self
                    .base
                    .send(&wire::graphql_error(Some(&id), vec![e.to_json()]));
            }
        };
        let sub = match op {
            Operation::Subscribe(s) => s,
            Operation::Mutation(_) => {
                return fail(
                    self,
                    "UnsupportedOperation",
                    "mutation not supported through the realtime channel: POST it to /graphql",
                )
            }
            Operation::Query(_) => {
                return fail(
                    self,
                    "UnsupportedOperation",
                    "query not supported through the realtime channel: POST it to /graphql",
                )
            }
        };
        let tag = wire::graphql_tag(&id, &sub.root, &sub.name, &sub.fields);
        if let Err(e) = self
            .base
            .subscribe(&id, NAMESPACE, sub.name.clone(), false, tag)
            .await
        {
            fail(self, e.error_type, &e.message);
        }
    }

    fn stop(&mut self, m: Message) {
        let id = match check_id(m.id.as_ref()) {
            Ok(id) => id.to_owned(),
            Err(e) => return self.error(None, "BadRequestException", e),
        };
        // Stopping twice, or a subscription that failed, completes too.
        self.base.unsubscribe(&id);
        self.base
            .send(&json!({ "type": "complete", "id": id }).to_string());
    }
}

impl Handler for GraphqlSession {
    fn app_id(&self) -> &str {
        &self.base.hub.app.id
    }

    async fn on_text(&mut self, text: String) -> Next {
        let m: Message = match parse_message(&text) {
            Ok(m) => m,
            Err(why) => {
                self.error(None, "BadRequestException", &why);
                return Next::Continue;
            }
        };
        match m.ty.as_deref() {
            Some("connection_init") => {
                self.base.send(&wire::graphql_ack());
                self.base.send(wire::KA);
            }
            Some("start") => self.start(m).await,
            Some("stop") => self.stop(m),
            Some(other) => {
                let shown: String = other.chars().take(64).collect();
                let id = m.id.as_ref().and_then(Value::as_str);
                self.error(
                    id,
                    "UnsupportedOperation",
                    &format!("Unknown message type {shown:?}"),
                )
            }
            None => self.error(None, "BadRequestException", "Missing `type`"),
        }
        Next::Continue
    }

    fn idle(&self) -> bool {
        self.base.is_empty()
    }

    fn keepalive(&self) -> KeepAlive {
        KeepAlive::Every(self.base.node.config.keepalive_interval())
    }

    fn keepalive_frame(&mut self) -> Option<Frame> {
        Some(Frame::text(wire::KA))
    }

    fn closing(&mut self, why: &Why) -> Closing {
        self.base.closing(why, |t, m| {
            wire::graphql_error(None, vec![wire::error_object(t, m)])
        })
    }

    async fn on_close(&mut self) {
        self.base.cleanup();
    }
}
