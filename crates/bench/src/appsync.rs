//! AppSync clients (`--protocol appsync-graphql` and `appsync-events`, of
//! `fanout`, `storm`, `slow` and `soak`): subscribers speak the generic
//! pub/sub GraphQL API (`graphql-ws` on `/graphql`, as the published
//! AppSync broadcast benchmark does) or the Events API
//! (`aws-appsync-event-ws` on `/event/realtime`); publishers
//! `POST /graphql` (the `publish` mutation) or `POST /event`. The API key
//! is `--key` (the development app's key is an API key on Herald's
//! embedded default). The `protocol` these functions take is one of the
//! two AppSync [`Proto`]s: `AppsyncGraphql`, or else the Events API.
//!
//! A subscription's id is its channel's bench name (`benchmark-fanout-3`),
//! so a data message names its channel the way a Pusher frame does.

use super::client::{
    bench_fields, http_error, next_text, string_field, ws_open, ClientError, Conn, Scan,
};
use super::proto::Proto;
use super::Target;
use base64::Engine;
use serde_json::{json, Value};
use std::net::IpAddr;
use std::time::Duration;

const SUBSCRIPTION: &str =
    "subscription SubscribeToData($name: String!) { subscribe(name: $name) { name data } }";
const MUTATION: &str = "mutation PublishData($name: String!, $data: AWSJSON!) { publish(name: $name, data: $data) { name data } }";

/// The Events API path of bench channel `name`.
fn events_path(name: &str) -> String {
    format!("/bench/{name}")
}

fn auth_headers(target: &Target) -> Value {
    json!({ "host": target.host, "x-api-key": target.key })
}

/// Connect and wait for `connection_ack`.
pub async fn open(
    target: &Target,
    source: Option<IpAddr>,
    timeout: Duration,
    protocol: Proto,
) -> Result<Conn, ClientError> {
    let auth = auth_headers(target).to_string();
    let (url, protocols) = match protocol {
        Proto::AppsyncGraphql => {
            let header = base64::engine::general_purpose::STANDARD.encode(&auth);
            (
                format!("ws://{}/graphql?header={header}&payload=e30=", target.host),
                "graphql-ws".to_string(),
            )
        }
        _ => {
            let header = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&auth);
            (
                format!("ws://{}/event/realtime", target.host),
                format!("aws-appsync-event-ws, header-{header}"),
            )
        }
    };
    let ws = ws_open(target, source, url, Some(&protocols), timeout).await?;
    let mut conn = Conn {
        ws,
        socket_id: String::new(),
    };
    conn.send(r#"{"type":"connection_init"}"#.into()).await?;
    let wait = async {
        loop {
            let text = next_text(&mut conn.ws).await?;
            match string_field(&text, "type") {
                Some("connection_ack") => return Ok(()),
                Some("ka") => continue,
                _ => return Err(rejected(&text)),
            }
        }
    };
    tokio::time::timeout(timeout, wait)
        .await
        .map_err(|_| ClientError::Timeout("waiting for connection_ack"))??;
    Ok(conn)
}

/// An AppSync error message as a client error.
fn rejected(text: &str) -> ClientError {
    let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    let errors = v
        .get("errors")
        .or_else(|| v.get("payload").and_then(|p| p.get("errors")));
    let e = errors.and_then(|e| e.get(0));
    let message = format!(
        "{}: {}",
        e.and_then(|e| e.get("errorType"))
            .and_then(Value::as_str)
            .unwrap_or("error"),
        e.and_then(|e| e.get("message"))
            .and_then(Value::as_str)
            .unwrap_or(text)
    );
    let code = e
        .and_then(|e| e.get("errorCode"))
        .and_then(Value::as_u64)
        .map(|c| c as u16);
    ClientError::Rejected { code, message }
}

/// Subscribe to bench channel `name` (also the subscription's id) and wait
/// for the acknowledgement.
pub async fn subscribe(
    conn: &mut Conn,
    target: &Target,
    name: &str,
    timeout: Duration,
    protocol: Proto,
) -> Result<(), ClientError> {
    let msg = match protocol {
        Proto::AppsyncGraphql => json!({
            "type": "start", "id": name,
            "payload": {
                "data": json!({ "query": SUBSCRIPTION, "variables": { "name": name } }).to_string(),
                "extensions": { "authorization": auth_headers(target) },
            },
        }),
        _ => json!({
            "type": "subscribe", "id": name, "channel": events_path(name),
            "authorization": auth_headers(target),
        }),
    };
    conn.send(msg.to_string()).await?;
    let wait = async {
        loop {
            let text = next_text(&mut conn.ws).await?;
            match string_field(&text, "type") {
                Some("start_ack" | "subscribe_success") => return Ok(()),
                Some("ka") => continue,
                _ => {
                    return Err(match rejected(&text) {
                        ClientError::Rejected { message, .. } => ClientError::Subscription {
                            status: None,
                            message,
                        },
                        other => other,
                    })
                }
            }
        }
    };
    tokio::time::timeout(timeout, wait)
        .await
        .map_err(|_| ClientError::Timeout("waiting for the subscription's acknowledgement"))?
}

/// The fields of an AppSync frame the fan-out reads: a `data` message is
/// `event` (the bench's event name), its subscription id is the channel.
pub fn scan<'a>(text: &'a str, event: &'static str) -> Scan<'a> {
    let is_data =
        text.starts_with(r#"{"type":"data""#) || string_field(text, "type") == Some("data");
    if !is_data {
        return Scan {
            event: "",
            channel: None,
            stamp: None,
            id: None,
        };
    }
    let (stamp, id) = bench_fields(text);
    Scan {
        event,
        channel: string_field(text, "id"),
        stamp,
        id,
    }
}

/// Publishes over `POST /graphql` or `POST /event` with the API key.
#[derive(Clone)]
pub struct Publisher {
    client: reqwest::Client,
    url: String,
    key: String,
    protocol: Proto,
}

impl Publisher {
    pub fn new(target: &Target, protocol: Proto) -> Publisher {
        let path = match protocol {
            Proto::AppsyncGraphql => "/graphql",
            _ => "/event",
        };
        Publisher {
            client: super::client::publish_client(),
            url: format!("{}{path}", target.http_base()),
            key: target.key.clone(),
            protocol,
        }
    }

    /// Publish `data` (a JSON text) to bench channel `name`.
    pub async fn publish(&self, name: &str, data: &str) -> Result<(), ClientError> {
        let body = match self.protocol {
            Proto::AppsyncGraphql => {
                json!({ "query": MUTATION, "variables": { "name": name, "data": data } })
            }
            _ => json!({ "channel": events_path(name), "events": [data] }),
        };
        // No Content-Type, as the published AppSync benchmark posts.
        let resp = self
            .client
            .post(&self.url)
            .header("x-api-key", &self.key)
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| http_error(e, "waiting for the publish endpoint"))?;
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        let failed = match self.protocol {
            Proto::AppsyncGraphql => text.contains("\"errors\""),
            _ => !text.contains("\"failed\":[]"),
        };
        if (200..300).contains(&status) && !failed {
            return Ok(());
        }
        Err(ClientError::Http {
            status: Some(status),
            message: text.chars().take(200).collect(),
        })
    }
}

/// Check the target speaks the protocol with these credentials: one
/// subscriber and one publish.
pub async fn preflight(target: &Target, protocol: Proto) -> Result<(), ClientError> {
    let timeout = Duration::from_secs(10);
    let mut conn = open(target, None, timeout, protocol).await?;
    subscribe(&mut conn, target, "benchmark-preflight", timeout, protocol).await?;
    conn.close().await;
    Publisher::new(target, protocol)
        .publish("benchmark-preflight", "{}")
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::MsgId;

    #[test]
    fn scans_data_messages() {
        let data = crate::client::bench_data(77, MsgId { sender: 1, seq: 9 });
        let events =
            json!({ "type": "data", "id": "benchmark-fanout-2", "event": data }).to_string();
        let s = scan(&events, "e");
        assert_eq!(
            (s.event, s.channel, s.stamp, s.id),
            (
                "e",
                Some("benchmark-fanout-2"),
                Some(77),
                Some(MsgId { sender: 1, seq: 9 })
            )
        );
        let gql = json!({ "type": "data", "id": "benchmark-fanout-0",
            "payload": { "data": { "subscribe": { "name": "benchmark-fanout-0", "data": data } } } })
        .to_string();
        let s = scan(&gql, "e");
        assert_eq!((s.channel, s.stamp), (Some("benchmark-fanout-0"), Some(77)));
        assert_eq!(scan(r#"{"type":"ka"}"#, "e").event, "");
    }
}
