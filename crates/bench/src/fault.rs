//! A fault in the middle of a `fanout` run (`--fault-cmd`, `--fault-at`),
//! and what it cost: the window from the fault until deliveries were whole
//! again, and what was missed in it.
//!
//! The bench knows nothing of how the broker or the nodes are run: the
//! operator gives a shell command (kill a Redis master, a NATS server, a
//! herald node) and the bench runs it `--fault-at` after publishing
//! started. `fanout` publishes on a fixed schedule (publish k at
//! k / rate) and knows, per publish, which subscribers got it, so the
//! fault's cost is exact ([`analyse`]):
//!
//! - the window ends at the first publish, scheduled after the fault and
//!   after the last one any subscriber missed, that every subscriber of its
//!   channel got: from then on deliveries were whole to the end of the run.
//!   A blip long after the fault therefore lengthens the window; that is
//!   the honest reading of "whole again".
//! - in the window: the publishes scheduled, those that failed (the
//!   publisher was told: not a silent loss), those accepted but missed by
//!   at least one subscriber, the deliveries lost, the most subscribers
//!   one publish missed, and the losses by the publisher's node and by the
//!   subscriber's node (cross-node losses show there).
//! - losses before the fault are reported apart: they are not the fault's.

use super::report::Report;
use std::time::{Duration, Instant};

/// The fault an operator asked for.
#[derive(Debug, Clone)]
pub struct Fault {
    /// Run with `sh -c`; stdout discarded, stderr kept for the report.
    pub command: String,
    /// After the first scheduled publish.
    pub at: Duration,
    /// Longest the command may run.
    pub timeout: Duration,
}

/// Run `command` with `sh -c`; how long it took, or why it failed (its
/// exit status and the tail of its stderr, or that it outlived `timeout`).
pub async fn shell(command: &str, timeout: Duration) -> Result<Duration, String> {
    let started = Instant::now();
    let child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("`{command}`: cannot start sh: {e}"))?;
    let out = tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .map_err(|_| format!("`{command}` still running after {timeout:?}"))?
        .map_err(|e| format!("`{command}`: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: String = err.trim().chars().rev().take(400).collect();
        return Err(format!(
            "`{command}` failed ({}): {}",
            out.status,
            tail.chars().rev().collect::<String>()
        ));
    }
    Ok(started.elapsed())
}

/// What happened to every publish of the run, indexed by publish number k.
#[derive(Debug, Clone, Default)]
pub struct Outcomes {
    /// Publishes per second: publish k was scheduled at k / rate.
    pub rate: f64,
    /// The node each publish went through.
    pub publish_node: Vec<usize>,
    /// Whether the server accepted it (a failed publish is owed to nobody).
    pub accepted: Vec<bool>,
    /// `missed[node][k]`: subscribers that started on `node` and did not
    /// get publish k.
    pub missed: Vec<Vec<u32>>,
}

impl Outcomes {
    /// Every publish accepted and delivered, through `nodes` publisher
    /// nodes and to subscribers on `subscriber_nodes` nodes.
    pub fn new(rate: f64, total: usize, subscriber_nodes: usize) -> Outcomes {
        Outcomes {
            rate,
            publish_node: vec![0; total],
            accepted: vec![true; total],
            missed: vec![vec![0; total]; subscriber_nodes.max(1)],
        }
    }

    fn missed_by(&self, k: usize) -> u64 {
        self.missed.iter().map(|m| u64::from(m[k])).sum()
    }
}

/// The fault's cost, from [`analyse`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Window {
    /// Seconds from the fault to the first publish every subscriber got
    /// again (scheduled times); None: deliveries were not whole again by
    /// the last publish.
    pub seconds: Option<f64>,
    pub publishes: u64,
    pub publish_errors: u64,
    /// Accepted publishes at least one subscriber missed.
    pub publishes_missed: u64,
    pub deliveries_lost: u64,
    /// The most subscribers one publish of the window missed.
    pub most_missed_by: u64,
    pub publishes_missed_by_publish_node: Vec<u64>,
    pub lost_by_publish_node: Vec<u64>,
    pub lost_by_subscriber_node: Vec<u64>,
    /// Deliveries lost before the fault (not the fault's).
    pub lost_before: u64,
}

/// The window after a fault at `at` (after the first scheduled publish)
/// over `nodes` publisher nodes.
pub fn analyse(o: &Outcomes, at: Duration, nodes: usize) -> Window {
    let total = o.accepted.len();
    let nodes = nodes.max(1);
    // The first publish scheduled at or after the fault.
    let k0 = ((at.as_secs_f64() * o.rate).ceil() as usize).min(total);
    let last_missed = (k0..total)
        .rev()
        .find(|&k| o.accepted[k] && o.missed_by(k) > 0);
    let from = last_missed.map_or(k0, |k| k + 1);
    let end = (from..total).find(|&k| o.accepted[k]);
    let mut w = Window {
        seconds: end.map(|k| (k as f64 / o.rate - at.as_secs_f64()).max(0.0)),
        publishes_missed_by_publish_node: vec![0; nodes],
        lost_by_publish_node: vec![0; nodes],
        lost_by_subscriber_node: vec![0; o.missed.len()],
        lost_before: (0..k0)
            .filter(|&k| o.accepted[k])
            .map(|k| o.missed_by(k))
            .sum(),
        ..Window::default()
    };
    for k in k0..end.unwrap_or(total) {
        w.publishes += 1;
        if !o.accepted[k] {
            w.publish_errors += 1;
            continue;
        }
        let missed = o.missed_by(k);
        if missed == 0 {
            continue;
        }
        let node = o.publish_node[k] % nodes;
        w.publishes_missed += 1;
        w.publishes_missed_by_publish_node[node] += 1;
        w.deliveries_lost += missed;
        w.lost_by_publish_node[node] += missed;
        w.most_missed_by = w.most_missed_by.max(missed);
        for (n, m) in o.missed.iter().enumerate() {
            w.lost_by_subscriber_node[n] += u64::from(m[k]);
        }
    }
    w
}

/// The fault's figures in `report`, and one note that says it in words.
/// `ran` is the command's outcome (how long it took, or why it failed);
/// per-node figures only with several nodes.
pub fn write(
    report: &mut Report,
    fault: &Fault,
    ran: &Result<Duration, String>,
    w: &Window,
    reconnected: u64,
) {
    report.value("fault_at", Some(fault.at.as_secs_f64()), "s");
    match ran {
        Ok(took) => report.value("fault_cmd_took", Some(took.as_secs_f64()), "s"),
        Err(e) => {
            report.value("fault_cmd_took", None, "s");
            report.notes.push(format!("fault command: {e}"));
        }
    }
    report.value("fault_window", w.seconds, "s");
    report.counter("fault_window_publishes", w.publishes);
    report.counter("fault_window_publish_errors", w.publish_errors);
    report.counter("fault_window_publishes_missed", w.publishes_missed);
    report.counter("fault_window_deliveries_lost", w.deliveries_lost);
    report.counter("fault_window_most_missed_by", w.most_missed_by);
    if w.lost_by_publish_node.len() > 1 {
        for (k, n) in w.publishes_missed_by_publish_node.iter().enumerate() {
            report.counter(
                &format!("fault_window_publishes_missed{{publish_node:{k}}}"),
                *n,
            );
        }
        for (k, n) in w.lost_by_publish_node.iter().enumerate() {
            report.counter(
                &format!("fault_window_deliveries_lost{{publish_node:{k}}}"),
                *n,
            );
        }
    }
    if w.lost_by_subscriber_node.len() > 1 {
        for (k, n) in w.lost_by_subscriber_node.iter().enumerate() {
            report.counter(
                &format!("fault_window_deliveries_lost{{subscriber_node:{k}}}"),
                *n,
            );
        }
    }
    report.counter("deliveries_lost_before_fault", w.lost_before);
    report.counter("subscribers_reconnected", reconnected);
    let whole = match w.seconds {
        Some(s) => format!("deliveries whole again after {s:.2} s"),
        None => "deliveries NOT whole again by the last publish".to_string(),
    };
    report.notes.push(format!(
        "fault at {:.1} s: {whole}; in that window {} publishes, {} failed, {} missed by up to {} \
         subscribers each, {} deliveries lost; {} lost before the fault; {} subscribers reconnected",
        fault.at.as_secs_f64(),
        w.publishes,
        w.publish_errors,
        w.publishes_missed,
        w.most_missed_by,
        w.deliveries_lost,
        w.lost_before,
        reconnected,
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 10 publishes/s for 3 s through 2 nodes, subscribers on 2 nodes.
    fn outcomes() -> Outcomes {
        let mut o = Outcomes::new(10.0, 30, 2);
        for k in 0..30 {
            o.publish_node[k] = k % 2;
        }
        o
    }

    #[test]
    fn nothing_missed_the_window_is_the_wait_for_the_next_publish() {
        let w = analyse(&outcomes(), Duration::from_millis(1050), 2);
        // Publish 11 (1.1 s) is the first after the fault, and whole.
        assert!((w.seconds.unwrap() - 0.05).abs() < 1e-9, "{w:?}");
        assert_eq!(w.publishes, 0);
        assert_eq!(w.deliveries_lost, 0);
    }

    #[test]
    fn the_window_runs_to_the_first_whole_publish_after_the_last_miss() {
        let mut o = outcomes();
        o.missed[0][3] = 1; // before the fault: not its
        o.missed[1][10] = 4; // at the fault (1.0 s)
        o.missed[0][11] = 2;
        o.missed[1][11] = 1;
        o.accepted[12] = false; // failed: owed to nobody
        o.missed[1][14] = 3; // the last miss
        let w = analyse(&o, Duration::from_secs(1), 2);
        // Publish 15 (1.5 s) is the first whole one after 14.
        assert!((w.seconds.unwrap() - 0.5).abs() < 1e-9, "{w:?}");
        assert_eq!(w.publishes, 5); // 10..=14
        assert_eq!(w.publish_errors, 1);
        assert_eq!(w.publishes_missed, 3);
        assert_eq!(w.deliveries_lost, 10);
        assert_eq!(w.most_missed_by, 4);
        // 10 and 14 went through node 0, 11 through node 1.
        assert_eq!(w.publishes_missed_by_publish_node, [2, 1]);
        assert_eq!(w.lost_by_publish_node, [7, 3]);
        assert_eq!(w.lost_by_subscriber_node, [2, 8]);
        assert_eq!(w.lost_before, 1);
    }

    #[test]
    fn a_miss_at_the_last_publish_means_not_whole_again() {
        let mut o = outcomes();
        o.missed[0][29] = 1;
        let w = analyse(&o, Duration::from_secs(2), 2);
        assert_eq!(w.seconds, None);
        assert_eq!(w.publishes, 10);
        assert_eq!(w.deliveries_lost, 1);
        // A failed last publish cannot end the window either.
        let mut o = outcomes();
        o.missed[0][28] = 1;
        o.accepted[29] = false;
        assert_eq!(analyse(&o, Duration::from_secs(2), 2).seconds, None);
    }

    #[test]
    fn a_fault_after_the_last_publish_has_an_empty_window() {
        let w = analyse(&outcomes(), Duration::from_secs(5), 2);
        assert_eq!(w.seconds, None);
        assert_eq!(w.publishes, 0);
    }

    #[tokio::test]
    async fn the_command_s_failure_and_timeout_are_told() {
        assert!(shell("true", Duration::from_secs(10)).await.is_ok());
        let e = shell("echo boom >&2; exit 3", Duration::from_secs(10))
            .await
            .unwrap_err();
        assert!(e.contains("failed") && e.contains("boom"), "{e}");
        let e = shell("sleep 5", Duration::from_millis(100))
            .await
            .unwrap_err();
        assert!(e.contains("still running"), "{e}");
    }
}
