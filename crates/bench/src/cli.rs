//! The `herald bench` command line: clap arguments for each scenario and
//! the glue from flags to a scenario's params struct and its report files.
//! Kept out of `main.rs` so the binary's entry point stays a dispatcher.
//! Over 800 lines because it holds every scenario's flags (one clap struct
//! each) beside their mapping to the params: split, each scenario would
//! be spread over two files.

use super::proto::Proto;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    scenario: Scenario,
}

// Parsed once at start: the size difference of the variants is harmless.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Scenario {
    #[command(flatten)]
    Pusher(BenchScenario),
    /// AnyCable RPC throughput: clients Connect, subscribe to
    /// BenchmarkChannel and loop `echo` commands against any
    /// AnyCable-compatible gRPC server (default --clients 1,10,50,
    /// --duration 10s).
    Rpc(super::rpc::RpcArgs),
    /// Serve AnyCable's RPC over gRPC with a BenchmarkChannel, the app for
    /// the rpc scenario and for Action Cable servers under test.
    RpcServer(super::rpc::RpcServerArgs),
    /// Runs of one scenario from several servers or builds side by side:
    /// `--json` reports (FILE or LABEL=FILE), medians per server, a
    /// Markdown table on stdout and --html with charts on shared axes.
    Compare(super::compare::CompareArgs),
}

/// The Pusher-protocol scenarios, once the RPC ones are set apart.
struct PusherArgs {
    scenario: BenchScenario,
}

#[derive(Subcommand)]
enum BenchScenario {
    /// Ramping users on one private channel; one in five sends (default
    /// --clients 1000 peak users, --duration 120s).
    Broadcast(BroadcastArgs),
    /// Connection avalanche: N clients connect and subscribe at once
    /// (default --clients 1000); --sweep 1000,2000,... for increasing N.
    Connect(ConnectArgs),
    /// HTTP publishers to subscribers over several channels (default
    /// --clients 1000 subscribers, --duration 30s).
    Fanout(FanoutArgs),
    /// Many idle subscribed connections; server memory per connection
    /// with --server-pid (default --clients 1000, --duration 10s hold).
    Idle(IdleArgs),
    /// Hours of mixed load (publishes, churn, presence, API queries);
    /// growth of the server's memory and descriptors per hour, lost and
    /// duplicated deliveries (default --clients 500, --duration 10m).
    Soak(SoakArgs),
    /// Reconnect storm and mass disconnect: N clients on public, private
    /// and presence channels drop at once and come back like pusher-js
    /// (or the protocol's own client: --protocol); with --rate, publishers
    /// keep publishing and each returning client reports messages missed,
    /// duplicated and out of order; then drop for good while new clients
    /// connect (default --clients 15000).
    Storm(StormArgs),
    /// Slow consumers: a share of subscribers stop reading; the others'
    /// latency against a clean run, 4100 closes, server memory (default
    /// --clients 2000, --duration 30s per phase).
    Slow(SlowArgs),
    /// Light load: a few clients (default --clients 1), one request at a
    /// time, paced; round trips per kind (ping, perform, subscribe, and an
    /// HTTP publish to the client's own channel).
    Latency(LatencyArgs),
    /// What a held Pusher client costs over each transport pusher-js
    /// speaks: ws, or the HTTP fallback (xhr_streaming, xhr_polling).
    /// Server memory per held client, then CPU per delivery at a steady
    /// publish rate (with --server-pid; default --clients 1000, --duration
    /// 5s hold). Run once per --transport and compare.
    Transports(TransportsArgs),
}

#[derive(Args)]
struct TransportsArgs {
    #[command(flatten)]
    common: BenchCommon,
    /// ws, xhr_streaming or xhr_polling.
    #[arg(long, default_value = "ws", value_parser = transport_name)]
    transport: super::transports::Transport,
    /// Events published once every client is held.
    #[arg(long, default_value_t = 200)]
    events: usize,
    /// Events published per second.
    #[arg(long, default_value_t = 20)]
    rate: u32,
    /// Clients opening at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
}

fn transport_name(s: &str) -> Result<super::transports::Transport, String> {
    super::transports::Transport::from_name(s)
        .ok_or_else(|| format!("{s}: one of ws, xhr_streaming, xhr_polling"))
}

#[derive(Args)]
struct LatencyArgs {
    #[command(flatten)]
    common: BenchCommon,
    /// Round trips of each kind per client.
    #[arg(long, default_value_t = 90)]
    rounds: usize,
    /// From one round trip's start to the next one's, per client.
    #[arg(long, default_value = "15ms", value_parser = super::parse_duration)]
    interval: std::time::Duration,
    /// The protocol the clients speak (actioncable needs `herald bench
    /// rpc-server` as the server's app).
    #[arg(long, default_value = "pusher", value_parser = protocol(LATENCY))]
    protocol: Proto,
    #[command(flatten)]
    broadcast: BroadcastTo,
}

#[derive(Args)]
struct SlowArgs {
    #[command(flatten)]
    common: BenchCommon,
    /// Share of the subscribers that stop reading (0: the clean run only).
    #[arg(long, default_value_t = 0.05)]
    slow_share: f64,
    /// Public channels the subscribers are spread over.
    #[arg(long, default_value_t = 10)]
    channels: usize,
    /// HTTP publishes per second, all channels together.
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// Bytes of each publish's data.
    #[arg(long, default_value_t = 4096)]
    payload: usize,
    /// Receive buffer of the slow subscribers' sockets (0: the system's).
    #[arg(long, default_value_t = 0)]
    slow_recv_buffer: usize,
    /// Keep the slow phase publishing past --duration, up to this long,
    /// until the server's herald_slow_clients_closed_total says every slow
    /// subscriber was closed.
    #[arg(long, value_parser = super::parse_duration)]
    until_closed: Option<std::time::Duration>,
    /// The per-connection queue bound expected of the server, for
    /// slow_queue_bound (Herald's default outbound_bytes).
    #[arg(long, default_value_t = 1024 * 1024)]
    queue_bytes: u64,
    /// The server's Prometheus metrics (default: /metrics on --url's port).
    #[arg(long)]
    metrics_url: Option<String>,
    /// The protocol subscribers and publishers speak (actioncable needs
    /// `herald bench rpc-server` as the server's app).
    #[arg(long, default_value = "pusher", value_parser = protocol(WORST_DAY))]
    protocol: Proto,
    #[command(flatten)]
    broadcast: BroadcastTo,
}

/// Where Action Cable publishes go (`--protocol actioncable`).
#[derive(Args)]
struct BroadcastTo {
    /// The AnyCable HTTP broadcast API (default: /_broadcast on --url's
    /// port, as Herald serves it; AnyCable: port 8090 when it has neither
    /// a broadcast key nor a secret, else its main port).
    #[arg(long)]
    broadcast_url: Option<String>,
    /// Sent as `Authorization: Bearer <key>` (Herald: rpc.broadcast_key;
    /// AnyCable: --broadcast_key, or the key it derives from --secret).
    #[arg(long)]
    broadcast_key: Option<String>,
}

impl BroadcastTo {
    fn get(self) -> super::proto::Broadcast {
        super::proto::Broadcast {
            url: self.broadcast_url,
            key: self.broadcast_key,
        }
    }
}

#[derive(Args)]
struct StormArgs {
    #[command(flatten)]
    common: BenchCommon,
    /// Public and private channels the clients are spread over.
    #[arg(long, default_value_t = 100)]
    channels: usize,
    /// Members per presence channel (Herald's default limit is 100).
    #[arg(long, default_value_t = 50)]
    presence_size: usize,
    /// Clients connecting at once in the first, orderly connect.
    #[arg(long, default_value_t = 256)]
    concurrency: usize,
    /// Spread first reconnects over this much more than the protocol's
    /// client waits (pusher-js: 1 s, no jitter of its own: 0 brings everyone
    /// back at once; Action Cable: its monitor's jittered poll; Amplify: 5 s).
    #[arg(long, default_value = "0s", value_parser = super::parse_duration)]
    jitter: std::time::Duration,
    /// A reconnecting client gives up after this long.
    #[arg(long, default_value = "120s", value_parser = super::parse_duration)]
    give_up: std::time::Duration,
    /// New clients per second during the mass disconnect.
    #[arg(long, default_value_t = 200.0)]
    newcomer_rate: f64,
    /// How long new clients keep coming after the mass disconnect.
    #[arg(long, default_value = "5s", value_parser = super::parse_duration)]
    window: std::time::Duration,
    /// The server's Prometheus metrics (default: /metrics on --url's port).
    #[arg(long)]
    metrics_url: Option<String>,
    /// The protocol the clients speak (only pusher has private and presence
    /// channels; actioncable and actioncable-ext need `herald bench
    /// rpc-server` as the app).
    #[arg(long, default_value = "pusher", value_parser = protocol(STORM))]
    protocol: Proto,
    /// Publishes per second, all channels together, from everyone
    /// subscribed through the drop until everyone is back (0: none); each
    /// returning client then reports what it missed, got twice or out of
    /// order.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    #[command(flatten)]
    broadcast: BroadcastTo,
    /// The nodes of a cluster (comma-separated ws:// URLs; replaces --url):
    /// clients spread round-robin, and one that loses its node reconnects
    /// to another, as a load balancer would send it; publishes go through
    /// a node that is up (each node's /_broadcast over Action Cable).
    #[arg(long, value_delimiter = ',')]
    node_url: Vec<String>,
    /// A rolling restart instead of the storm's drop: run this shell
    /// command for each node in turn ({n}: its index from 0, {signal}: TERM
    /// or KILL); it must stop the node, start it again and return once it
    /// listens. The bench waits after each until every client is back.
    #[arg(long)]
    restart_cmd: Option<String>,
    /// The signal `{signal}` names in --restart-cmd: term (a graceful
    /// shutdown) or kill.
    #[arg(long, default_value = "term", value_parser = ["term", "kill"])]
    restart_signal: String,
    /// Longest a --restart-cmd may run.
    #[arg(long, default_value = "120s", value_parser = super::parse_duration)]
    restart_timeout: std::time::Duration,
}

#[derive(Args)]
struct SoakArgs {
    #[command(flatten)]
    common: BenchCommon,
    /// Growth is fitted after this; default 10 % of --duration, at most 5m.
    #[arg(long, value_parser = super::parse_duration)]
    warmup: Option<std::time::Duration>,
    /// How often the server's memory, descriptors and threads are sampled.
    #[arg(long, default_value = "10s", value_parser = super::parse_duration)]
    sample_interval: std::time::Duration,
    /// Public channels the subscribers are spread over.
    #[arg(long, default_value_t = 10)]
    channels: usize,
    /// HTTP publishes per second, all channels together: the load knob
    /// (with --clients, deliveries/s ≈ rate × clients / channels).
    #[arg(long, default_value_t = 50.0)]
    rate: f64,
    /// A subscriber's mean life before it reconnects (the churn).
    #[arg(long, default_value = "60s", value_parser = super::parse_duration)]
    lifetime: std::time::Duration,
    /// Presence members joining and leaving.
    #[arg(long, default_value_t = 40)]
    presence: usize,
    #[arg(long, default_value_t = 4)]
    presence_channels: usize,
    /// A presence member's mean stay before it leaves.
    #[arg(long, default_value = "15s", value_parser = super::parse_duration)]
    presence_stay: std::time::Duration,
    /// One HTTP API query (channels, channel info, users) this often.
    #[arg(long, default_value = "1s", value_parser = super::parse_duration)]
    api_interval: std::time::Duration,
    /// A leaving subscriber reads this much longer once every publish
    /// stamped before it left has been answered.
    #[arg(long, default_value = "2s", value_parser = super::parse_duration)]
    grace: std::time::Duration,
    /// The server's Prometheus metrics (default: /metrics on --url's port).
    #[arg(long)]
    metrics_url: Option<String>,
    /// The protocol subscribers and publishers speak (presence and API
    /// queries only over pusher; actioncable needs `herald bench
    /// rpc-server` as the server's app).
    #[arg(long, default_value = "pusher", value_parser = protocol(WORST_DAY))]
    protocol: Proto,
    #[command(flatten)]
    broadcast: BroadcastTo,
}

/// The `--protocol` parser of a scenario: clap offers, documents and
/// accepts only the protocols of `values` (the scenario's `PROTOCOLS`),
/// each with its help there (what the protocol means in that scenario);
/// a test below checks the two lists agree.
fn protocol(values: &'static [(Proto, &'static str)]) -> impl TypedValueParser<Value = Proto> {
    PossibleValuesParser::new(
        values
            .iter()
            .map(|&(proto, help)| PossibleValue::new(proto.name()).help(help)),
    )
    .try_map(|name| Proto::from_name(&name).ok_or("not a protocol"))
}

const APPSYNC_GRAPHQL: (Proto, &str) = (
    Proto::AppsyncGraphql,
    "AppSync generic pub/sub GraphQL: graphql-ws subscribers on /graphql, publish mutations \
     on POST /graphql (--key is the API key)",
);
const APPSYNC_EVENTS: (Proto, &str) = (
    Proto::AppsyncEvents,
    "AppSync Events: aws-appsync-event-ws subscribers on /event/realtime, POST /event \
     publishers (--key is the API key)",
);

/// `broadcast` and `connect` (their `PROTOCOLS`).
const WS_CLIENTS: &[(Proto, &str)] = &[
    (Proto::Pusher, "Pusher Channels v7 at /app/{key}"),
    (
        Proto::ActionCable,
        "Action Cable at /cable, BenchmarkChannel of `herald bench rpc-server`",
    ),
    (
        Proto::ActionCableExt,
        "the same over actioncable-v1-ext-json (its stream reliable: positions on every \
         message, history kept)",
    ),
];

/// `fanout` (its `PROTOCOLS`).
const FANOUT: &[(Proto, &str)] = &[
    (
        Proto::Pusher,
        "Pusher WebSocket subscribers, Pusher HTTP API publishers",
    ),
    APPSYNC_GRAPHQL,
    APPSYNC_EVENTS,
];

/// `slow` and `soak` ([`Proto::WORST_DAY`]).
const WORST_DAY: &[(Proto, &str)] = &[
    (
        Proto::Pusher,
        "Pusher WebSocket clients at /app/{key}, Pusher HTTP API publishes",
    ),
    (
        Proto::ActionCable,
        "Action Cable at /cable, subscribed to `herald bench rpc-server`'s BenchmarkChannel (one \
         `id` per bench channel); publishes through the HTTP broadcast API (--broadcast-url)",
    ),
    APPSYNC_GRAPHQL,
    APPSYNC_EVENTS,
];

/// `latency` (its `PROTOCOLS`).
const LATENCY: &[(Proto, &str)] = &[
    (
        Proto::Pusher,
        "Pusher at /app/{key}: pusher:ping, subscribe, and Pusher HTTP API publishes",
    ),
    (
        Proto::ActionCable,
        "Action Cable at /cable with `herald bench rpc-server` as the app: BenchmarkChannel's \
         echo, subscribe, and publishes through the HTTP broadcast API (--broadcast-url)",
    ),
    APPSYNC_GRAPHQL,
    APPSYNC_EVENTS,
];

/// `storm`: every protocol ([`Proto::ALL`]).
const STORM: &[(Proto, &str)] = &[
    WORST_DAY[0],
    WORST_DAY[1],
    (
        Proto::ActionCableExt,
        "Action Cable over actioncable-v1-ext-json, as @anycable/core: keeps its sid and stream \
         positions, restores its session and asks for the missed messages after a drop",
    ),
    APPSYNC_GRAPHQL,
    APPSYNC_EVENTS,
];

#[derive(Args, Clone)]
struct BenchCommon {
    /// Server to load (loopback only unless --allow-remote); several
    /// comma-separated nodes of one cluster (connect, idle, broadcast,
    /// fanout): clients spread over them round-robin, publishes go through
    /// each in turn.
    #[arg(long, default_value = "ws://127.0.0.1:8080", value_delimiter = ',')]
    url: Vec<String>,
    #[arg(long, default_value = super::DEV_APP_ID)]
    app_id: String,
    #[arg(long, default_value = super::DEV_APP_KEY)]
    key: String,
    #[arg(long, default_value = super::DEV_APP_SECRET)]
    secret: String,
    /// Clients: peak users (broadcast), N (connect, idle), subscribers (fanout).
    #[arg(long)]
    clients: Option<usize>,
    /// Ramp time (broadcast), publishing time (fanout), hold time (idle);
    /// connect refuses it.
    #[arg(long, value_parser = super::parse_duration)]
    duration: Option<std::time::Duration>,
    /// Write every figure as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write an HTML report (histograms, timeline) to this file.
    #[arg(long)]
    html: Option<PathBuf>,
    /// Name the server or build under test in the reports, for
    /// `herald bench compare`.
    #[arg(long)]
    label: Option<String>,
    /// The server's pid: report its CPU and peak memory from /proc.
    /// Several comma-separated pids (in --url's order): each node's CPU and
    /// memory, and their sums (connect, idle, broadcast, fanout).
    #[arg(long, value_delimiter = ',')]
    server_pid: Vec<u32>,
    /// Generator processes sharing the clients (connect, idle, broadcast,
    /// fanout): each holds its share, up to its own open-file limit, and
    /// the parent merges their reports exactly.
    #[arg(long, default_value_t = 1)]
    processes: usize,
    /// Set by the parent of a --processes run: this child's place
    /// (INDEX/COUNT@CLOCK_EPOCH_US).
    #[arg(long, hide = true)]
    shard: Option<String>,
    /// Seconds each client may take to connect, and to subscribe.
    #[arg(long, default_value = "30s", value_parser = super::parse_duration)]
    timeout: std::time::Duration,
    /// No progress line on stderr.
    #[arg(long)]
    no_progress: bool,
    /// Allow a target that is not a loopback address.
    #[arg(long)]
    allow_remote: bool,
    /// Generator threads; 0 means one per CPU core. With 1 the generator
    /// runs on tokio's single-threaded scheduler (no work stealing, no
    /// cross-thread wake-ups), which costs less CPU per delivery when
    /// server and generator share a small machine.
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ViaArg {
    Ws,
    Http,
}

#[derive(Args)]
struct BroadcastArgs {
    #[command(flatten)]
    common: BenchCommon,
    /// How senders send: client events (ws) or HTTP API publishes (http).
    #[arg(long, value_enum, default_value = "ws")]
    via: ViaArg,
    /// How long each user lives before reconnecting.
    #[arg(long, default_value = "45s", value_parser = super::parse_duration)]
    lifetime: std::time::Duration,
    /// One user in this many is a sender.
    #[arg(long, default_value_t = 5)]
    sender_every: usize,
    /// A sender's tick.
    #[arg(long, default_value = "200ms", value_parser = super::parse_duration)]
    send_interval: std::time::Duration,
    /// Chance a sender sends on each tick.
    #[arg(long, default_value_t = 0.4)]
    send_probability: f64,
    #[arg(long, default_value = "private-benchmark")]
    channel: String,
    /// The protocol users speak: pusher, or actioncable (/cable with
    /// `herald bench rpc-server`'s BenchmarkChannel as the server's app;
    /// senders perform its broadcast action), or actioncable-ext (the
    /// same over actioncable-v1-ext-json).
    #[arg(long, default_value = "pusher", value_parser = protocol(WS_CLIENTS))]
    protocol: Proto,
}

#[derive(Args)]
struct ConnectArgs {
    #[command(flatten)]
    common: BenchCommon,
    /// Run increasing N, e.g. 1000,2000,5000,10000,20000.
    #[arg(long, value_delimiter = ',')]
    sweep: Option<Vec<usize>>,
    #[arg(long, default_value = "benchmark-connect")]
    channel: String,
    /// Keep every connection open until all N have settled, instead of each
    /// client disconnecting right after its own confirmation.
    #[arg(long)]
    hold: bool,
    /// The protocol clients speak: pusher, or actioncable (/cable,
    /// subscribing to `herald bench rpc-server`'s BenchmarkChannel).
    #[arg(long, default_value = "pusher", value_parser = protocol(WS_CLIENTS))]
    protocol: Proto,
}

#[derive(Args)]
struct FanoutArgs {
    #[command(flatten)]
    common: BenchCommon,
    /// Channels the subscribers are spread over.
    #[arg(long, default_value_t = 10)]
    channels: usize,
    /// Concurrent HTTP publishers.
    #[arg(long, default_value_t = 10)]
    publishers: usize,
    /// Publishes per second, all publishers together.
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// Longest wait for outstanding deliveries after the last publish.
    #[arg(long, default_value = "5s", value_parser = super::parse_duration)]
    drain: std::time::Duration,
    /// Subscribers connect to these servers, round-robin (nodes of one
    /// cluster; comma-separated ws:// URLs); publishers use --url.
    #[arg(long, value_delimiter = ',')]
    subscriber_url: Vec<String>,
    /// The protocol subscribers and publishers speak.
    #[arg(long, default_value = "pusher", value_parser = protocol(FANOUT))]
    protocol: Proto,
    /// A fault to run in the middle of publishing: this shell command
    /// (e.g. `kill -9 PID` of a broker server or a node) at --fault-at;
    /// the report adds the window until deliveries were whole again and
    /// what was missed in it. Dropped subscribers then come back 1 s later
    /// on another node, as pusher-js does. One generator process only.
    #[arg(long)]
    fault_cmd: Option<String>,
    /// When --fault-cmd runs, after the first scheduled publish; within
    /// --duration.
    #[arg(long, default_value = "10s", value_parser = super::parse_duration)]
    fault_at: std::time::Duration,
    /// Longest --fault-cmd may run (it runs beside the publishers).
    #[arg(long, default_value = "60s", value_parser = super::parse_duration)]
    fault_timeout: std::time::Duration,
}

#[derive(Args)]
struct IdleArgs {
    #[command(flatten)]
    common: BenchCommon,
    /// Channels each connection subscribes to (K).
    #[arg(long, default_value_t = 1)]
    channels: usize,
    /// Distinct channel names the subscriptions are spread over.
    #[arg(long, default_value_t = 100)]
    channel_pool: usize,
    /// Connections opened at once.
    #[arg(long, default_value_t = 256)]
    concurrency: usize,
    /// The protocol clients speak: pusher, or actioncable /
    /// actioncable-ext (/cable, through the app's Connect and Command, so
    /// the figure is what an identified, subscribed connection holds).
    #[arg(long, default_value = "pusher", value_parser = protocol(WS_CLIENTS))]
    protocol: Proto,
}

/// Run `herald bench <scenario>`: parse-free entry for `main`.
pub fn run(args: BenchArgs) -> ExitCode {
    use super::{broadcast, connect, fanout, idle, Target};
    let args = match args.scenario {
        Scenario::Rpc(a) => return super::rpc::run_cli(a),
        Scenario::RpcServer(a) => return super::rpc::serve_cli(a),
        Scenario::Compare(a) => return super::compare::run_cli(a),
        Scenario::Pusher(scenario) => PusherArgs { scenario },
    };
    let (name, mut common) = match &args.scenario {
        BenchScenario::Broadcast(a) => ("broadcast", a.common.clone()),
        BenchScenario::Connect(a) => ("connect", a.common.clone()),
        BenchScenario::Fanout(a) => ("fanout", a.common.clone()),
        BenchScenario::Idle(a) => ("idle", a.common.clone()),
        BenchScenario::Soak(a) => ("soak", a.common.clone()),
        BenchScenario::Storm(a) => ("storm", a.common.clone()),
        BenchScenario::Slow(a) => ("slow", a.common.clone()),
        BenchScenario::Latency(a) => ("latency", a.common.clone()),
        BenchScenario::Transports(a) => ("transports", a.common.clone()),
    };
    let sweep = matches!(&args.scenario, BenchScenario::Connect(a) if a.sweep.is_some());
    let spread = common.processes > 1 || common.server_pid.len() > 1;
    if let BenchScenario::Fanout(a) = &args.scenario {
        if a.fault_cmd.is_some() && common.processes > 1 {
            // The window needs every subscriber's ledger in one place, and
            // one process to run the command once.
            eprintln!("herald bench: --fault-cmd runs in one generator process (--processes 1)");
            return ExitCode::from(2);
        }
        if a.fault_cmd.is_some() && a.fault_at >= common.duration.unwrap_or(Duration::from_secs(30))
        {
            eprintln!("herald bench: --fault-at must be within --duration (the publishing time)");
            return ExitCode::from(2);
        }
    }
    if (spread && (sweep || !super::multi::SCENARIOS.contains(&name))) || common.processes == 0 {
        eprintln!("herald bench: {}", super::multi::refusal(name));
        return ExitCode::from(2);
    }
    if common.url.len() > 1 && !super::multi::SCENARIOS.contains(&name) {
        eprintln!(
            "herald bench: {name} takes one --url (several nodes: connect, idle, broadcast and              fanout; storm has --node-url)"
        );
        return ExitCode::from(2);
    }
    if common.url.is_empty() {
        eprintln!("herald bench: --url is empty");
        return ExitCode::from(2);
    }
    let shard = match common.shard.as_deref().map(super::shard::Shard::parse) {
        None => None,
        Some(Ok((shard, epoch))) => {
            // A child: its parent measures the servers and writes the
            // reports; this process keeps the parent's clock.
            super::set_clock_epoch(epoch);
            common.no_progress = true;
            common.server_pid.clear();
            Some(shard)
        }
        Some(Err(e)) => {
            eprintln!("herald bench: {e}");
            return ExitCode::from(2);
        }
    };
    if matches!(args.scenario, BenchScenario::Storm(_)) && common.duration.is_some() {
        eprintln!(
            "herald bench: storm has no --duration: it lasts until every client is back (or has \
             given up, --give-up) and the mass disconnect's --window is over"
        );
        return ExitCode::from(2);
    }
    if common.clients == Some(0) {
        // Zero clients would run the whole duration measuring nothing.
        eprintln!("herald bench: --clients must be at least 1");
        return ExitCode::from(2);
    }
    if matches!(args.scenario, BenchScenario::Latency(_)) && common.duration.is_some() {
        eprintln!(
            "herald bench: latency has no --duration: each client makes --rounds round trips of \
             each kind, --interval apart"
        );
        return ExitCode::from(2);
    }
    if matches!(args.scenario, BenchScenario::Connect(_)) && common.duration.is_some() {
        // An avalanche ends when every client has settled; silently
        // ignoring a duration would let someone think they set one.
        eprintln!(
            "herald bench: connect has no --duration: each avalanche lasts until every client \
             has connected and subscribed (or failed); use --clients or --sweep to size it"
        );
        return ExitCode::from(2);
    }
    let mut nodes = Vec::new();
    for url in &common.url {
        match Target::new(
            url,
            &common.app_id,
            &common.key,
            &common.secret,
            common.allow_remote,
        ) {
            Ok(t) => nodes.push(t),
            Err(e) => {
                eprintln!("herald bench: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let target = nodes[0].clone();
    if nodes.len() == 1 {
        nodes.clear();
    }
    let server_pid = common.server_pid.first().copied();
    let runtime = match common.threads {
        0 => tokio::runtime::Runtime::new(),
        1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
    };
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => {
            eprintln!("herald bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let progress = !common.no_progress;
    let result = runtime.block_on(async {
        super::now_us();
        if spread && shard.is_none() {
            // The parent of a --processes run: the children run the
            // scenario with these same arguments.
            let hold = match &args.scenario {
                BenchScenario::Idle(_) => common.duration.unwrap_or(Duration::from_secs(10)),
                _ => Duration::ZERO,
            };
            return super::multi::run(&super::multi::MultiParams {
                scenario: name.to_string(),
                args: std::env::args()
                    .skip_while(|a| a != "bench")
                    .skip(1)
                    .collect(),
                processes: common.processes,
                server_pids: common.server_pid.clone(),
                hold,
            })
            .await;
        }
        match args.scenario {
            BenchScenario::Broadcast(a) => {
                let mut p = broadcast::BroadcastParams::new(target);
                p.peak = common.clients.unwrap_or(p.peak);
                p.duration = common.duration.unwrap_or(p.duration);
                p.lifetime = a.lifetime;
                p.sender_every = a.sender_every;
                p.send_interval = a.send_interval;
                p.send_probability = a.send_probability;
                p.channel = a.channel;
                p.protocol = a.protocol;
                p.via = match a.via {
                    ViaArg::Ws => broadcast::Via::Ws,
                    ViaArg::Http => broadcast::Via::Http,
                };
                p.timeout = common.timeout;
                p.progress = progress;
                p.server_pid = server_pid;
                p.nodes = nodes;
                p.shard = shard;
                broadcast::run(&p).await
            }
            BenchScenario::Connect(a) => {
                let mut p = connect::ConnectParams::new(target);
                p.clients = common.clients.unwrap_or(p.clients);
                p.channel = a.channel;
                p.hold = a.hold;
                p.protocol = a.protocol;
                p.timeout = common.timeout;
                p.progress = progress;
                p.server_pid = server_pid;
                p.nodes = nodes;
                p.shard = shard;
                match a.sweep {
                    Some(steps) => {
                        connect::sweep(&connect::SweepParams {
                            base: p,
                            steps,
                            pause: std::time::Duration::from_secs(3),
                        })
                        .await
                    }
                    None => connect::run(&p).await,
                }
            }
            BenchScenario::Fanout(a) => {
                let mut p = fanout::FanoutParams::new(target);
                p.subscribers = common.clients.unwrap_or(p.subscribers);
                p.duration = common.duration.unwrap_or(p.duration);
                p.channels = a.channels;
                p.publishers = a.publishers;
                p.rate = a.rate;
                p.drain = a.drain;
                p.protocol = a.protocol;
                p.timeout = common.timeout;
                p.progress = progress;
                p.server_pid = server_pid;
                p.nodes = nodes;
                p.shard = shard;
                p.fault = a.fault_cmd.map(|command| super::fault::Fault {
                    command,
                    at: a.fault_at,
                    timeout: a.fault_timeout,
                });
                for url in &a.subscriber_url {
                    match Target::new(
                        url,
                        &common.app_id,
                        &common.key,
                        &common.secret,
                        common.allow_remote,
                    ) {
                        Ok(t) => p.subscriber_targets.push(t),
                        Err(e) => return Err(e),
                    }
                }
                fanout::run(&p).await
            }
            BenchScenario::Idle(a) => {
                let mut p = idle::IdleParams::new(target);
                p.clients = common.clients.unwrap_or(p.clients);
                p.hold = common.duration.unwrap_or(p.hold);
                p.channels_per_client = a.channels;
                p.channel_pool = a.channel_pool;
                p.concurrency = a.concurrency;
                p.protocol = a.protocol;
                p.timeout = common.timeout;
                p.progress = progress;
                p.server_pid = server_pid;
                p.nodes = nodes;
                p.shard = shard;
                idle::run(&p).await
            }
            BenchScenario::Soak(a) => {
                let mut p = super::soak::SoakParams::new(target);
                p.protocol = a.protocol;
                p.broadcast = a.broadcast.get();
                p.subscribers = common.clients.unwrap_or(p.subscribers);
                p.duration = common.duration.unwrap_or(p.duration);
                p.warmup = a.warmup;
                p.sample_interval = a.sample_interval;
                p.channels = a.channels;
                p.rate = a.rate;
                p.lifetime = a.lifetime;
                p.presence = a.presence;
                p.presence_channels = a.presence_channels;
                p.presence_stay = a.presence_stay;
                p.api_interval = a.api_interval;
                p.grace = a.grace;
                p.metrics_url = a.metrics_url;
                p.timeout = common.timeout;
                p.progress = progress;
                p.server_pid = server_pid;
                super::soak::run(&p).await
            }
            BenchScenario::Storm(a) => {
                let mut p = super::storm::StormParams::new(target);
                p.protocol = a.protocol;
                p.clients = common.clients.unwrap_or(p.clients);
                p.channels = a.channels;
                p.presence_size = a.presence_size;
                p.concurrency = a.concurrency;
                p.jitter = a.jitter;
                p.give_up = a.give_up;
                p.newcomer_rate = a.newcomer_rate;
                p.window = a.window;
                p.rate = a.rate;
                p.broadcast = a.broadcast.get();
                p.metrics_url = a.metrics_url;
                p.timeout = common.timeout;
                p.progress = progress;
                p.server_pid = server_pid;
                for url in &a.node_url {
                    p.nodes.push(Target::new(
                        url,
                        &common.app_id,
                        &common.key,
                        &common.secret,
                        common.allow_remote,
                    )?);
                }
                if let Some(first) = p.nodes.first() {
                    p.target = first.clone();
                }
                p.restart = a.restart_cmd.map(|command| super::rolling::Restart {
                    command,
                    signal: match a.restart_signal.as_str() {
                        "kill" => super::rolling::Signal::Kill,
                        _ => super::rolling::Signal::Term,
                    },
                    timeout: a.restart_timeout,
                });
                super::storm::run(&p).await
            }
            BenchScenario::Slow(a) => {
                let mut p = super::slow::SlowParams::new(target);
                p.protocol = a.protocol;
                p.broadcast = a.broadcast.get();
                p.clients = common.clients.unwrap_or(p.clients);
                p.duration = common.duration.unwrap_or(p.duration);
                p.slow_share = a.slow_share;
                p.channels = a.channels;
                p.rate = a.rate;
                p.payload = a.payload;
                p.slow_recv_buffer = a.slow_recv_buffer;
                p.until_closed = a.until_closed;
                p.queue_bytes = a.queue_bytes;
                p.metrics_url = a.metrics_url;
                p.timeout = common.timeout;
                p.progress = progress;
                p.server_pid = server_pid;
                super::slow::run(&p).await
            }
            BenchScenario::Latency(a) => {
                let mut p = super::latency::LatencyParams::new(target);
                p.protocol = a.protocol;
                p.broadcast = a.broadcast.get();
                p.clients = common.clients.unwrap_or(p.clients);
                p.rounds = a.rounds;
                p.interval = a.interval;
                p.timeout = common.timeout;
                p.server_pid = server_pid;
                super::latency::run(&p).await
            }
            BenchScenario::Transports(a) => {
                let p = super::transports::TransportsParams {
                    target,
                    transport: a.transport,
                    clients: common.clients.unwrap_or(1000),
                    events: a.events,
                    rate: a.rate,
                    hold: common.duration.unwrap_or(Duration::from_secs(5)),
                    concurrency: a.concurrency,
                    timeout: common.timeout,
                    server_pid,
                };
                super::transports::run(&p).await
            }
        }
    });
    let mut report = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("herald bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    if shard.is_some() {
        return match super::shard::send_report(&report) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("herald bench: cannot send the report to the parent process: {e}");
                ExitCode::FAILURE
            }
        };
    }
    report.label = common.label.clone();
    print!("{}", report.summary());
    let mut code = ExitCode::SUCCESS;
    if let Some(path) = &common.json {
        let text = serde_json::to_string_pretty(&report.json()).unwrap_or_default();
        if let Err(e) = std::fs::write(path, text + "\n") {
            eprintln!("herald bench: cannot write {}: {e}", path.display());
            code = ExitCode::FAILURE;
        }
    }
    if let Some(path) = &common.html {
        if let Err(e) = std::fs::write(path, report.html()) {
            eprintln!("herald bench: cannot write {}: {e}", path.display());
            code = ExitCode::FAILURE;
        }
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;
    use clap::Parser;

    #[derive(Parser)]
    struct Bench {
        #[command(flatten)]
        args: BenchArgs,
    }

    /// The `--protocol` of `herald bench <argv>`.
    fn protocol_of(argv: &[&str]) -> Result<Proto, clap::Error> {
        let bench = Bench::try_parse_from(std::iter::once("bench").chain(argv.iter().copied()))?;
        Ok(match bench.args.scenario {
            Scenario::Pusher(BenchScenario::Broadcast(a)) => a.protocol,
            Scenario::Pusher(BenchScenario::Connect(a)) => a.protocol,
            Scenario::Pusher(BenchScenario::Fanout(a)) => a.protocol,
            Scenario::Pusher(BenchScenario::Soak(a)) => a.protocol,
            Scenario::Pusher(BenchScenario::Storm(a)) => a.protocol,
            Scenario::Pusher(BenchScenario::Slow(a)) => a.protocol,
            Scenario::Pusher(BenchScenario::Latency(a)) => a.protocol,
            _ => panic!("{argv:?} has no --protocol"),
        })
    }

    /// Each scenario's `--protocol` takes exactly the protocols the
    /// scenario speaks, by name, and defaults to pusher; the others are
    /// clap's invalid values.
    #[test]
    fn each_scenario_takes_the_protocols_it_speaks() {
        use crate::{broadcast, connect, fanout};
        for (scenario, speaks) in [
            ("broadcast", broadcast::PROTOCOLS),
            ("connect", connect::PROTOCOLS),
            ("fanout", fanout::PROTOCOLS),
            ("storm", &Proto::ALL[..]),
            ("slow", &Proto::WORST_DAY[..]),
            ("soak", &Proto::WORST_DAY[..]),
            ("latency", crate::latency::PROTOCOLS),
        ] {
            assert_eq!(
                protocol_of(&[scenario]).unwrap(),
                Proto::Pusher,
                "{scenario}"
            );
            for proto in Proto::ALL {
                let parsed = protocol_of(&[scenario, "--protocol", proto.name()]);
                if speaks.contains(&proto) {
                    assert_eq!(parsed.unwrap(), proto, "{scenario}");
                } else {
                    let kind = parsed.err().map(|e| e.kind());
                    assert_eq!(kind, Some(ErrorKind::InvalidValue), "{scenario} {proto:?}");
                }
            }
            let kind = protocol_of(&[scenario, "--protocol", "stomp"])
                .err()
                .map(|e| e.kind());
            assert_eq!(kind, Some(ErrorKind::InvalidValue), "{scenario}");
        }
    }
}
