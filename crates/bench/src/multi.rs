//! The parent of a `--processes N` run (or of a run given several
//! `--server-pid`s): it starts N child `herald bench` processes with the
//! same arguments and a hidden `--shard INDEX/N@EPOCH`, answers their
//! barriers ([`super::shard`]), measures the servers itself (each pid's CPU
//! and memory, per node and summed), and merges the children's reports
//! ([`super::merge`]).
//!
//! One process holds at most its open-file limit of connections; N
//! children hold N times that, on the same bench clock (`CLOCK_MONOTONIC`
//! from the parent's zero), so a message stamped in one child is timed in
//! another without skew.

use super::{cpu_seconds, memory, monotonic_us, rss_bytes, BenchError, Report};
use serde_json::Value;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// The scenarios that run over several processes; the others refuse
/// `--processes` ([`refusal`]).
pub const SCENARIOS: &[&str] = &["connect", "idle", "broadcast", "fanout"];

/// Why a scenario cannot be split over processes, for its error message.
pub fn refusal(scenario: &str) -> String {
    format!(
        "{scenario} runs in one process: --processes and several --server-pid work with {} \
         only (soak, storm and slow time reconnects, presence and churn against one ledger \
         and one set of clients, which they would have to share across processes; connect \
         --sweep runs steps one after another)",
        SCENARIOS.join(", ")
    )
}

pub struct MultiParams {
    /// The scenario's name (one of [`SCENARIOS`]).
    pub scenario: String,
    /// The arguments after `herald bench`, as given; each child gets them
    /// plus `--shard` (a child ignores `--processes`, `--server-pid`,
    /// `--json`, `--html` and the progress line).
    pub args: Vec<String>,
    pub processes: usize,
    /// The servers' pids, in the order of `--url` (node k's pid k).
    pub server_pids: Vec<u32>,
    /// `idle`: how long the parent holds every connection open between
    /// measuring the servers' memory.
    pub hold: Duration,
}

/// One server's CPU and memory across the run.
struct Probe {
    pid: u32,
    cpu_start: Option<f64>,
    rss_before: Option<u64>,
    rss_open: Option<u64>,
    rss_after: Option<u64>,
}

struct Child {
    process: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    stdin: tokio::process::ChildStdin,
}

impl Child {
    /// Why this child sent nothing more: how it ended.
    async fn ended(&mut self, i: usize, n: usize, at: &str) -> BenchError {
        let status = tokio::time::timeout(Duration::from_secs(5), self.process.wait()).await;
        let how = match status {
            Ok(Ok(s)) => s.to_string(),
            _ => "its output closed".to_string(),
        };
        BenchError(format!(
            "generator process {i} of {n} ended ({how}) {at}; its share of the clients is \
             unaccounted, so there is no merged report"
        ))
    }
}

pub async fn run(p: &MultiParams) -> Result<Report, BenchError> {
    if !SCENARIOS.contains(&p.scenario.as_str()) {
        return Err(BenchError(refusal(&p.scenario)));
    }
    let n = p.processes.max(1);
    let exe = std::env::current_exe()
        .map_err(|e| BenchError(format!("cannot find the herald binary to start: {e}")))?;
    let mut probes: Vec<Probe> = p
        .server_pids
        .iter()
        .map(|&pid| Probe {
            pid,
            cpu_start: cpu_seconds(Some(pid)),
            rss_before: rss_bytes(Some(pid)),
            rss_open: None,
            rss_after: None,
        })
        .collect();
    for probe in &probes {
        if probe.cpu_start.is_none() {
            return Err(BenchError(format!(
                "--server-pid {}: no such process on this machine",
                probe.pid
            )));
        }
    }
    let started = Instant::now();
    let epoch = monotonic_us();
    super::set_clock_epoch(epoch);
    let mut children = Vec::with_capacity(n);
    for i in 0..n {
        let mut cmd = tokio::process::Command::new(&exe);
        cmd.arg("bench")
            .args(&p.args)
            .arg("--shard")
            .arg(format!("{i}/{n}@{epoch}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut process = cmd
            .spawn()
            .map_err(|e| BenchError(format!("cannot start generator process {i}: {e}")))?;
        let stdout = process.stdout.take().expect("piped");
        let stdin = process.stdin.take().expect("piped");
        children.push(Child {
            process,
            lines: BufReader::new(stdout).lines(),
            stdin,
        });
    }
    eprintln!("herald bench: {n} generator processes started");
    let mut reports = Vec::with_capacity(n);
    loop {
        // One line from every child: all at the same barrier, or all done.
        let mut tag = None;
        let mut payloads = Vec::with_capacity(n);
        for (i, child) in children.iter_mut().enumerate() {
            let at = tag
                .as_ref()
                .map_or("before its next barrier".to_string(), |t| {
                    format!("before barrier {t:?}")
                });
            let line = match child.lines.next_line().await {
                Ok(Some(line)) => line,
                _ => return Err(child.ended(i, n, &at).await),
            };
            let (t, rest) = line.split_once(' ').unwrap_or((line.as_str(), "null"));
            match &tag {
                None => tag = Some(t.to_string()),
                Some(first) if first != t => {
                    return Err(BenchError(format!(
                        "generator process {i} of {n} reached {t:?} while the others reached \
                         {first:?}"
                    )))
                }
                _ => {}
            }
            let v: Value = serde_json::from_str(rest).map_err(|e| {
                BenchError(format!(
                    "generator process {i} sent an unreadable line: {e}"
                ))
            })?;
            payloads.push(v);
        }
        let tag = tag.unwrap_or_default();
        if tag == "report" {
            for v in &payloads {
                reports.push(super::merge::decode(v)?);
            }
            break;
        }
        eprintln!("herald bench: all {n} generator processes at {tag:?}");
        if tag == "open" {
            // idle: every connection of every child is open. Let the
            // servers' allocations settle, measure, hold, measure again.
            tokio::time::sleep(Duration::from_secs(1)).await;
            for probe in &mut probes {
                probe.rss_open = rss_bytes(Some(probe.pid));
            }
            tokio::time::sleep(p.hold).await;
            for probe in &mut probes {
                probe.rss_after = rss_bytes(Some(probe.pid));
            }
        }
        let answer = format!("{tag} {}\n", Value::Array(payloads));
        for (i, child) in children.iter_mut().enumerate() {
            if child.stdin.write_all(answer.as_bytes()).await.is_err() {
                return Err(child.ended(i, n, &format!("at barrier {tag:?}")).await);
            }
        }
    }
    for (i, child) in children.iter_mut().enumerate() {
        match child.process.wait().await {
            Ok(s) if s.success() => {}
            Ok(s) => {
                return Err(BenchError(format!(
                    "generator process {i} of {n} sent its report but exited {s}"
                )))
            }
            Err(e) => return Err(BenchError(format!("generator process {i}: {e}"))),
        }
    }
    let wall = started.elapsed().as_secs_f64().max(1e-9);
    let mut report = super::merge::merge(reports);
    report.param("processes", n);
    if report.scenario == "fanout" {
        let achieved = report.figure("http_publish_rate_achieved").unwrap_or(0.0);
        let asked = report.figure("http_publish_rate_asked").unwrap_or(0.0);
        let lag = report.latency("publish_lag").map_or(0.0, |t| t.max);
        let sent = report.count("http_publishes") + report.count("http_publish_errors");
        if let Some(note) = super::fanout::behind(sent, achieved, asked, lag) {
            report.notes.push(note);
        }
    }
    servers(&mut report, &probes, wall);
    Ok(report)
}

/// The servers' figures: CPU over the run and memory at its end, per node
/// (`{node:K}`, K the pid's place in `--server-pid`) when there are
/// several, and summed under the one-server names; for `idle`, memory
/// before, open and after, and per connection held.
fn servers(report: &mut Report, probes: &[Probe], wall: f64) {
    if probes.is_empty() {
        return;
    }
    let several = probes.len() > 1;
    let tag = |name: &str, k: usize| format!("{name}{{node:{k}}}");
    let mut cpu_total = 0.0;
    let (mut peak_total, mut end_total) = (0u64, 0u64);
    for (k, probe) in probes.iter().enumerate() {
        let cpu = match (probe.cpu_start, cpu_seconds(Some(probe.pid))) {
            (Some(a), Some(b)) => b - a,
            _ => {
                report.notes.push(format!(
                    "--server-pid {}: the process is gone; its CPU is not counted",
                    probe.pid
                ));
                0.0
            }
        };
        cpu_total += cpu;
        let m = memory(Some(probe.pid));
        peak_total += m.map_or(0, |m| m.peak);
        end_total += m.map_or(0, |m| m.rss);
        if several {
            report.value(&tag("server_cpu", k), Some(cpu), "s");
            report.value(&tag("server_cpu_share", k), Some(cpu / wall), "core");
            report.value(&tag("server_rss_peak", k), m.map(|m| m.peak as f64), "B");
            report.value(&tag("server_rss_end", k), m.map(|m| m.rss as f64), "B");
        }
    }
    report.cpu("server_cpu", cpu_total, wall);
    // CPU per delivery: all servers' over all deliveries, and each node's
    // over the deliveries its subscribers received (fanout reports them
    // per node).
    let delivered = report.count("deliveries_received");
    if delivered > 0 {
        report.value(
            "server_cpu_per_delivery",
            Some(cpu_total * 1e6 / delivered as f64),
            "µs",
        );
    }
    if several {
        for k in 0..probes.len() {
            let here = report.count(&format!("deliveries_received{{node:{k}}}"));
            let cpu = report.figure(&tag("server_cpu", k));
            if let (Some(cpu), true) = (cpu, here > 0) {
                report.value(
                    &tag("server_cpu_per_delivery", k),
                    Some(cpu * 1e6 / here as f64),
                    "µs",
                );
            }
        }
    }
    report.value("server_rss_peak", Some(peak_total as f64), "B");
    report.value("server_rss_end", Some(end_total as f64), "B");
    if several {
        report.notes.push(
            "server_rss_peak is the sum of each server's own peak (VmHWM), which they need not \
             have reached at the same moment"
                .into(),
        );
    }
    if report.scenario != "idle" {
        return;
    }
    // idle: the children had no pid; the parent measured while all were open.
    let held = |k: Option<usize>| match k {
        Some(k) if several => report.count(&format!("ws_subscribed{{node:{k}}}")),
        _ => match report.get("ws_subscribe_success") {
            Some(super::report::Metric::Rate { passes, .. }) => *passes,
            _ => 0,
        },
    };
    let sum = |f: fn(&Probe) -> Option<u64>| -> Option<u64> { probes.iter().map(f).sum() };
    let (before, open, after) = (
        sum(|p| p.rss_before),
        sum(|p| p.rss_open),
        sum(|p| p.rss_after),
    );
    let per = |a: Option<u64>, b: Option<u64>, n: u64| match (a, b) {
        (Some(a), Some(b)) if n > 0 => Some((b as f64 - a as f64) / n as f64),
        _ => None,
    };
    let f = |v: Option<u64>| v.map(|b| b as f64);
    let total = held(None);
    let mut figures = vec![
        ("server_rss_before".to_string(), f(before)),
        ("server_rss_open".to_string(), f(open)),
        ("server_rss_after".to_string(), f(after)),
        (
            "server_memory_per_connection".to_string(),
            per(before, after, total),
        ),
    ];
    if several {
        for (k, probe) in probes.iter().enumerate() {
            figures.push((
                tag("server_memory_per_connection", k),
                per(probe.rss_before, probe.rss_after, held(Some(k))),
            ));
        }
    }
    for (name, v) in figures {
        report.metrics.retain(|(n, _)| *n != name);
        report.value(&name, v, "B");
    }
    report.notes.retain(|n| !n.starts_with("give --server-pid"));
}
