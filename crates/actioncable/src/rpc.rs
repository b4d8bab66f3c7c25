//! The RPC client to the app: AnyCable's `anycable.RPC` service over gRPC
//! (one multiplexed HTTP/2 connection) or over HTTP (`POST {url}/connect`,
//! `/command`, `/disconnect` with JSON bodies), chosen by the host the way
//! AnyCable chooses: an `http://` or `https://` URL means HTTP, anything
//! else gRPC.
//!
//! Every call is bounded: at most `concurrency` in flight (a semaphore), at
//! most `timeout` in all (waiting for a slot, attempts and back-off), and
//! retried only when the app could not take it at all (unreachable,
//! overloaded), at most `retries` times. The session id travels as AnyCable
//! sends it: `sid` gRPC metadata, or the `x-anycable-meta-sid` header.

use crate::config::RpcConfig;
use crate::metrics;
use crate::proto::{
    CommandMessage, CommandResponse, ConnectionRequest, ConnectionResponse, DisconnectRequest,
    DisconnectResponse,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

/// Largest HTTP RPC answer read, in bytes (gRPC's own limit is 4 MiB too).
pub const MAX_ANSWER: usize = 4 * 1024 * 1024;

/// First back-off between attempts; doubles each time.
const BACKOFF: Duration = Duration::from_millis(50);

/// Why a call produced no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RpcError {
    #[error("RPC call timed out (rpc.timeout_ms)")]
    Timeout,
    #[error("RPC server unreachable: {0}")]
    Unavailable(String),
    #[error("RPC server answered with an error: {0}")]
    Failed(String),
    #[error("RPC server answered something unreadable: {0}")]
    Garbage(String),
}

impl RpcError {
    /// Whether trying again may help (the app never got the call).
    fn retryable(&self) -> bool {
        matches!(self, RpcError::Unavailable(_))
    }
}

#[derive(Clone, Copy)]
enum Method {
    Connect,
    Command,
    Disconnect,
}

impl Method {
    fn grpc_path(self) -> PathAndQuery {
        PathAndQuery::from_static(match self {
            Method::Connect => "/anycable.RPC/Connect",
            Method::Command => "/anycable.RPC/Command",
            Method::Disconnect => "/anycable.RPC/Disconnect",
        })
    }

    fn http_name(self) -> &'static str {
        match self {
            Method::Connect => "connect",
            Method::Command => "command",
            Method::Disconnect => "disconnect",
        }
    }
}

enum Transport {
    Grpc(Channel),
    Http {
        client: reqwest::Client,
        base: String,
        secret: Option<String>,
    },
}

/// The client; cheap to share (`Arc`).
pub struct Rpc {
    transport: Transport,
    slots: Arc<Semaphore>,
    timeout: Duration,
    retries: u32,
    /// For logs: the host without credentials or query.
    pub target: String,
}

/// Which transport a host means, and its address for that transport.
pub fn parse_host(host: &str) -> Result<(bool, String), String> {
    let host = host.trim();
    let lower = host.to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        reqwest::Url::parse(host).map_err(|e| format!("rpc.host {host:?} is not a URL: {e}"))?;
        return Ok((true, host.trim_end_matches('/').to_owned()));
    }
    let rest = lower
        .strip_prefix("grpc://")
        .or_else(|| lower.strip_prefix("dns:///"))
        .map(|_| &host[host.find("//").map_or(0, |i| i + 2)..])
        .unwrap_or(host)
        .trim_start_matches('/');
    if rest.contains("://") || rest.is_empty() || rest.contains('/') {
        return Err(format!(
            "rpc.host {host:?}: expected http(s)://..., host:port or grpc://host:port"
        ));
    }
    let uri = format!("http://{rest}");
    uri.parse::<tonic::codegen::http::Uri>()
        .map_err(|e| format!("rpc.host {host:?} is not host:port: {e}"))?;
    Ok((false, uri))
}

impl Rpc {
    /// A client for `config.host` (which must be set). Call inside the
    /// runtime: the gRPC connection is made lazily, on the first call, and
    /// re-made by itself after it breaks.
    pub fn new(config: &RpcConfig) -> Result<Rpc, String> {
        let host = config.host.as_deref().ok_or("rpc.host is not set")?;
        let (http, address) = parse_host(host)?;
        let timeout = config.timeout();
        let (address, transport) = if http {
            let client = reqwest::Client::builder()
                .timeout(timeout)
                .connect_timeout(timeout)
                .pool_max_idle_per_host(config.concurrency)
                .tcp_nodelay(true)
                .build()
                .map_err(|e| format!("cannot build the HTTP RPC client: {e}"))?;
            let transport = Transport::Http {
                client,
                base: address.clone(),
                secret: config.secret.clone(),
            };
            (address, transport)
        } else {
            let address = if config.tls {
                address.replacen("http://", "https://", 1)
            } else {
                address
            };
            let mut endpoint = Endpoint::from_shared(address.clone())
                .map_err(|e| format!("rpc.host {host:?}: {e}"))?
                .connect_timeout(timeout)
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_while_idle(true);
            if config.tls {
                let mut tls = ClientTlsConfig::new().with_native_roots();
                if let Some(path) = &config.tls_root_ca {
                    let pem = std::fs::read(path)
                        .map_err(|e| format!("rpc.tls_root_ca {path:?}: cannot read it: {e}"))?;
                    tls = tls.ca_certificate(Certificate::from_pem(pem));
                }
                endpoint = endpoint
                    .tls_config(tls)
                    .map_err(|e| format!("rpc.tls: {e}"))?;
            }
            (address, Transport::Grpc(endpoint.connect_lazy()))
        };
        let target = match reqwest::Url::parse(&address) {
            Ok(mut u) => {
                let _ = u.set_password(None);
                let _ = u.set_username("");
                u.set_query(None);
                u.to_string()
            }
            Err(_) => address,
        };
        Ok(Rpc {
            transport,
            slots: Arc::new(Semaphore::new(config.concurrency)),
            timeout,
            retries: config.retries,
            target,
        })
    }

    pub fn is_http(&self) -> bool {
        matches!(self.transport, Transport::Http { .. })
    }

    // Not `async fn`s: those would keep the request twice in the future.
    /// A `Connect` call in a slot already waited for ([`Rpc::slot`]).
    pub fn connect_in<'a>(
        &'a self,
        slot: Slot,
        sid: &'a str,
        req: ConnectionRequest,
    ) -> impl Future<Output = Result<ConnectionResponse, RpcError>> + Send + 'a {
        self.call_in(slot, Method::Connect, sid, req)
    }

    /// A `Command` call in a slot already waited for ([`Rpc::slot`]).
    pub fn command_in<'a>(
        &'a self,
        slot: Slot,
        sid: &'a str,
        req: CommandMessage,
    ) -> impl Future<Output = Result<CommandResponse, RpcError>> + Send + 'a {
        self.call_in(slot, Method::Command, sid, req)
    }

    pub fn disconnect<'a>(
        &'a self,
        sid: &'a str,
        req: DisconnectRequest,
    ) -> impl Future<Output = Result<DisconnectResponse, RpcError>> + Send + 'a {
        self.call(Method::Disconnect, sid, req)
    }

    /// Wait for a place among the `concurrency` calls in flight, within
    /// the call's `timeout`. A future of its own, so that a caller can wait
    /// holding only this (a few hundred bytes) and build the call's much
    /// larger future once it has the slot: thousands of clients wait here
    /// in a reconnect storm.
    pub async fn slot(&self) -> Result<Slot, RpcError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        match tokio::time::timeout_at(deadline, self.slots.clone().acquire_owned()).await {
            Ok(permit) => Ok(Slot {
                _permit: permit.expect("never closed"),
                deadline,
            }),
            Err(_) => {
                // A call that never got to start.
                herald_core::metrics::count(&metrics::RPC_CALLS);
                herald_core::metrics::count(&metrics::RPC_TIMEOUTS);
                Err(RpcError::Timeout)
            }
        }
    }

    async fn call<Req, Res>(&self, method: Method, sid: &str, req: Req) -> Result<Res, RpcError>
    where
        Req: prost::Message + Serialize + Clone + Send + 'static,
        Res: prost::Message + DeserializeOwned + Default + Send + 'static,
    {
        let slot = self.slot().await?;
        // Boxed once the slot is here: a call waiting for one holds only
        // its request and the wait.
        Box::pin(self.call_in(slot, method, sid, req)).await
    }

    /// Attempts and back-off, until the slot's deadline.
    async fn call_in<Req, Res>(
        &self,
        slot: Slot,
        method: Method,
        sid: &str,
        req: Req,
    ) -> Result<Res, RpcError>
    where
        Req: prost::Message + Serialize + Clone + Send + 'static,
        Res: prost::Message + DeserializeOwned + Default + Send + 'static,
    {
        herald_core::metrics::count(&metrics::RPC_CALLS);
        let attempts = async {
            let mut backoff = BACKOFF;
            let mut attempt = 0;
            loop {
                // Boxed: the transport's state is large; a call holds it
                // only while an attempt is under way.
                let result = match &self.transport {
                    Transport::Grpc(channel) => {
                        Box::pin(grpc(channel, method, sid, req.clone())).await
                    }
                    Transport::Http {
                        client,
                        base,
                        secret,
                    } => Box::pin(http(client, base, secret.as_deref(), method, sid, &req)).await,
                };
                match result {
                    Err(e) if e.retryable() && attempt < self.retries => {
                        attempt += 1;
                        herald_core::metrics::count(&metrics::RPC_RETRIES);
                        tokio::time::sleep(backoff).await;
                        backoff *= 2;
                    }
                    other => return other,
                }
            }
        };
        let result = match tokio::time::timeout_at(slot.deadline, attempts).await {
            Ok(r) => r,
            Err(_) => Err(RpcError::Timeout),
        };
        drop(slot);
        if let Err(e) = &result {
            herald_core::metrics::count(match e {
                RpcError::Timeout => &metrics::RPC_TIMEOUTS,
                _ => &metrics::RPC_ERRORS,
            });
        }
        result
    }
}

/// A place among the calls in flight, given back when dropped; the call
/// made in it must end by `deadline` (the `timeout` counts from the start
/// of the wait).
pub struct Slot {
    _permit: tokio::sync::OwnedSemaphorePermit,
    deadline: tokio::time::Instant,
}

async fn grpc<Req, Res>(
    channel: &Channel,
    method: Method,
    sid: &str,
    req: Req,
) -> Result<Res, RpcError>
where
    Req: prost::Message + Send + 'static,
    Res: prost::Message + Default + Send + 'static,
{
    let mut client = tonic::client::Grpc::new(channel.clone());
    client
        .ready()
        .await
        .map_err(|e| RpcError::Unavailable(e.to_string()))?;
    let mut request = tonic::Request::new(req);
    if let Ok(v) = MetadataValue::try_from(sid) {
        request.metadata_mut().insert("sid", v);
    }
    request
        .metadata_mut()
        .insert("protov", MetadataValue::from_static("v1"));
    let codec = tonic_prost::ProstCodec::<Req, Res>::default();
    match client.unary(request, method.grpc_path(), codec).await {
        Ok(res) => Ok(res.into_inner()),
        Err(status) => Err(match status.code() {
            tonic::Code::Unavailable | tonic::Code::ResourceExhausted => {
                RpcError::Unavailable(status.message().to_owned())
            }
            tonic::Code::DeadlineExceeded => RpcError::Timeout,
            tonic::Code::Internal | tonic::Code::Unknown if status.message().contains("decode") => {
                RpcError::Garbage(status.message().to_owned())
            }
            code => RpcError::Failed(format!("{code:?}: {}", status.message())),
        }),
    }
}

async fn http<Req, Res>(
    client: &reqwest::Client,
    base: &str,
    secret: Option<&str>,
    method: Method,
    sid: &str,
    req: &Req,
) -> Result<Res, RpcError>
where
    Req: Serialize,
    Res: DeserializeOwned,
{
    let body = serde_json::to_vec(req).map_err(|e| RpcError::Failed(e.to_string()))?;
    let mut builder = client
        .post(format!("{base}/{}", method.http_name()))
        .header("content-type", "application/json")
        .header("x-anycable-meta-sid", sid)
        .header("x-anycable-meta-protov", "v1")
        .body(body);
    if let Some(secret) = secret {
        builder = builder.bearer_auth(secret);
    }
    let mut res = builder.send().await.map_err(|e| {
        if e.is_timeout() {
            RpcError::Timeout
        } else if e.is_connect() {
            RpcError::Unavailable(e.without_url().to_string())
        } else {
            RpcError::Failed(e.without_url().to_string())
        }
    })?;
    let status = res.status();
    if status == reqwest::StatusCode::SERVICE_UNAVAILABLE
        || status == reqwest::StatusCode::TOO_MANY_REQUESTS
    {
        return Err(RpcError::Unavailable(format!("HTTP {status}")));
    }
    if status == reqwest::StatusCode::UNAUTHORIZED {
        return Err(RpcError::Failed(
            "HTTP 401 Unauthorized (check rpc.secret)".into(),
        ));
    }
    if !status.is_success() {
        return Err(RpcError::Failed(format!("HTTP {status}")));
    }
    let mut body = Vec::new();
    loop {
        match res.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > MAX_ANSWER {
                    return Err(RpcError::Garbage(format!(
                        "answer larger than {MAX_ANSWER} bytes"
                    )));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(e) if e.is_timeout() => return Err(RpcError::Timeout),
            Err(e) => return Err(RpcError::Failed(e.without_url().to_string())),
        }
    }
    serde_json::from_slice(&body).map_err(|e| RpcError::Garbage(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_follow_anycable_convention() {
        assert_eq!(
            parse_host("http://app:3000/_anycable/").unwrap(),
            (true, "http://app:3000/_anycable".into())
        );
        assert!(parse_host("https://app/x").unwrap().0);
        assert_eq!(
            parse_host("localhost:50051").unwrap(),
            (false, "http://localhost:50051".into())
        );
        assert_eq!(
            parse_host("grpc://127.0.0.1:50051").unwrap(),
            (false, "http://127.0.0.1:50051".into())
        );
        assert_eq!(
            parse_host("dns:///rpc:50051").unwrap(),
            (false, "http://rpc:50051".into())
        );
        assert!(parse_host("ftp://x").is_err());
        assert!(parse_host("grpc://").is_err());
        assert!(parse_host("host:port:x/y").is_err());
    }
}
