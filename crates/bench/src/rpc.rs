//! AnyCable RPC benchmarks.
//!
//! `herald bench rpc-server --port 50051` serves AnyCable's `anycable.RPC`
//! over gRPC with one channel, `BenchmarkChannel`: every connection is
//! accepted; subscribing streams `all` (or `all<id>` with an `id` param);
//! `echo` transmits its data back; `broadcast` publishes the data to the
//! stream through an Action Cable server's `POST /_broadcast` and transmits
//! it back with `"action": "broadcastResult"`; `stats` transmits how many
//! `Connect` calls the app has answered (`{"action":"stats","connects":N}`),
//! so `storm` can count the calls a reconnect costs. A subscription whose
//! identifier names `"presence": "<id>"` joins its stream's presence as that
//! member (info `{"id": "<id>"}`) from the answer (`CommandResponse.presence`,
//! with `$p` in its state), and `leave` leaves it, as AnyCable's
//! server-side presence does. The welcome carries
//! the session id the server sent with `Connect` (`sid` metadata), as
//! AnyCable's own app libraries do: the extended protocol's clients
//! restore their session with it.
//!
//! `herald bench rpc --target host:port --clients 1,10,50 --duration 10s`
//! runs the RPC scenario against any AnyCable-compatible gRPC server: each
//! client `Connect`s, subscribes to `BenchmarkChannel`, then loops `echo`
//! commands, one at a time, for the duration. It reports requests per
//! second and latency percentiles for each client count.

use hdrhistogram::Histogram;
use herald_anycable_proto::{
    status_of, CommandMessage, CommandResponse, ConnectionRequest, ConnectionResponse,
    DisconnectRequest, DisconnectResponse, Env, EnvResponse, PresenceResponse, Status,
};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tonic::codegen::http;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::codegen::Service;
use tonic::server::NamedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status as GrpcStatus};

#[derive(clap::Args)]
pub struct RpcArgs {
    /// The RPC server, host:port (gRPC).
    #[arg(long, default_value = "127.0.0.1:50051")]
    target: String,
    /// Client counts to run, one after the other.
    #[arg(long, value_delimiter = ',', default_value = "1,10,50")]
    clients: Vec<usize>,
    /// How long each client count runs.
    #[arg(long, default_value = "10s", value_parser = super::parse_duration)]
    duration: Duration,
    /// Allow a target that is not a loopback address.
    #[arg(long)]
    allow_remote: bool,
    /// Runtime threads; 0 means one per CPU core, 1 a single-threaded
    /// runtime (less CPU per call when client and server share a machine).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// HTTP/2 connections the clients share (client i uses connection
    /// i mod N). 1, the default, is how an Action Cable server calls its
    /// app: one multiplexed connection.
    #[arg(long, default_value_t = 1)]
    connections: usize,
}

#[derive(clap::Args)]
pub struct RpcServerArgs {
    /// Port to listen on (loopback).
    #[arg(long, default_value_t = 50051)]
    port: u16,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Where `broadcast` publishes: an Action Cable server's broadcast URL.
    #[arg(long, default_value = "http://127.0.0.1:8080/_broadcast")]
    broadcast_url: String,
    /// Bearer key for the broadcast URL.
    #[arg(long)]
    broadcast_key: Option<String>,
    /// Runtime threads; 0 means one per CPU core, 1 a single-threaded
    /// runtime.
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    match threads {
        0 => tokio::runtime::Runtime::new(),
        1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
    }
}

// ----- the server ---------------------------------------------------------------

/// The BenchmarkChannel app.
pub struct BenchApp {
    broadcast_url: String,
    broadcast_key: Option<String>,
    http: reqwest::Client,
    next_id: AtomicU64,
    pub calls: AtomicU64,
    /// `Connect` calls answered.
    pub connects: AtomicU64,
}

impl BenchApp {
    pub fn new(broadcast_url: String, broadcast_key: Option<String>) -> BenchApp {
        BenchApp {
            broadcast_url,
            broadcast_key,
            http: reqwest::Client::new(),
            next_id: AtomicU64::new(1),
            calls: AtomicU64::new(0),
            connects: AtomicU64::new(0),
        }
    }

    /// `sid`: the session id the server sent as gRPC metadata, if any.
    fn connect(&self, sid: Option<&str>, _req: ConnectionRequest) -> ConnectionResponse {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.connects.fetch_add(1, Ordering::Relaxed);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let welcome = match sid {
            Some(sid) => json!({ "type": "welcome", "sid": sid }).to_string(),
            None => r#"{"type":"welcome"}"#.to_string(),
        };
        ConnectionResponse {
            status: Status::Success as i32,
            identifiers: json!({ "id": id }).to_string(),
            transmissions: vec![welcome],
            ..ConnectionResponse::default()
        }
    }

    async fn command(&self, req: CommandMessage) -> CommandResponse {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let params: Value = serde_json::from_str(&req.identifier).unwrap_or(Value::Null);
        if params["channel"] != "BenchmarkChannel" {
            return CommandResponse {
                status: Status::Failure as i32,
                transmissions: vec![
                    json!({ "identifier": req.identifier, "type": "reject_subscription" })
                        .to_string(),
                ],
                ..CommandResponse::default()
            };
        }
        let stream = match &params["id"] {
            Value::Null => "all".to_owned(),
            Value::String(s) => format!("all{s}"),
            other => format!("all{other}"),
        };
        let ok = |transmissions: Vec<String>| CommandResponse {
            status: Status::Success as i32,
            transmissions,
            ..CommandResponse::default()
        };
        let presence = |kind: &str, id: &str, info: String| PresenceResponse {
            kind: kind.into(),
            id: id.into(),
            info,
            ttl: 0,
        };
        match req.command.as_str() {
            "subscribe" => {
                let (env, presence) = match params["presence"].as_str() {
                    Some(id) => (
                        Some(EnvResponse {
                            istate: [("$p".to_owned(), stream.clone())].into(),
                            ..EnvResponse::default()
                        }),
                        Some(presence("join", id, json!({ "id": id }).to_string())),
                    ),
                    None => (None, None),
                };
                CommandResponse {
                    streams: vec![stream],
                    env,
                    presence,
                    ..ok(vec![json!({
                        "identifier": req.identifier,
                        "type": "confirm_subscription"
                    })
                    .to_string()])
                }
            }
            "unsubscribe" => CommandResponse {
                stop_streams: true,
                ..ok(Vec::new())
            },
            "message" => {
                let mut data: Value = serde_json::from_str(&req.data).unwrap_or(Value::Null);
                let transmit =
                    |d: &Value| json!({ "identifier": req.identifier, "message": d }).to_string();
                match data["action"].as_str() {
                    Some("echo") => ok(vec![transmit(&data)]),
                    Some("leave") => CommandResponse {
                        presence: Some(presence("leave", "", String::new())),
                        ..ok(Vec::new())
                    },
                    Some("stats") => ok(vec![transmit(&json!({
                        "action": "stats",
                        "connects": self.connects.load(Ordering::Relaxed),
                    }))]),
                    Some("broadcast") => {
                        let body =
                            json!({ "stream": stream, "data": data.to_string() }).to_string();
                        let mut post = self.http.post(&self.broadcast_url).body(body);
                        if let Some(k) = &self.broadcast_key {
                            post = post.bearer_auth(k);
                        }
                        if let Err(e) = post.send().await {
                            return CommandResponse {
                                status: Status::Error as i32,
                                error_msg: format!("broadcast failed: {e}"),
                                ..CommandResponse::default()
                            };
                        }
                        data["action"] = json!("broadcastResult");
                        ok(vec![transmit(&data)])
                    }
                    _ => CommandResponse {
                        status: Status::Error as i32,
                        error_msg: "unknown action".into(),
                        ..CommandResponse::default()
                    },
                }
            }
            _ => CommandResponse {
                status: Status::Error as i32,
                error_msg: "unknown command".into(),
                ..CommandResponse::default()
            },
        }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// One RPC method as the unary service tonic's server runs.
macro_rules! method {
    ($name:ident, $req:ty, $res:ty, |$app:ident, $r:ident| $body:expr) => {
        struct $name(Arc<BenchApp>);

        impl Service<Request<$req>> for $name {
            type Response = Response<$res>;
            type Error = GrpcStatus;
            type Future = BoxFuture<Result<Response<$res>, GrpcStatus>>;

            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
                Poll::Ready(Ok(()))
            }

            fn call(&mut self, req: Request<$req>) -> Self::Future {
                let $app = self.0.clone();
                let $r = req;
                Box::pin(async move { Ok(Response::new($body)) })
            }
        }
    };
}

method!(
    ConnectMethod,
    ConnectionRequest,
    ConnectionResponse,
    |app, r| {
        let sid = r.metadata().get("sid").and_then(|v| v.to_str().ok());
        let sid = sid.map(str::to_owned);
        app.connect(sid.as_deref(), r.into_inner())
    }
);
method!(CommandMethod, CommandMessage, CommandResponse, |app, r| app
    .command(r.into_inner())
    .await);
method!(
    DisconnectMethod,
    DisconnectRequest,
    DisconnectResponse,
    |app, _r| {
        app.calls.fetch_add(1, Ordering::Relaxed);
        DisconnectResponse {
            status: Status::Success as i32,
            ..DisconnectResponse::default()
        }
    }
);

/// `anycable.RPC` for tonic's router.
#[derive(Clone)]
pub struct RpcService(pub Arc<BenchApp>);

impl NamedService for RpcService {
    const NAME: &'static str = herald_anycable_proto::SERVICE;
}

impl Service<http::Request<tonic::body::Body>> for RpcService {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let app = self.0.clone();
        Box::pin(async move {
            let res = match req.uri().path() {
                "/anycable.RPC/Connect" => {
                    let codec =
                        tonic_prost::ProstCodec::<ConnectionResponse, ConnectionRequest>::default();
                    tonic::server::Grpc::new(codec)
                        .unary(ConnectMethod(app), req)
                        .await
                }
                "/anycable.RPC/Command" => {
                    let codec =
                        tonic_prost::ProstCodec::<CommandResponse, CommandMessage>::default();
                    tonic::server::Grpc::new(codec)
                        .unary(CommandMethod(app), req)
                        .await
                }
                "/anycable.RPC/Disconnect" => {
                    let codec =
                        tonic_prost::ProstCodec::<DisconnectResponse, DisconnectRequest>::default();
                    tonic::server::Grpc::new(codec)
                        .unary(DisconnectMethod(app), req)
                        .await
                }
                _ => GrpcStatus::unimplemented("no such method").into_http(),
            };
            Ok(res)
        })
    }
}

/// Serve the BenchmarkChannel app on `addr` until `stop` resolves.
pub async fn serve(
    addr: SocketAddr,
    app: Arc<BenchApp>,
    stop: impl Future<Output = ()> + Send,
) -> Result<(), String> {
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .add_service(RpcService(app))
        .serve_with_shutdown(addr, stop)
        .await
        .map_err(|e| format!("cannot serve on {addr}: {e}"))
}

/// [`serve`] over TLS with this PEM certificate chain and key.
pub async fn serve_tls(
    addr: SocketAddr,
    app: Arc<BenchApp>,
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    stop: impl Future<Output = ()> + Send,
) -> Result<(), String> {
    let identity = tonic::transport::Identity::from_pem(cert_pem, key_pem);
    tonic::transport::Server::builder()
        .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
        .map_err(|e| format!("TLS: {e}"))?
        .tcp_nodelay(true)
        .add_service(RpcService(app))
        .serve_with_shutdown(addr, stop)
        .await
        .map_err(|e| format!("cannot serve on {addr}: {e}"))
}

pub fn serve_cli(a: RpcServerArgs) -> ExitCode {
    let addr: SocketAddr = match format!("{}:{}", a.host, a.port).parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("herald bench rpc-server: bad address: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match runtime(a.threads) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("herald bench rpc-server: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let app = Arc::new(BenchApp::new(a.broadcast_url, a.broadcast_key));
    eprintln!("herald bench rpc-server: anycable.RPC (gRPC) with BenchmarkChannel on {addr}");
    let stop = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    match runtime.block_on(serve(addr, app, stop)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("herald bench rpc-server: {e}");
            ExitCode::FAILURE
        }
    }
}

// ----- the scenario ---------------------------------------------------------------

/// One client count's figures.
#[derive(Debug, Clone)]
pub struct RpcRun {
    pub clients: usize,
    pub requests: u64,
    pub errors: u64,
    pub seconds: f64,
    /// Microseconds.
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub max: u64,
}

impl RpcRun {
    pub fn per_second(&self) -> f64 {
        self.requests as f64 / self.seconds.max(1e-9)
    }
}

async fn unary<Req, Res>(
    channel: &Channel,
    path: &'static str,
    sid: &str,
    req: Req,
) -> Result<Res, String>
where
    Req: prost::Message + Send + 'static,
    Res: prost::Message + Default + Send + 'static,
{
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.map_err(|e| e.to_string())?;
    let mut request = Request::new(req);
    if let Ok(v) = sid.parse() {
        request.metadata_mut().insert("sid", v);
    }
    request
        .metadata_mut()
        .insert("protov", "v1".parse().expect("ascii"));
    let codec = tonic_prost::ProstCodec::<Req, Res>::default();
    grpc.unary(request, PathAndQuery::from_static(path), codec)
        .await
        .map(|r| r.into_inner())
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
}

fn env() -> Option<Env> {
    Some(Env {
        url: "http://bench.local/cable".into(),
        ..Env::default()
    })
}

async fn open(target: &str) -> Result<Channel, String> {
    Endpoint::from_shared(format!("http://{target}"))
        .map_err(|e| e.to_string())?
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| format!("cannot connect to {target}: {e}"))
}

/// One client: Connect, subscribe, then `echo` until `until`.
async fn client(
    channel: Channel,
    n: usize,
    until: Instant,
) -> Result<(Histogram<u64>, u64, u64), String> {
    let sid = format!("bench-{n}");
    let c: ConnectionResponse = unary(
        &channel,
        "/anycable.RPC/Connect",
        &sid,
        ConnectionRequest { env: env() },
    )
    .await?;
    if status_of(c.status) != Status::Success {
        return Err(format!("Connect answered {:?}", status_of(c.status)));
    }
    let identifier = json!({ "channel": "BenchmarkChannel" }).to_string();
    let sub: CommandResponse = unary(
        &channel,
        "/anycable.RPC/Command",
        &sid,
        CommandMessage {
            command: "subscribe".into(),
            identifier: identifier.clone(),
            connection_identifiers: c.identifiers.clone(),
            data: String::new(),
            env: env(),
        },
    )
    .await?;
    if status_of(sub.status) != Status::Success {
        return Err(format!("subscribe answered {:?}", status_of(sub.status)));
    }
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds");
    let (mut ok, mut errors) = (0u64, 0u64);
    let mut i = 0u64;
    while Instant::now() < until {
        i += 1;
        let data = json!({ "action": "echo", "n": i }).to_string();
        let started = Instant::now();
        let res: Result<CommandResponse, String> = unary(
            &channel,
            "/anycable.RPC/Command",
            &sid,
            CommandMessage {
                command: "message".into(),
                identifier: identifier.clone(),
                connection_identifiers: c.identifiers.clone(),
                data,
                env: env(),
            },
        )
        .await;
        match res {
            Ok(r) if status_of(r.status) == Status::Success && !r.transmissions.is_empty() => {
                let _ = hist.record((started.elapsed().as_micros() as u64).max(1));
                ok += 1;
            }
            _ => errors += 1,
        }
    }
    Ok((hist, ok, errors))
}

/// Run `clients` concurrent clients for `duration` over `connections`
/// HTTP/2 connections.
pub async fn run_once(
    target: &str,
    clients: usize,
    connections: usize,
    duration: Duration,
) -> Result<RpcRun, String> {
    let mut channels = Vec::new();
    for _ in 0..connections.clamp(1, clients.max(1)) {
        channels.push(open(target).await?);
    }
    let started = Instant::now();
    let until = started + duration;
    let tasks: Vec<_> = (0..clients)
        .map(|n| tokio::spawn(client(channels[n % channels.len()].clone(), n, until)))
        .collect();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds");
    let (mut requests, mut errors) = (0, 0);
    for t in tasks {
        let (h, ok, err) = t.await.map_err(|e| e.to_string())??;
        hist.add(h).map_err(|e| e.to_string())?;
        requests += ok;
        errors += err;
    }
    Ok(RpcRun {
        clients,
        requests,
        errors,
        seconds: started.elapsed().as_secs_f64(),
        p50: hist.value_at_quantile(0.50),
        p90: hist.value_at_quantile(0.90),
        p99: hist.value_at_quantile(0.99),
        max: hist.max(),
    })
}

pub fn summary(runs: &[RpcRun]) -> String {
    let ms = |us: u64| us as f64 / 1000.0;
    let mut out = String::from(
        "clients   requests/s   requests   errors   p(50) ms   p(90) ms   p(99) ms   max ms\n",
    );
    for r in runs {
        out.push_str(&format!(
            "{:>7}   {:>10.0}   {:>8}   {:>6}   {:>8.2}   {:>8.2}   {:>8.2}   {:>6.2}\n",
            r.clients,
            r.per_second(),
            r.requests,
            r.errors,
            ms(r.p50),
            ms(r.p90),
            ms(r.p99),
            ms(r.max)
        ));
    }
    out
}

pub fn run_cli(a: RpcArgs) -> ExitCode {
    let host = a
        .target
        .rsplit_once(':')
        .map_or(a.target.as_str(), |(h, _)| h);
    let loopback = host == "localhost"
        || host
            .trim_matches(|c| c == '[' || c == ']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if !loopback && !a.allow_remote {
        eprintln!(
            "herald bench rpc: {} is not a loopback address (--allow-remote to load it anyway)",
            a.target
        );
        return ExitCode::from(2);
    }
    if a.connections == 0 {
        eprintln!("herald bench rpc: --connections must be at least 1");
        return ExitCode::from(2);
    }
    if a.clients.is_empty() || a.clients.contains(&0) {
        eprintln!("herald bench rpc: --clients must list positive counts, e.g. 1,10,50");
        return ExitCode::from(2);
    }
    let runtime = match runtime(a.threads) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("herald bench rpc: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut runs = Vec::new();
    for &n in &a.clients {
        eprintln!(
            "herald bench rpc: {n} clients for {:?} against {}",
            a.duration, a.target
        );
        match runtime.block_on(run_once(&a.target, n, a.connections, a.duration)) {
            Ok(r) => runs.push(r),
            Err(e) => {
                eprintln!("herald bench rpc: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    print!("{}", summary(&runs));
    ExitCode::SUCCESS
}
