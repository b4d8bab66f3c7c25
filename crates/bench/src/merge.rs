//! Merging the reports of a `--processes` run: each child generator sends
//! its [`Report`] whole ([`encode`]: counters, pass/total pairs, latency
//! histograms in HdrHistogram's V2 encoding, figures with their units, the
//! timeline), and the parent adds them up ([`merge`]) so the merged report
//! reads as if one process had held every client.
//!
//! Exactness is the point: counters and rates are sums of counts (never
//! averages of shares), latencies come from the children's histograms
//! added together, so a merged p99 is the p99 of every sample. Only
//! figures that are not counts need a rule of their own ([`value_rule`]).

use super::metrics::Tick;
use super::report::{decode_histogram, encode_histogram, Metric, Report};
use super::BenchError;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// A report as the child sends it: lossless, unlike `--json` (which keeps
/// rates as fractions).
pub fn encode(r: &Report) -> Value {
    let metrics: Vec<Value> = r
        .metrics
        .iter()
        .map(|(name, m)| match m {
            Metric::Counter(n) => json!({"name": name, "counter": n}),
            Metric::Rate { passes, total } => json!({"name": name, "rate": [passes, total]}),
            Metric::Trend(_) => {
                let h = r
                    .histograms
                    .iter()
                    .find(|(n, _)| n == name)
                    .and_then(|(_, h)| encode_histogram(h));
                json!({"name": name, "trend": h})
            }
            Metric::Value(v, unit) => json!({"name": name, "value": v, "unit": unit}),
        })
        .collect();
    let timeline: Vec<Value> = r
        .timeline
        .iter()
        .map(|t| {
            json!([
                t.second,
                t.connections,
                t.sent,
                t.received,
                t.errors,
                t.p99_ms
            ])
        })
        .collect();
    json!({
        "scenario": r.scenario,
        "params": r.params,
        "seconds": r.seconds,
        "notes": r.notes,
        "metrics": metrics,
        "timeline": timeline,
    })
}

/// The units the scenarios use, as the `&'static str` a [`Metric::Value`]
/// holds; another one (none today) is leaked, once per merged report.
fn unit(u: &str) -> &'static str {
    match u {
        "" => "",
        "s" => "s",
        "B" => "B",
        "core" => "core",
        "/s" => "/s",
        "%" => "%",
        "ms" => "ms",
        "µs" => "µs",
        other => Box::leak(other.to_string().into_boxed_str()),
    }
}

fn bad(what: &str) -> BenchError {
    BenchError(format!(
        "a generator process sent a report the parent cannot read ({what})"
    ))
}

/// The inverse of [`encode`].
pub fn decode(v: &Value) -> Result<Report, BenchError> {
    let mut r = Report::new(v["scenario"].as_str().ok_or_else(|| bad("scenario"))?);
    r.seconds = v["seconds"].as_f64().unwrap_or(0.0);
    for p in v["params"].as_array().ok_or_else(|| bad("params"))? {
        let (Some(k), Some(val)) = (p[0].as_str(), p[1].as_str()) else {
            return Err(bad("a param"));
        };
        r.param(k, val);
    }
    for n in v["notes"].as_array().ok_or_else(|| bad("notes"))? {
        r.notes.push(n.as_str().unwrap_or_default().to_string());
    }
    for m in v["metrics"].as_array().ok_or_else(|| bad("metrics"))? {
        let name = m["name"].as_str().ok_or_else(|| bad("a metric's name"))?;
        if let Some(n) = m.get("counter") {
            r.counter(name, n.as_u64().ok_or_else(|| bad(name))?);
        } else if let Some(pt) = m.get("rate") {
            let (Some(p), Some(t)) = (pt[0].as_u64(), pt[1].as_u64()) else {
                return Err(bad(name));
            };
            r.rate(name, p, t);
        } else if let Some(h) = m.get("trend") {
            let h = match h.as_str() {
                Some(text) => decode_histogram(text).map_err(|e| bad(&format!("{name}: {e}")))?,
                None => super::metrics::histogram(),
            };
            r.trend(name, h);
        } else {
            r.value(
                name,
                m["value"].as_f64(),
                unit(m["unit"].as_str().unwrap_or("")),
            );
        }
    }
    for t in v["timeline"].as_array().ok_or_else(|| bad("timeline"))? {
        r.timeline.push(Tick {
            second: t[0].as_u64().unwrap_or(0),
            step: None,
            connections: t[1].as_i64().unwrap_or(0),
            sent: t[2].as_u64().unwrap_or(0),
            received: t[3].as_u64().unwrap_or(0),
            errors: t[4].as_u64().unwrap_or(0),
            p99_ms: t[5].as_f64(),
        });
    }
    Ok(r)
}

/// How the children's values of one figure combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Each child had its share: CPU seconds and shares of a core, peak
    /// connections (the sum of the children's peaks, an upper bound of the
    /// run's peak), publish rates (each child publishes its share).
    Sum,
    /// Per-connection figures: each child holds an equal share.
    Mean,
    /// Times until something was done everywhere (`all_open_after`, ...),
    /// and any figure not named here.
    Max,
}

/// The rule for a figure, by its name without a `{tag}`.
pub fn value_rule(name: &str) -> Rule {
    let base = name.split('{').next().unwrap_or(name);
    if base.ends_with("_per_connection") {
        Rule::Mean
    } else if base.starts_with("generator_cpu")
        || base == "peak_connections"
        || base.starts_with("http_publish_rate")
    {
        Rule::Sum
    } else {
        Rule::Max
    }
}

/// One report from the children's: metrics in the order they first
/// appear, each combined by its kind; params of the first child; notes
/// once each; the timeline summed per second (its per-second p99 is the
/// worst child's, since the children do not send per-second histograms).
pub fn merge(children: Vec<Report>) -> Report {
    let mut out = Report::new(
        children
            .first()
            .map_or("merged", |r| r.scenario.as_str())
            .to_string()
            .as_str(),
    );
    let Some(first) = children.first() else {
        return out;
    };
    out.params = first.params.clone();
    out.seconds = children.iter().map(|r| r.seconds).fold(0.0, f64::max);
    let mut names: Vec<String> = Vec::new();
    for r in &children {
        for (name, _) in &r.metrics {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
        for n in &r.notes {
            if !out.notes.contains(n) {
                out.notes.push(n.clone());
            }
        }
    }
    for name in &names {
        let all: Vec<&Metric> = children.iter().filter_map(|r| r.get(name)).collect();
        match all[0] {
            Metric::Counter(_) => {
                let n = all
                    .iter()
                    .map(|m| match m {
                        Metric::Counter(n) => *n,
                        _ => 0,
                    })
                    .sum();
                out.counter(name, n);
            }
            Metric::Rate { .. } => {
                let (mut p, mut t) = (0, 0);
                for m in &all {
                    if let Metric::Rate { passes, total } = m {
                        p += passes;
                        t += total;
                    }
                }
                out.rate(name, p, t);
            }
            Metric::Trend(_) => {
                let mut h = super::metrics::histogram();
                for r in &children {
                    if let Some((_, other)) = r.histograms.iter().find(|(n, _)| n == name) {
                        let _ = h.add(other);
                    }
                }
                out.trend(name, h);
            }
            Metric::Value(_, u) => {
                let vals: Vec<f64> = all
                    .iter()
                    .filter_map(|m| match m {
                        Metric::Value(v, _) => *v,
                        _ => None,
                    })
                    .collect();
                let v = (!vals.is_empty()).then(|| match value_rule(name) {
                    Rule::Sum => vals.iter().sum(),
                    Rule::Mean => vals.iter().sum::<f64>() / vals.len() as f64,
                    Rule::Max => vals.iter().copied().fold(f64::MIN, f64::max),
                });
                out.value(name, v, u);
            }
        }
    }
    let mut seconds: BTreeMap<u64, Tick> = BTreeMap::new();
    for r in &children {
        for t in &r.timeline {
            let m = seconds.entry(t.second).or_insert_with(|| Tick {
                second: t.second,
                ..Tick::default()
            });
            m.connections += t.connections;
            m.sent += t.sent;
            m.received += t.received;
            m.errors += t.errors;
            m.p99_ms = match (m.p99_ms, t.p99_ms) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
        }
    }
    out.timeline = seconds.into_values().collect();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn child(received: u64, latencies: &[u64], cpu: f64) -> Report {
        let mut r = Report::new("fanout");
        r.param("url", "ws://127.0.0.1:1");
        r.seconds = 2.0;
        r.counter("deliveries_received", received);
        r.rate("delivery_success", received, 10);
        let mut h = super::super::metrics::histogram();
        for &v in latencies {
            h.record(v).unwrap();
        }
        r.trend("message_latency", h);
        r.value("generator_cpu", Some(cpu), "s");
        r.value("all_subscribed_after", Some(cpu * 10.0), "s");
        r.value("server_rss_end", None, "B");
        r.timeline.push(Tick {
            second: 1,
            connections: 5,
            sent: 1,
            received,
            p99_ms: Some(cpu),
            ..Tick::default()
        });
        r.notes.push("same".into());
        r
    }

    #[test]
    fn counts_add_up_and_percentiles_come_from_every_sample() {
        let a = decode(&encode(&child(10, &[1000; 99], 0.5))).unwrap();
        let b = decode(&encode(&child(7, &[50_000], 0.25))).unwrap();
        let m = merge(vec![a, b]);
        assert_eq!(m.count("deliveries_received"), 17);
        assert_eq!(
            m.get("delivery_success"),
            Some(&Metric::Rate {
                passes: 17,
                total: 20
            })
        );
        // 100 samples: the 99 fast ones of one child and the slow one of
        // the other; the merged p99 is the fast ones', the max the slow one.
        let t = m.latency("message_latency").unwrap();
        assert_eq!(t.count, 100);
        assert!((t.p99 - 1.0).abs() < 0.01, "{t:?}");
        assert!((t.max - 50.0).abs() < 0.1, "{t:?}");
        assert_eq!(m.figure("generator_cpu"), Some(0.75));
        assert_eq!(m.figure("all_subscribed_after"), Some(5.0));
        assert_eq!(m.get("server_rss_end"), Some(&Metric::Value(None, "B")));
        assert_eq!(m.timeline.len(), 1);
        assert_eq!(m.timeline[0].connections, 10);
        assert_eq!(m.timeline[0].received, 17);
        assert_eq!(m.timeline[0].p99_ms, Some(0.5));
        assert_eq!(m.notes, vec!["same".to_string()]);
        assert_eq!(m.params, vec![("url".into(), "ws://127.0.0.1:1".into())]);
    }

    #[test]
    fn rules() {
        assert_eq!(value_rule("generator_cpu_share"), Rule::Sum);
        assert_eq!(value_rule("server_memory_per_connection"), Rule::Mean);
        assert_eq!(value_rule("all_open_after"), Rule::Max);
        assert_eq!(value_rule("http_publish_rate_achieved"), Rule::Sum);
    }
}
