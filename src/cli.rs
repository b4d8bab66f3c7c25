//! The `herald` command: `herald serve` runs the server, `herald config`
//! shows or checks the configuration it would run with, `herald bench`
//! load-tests any server speaking the Pusher protocol. [`main`] takes the
//! adapters to serve, so a build with another protocol is this plus its
//! adapter (src/main.rs lists Herald's own; examples/echo-adapter adds one).
//! Each adapter's environment variables and flags join `serve`'s and
//! `config`'s here ([`herald_core::adapter::Setting`]).

use crate::effective::{self, Effective, Source};
use crate::server;
use clap::parser::ValueSource;
use clap::Arg;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use herald_core::adapter::{Adapters, Setting};
use herald_core::config::{Config, Overrides};
use herald_core::node::Node;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Parser)]
#[command(
    name = "herald",
    version = crate::build_info::LONG_VERSION,
    about = "Self-hosted real-time messaging server (Pusher Channels v7, Action Cable with AnyCable RPC, AWS AppSync real-time)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server.
    Serve(ServeArgs),
    /// Print the effective configuration, each value with its source
    /// (secrets masked); with --check, only problems (exit 2 if invalid).
    Config(ConfigArgs),
    /// Exit 0 if a herald answers 200 on /up (for container health checks,
    /// where no curl is at hand).
    Health(HealthArgs),
    /// Load-test a server speaking the Pusher protocol (k6-style summary).
    Bench(herald_bench::cli::BenchArgs),
}

#[derive(Args)]
struct HealthArgs {
    /// The URL to ask (plain HTTP; default http://127.0.0.1:$HERALD_PORT/up,
    /// port 8080 when unset).
    #[arg(long)]
    url: Option<String>,
}

#[derive(Args)]
struct ConfigArgs {
    #[command(flatten)]
    serve: ServeArgs,
    /// Print only problems (unsupported or unknown peer variables,
    /// conflicts, errors) and "ok"; exit 2 on an invalid configuration.
    #[arg(long)]
    check: bool,
    /// Show only the settings that differ from the defaults.
    #[arg(long, conflicts_with = "check")]
    changed: bool,
}

#[derive(Args)]
struct ServeArgs {
    /// TOML configuration file.
    #[arg(long, env = "HERALD_CONFIG")]
    config: Option<PathBuf>,
    /// A Laravel or Rails `.env` file: its variables (Herald's own and the
    /// peers' REVERB_*, SOKETI_*, ANYCABLE_*, PUSHER_APP_*) are read as if
    /// set in the environment; the environment wins.
    #[arg(long, value_name = "PATH")]
    env_file: Option<PathBuf>,
    /// Refuse to start as root (uid 0). The image runs as an unprivileged
    /// user; this turns a `--user 0` override into an error.
    #[arg(long, env = "HERALD_REFUSE_ROOT")]
    refuse_root: Option<bool>,
    /// Address to bind (default 127.0.0.1).
    #[arg(long, env = "HERALD_HOST")]
    host: Option<String>,
    /// Port to listen on (default 8080).
    #[arg(long, env = "HERALD_PORT", value_parser = port)]
    port: Option<u16>,
    /// Seconds of client silence before a ping (default 120).
    #[arg(long, env = "HERALD_ACTIVITY_TIMEOUT", value_parser = seconds("HERALD_ACTIVITY_TIMEOUT"))]
    activity_timeout: Option<u64>,
    /// Seconds clients get to leave on shutdown (default 10).
    #[arg(long, env = "HERALD_SHUTDOWN_GRACE", value_parser = seconds("HERALD_SHUTDOWN_GRACE"))]
    shutdown_grace: Option<u64>,
    /// Milliseconds each connection's writer collects frames after the
    /// first before one write (0 = write at once; see docs/configuration.md).
    #[arg(long, env = "HERALD_WRITE_DELAY_MS", value_parser = millis("HERALD_WRITE_DELAY_MS"))]
    write_delay_ms: Option<u64>,
    /// Apply --write-delay-ms only to connections written to in the last
    /// 50 ms (quiet connections write at once).
    #[arg(long, env = "HERALD_WRITE_DELAY_BUSY_ONLY")]
    write_delay_busy_only: Option<bool>,
    /// Apply --write-delay-ms only while the fan-out delivers at least
    /// this many frames a second (0 = at any rate; see
    /// docs/configuration.md).
    #[arg(long, env = "HERALD_WRITE_DELAY_MIN_RATE")]
    write_delay_min_rate: Option<u32>,
    /// Let the fan-out write quiet connections' frames to their sockets
    /// itself (default true; see docs/configuration.md).
    #[arg(long, env = "HERALD_DIRECT_WRITES")]
    direct_writes: Option<bool>,
    /// Negotiate permessage-deflate with WebSocket clients that offer it
    /// (default true; see docs/configuration.md).
    #[arg(long, env = "HERALD_WEBSOCKET_COMPRESSION")]
    websocket_compression: Option<bool>,
    /// Serve the development app (public secret) on a non-loopback host.
    #[arg(long, env = "HERALD_ALLOW_DEVELOPMENT_CREDENTIALS")]
    allow_development_credentials: Option<bool>,
    /// Log filter, e.g. `info` or `herald=debug`.
    #[arg(long, env = "HERALD_LOG")]
    log: Option<String>,
    /// Id of the single app (replaces the development app's).
    #[arg(long, env = "HERALD_APP_ID")]
    app_id: Option<String>,
    /// Key of the single app.
    #[arg(long, env = "HERALD_APP_KEY")]
    app_key: Option<String>,
    /// Secret of the single app.
    #[arg(long, env = "HERALD_APP_SECRET", hide_env_values = true)]
    app_secret: Option<String>,
    /// Web pages that may connect to the single app, comma-separated:
    /// hosts, `*.domain` wildcards, full origins, or `*` (any; the default).
    #[arg(long, env = "HERALD_ALLOWED_ORIGINS", value_delimiter = ',')]
    allowed_origins: Option<Vec<String>>,
    /// PEM certificate chain: serve wss:// and https:// (needs --tls-key).
    #[arg(long, env = "HERALD_TLS_CERT")]
    tls_cert: Option<String>,
    /// PEM private key for --tls-cert.
    #[arg(long, env = "HERALD_TLS_KEY")]
    tls_key: Option<String>,
    /// Log lines as `text` (default) or `json`.
    #[arg(long, env = "HERALD_LOG_FORMAT")]
    log_format: Option<herald_core::config::LogFormat>,
    /// Serve /metrics on this port only (same host), not on --port.
    #[arg(long, env = "HERALD_METRICS_PORT", value_parser = metrics_port)]
    metrics_port: Option<u16>,
    /// Serve the live dashboard at /dashboard (needs --dashboard-token).
    #[arg(long, env = "HERALD_DASHBOARD")]
    dashboard: Option<bool>,
    /// The dashboard's access token (at least 16 characters; the dashboard
    /// also needs --dashboard / HERALD_DASHBOARD / `dashboard = true`).
    #[arg(long, env = "HERALD_DASHBOARD_TOKEN", hide_env_values = true)]
    dashboard_token: Option<String>,
    /// Cluster broker: `local` (default), redis://…, rediss://…,
    /// redis-sentinel://HOST:PORT[,…]/MASTER, nats://… (several NATS servers
    /// comma-separated)
    /// (see docs/cluster.md).
    #[arg(long, env = "HERALD_BROKER", hide_env_values = true)]
    broker: Option<String>,
    /// PEM file of the authorities to trust for the broker's TLS
    /// certificate, instead of the system's (rediss://… or tls:// only).
    #[arg(long, env = "HERALD_BROKER_TLS_CA", value_name = "PATH")]
    broker_tls_ca: Option<String>,
    /// PEM client certificate to present to the broker (needs
    /// --broker-tls-key).
    #[arg(long, env = "HERALD_BROKER_TLS_CERT", value_name = "PATH")]
    broker_tls_cert: Option<String>,
    /// PEM private key of --broker-tls-cert.
    #[arg(long, env = "HERALD_BROKER_TLS_KEY", value_name = "PATH")]
    broker_tls_key: Option<String>,
    /// Seconds between keep-alive messages on protocols that send them on
    /// a clock (AppSync's `ka`; default 60).
    #[arg(long, env = "HERALD_KEEPALIVE_INTERVAL", value_parser = seconds("HERALD_KEEPALIVE_INTERVAL"))]
    keepalive_interval: Option<u64>,
}

/// `--port` / `HERALD_PORT`. clap names only the flag in its errors; a
/// value from the environment deserves its variable's name too.
fn port(s: &str) -> Result<u16, String> {
    s.parse()
        .map_err(|_| format!("{s:?} is not a port number (0-65535; from --port or HERALD_PORT)"))
}

fn metrics_port(s: &str) -> Result<u16, String> {
    s.parse().map_err(|_| {
        format!("{s:?} is not a port number (0-65535; from --metrics-port or HERALD_METRICS_PORT)")
    })
}

/// A whole number of `unit`s, from a flag or the environment variable `env`.
fn whole(unit: &'static str, env: &'static str) -> impl Fn(&str) -> Result<u64, String> + Clone {
    move |s: &str| {
        s.parse()
            .map_err(|_| format!("{s:?} is not a whole number of {unit} (from the flag or {env})"))
    }
}

fn seconds(env: &'static str) -> impl Fn(&str) -> Result<u64, String> + Clone {
    whole("seconds", env)
}

fn millis(env: &'static str) -> impl Fn(&str) -> Result<u64, String> + Clone {
    whole("milliseconds", env)
}

/// `--env-file PATH` before clap reads the environment: the file's
/// variables must be in place when `env = ...` arguments are resolved.
fn env_file_arg() -> Option<PathBuf> {
    let mut args = std::env::args_os().skip(1);
    while let Some(a) = args.next() {
        let a = a.to_string_lossy().into_owned();
        if a == "--" {
            break;
        }
        if a == "--env-file" {
            return args.next().map(PathBuf::from);
        }
        if let Some(p) = a.strip_prefix("--env-file=") {
            return Some(PathBuf::from(p));
        }
    }
    None
}

/// The command with every adapter's arguments on `serve` and `config`.
fn command(adapters: &Adapters) -> clap::Command {
    let args: Vec<Arg> = adapters
        .iter()
        .flat_map(|a| a.settings())
        .map(|s| {
            Arg::new(s.key)
                .long(s.flag)
                .value_name(s.flag.to_uppercase().replace('-', "_"))
                .env(s.env)
                .help(s.help)
                .hide_env_values(s.secret)
        })
        .collect();
    Cli::command()
        .mut_subcommand("serve", |c| c.args(args.clone()))
        .mut_subcommand("config", |c| c.args(args))
}

/// Run the `herald` command with `adapters` (the binary's `main`).
pub fn main(adapters: Adapters) -> ExitCode {
    if let Some(path) = env_file_arg() {
        if let Err(e) = effective::load_env_file(&path) {
            eprintln!("herald: {e}");
            return ExitCode::from(2);
        }
    }
    let matches = command(&adapters).get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    let sub = |name| matches.subcommand_matches(name);
    match cli.command {
        Command::Serve(args) => serve(args, sub("serve"), adapters),
        Command::Config(args) => show_config(args, sub("config"), &adapters),
        Command::Health(args) => health(args),
        Command::Bench(args) => herald_bench::cli::run(args),
    }
}

/// The config key each `serve` argument sets (its id, when not the same).
fn key_of(id: &str) -> Option<&str> {
    Some(match id {
        "config" | "env_file" | "check" | "refuse_root" => return None,
        "broker" => "broker.url",
        "broker_tls_ca" => "broker.tls_ca",
        "broker_tls_cert" => "broker.tls_cert",
        "broker_tls_key" => "broker.tls_key",
        "app_id" => "apps[0].id",
        "app_key" => "apps[0].key",
        "app_secret" => "apps[0].secret",
        "allowed_origins" => "apps[0].allowed_origins",
        // Adapters' arguments are named by the key they set.
        other => other,
    })
}

/// The settings Herald's own environment and flags gave, environment
/// first (flags win over it), from clap's record of each value's source.
fn herald_sources(
    name: &str,
    matches: Option<&ArgMatches>,
    adapters: &Adapters,
) -> Vec<(String, Source)> {
    let Some(matches) = matches else {
        return Vec::new();
    };
    let cmd = command(adapters);
    let Some(sub) = cmd.find_subcommand(name) else {
        return Vec::new();
    };
    let mut env = Vec::new();
    let mut flags = Vec::new();
    for arg in sub.get_arguments() {
        let id = arg.get_id().as_str();
        let Some(key) = key_of(id) else { continue };
        match matches.value_source(id) {
            Some(ValueSource::EnvVariable) => env.push((
                key.to_string(),
                Source::Env(
                    arg.get_env()
                        .map(|e| e.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                ),
            )),
            Some(ValueSource::CommandLine) => flags.push((
                key.to_string(),
                Source::Flag(format!("--{}", arg.get_long().unwrap_or(id))),
            )),
            _ => {}
        }
    }
    env.extend(flags);
    env
}

fn effective_config(
    args: ServeArgs,
    matches: Option<&ArgMatches>,
    name: &str,
    adapters: &Adapters,
) -> Result<Effective, String> {
    let (file, overrides) = layers(args, matches, adapters)?;
    effective_from(file.as_deref(), &overrides, matches, name, adapters)
}

/// The config file named and the environment's and flags' overrides.
fn layers(
    args: ServeArgs,
    matches: Option<&ArgMatches>,
    adapters: &Adapters,
) -> Result<(Option<PathBuf>, Overrides), String> {
    let file = args.config.clone();
    let mut overrides = overrides(args);
    overrides.adapter = adapter_overrides(matches, adapters)?;
    Ok((file, overrides))
}

fn effective_from(
    file: Option<&std::path::Path>,
    overrides: &Overrides,
    matches: Option<&ArgMatches>,
    name: &str,
    adapters: &Adapters,
) -> Result<Effective, String> {
    let eff = effective::load(
        file,
        overrides,
        herald_sources(name, matches, adapters),
        &crate::peers::Env::from_process(),
        adapters,
    )?;
    // A bad broker URL is a configuration error like any other, for
    // `serve` (refused before anything listens) and `config` alike: the
    // engine's own parser, naming the setting, never the password.
    herald_broker::check(&eff.config.broker)?;
    // The broker's TLS files too: read and checked here, so that a
    // missing or garbage file is refused before anything listens.
    herald_broker::tls::BrokerTls::load(&eff.config.broker)?;
    Ok(eff)
}

/// The adapters' settings given by their environment variables and
/// flags: (key, the variable or flag, value). A value its adapter cannot
/// read is an error naming the variable or flag.
fn adapter_overrides(
    matches: Option<&ArgMatches>,
    adapters: &Adapters,
) -> Result<Vec<(String, String, toml::Value)>, String> {
    let Some(matches) = matches else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for s in adapters.iter().flat_map(|a| a.settings()) {
        let Some(v) = matches.get_one::<String>(s.key) else {
            continue;
        };
        let name = origin(matches, s);
        let value = (s.parse)(v).map_err(|e| format!("{name}: {e}"))?;
        out.push((s.key.to_owned(), name, value));
    }
    Ok(out)
}

/// `HERALD_X` or `--x`, whichever gave `s`'s value.
fn origin(matches: &ArgMatches, s: &Setting) -> String {
    match matches.value_source(s.key) {
        Some(ValueSource::EnvVariable) => s.env.to_owned(),
        _ => format!("--{}", s.flag),
    }
}

fn show_config(args: ConfigArgs, matches: Option<&ArgMatches>, adapters: &Adapters) -> ExitCode {
    let check = args.check;
    let changed = args.changed;
    let eff = match effective_config(args.serve, matches, "config", adapters) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("herald: {e}");
            return ExitCode::from(2);
        }
    };
    let warnings = eff.warnings();
    if check {
        for w in &warnings {
            println!("warning: {w}");
        }
        println!("ok");
        return ExitCode::SUCCESS;
    }
    let mut rows = eff.settings();
    if changed {
        rows.retain(|(_, _, source)| *source != Source::Default);
    }
    let width = rows
        .iter()
        .map(|(k, v, _)| k.len() + v.len() + 3)
        .max()
        .unwrap_or(0)
        .min(72);
    for (key, value, source) in rows {
        let line = format!("{key} = {value}");
        println!("{line:<width$}  # {source}");
    }
    for w in &warnings {
        println!("# warning: {w}");
    }
    ExitCode::SUCCESS
}

/// `herald health`: one GET, 2 s at most, status 200 or exit 1.
fn health(args: HealthArgs) -> ExitCode {
    use std::io::{Read, Write};
    use std::time::Duration;
    let url = args.url.unwrap_or_else(|| {
        let port = std::env::var("HERALD_PORT").unwrap_or_else(|_| "8080".into());
        format!("http://127.0.0.1:{port}/up")
    });
    let Some(rest) = url.strip_prefix("http://") else {
        eprintln!("herald health: {url:?} is not an http:// URL");
        return ExitCode::from(2);
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    let answer = (|| -> std::io::Result<String> {
        use std::net::ToSocketAddrs;
        let addr = authority
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| std::io::Error::other("no address"))?;
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.set_write_timeout(Some(Duration::from_secs(2)))?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: {authority}\r\n\r\n")?;
        let mut head = [0u8; 64];
        let n = s.read(&mut head)?;
        Ok(String::from_utf8_lossy(&head[..n]).into_owned())
    })();
    match answer {
        Ok(head) if head.split_whitespace().nth(1) == Some("200") => ExitCode::SUCCESS,
        Ok(head) => {
            eprintln!(
                "herald health: {url}: {}",
                head.lines().next().unwrap_or("")
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("herald health: {url}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(args: ServeArgs, matches: Option<&ArgMatches>, adapters: Adapters) -> ExitCode {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if args.refuse_root == Some(true) && unsafe { libc::geteuid() } == 0 {
        eprintln!("herald: running as root and HERALD_REFUSE_ROOT/--refuse-root is set: start as an unprivileged user");
        return ExitCode::from(2);
    }
    let loaded = layers(args, matches, &adapters).and_then(|(file, overrides)| {
        let eff = effective_from(file.as_deref(), &overrides, matches, "serve", &adapters)?;
        Ok((eff, file, overrides))
    });
    let (eff, file, overrides) = match loaded {
        Ok(e) => e,
        Err(e) => {
            eprintln!("herald: {e}");
            return ExitCode::from(2);
        }
    };
    // SIGHUP re-reads the apps the same way: the file, then the peers'
    // and Herald's own environment and flags, every check included.
    let source = Arc::new(FileSource {
        file,
        overrides,
        adapters: adapters.clone(),
    });
    let config = eff.config.clone();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&config.log))
        // Colour codes only on a terminal: in files, the journal and
        // container logs they are noise around every line.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match config.log_format {
        herald_core::config::LogFormat::Text => logs.init(),
        herald_core::config::LogFormat::Json => logs.json().flatten_event(true).init(),
    }
    log_peer_settings(&eff);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("herald: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(config, adapters, source)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("herald: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One line naming the peer variables read (names only: values may be
/// secrets), one per thing not taken from them.
fn log_peer_settings(eff: &Effective) {
    let read = eff.peers.read_names();
    if !read.is_empty() {
        tracing::info!(
            peers = %eff.peers.peers().join(", "),
            variables = %read.join(", "),
            "read the settings of the server Herald replaces"
        );
    }
    for (name, why) in &eff.peers.no_effect {
        tracing::info!(
            variable = name,
            "{name} read: nothing for the server to do ({why})"
        );
    }
    for w in eff.warnings() {
        tracing::warn!("{w}");
    }
}

fn overrides(args: ServeArgs) -> Overrides {
    Overrides {
        host: args.host,
        port: args.port,
        activity_timeout: args.activity_timeout,
        shutdown_grace: args.shutdown_grace,
        write_delay_ms: args.write_delay_ms,
        write_delay_busy_only: args.write_delay_busy_only,
        write_delay_min_rate: args.write_delay_min_rate,
        direct_writes: args.direct_writes,
        websocket_compression: args.websocket_compression,
        allow_development_credentials: args.allow_development_credentials,
        log: args.log,
        app_id: args.app_id,
        app_key: args.app_key,
        app_secret: args.app_secret,
        allowed_origins: args.allowed_origins,
        tls_cert: args.tls_cert,
        tls_key: args.tls_key,
        log_format: args.log_format,
        metrics_port: args.metrics_port,
        dashboard: args.dashboard,
        dashboard_token: args.dashboard_token,
        broker: args.broker,
        broker_tls_ca: args.broker_tls_ca,
        broker_tls_cert: args.broker_tls_cert,
        broker_tls_key: args.broker_tls_key,
        keepalive_interval: args.keepalive_interval,
        adapter: Vec::new(),
    }
}

/// The apps of the config file (and the layers over it), re-read on
/// SIGHUP: the source of [`herald_core::apps`] that `herald serve` uses.
struct FileSource {
    file: Option<PathBuf>,
    overrides: Overrides,
    adapters: Adapters,
}

impl herald_core::apps::Source for FileSource {
    fn name(&self) -> &'static str {
        "file"
    }

    fn load(
        &self,
    ) -> herald_core::future::BoxFuture<Result<Vec<herald_core::config::AppConfig>, String>> {
        let (file, overrides, adapters) = (
            self.file.clone(),
            self.overrides.clone(),
            self.adapters.clone(),
        );
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                effective_from(file.as_deref(), &overrides, None, "serve", &adapters)
                    .map(|eff| eff.config.apps)
            })
            .await
            .map_err(|e| e.to_string())?
        })
    }
}

async fn run(
    config: Config,
    adapters: Adapters,
    source: Arc<dyn herald_core::apps::Source>,
) -> std::io::Result<()> {
    let ip = config
        .bind_ip()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
    let addr = SocketAddr::new(ip, config.port);
    match server::raise_open_file_limit() {
        Some(limit) if limit < 10_000 => tracing::warn!(
            limit,
            "open-file limit is low: each connection needs a file descriptor; \
             raise it (ulimit -Hn, LimitNOFILE=) to serve more clients"
        ),
        Some(limit) => tracing::info!(limit, "open-file limit"),
        None => tracing::warn!("cannot read the open-file limit"),
    }
    let listener = server::bind(addr, config.listen_backlog)
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
    for app in &config.apps {
        if app.is_development() {
            tracing::warn!(
                app_id = %app.id,
                key = %app.key,
                "serving with the DEVELOPMENT credentials (secret \"app-secret\" is public); \
                 configure your own apps before exposing this server"
            );
        }
    }
    let broker = herald_broker::from_config(&config.broker)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let shown = config.broker.shown_url();
    let database = config.apps_database.clone();
    let node = Node::new(config, broker);
    match database.url {
        Some(_) => {
            // The table's apps before the first client: a start with the
            // database away serves the file's apps and retries.
            let db = crate::apps_db::DbSource::new(source, database);
            let every = db.refresh();
            node.apps.set_source(db);
            if let Err(e) = node.apps.reload().await {
                tracing::error!(error = %e, "apps database: not read at start; retrying every refresh");
            }
            crate::apps_db::spawn(node.clone(), every);
        }
        None => node.apps.set_source(source),
    }
    node.start_fanout();
    tracing::info!(%addr, apps = node.apps.len(), broker = node.broker.name(), url = %shown, "herald listening");
    if node.config.dashboard_token().is_some() {
        let scheme = if node.config.tls_cert.is_some() {
            "https"
        } else {
            "http"
        };
        tracing::info!(
            "dashboard at {scheme}://{addr}/dashboard (sign in with the dashboard token)"
        );
    }
    server::serve_with(adapters, node, listener, server::shutdown::signal()).await
}
