//! `herald bench`: a load generator for any server speaking Herald's
//! protocols (Pusher Channels v7 with its HTTP API, Action Cable with
//! AnyCable's extended protocol, AppSync's GraphQL and Events APIs). Its own crate
//! (`herald-bench`): it shares only `herald-signing` with the server, and
//! the `herald` binary's `bench` subcommand calls [`cli::run`].
//!
//! ```text
//! lib.rs      the target (URL, app credentials), errors, preflight checks,
//!             open-file limit, source addresses, CPU and memory probes
//! client      one WebSocket client: connect, subscribe, scan frames
//! metrics     HDR latency histograms, live counters, the once-a-second
//!             monitor (progress line and timeline)
//! ledger      message ids and exact delivery accounting (lost, duplicated,
//!             unexpected)
//! report      the k6-style summary, `--json` and `--html` output
//! broadcast   ramping virtual users sending client events (or HTTP publishes)
//! connect     connection avalanche, and `--sweep` over increasing N
//! fanout      HTTP publishers to many subscribers over several channels
//! idle        many idle subscribed connections; server memory per connection
//! wire        the clients' socket: TCP, counted, optionally offering
//!             permessage-deflate (`--deflate`)
//! transports  held Pusher clients over ws, xhr_streaming or xhr_polling:
//!             server memory per held client, CPU per delivery
//! latency     light load: a few clients, one paced request at a time;
//!             round trips per kind and protocol
//! rpc         AnyCable RPC: a gRPC BenchmarkChannel server (`rpc-server`)
//!             and a throughput scenario against any such server (`rpc`)
//! soak        hours of mixed load; growth of the server's memory,
//!             descriptors and threads per hour, exact delivery accounting
//! storm       mass disconnect and reconnect; new clients meanwhile; the
//!             server's gauge and descriptors back to baseline
//! slow        a share of subscribers stop reading; the others' latency
//!             against a clean run, slow-client closes, server memory
//! shard       a child of a `--processes` run: the clients it owns, its
//!             barriers with the parent
//! multi       the parent of a `--processes` run: starts the children,
//!             answers their barriers, measures the servers (several pids)
//! merge       the children's reports sent whole and added up exactly
//! worst       what soak, storm and slow share (process probes, /metrics,
//!             HTTP API queries, presence subscriptions, slopes)
//! proto       which protocol the clients speak (`--protocol`: Pusher,
//!             Action Cable, AppSync GraphQL or Events) behind one client,
//!             for every scenario that has one; their publishers and their
//!             reference clients' reconnect timing
//! actioncable Action Cable clients (`--protocol actioncable`,
//!             BenchmarkChannel over /cable)
//! appsync     AppSync clients and publishers (`--protocol appsync-graphql`
//!             and `appsync-events`)
//! actioncable_ext  `actioncable-v1-ext-json` clients (`--protocol
//!             actioncable-ext`): positions, history, session restore
//! fault       a fault in the middle of a `fanout` run (`--fault-cmd`) and
//!             what it cost
//! gap         `storm --rate`: what each client got across its gap
//! rolling     `storm` over several nodes and their rolling restart
//! compare     `herald bench compare`: runs of one scenario side by side
//! ```
//!
//! Every scenario is a library function taking a params struct and returning
//! a [`report::Report`], so tests call them directly. Latencies are measured
//! on one process clock ([`now_us`], microseconds since the bench started)
//! that senders write into the payload and receivers subtract from, so there
//! is no clock skew to correct for. Every message carries a unique id, so
//! messages a server drops show up as lost deliveries (expected minus
//! distinct expected ids received), never hidden in an average or made up
//! for by duplicates.

pub mod actioncable;
pub mod actioncable_ext;
pub mod appsync;
pub mod broadcast;
pub mod cli;
pub mod client;
pub mod compare;
pub mod connect;
pub mod fanout;
pub mod fault;
pub mod gap;
pub mod idle;
pub mod latency;
pub mod ledger;
pub mod merge;
pub mod metrics;
pub mod multi;
pub mod proto;
pub mod report;
pub mod rolling;
pub mod rpc;
pub mod shard;
pub mod slow;
pub mod soak;
pub mod storm;
pub mod transports;
pub mod wire;
pub mod worst;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use report::Report;

// The defaults of --app-id, --key and --secret. They match the Herald
// server's development app (`DEV_APP_ID`, `DEV_APP_KEY`, `DEV_APP_SECRET`
// in the server's `config`), so `herald serve` and `herald bench` work
// together without flags. The bench keeps its own copy rather than depend
// on the server crate; a test in tests/it/bench_scenarios.rs checks they agree.

/// Default `--app-id`: the Herald development app's id.
pub const DEV_APP_ID: &str = "app-id";
/// Default `--key`: the Herald development app's key.
pub const DEV_APP_KEY: &str = "app-key";
/// Default `--secret`: the Herald development app's (public) secret.
pub const DEV_APP_SECRET: &str = "app-secret";

/// A failure that stops a scenario, worded for the person running it.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchError(pub String);

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BenchError {}

pub fn err<T>(message: impl Into<String>) -> Result<T, BenchError> {
    Err(BenchError(message.into()))
}

/// The server under test and the app to use on it.
#[derive(Debug, Clone)]
pub struct Target {
    /// As given, e.g. `ws://127.0.0.1:8080`.
    pub url: String,
    pub host: String,
    pub addr: SocketAddr,
    pub app_id: String,
    pub key: String,
    pub secret: String,
}

impl Target {
    /// Parse `ws://host[:port][/]`. Load goes to loopback only unless
    /// `allow_remote` is set: a load test aimed at someone else's server
    /// by mistake is not a small accident.
    pub fn new(
        url: &str,
        app_id: &str,
        key: &str,
        secret: &str,
        allow_remote: bool,
    ) -> Result<Target, BenchError> {
        let rest = if let Some(r) = url.strip_prefix("ws://") {
            r
        } else if url.starts_with("wss://") {
            return err(format!(
                "{url}: wss:// (TLS) is not supported by herald bench; use ws:// against the server's plain port"
            ));
        } else {
            return err(format!(
                "{url}: the URL must start with ws://, e.g. ws://127.0.0.1:8080"
            ));
        };
        let authority = rest.trim_end_matches('/');
        if authority.contains('/') {
            return err(format!(
                "{url}: give only the server's address (ws://host:port); the bench adds /app/{{key}} itself"
            ));
        }
        let with_port = if authority.starts_with('[') {
            if authority.contains("]:") {
                authority.to_string()
            } else {
                format!("{authority}:80")
            }
        } else if authority.contains(':') {
            authority.to_string()
        } else {
            format!("{authority}:80")
        };
        let addr = with_port
            .to_socket_addrs()
            .map_err(|e| BenchError(format!("{url}: cannot resolve the host: {e}")))?
            .next()
            .ok_or_else(|| BenchError(format!("{url}: the host has no address")))?;
        if !addr.ip().is_loopback() && !allow_remote {
            return err(format!(
                "{url} resolves to {}, which is not a loopback address; herald bench only loads \
                 127.0.0.0/8 or ::1 unless --allow-remote is given",
                addr.ip()
            ));
        }
        Ok(Target {
            url: url.to_string(),
            host: with_port,
            addr,
            app_id: app_id.to_string(),
            key: key.to_string(),
            secret: secret.to_string(),
        })
    }

    /// The WebSocket URL a client opens.
    pub fn ws_url(&self) -> String {
        format!(
            "ws://{}/app/{}?protocol=7&client=herald-bench&version={}&flash=false",
            self.host,
            self.key,
            env!("CARGO_PKG_VERSION")
        )
    }

    /// `http://host:port`, for the HTTP API.
    pub fn http_base(&self) -> String {
        format!("http://{}", self.host)
    }

    /// The source address for the `i`-th connection. On IPv4 loopback the
    /// connections are spread over 127.0.0.1–127.0.0.64 so the bench is not
    /// limited to one address's ~28k ephemeral ports.
    pub fn source_for(&self, i: usize) -> Option<IpAddr> {
        match self.addr.ip() {
            IpAddr::V4(v4) if v4.is_loopback() => Some(IpAddr::V4(Ipv4Addr::new(
                127,
                0,
                0,
                1 + (i % SOURCE_ADDRESSES) as u8,
            ))),
            _ => None,
        }
    }
}

/// The node client `i` uses: round-robin over `nodes` (several `--url`s),
/// or `target` when there is no list.
pub fn node<'a>(target: &'a Target, nodes: &'a [Target], i: usize) -> &'a Target {
    match nodes.len() {
        0 => target,
        n => &nodes[i % n],
    }
}

/// How many 127.0.0.x source addresses connections are spread over.
pub const SOURCE_ADDRESSES: usize = 64;

/// The bench clock's zero, in microseconds of `CLOCK_MONOTONIC`.
static EPOCH_US: OnceLock<u64> = OnceLock::new();

/// `CLOCK_MONOTONIC` in microseconds: one clock for every process on the
/// machine (what `Instant` reads on Linux), so the generator processes of a
/// `--processes` run stamp and subtract on the same clock.
pub fn monotonic_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write to; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

/// The bench clock: microseconds since the bench first asked (or since the
/// zero a parent process gave, [`set_clock_epoch`]). Senders put it in the
/// payload, receivers subtract it from their own.
pub fn now_us() -> u64 {
    monotonic_us().saturating_sub(*EPOCH_US.get_or_init(monotonic_us))
}

/// Start the bench clock at `epoch` (microseconds of `CLOCK_MONOTONIC`), as
/// the parent of a `--processes` run tells each child; false if the clock
/// was already read.
pub fn set_clock_epoch(epoch: u64) -> bool {
    EPOCH_US.set(epoch).is_ok()
}

/// Raise this process's open-file limit to fit `needed` descriptors.
/// Returns a warning when it cannot.
pub fn raise_nofile(needed: u64) -> Option<String> {
    // Sockets plus stdio, the runtime's epoll and eventfd, and some slack.
    let want = needed + 64;
    let Ok(now) = rlimit::increase_nofile_limit(u64::MAX) else {
        return Some("cannot read the open-file limit (getrlimit failed)".into());
    };
    // Past the hard limit only with privilege (CAP_SYS_RESOURCE): try.
    if now >= want || rlimit::Resource::NOFILE.set(want, want).is_ok() {
        return None;
    }
    Some(format!(
        "open-file limit is {now} but {needed} connections need about {want}; \
         raise it (ulimit -n {want}) or expect connection errors"
    ))
}

/// The open-file limit of another process, from `/proc/<pid>/limits`.
pub fn nofile_of(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// CPU seconds (user + system) used by a process, from `/proc/<pid>/stat`;
/// `None` means this process.
pub fn cpu_seconds(pid: Option<u32>) -> Option<f64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/stat"),
        None => "/proc/self/stat".to_string(),
    };
    let text = std::fs::read_to_string(path).ok()?;
    // Fields after the command name (which may contain spaces) start at field 3.
    let after = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks = if ticks > 0 { ticks as f64 } else { 100.0 };
    Some((utime + stime) / ticks)
}

/// `/proc/<pid>/status`; `None` means this process.
fn proc_status(pid: Option<u32>) -> Option<String> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/status"),
        None => "/proc/self/status".to_string(),
    };
    std::fs::read_to_string(path).ok()
}

/// A `Name:   1234 kB` line of `/proc/<pid>/status`, in bytes.
fn status_bytes(status: &str, name: &str) -> Option<u64> {
    let line = status
        .lines()
        .find(|l| l.strip_prefix(name).is_some_and(|r| r.starts_with(':')))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Resident memory of a process in bytes, from `/proc/<pid>/status`.
pub fn rss_bytes(pid: Option<u32>) -> Option<u64> {
    status_bytes(&proc_status(pid)?, "VmRSS")
}

/// A process's resident memory now and at its peak, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// `VmRSS`: resident now.
    pub rss: u64,
    /// `VmHWM`: the most it has been resident at once since it started
    /// (the kernel's high-water mark, never below `rss`).
    pub peak: u64,
}

/// Current and peak resident memory of a process, from one read of
/// `/proc/<pid>/status` (so `peak >= rss`); `None` means this process.
pub fn memory(pid: Option<u32>) -> Option<Memory> {
    let status = proc_status(pid)?;
    Some(Memory {
        rss: status_bytes(&status, "VmRSS")?,
        peak: status_bytes(&status, "VmHWM")?,
    })
}

/// With the server's pid, add its peak memory (`server_rss_peak`, VmHWM)
/// and its resident memory at the end of the run (`server_rss_end`) to a
/// report. Every scenario calls this last.
pub fn server_memory(report: &mut Report, server_pid: Option<u32>) {
    let Some(pid) = server_pid else {
        return;
    };
    let m = memory(Some(pid));
    report.value("server_rss_peak", m.map(|m| m.peak as f64), "B");
    report.value("server_rss_end", m.map(|m| m.rss as f64), "B");
    if m.is_none() {
        report.notes.push(format!(
            "cannot read VmHWM and VmRSS from /proc/{pid}/status: is --server-pid {pid} the \
             server's pid on this machine, and is it still running?"
        ));
    }
}

/// CPU used by this process (and optionally the server) over a run.
pub struct CpuMeter {
    started: Instant,
    self_start: Option<f64>,
    server_pid: Option<u32>,
    server_start: Option<f64>,
}

impl CpuMeter {
    pub fn start(server_pid: Option<u32>) -> CpuMeter {
        CpuMeter {
            started: Instant::now(),
            self_start: cpu_seconds(None),
            server_pid,
            server_start: server_pid.and_then(|p| cpu_seconds(Some(p))),
        }
    }

    /// Add `generator_cpu` (and `server_cpu`) to a report: seconds used and
    /// the share of one core over the wall time.
    pub fn finish(&self, report: &mut Report) {
        let wall = self.started.elapsed().as_secs_f64().max(1e-9);
        if let (Some(a), Some(b)) = (self.self_start, cpu_seconds(None)) {
            report.cpu("generator_cpu", b - a, wall);
        }
        if let (Some(pid), Some(a)) = (self.server_pid, self.server_start) {
            if let Some(b) = cpu_seconds(Some(pid)) {
                report.cpu("server_cpu", b - a, wall);
            }
        }
    }
}

/// Parse a duration flag: `120`, `120s`, `2m`, `500ms`, `1.5s`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, "s"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 30s, 2m, 500ms)"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use ms, s, m or h)")),
    };
    if !(0.0..=86_400.0).contains(&secs) {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A tiny deterministic PRNG (xorshift64*), one per virtual user, so the
/// hot loop needs neither a lock nor a thread-local generator.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Check, with one client, that the target speaks the Pusher protocol and
/// accepts these credentials, so a wrong URL, key or secret is one clear
/// error rather than thousands of failed connections.
pub async fn preflight(
    target: &Target,
    private_channel: Option<&str>,
    http_api: bool,
) -> Result<(), BenchError> {
    let timeout = Duration::from_secs(10);
    let mut conn = client::Conn::open(target, None, timeout)
        .await
        .map_err(|e| BenchError(e.explain(target)))?;
    let channel = private_channel.unwrap_or("benchmark-preflight");
    conn.subscribe(target, &[channel], timeout)
        .await
        .map_err(|e| BenchError(e.explain(target)))?;
    conn.close().await;
    if http_api {
        let publisher = client::HttpPublisher::new(target);
        publisher
            .publish("benchmark-preflight", "preflight", "{}", None)
            .await
            .map_err(|e| BenchError(e.explain(target)))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        let t = Target::new("ws://127.0.0.1:8080/", "a", "k", "s", false).unwrap();
        assert_eq!(t.addr, "127.0.0.1:8080".parse().unwrap());
        assert!(t
            .ws_url()
            .starts_with("ws://127.0.0.1:8080/app/k?protocol=7"));
        assert_eq!(t.http_base(), "http://127.0.0.1:8080");
        assert_eq!(
            t.source_for(1),
            Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)))
        );
        assert!(Target::new("http://127.0.0.1:8080", "a", "k", "s", false).is_err());
        assert!(Target::new("wss://127.0.0.1", "a", "k", "s", false).is_err());
        assert!(Target::new("ws://127.0.0.1:8080/app/k", "a", "k", "s", false).is_err());
        assert!(Target::new("ws://10.1.2.3:8080", "a", "k", "s", false).is_err());
        assert!(Target::new("ws://10.1.2.3:8080", "a", "k", "s", true).is_ok());
    }

    #[test]
    fn source_addresses_cycle_over_64_loopback_addresses() {
        let t = Target::new("ws://127.0.0.1:8080", "a", "k", "s", false).unwrap();
        let picked: Vec<IpAddr> = (0..200).map(|i| t.source_for(i).unwrap()).collect();
        let distinct: std::collections::BTreeSet<IpAddr> = picked.iter().copied().collect();
        assert_eq!(distinct.len(), SOURCE_ADDRESSES);
        let first = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
        let last = IpAddr::V4(Ipv4Addr::new(127, 0, 0, SOURCE_ADDRESSES as u8));
        assert_eq!(distinct.first(), Some(&first));
        assert_eq!(distinct.last(), Some(&last));
        // Consecutive connections use different addresses, so even a small
        // run is spread, and the spread wraps around.
        assert_ne!(picked[0], picked[1]);
        assert_eq!(picked[0], picked[SOURCE_ADDRESSES]);
        // Another loopback target (127.0.0.5) is spread the same way.
        let t = Target::new("ws://127.0.0.5:8080", "a", "k", "s", false).unwrap();
        assert_eq!(
            t.source_for(3),
            Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 4)))
        );
        // IPv6 and remote targets: the kernel picks the source.
        let t = Target::new("ws://[::1]:8080", "a", "k", "s", false).unwrap();
        assert_eq!(t.source_for(3), None);
        let t = Target::new("ws://10.1.2.3:8080", "a", "k", "s", true).unwrap();
        assert_eq!(t.source_for(3), None);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("120"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("3d").is_err());
    }

    #[test]
    fn status_fields_in_bytes() {
        let status = "Name:\therald\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\nVmRSSx:\t1 kB\n";
        assert_eq!(status_bytes(status, "VmHWM"), Some(20 * 1024 * 1024));
        assert_eq!(status_bytes(status, "VmRSS"), Some(10 * 1024 * 1024));
        assert_eq!(status_bytes(status, "VmSwap"), None);
    }

    #[test]
    fn server_memory_only_with_a_pid() {
        let mut r = Report::new("demo");
        server_memory(&mut r, None);
        assert!(r.metrics.is_empty() && r.notes.is_empty());
        server_memory(&mut r, Some(std::process::id()));
        let (peak, end) = (r.figure("server_rss_peak"), r.figure("server_rss_end"));
        assert!(peak.unwrap() >= end.unwrap(), "{}", r.summary());
        assert!(r.notes.is_empty(), "{:?}", r.notes);
        // A pid that cannot be read: the figures are there as none, with a note.
        let mut r = Report::new("demo");
        server_memory(&mut r, Some(u32::MAX));
        assert_eq!(
            r.get("server_rss_peak"),
            Some(&report::Metric::Value(None, "B"))
        );
        assert!(r.notes[0].contains("--server-pid"), "{:?}", r.notes);
    }

    #[test]
    fn proc_probes() {
        assert!(cpu_seconds(None).is_some());
        assert!(rss_bytes(None).unwrap() > 0);
        let m = memory(None).unwrap();
        assert!(m.rss > 0 && m.peak >= m.rss, "{m:?}");
        let mut r = Rng::new(7);
        let hits = (0..10_000).filter(|_| r.next_f64() < 0.4).count();
        assert!((3_500..4_500).contains(&hits), "{hits}");
    }
}
