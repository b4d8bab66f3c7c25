//! What the "worst day" scenarios (`soak`, `storm`, `slow`) share: probes
//! of the server process (resident memory, open descriptors, threads), its
//! `/metrics` gauges, signed HTTP API queries, subscriptions to public,
//! private and presence channels in one go, pusher-js's reconnect delays,
//! and the least-squares slope that says whether a series grows.

use super::client::{data_value, scan, ClientError, Conn};
use super::{memory, Report, Target};
use herald_signing as signing;
use serde_json::Value;
use std::time::Duration;

/// Open descriptors of a process: the entries of `/proc/<pid>/fd`.
pub fn open_fds(pid: u32) -> Option<u64> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    Some(dir.filter(|e| e.is_ok()).count() as u64)
}

/// Threads of a process (`Threads:` in `/proc/<pid>/status`). The kernel
/// cannot see async tasks; a thread count that grows is what it can see of
/// work that is never finished.
pub fn threads(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))?
        .trim()
        .parse()
        .ok()
}

/// One look at the server process.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Probe {
    pub rss: Option<u64>,
    pub fds: Option<u64>,
    pub threads: Option<u64>,
}

pub fn probe(pid: Option<u32>) -> Probe {
    let Some(pid) = pid else {
        return Probe::default();
    };
    Probe {
        rss: memory(Some(pid)).map(|m| m.rss),
        fds: open_fds(pid),
        threads: threads(pid),
    }
}

/// The sum of the series of `name` in a Prometheus text exposition (every
/// label set), or `None` when there is no such series.
pub fn metric_sum(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        // `name{labels} value` or `name value`, not `name_total ...`.
        let value = if let Some(labels) = rest.strip_prefix('{') {
            match labels.rfind('}') {
                Some(end) => &labels[end + 1..],
                None => continue,
            }
        } else if rest.starts_with(' ') {
            rest
        } else {
            continue;
        };
        if let Some(v) = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

/// Reads the server's `/metrics` (where it has one).
#[derive(Clone)]
pub struct Metrics {
    client: reqwest::Client,
    url: String,
}

impl Metrics {
    /// `url`: the metrics endpoint; `None` means `/metrics` on the target.
    pub fn new(target: &Target, url: Option<&str>) -> Metrics {
        Metrics {
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                // No idle connection kept: it would be one more descriptor
                // in the server when its descriptors are compared with the
                // baseline.
                .pool_max_idle_per_host(0)
                .build()
                .expect("an HTTP client with default settings builds"),
            url: url
                .map(str::to_string)
                .unwrap_or_else(|| format!("{}/metrics", target.http_base())),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The exposition text, or `None` when the server has none there.
    pub async fn text(&self) -> Option<String> {
        let resp = self.client.get(&self.url).send().await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        resp.text().await.ok()
    }

    /// One metric's value (summed over its label sets).
    pub async fn get(&self, name: &str) -> Option<f64> {
        metric_sum(&self.text().await?, name)
    }
}

/// Signed `GET`s on the Pusher HTTP API.
#[derive(Clone)]
pub struct Api {
    client: reqwest::Client,
    base: String,
    app_id: String,
    key: String,
    secret: String,
}

impl Api {
    pub fn new(target: &Target) -> Api {
        Api {
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .pool_max_idle_per_host(4)
                .build()
                .expect("an HTTP client with default settings builds"),
            base: target.http_base(),
            app_id: target.app_id.clone(),
            key: target.key.clone(),
            secret: target.secret.clone(),
        }
    }

    /// `GET /apps/{id}{rest}` with `params`, signed; the JSON answer.
    pub async fn get(&self, rest: &str, params: &[(&str, &str)]) -> Result<Value, ClientError> {
        let path = format!("/apps/{}{rest}", self.app_id);
        let query = signing::sign_query(&self.key, &self.secret, "GET", &path, b"", params);
        let resp = self
            .client
            .get(format!("{}{path}?{query}", self.base))
            .send()
            .await
            .map_err(|e| ClientError::Http {
                status: None,
                message: e.to_string(),
            })?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| ClientError::Http {
            status: Some(status),
            message: e.to_string(),
        })?;
        if status != 200 {
            let shown: String = text.chars().take(200).collect();
            return Err(ClientError::Http {
                status: Some(status),
                message: format!("GET {path}: {shown}"),
            });
        }
        serde_json::from_str(&text).map_err(|e| ClientError::Http {
            status: Some(status),
            message: format!("GET {path}: not JSON ({e})"),
        })
    }

    /// Members of a presence channel, from `GET /channels/{name}/users`.
    pub async fn presence_users(&self, channel: &str) -> Result<usize, ClientError> {
        let v = self.get(&format!("/channels/{channel}/users"), &[]).await?;
        v.get("users")
            .and_then(Value::as_array)
            .map(Vec::len)
            .ok_or_else(|| ClientError::Http {
                status: Some(200),
                message: format!("GET /channels/{channel}/users: no users array in {v}"),
            })
    }

    /// Channels with subscribers whose names start with `prefix`.
    pub async fn occupied(&self, prefix: &str) -> Result<Vec<String>, ClientError> {
        let v = self
            .get("/channels", &[("filter_by_prefix", prefix)])
            .await?;
        Ok(v.get("channels")
            .and_then(Value::as_object)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default())
    }
}

/// What went wrong with an HTTP API query, for people.
pub fn api_error(e: &ClientError, target: &Target) -> String {
    match e {
        ClientError::Http {
            status: Some(s @ (400 | 500..=599)),
            message,
        } => format!("HTTP API query failed: {message} (HTTP {s})"),
        ClientError::Http {
            status: None,
            message,
        } => format!("HTTP API query failed: {message}"),
        other => other.explain(target),
    }
}

/// A `pusher:subscribe` frame for any channel type: `private-` and
/// `presence-` ones signed with the app secret (presence as `user_id`).
pub fn subscribe_frame(target: &Target, socket_id: &str, channel: &str, user_id: &str) -> String {
    if channel.starts_with("presence-") {
        let channel_data = serde_json::json!({"user_id": user_id, "user_info": {}}).to_string();
        let auth = signing::token(
            &target.key,
            &target.secret,
            &signing::channel_string(socket_id, channel, Some(&channel_data)),
        );
        serde_json::json!({"event":"pusher:subscribe","data":{
            "channel": channel, "auth": auth, "channel_data": channel_data}})
        .to_string()
    } else if channel.starts_with("private-") {
        let auth = signing::token(
            &target.key,
            &target.secret,
            &signing::channel_string(socket_id, channel, None),
        );
        serde_json::json!({"event":"pusher:subscribe","data":{"channel":channel,"auth":auth}})
            .to_string()
    } else {
        serde_json::json!({"event":"pusher:subscribe","data":{"channel":channel}}).to_string()
    }
}

/// Subscribe to `channels` (any type; presence ones as `user_id`) and wait
/// until each is confirmed. Returns, per presence channel, the member count
/// the confirmation carried.
pub async fn subscribe(
    conn: &mut Conn,
    target: &Target,
    channels: &[&str],
    user_id: &str,
    timeout: Duration,
) -> Result<Vec<(String, u64)>, ClientError> {
    for channel in channels {
        let frame = subscribe_frame(target, &conn.socket_id, channel, user_id);
        conn.send(frame).await?;
    }
    let mut pending = channels.len();
    let mut counts = Vec::new();
    let wait = async {
        while pending > 0 {
            let text = conn.recv().await?;
            let s = scan(&text);
            match s.event {
                "pusher_internal:subscription_succeeded" => {
                    pending -= 1;
                    if let Some(ch) = s.channel.filter(|c| c.starts_with("presence-")) {
                        let n = data_value(&text)
                            .pointer("/presence/count")
                            .and_then(Value::as_u64)
                            .unwrap_or(0);
                        counts.push((ch.to_string(), n));
                    }
                }
                "pusher:subscription_error" | "pusher:error" => {
                    let d = data_value(&text);
                    let message = d
                        .get("error")
                        .or_else(|| d.get("message"))
                        .and_then(Value::as_str)
                        .unwrap_or("(no message)")
                        .to_string();
                    return Err(if s.event == "pusher:error" {
                        ClientError::Rejected {
                            code: d.get("code").and_then(Value::as_u64).map(|c| c as u16),
                            message,
                        }
                    } else {
                        ClientError::Subscription {
                            status: d.get("status").and_then(Value::as_u64).map(|c| c as u16),
                            message,
                        }
                    });
                }
                _ => {}
            }
        }
        Ok(())
    };
    tokio::time::timeout(timeout, wait)
        .await
        .map_err(|_| ClientError::Timeout("waiting for subscription_succeeded"))??;
    Ok(counts)
}

/// How pusher-js (8.x, `ConnectionManager`) waits before reconnecting,
/// by the close it saw: 4000–4099 it gives up, 4100–4199 ("backoff") and a
/// plain close 1 s, 4200–4299 ("retry") at once. There is no random jitter
/// in pusher-js: every client that lost its connection at the same moment
/// comes back at the same moment, one second later. Each attempt then has
/// 15 s to connect, doubling per failed attempt up to 60 s
/// ([`attempt_timeout`]).
pub fn pusher_js_retry_delay(close_code: Option<u16>) -> Option<Duration> {
    match close_code {
        Some(4000..=4099) => None,
        Some(4200..=4299) => Some(Duration::ZERO),
        _ => Some(Duration::from_secs(1)),
    }
}

/// pusher-js's time limit for the `n`-th attempt (0-based) of one
/// reconnect: 15 s, doubling, at most 60 s.
pub fn attempt_timeout(n: u32) -> Duration {
    Duration::from_secs((15u64 << n.min(3)).min(60))
}

/// A least-squares line through a series.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slope {
    /// Units of y per unit of x.
    pub slope: f64,
    /// Its standard error (ordinary least squares, residuals assumed
    /// independent: samples 10 s apart are correlated, so treat it as a
    /// lower bound).
    pub stderr: f64,
    pub points: usize,
}

impl Slope {
    /// Whether the slope is distinguishable from zero: more than two
    /// standard errors away from it.
    pub fn significant(&self) -> bool {
        self.slope.abs() > 2.0 * self.stderr
    }
}

/// The least-squares slope of `y` on `x`, with its standard error; `None`
/// with fewer than three points or all `x` equal.
pub fn slope(points: &[(f64, f64)]) -> Option<Slope> {
    let n = points.len();
    if n < 3 {
        return None;
    }
    let nf = n as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / nf;
    let my = points.iter().map(|p| p.1).sum::<f64>() / nf;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let b = sxy / sxx;
    let a = my - b * mx;
    let ssr: f64 = points.iter().map(|p| (p.1 - a - b * p.0).powi(2)).sum();
    let stderr = (ssr / (nf - 2.0) / sxx).sqrt();
    Some(Slope {
        slope: b,
        stderr,
        points: n,
    })
}

/// Wait until `probe` returns `want` (or `timeout` passes); the last value
/// seen. For gauges and descriptors that settle a little after the
/// clients have gone.
pub async fn settle<F, Fut>(want: u64, timeout: Duration, mut probe: F) -> Option<u64>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<u64>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let v = probe().await;
        if v == Some(want) || tokio::time::Instant::now() >= deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether the server gave back what the load took: waits (up to
/// `settle`) for its descriptors and `herald_connections` gauge to return
/// to their values before the load, and reports both as
/// `fds_{when}` / `connections_gauge_{when}` beside the baselines, with
/// `fds_back_to_baseline`, `gauge_back_to_baseline` and a note for each
/// that did not come back. `None` where the figure is unknown (no
/// `--server-pid`, a server without the gauge).
pub struct Returned {
    pub fds: Option<bool>,
    pub gauge: Option<bool>,
}

pub async fn report_return(
    report: &mut Report,
    pid: Option<u32>,
    base: &Probe,
    gauge_base: Option<f64>,
    metrics: &Metrics,
    settle_for: Duration,
    when: &str,
) -> Returned {
    let fds_after = match (pid, base.fds) {
        (Some(pid), Some(want)) => settle(want, settle_for, || async move { open_fds(pid) }).await,
        _ => None,
    };
    let gauge_after = match gauge_base {
        Some(want) => settle(want as u64, settle_for, || async move {
            metrics.get("herald_connections").await.map(|g| g as u64)
        })
        .await
        .map(|g| g as f64),
        None => None,
    };
    let fds = base.fds.zip(fds_after).map(|(a, b)| a == b);
    let gauge = gauge_base.map(|b| gauge_after == Some(b));
    report.value("fds_baseline", base.fds.map(|v| v as f64), "");
    report.value(&format!("fds_{when}"), fds_after.map(|v| v as f64), "");
    report.value("fds_back_to_baseline", fds.map(|b| b as u8 as f64), "");
    report.value("connections_gauge_baseline", gauge_base, "");
    report.value(&format!("connections_gauge_{when}"), gauge_after, "");
    report.value("gauge_back_to_baseline", gauge.map(|b| b as u8 as f64), "");
    if fds == Some(false) {
        report.notes.push(format!(
            "the server had {:?} descriptors before the load and {:?} ({when}, after waiting \
             {settle_for:?})",
            base.fds, fds_after
        ));
    }
    if gauge == Some(false) {
        report.notes.push(format!(
            "herald_connections was {gauge_base:?} before the load and {gauge_after:?} ({when})"
        ));
    }
    Returned { fds, gauge }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slopes() {
        // y = 3x + 1 exactly: slope 3, no error.
        let pts: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, 3.0 * i as f64 + 1.0)).collect();
        let s = slope(&pts).unwrap();
        assert!((s.slope - 3.0).abs() < 1e-9 && s.stderr < 1e-9, "{s:?}");
        assert!(s.significant());
        // Noise around a flat line: not distinguishable from zero.
        let flat: Vec<(f64, f64)> = (0..40)
            .map(|i| (i as f64, 100.0 + if i % 2 == 0 { 5.0 } else { -5.0 }))
            .collect();
        let s = slope(&flat).unwrap();
        assert!(!s.significant(), "{s:?}");
        assert!(slope(&pts[..2]).is_none());
        assert!(slope(&[(1.0, 1.0), (1.0, 2.0), (1.0, 3.0)]).is_none());
    }

    #[test]
    fn metric_sums_over_label_sets_only_of_that_name() {
        let text = "# HELP herald_connections Open\n# TYPE herald_connections gauge\n\
                    herald_connections{app=\"a\",protocol=\"p\"} 3\n\
                    herald_connections{app=\"b\",protocol=\"p\"} 4\n\
                    herald_connections_opened_total{app=\"a\"} 99\n\
                    other 1\nplain 2.5\n";
        assert_eq!(metric_sum(text, "herald_connections"), Some(7.0));
        assert_eq!(metric_sum(text, "plain"), Some(2.5));
        assert_eq!(metric_sum(text, "missing"), None);
    }

    #[test]
    fn pusher_js_delays() {
        assert_eq!(pusher_js_retry_delay(None), Some(Duration::from_secs(1)));
        assert_eq!(
            pusher_js_retry_delay(Some(1006)),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            pusher_js_retry_delay(Some(4100)),
            Some(Duration::from_secs(1))
        );
        assert_eq!(pusher_js_retry_delay(Some(4201)), Some(Duration::ZERO));
        assert_eq!(pusher_js_retry_delay(Some(4001)), None);
        assert_eq!(attempt_timeout(0), Duration::from_secs(15));
        assert_eq!(attempt_timeout(1), Duration::from_secs(30));
        assert_eq!(attempt_timeout(2), Duration::from_secs(60));
        assert_eq!(attempt_timeout(9), Duration::from_secs(60));
    }

    #[test]
    fn process_probes() {
        let me = std::process::id();
        let p = probe(Some(me));
        assert!(p.rss.unwrap() > 0 && p.fds.unwrap() > 0 && p.threads.unwrap() >= 1);
        assert_eq!(probe(None), Probe::default());
    }
}
