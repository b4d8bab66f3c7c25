//! Results: the k6-style summary, `--json` (every figure under the same
//! metric names) and `--html` (latency histograms and a timeline as SVG).

use super::ledger::Deliveries;
use super::metrics::{Live, Tick};
use hdrhistogram::Histogram;
use serde_json::{json, Map, Value};
use std::fmt::Write as _;

/// Latency summary in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Trend {
    pub count: u64,
    pub avg: f64,
    pub min: f64,
    pub med: f64,
    pub max: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
}

impl Trend {
    pub fn of(h: &Histogram<u64>) -> Trend {
        if h.is_empty() {
            return Trend::default();
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Trend {
            count: h.len(),
            avg: h.mean() / 1000.0,
            min: ms(h.min()),
            med: ms(h.value_at_quantile(0.5)),
            max: ms(h.max()),
            p90: ms(h.value_at_quantile(0.90)),
            p95: ms(h.value_at_quantile(0.95)),
            p99: ms(h.value_at_quantile(0.99)),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Metric {
    /// A count; printed with its rate per second over the run.
    Counter(u64),
    /// A share of passes: printed as a percentage, JSON as a fraction.
    Rate { passes: u64, total: u64 },
    /// A latency distribution in ms.
    Trend(Trend),
    /// A single figure with a unit (`s`, `B`, `%`, ...); `None` prints "none".
    Value(Option<f64>, &'static str),
}

/// What a scenario run produced.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub scenario: String,
    pub params: Vec<(String, String)>,
    pub metrics: Vec<(String, Metric)>,
    /// Warnings and explanations, printed under the summary.
    pub notes: Vec<String>,
    pub timeline: Vec<Tick>,
    /// Latency histograms for the HTML report, by metric name.
    pub histograms: Vec<(String, Histogram<u64>)>,
    /// Wall time the counters' rates are computed over.
    pub seconds: f64,
    /// Periodic samples of the server (`soak`), as JSON objects; written
    /// to `--json` under `samples` when there are any.
    pub samples: Vec<Value>,
    /// What `--label` named the server or build under test; `herald bench
    /// compare` groups runs by it.
    pub label: Option<String>,
}

impl Report {
    pub fn new(scenario: &str) -> Report {
        Report {
            scenario: scenario.into(),
            ..Report::default()
        }
    }

    pub fn param(&mut self, name: &str, value: impl ToString) {
        self.params.push((name.into(), value.to_string()));
    }

    pub fn counter(&mut self, name: &str, n: u64) {
        self.metrics.push((name.into(), Metric::Counter(n)));
    }

    pub fn rate(&mut self, name: &str, passes: u64, total: u64) {
        self.metrics
            .push((name.into(), Metric::Rate { passes, total }));
    }

    pub fn value(&mut self, name: &str, v: Option<f64>, unit: &'static str) {
        self.metrics.push((name.into(), Metric::Value(v, unit)));
    }

    pub fn trend(&mut self, name: &str, h: Histogram<u64>) {
        self.metrics
            .push((name.into(), Metric::Trend(Trend::of(&h))));
        self.histograms.push((name.into(), h));
    }

    pub fn cpu(&mut self, name: &str, seconds: f64, wall: f64) {
        self.value(name, Some(seconds), "s");
        self.value(&format!("{name}_share"), Some(seconds / wall), "core");
    }

    /// Connection errors: the total, and one counter per kind.
    pub fn errors(&mut self, live: &Live) {
        self.counter(
            "connection_errors",
            live.errors.load(std::sync::atomic::Ordering::Relaxed),
        );
        for (kind, n) in live.error_kinds() {
            self.counter(&format!("connection_errors{{kind:{kind}}}"), n);
        }
        for e in live.error_examples() {
            self.notes.push(format!("error: {e}"));
        }
    }

    /// Delivery accounting under the same names in every scenario:
    /// `deliveries_received` counts distinct expected messages, so
    /// `deliveries_duplicated` and `deliveries_unexpected` are reported
    /// beside `deliveries_lost`, never netted against it.
    pub fn deliveries(&mut self, d: &Deliveries) {
        self.counter("deliveries_expected", d.expected);
        self.counter("deliveries_received", d.received);
        self.counter("deliveries_lost", d.lost());
        self.counter("deliveries_duplicated", d.duplicated);
        self.counter("deliveries_unexpected", d.unexpected);
        self.rate("delivery_success", d.received, d.expected);
        if d.duplicated > 0 {
            self.notes.push(format!(
                "{} deliveries were duplicates of a message the receiver already had",
                d.duplicated
            ));
        }
        if d.unexpected > 0 {
            self.notes.push(format!(
                "{} deliveries were not expected where they arrived (echo of the receiver's \
                 own message, a failed publish delivered anyway, or a frame without a bench id)",
                d.unexpected
            ));
        }
    }

    pub fn get(&self, name: &str) -> Option<&Metric> {
        self.metrics.iter().find(|(n, _)| n == name).map(|(_, m)| m)
    }

    /// A counter's value (0 when absent), for tests and callers.
    pub fn count(&self, name: &str) -> u64 {
        match self.get(name) {
            Some(Metric::Counter(n)) => *n,
            _ => 0,
        }
    }

    pub fn fraction(&self, name: &str) -> Option<f64> {
        match self.get(name) {
            Some(Metric::Rate { passes, total }) => Some(if *total == 0 {
                0.0
            } else {
                *passes as f64 / *total as f64
            }),
            _ => None,
        }
    }

    pub fn latency(&self, name: &str) -> Option<Trend> {
        match self.get(name) {
            Some(Metric::Trend(t)) => Some(*t),
            _ => None,
        }
    }

    pub fn figure(&self, name: &str) -> Option<f64> {
        match self.get(name) {
            Some(Metric::Value(v, _)) => *v,
            _ => None,
        }
    }

    /// The k6-style text summary.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "\n  scenario: {}", self.scenario);
        for (k, v) in &self.params {
            let _ = writeln!(out, "     {k}: {v}");
        }
        out.push('\n');
        let width = self
            .metrics
            .iter()
            .map(|(n, _)| n.len())
            .max()
            .unwrap_or(0)
            .max(30)
            + 3;
        for (name, m) in &self.metrics {
            let dots = ".".repeat(width - name.len());
            let value = match m {
                Metric::Counter(n) => {
                    let rate = if self.seconds > 0.0 {
                        *n as f64 / self.seconds
                    } else {
                        0.0
                    };
                    format!("{n:<10} {}/s", short(rate))
                }
                Metric::Rate { passes, total } => {
                    let pct = if *total == 0 {
                        0.0
                    } else {
                        100.0 * *passes as f64 / *total as f64
                    };
                    format!("{pct:.2}% ✓ {passes} ✗ {}", total - passes)
                }
                Metric::Trend(t) => format!(
                    "avg={} min={} med={} max={} p(90)={} p(95)={} p(99)={}",
                    ms(t.avg),
                    ms(t.min),
                    ms(t.med),
                    ms(t.max),
                    ms(t.p90),
                    ms(t.p95),
                    ms(t.p99)
                ),
                Metric::Value(None, _) => "none".to_string(),
                Metric::Value(Some(v), "core") => format!("{:.1}% of one core", v * 100.0),
                Metric::Value(Some(v), "B") => bytes(*v),
                Metric::Value(Some(v), unit) => format!("{}{unit}", short(*v)),
            };
            let _ = writeln!(out, "     {name}{dots}: {value}");
        }
        if !self.notes.is_empty() {
            out.push('\n');
            for n in &self.notes {
                let _ = writeln!(out, "  ! {n}");
            }
        }
        out
    }

    /// Every figure under the summary's metric names: counters as numbers,
    /// latencies as `{avg,min,med,max,p90,p95,p99}` in ms, rates as fractions.
    pub fn json(&self) -> Value {
        let mut metrics = Map::new();
        let mut per_second = Map::new();
        for (name, m) in &self.metrics {
            let v = match m {
                Metric::Counter(n) => {
                    if self.seconds > 0.0 {
                        per_second.insert(name.clone(), json!(*n as f64 / self.seconds));
                    }
                    json!(n)
                }
                Metric::Rate { passes, total } => {
                    json!(if *total == 0 {
                        0.0
                    } else {
                        *passes as f64 / *total as f64
                    })
                }
                Metric::Trend(t) => json!({
                    "avg": t.avg, "min": t.min, "med": t.med, "max": t.max,
                    "p90": t.p90, "p95": t.p95, "p99": t.p99, "count": t.count,
                }),
                Metric::Value(v, _) => json!(v),
            };
            metrics.insert(name.clone(), v);
        }
        let params: Map<String, Value> = self
            .params
            .iter()
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect();
        let timeline: Vec<Value> = self
            .timeline
            .iter()
            .map(|t| {
                let mut v = json!({"second": t.second, "connections": t.connections, "sent": t.sent,
                       "received": t.received, "errors": t.errors, "p99": t.p99_ms});
                if let Some(n) = t.step {
                    v["step"] = json!(n);
                }
                v
            })
            .collect();
        let mut out = json!({
            "scenario": self.scenario,
            "params": params,
            "seconds": self.seconds,
            "metrics": metrics,
            "per_second": per_second,
            "notes": self.notes,
            "timeline": timeline,
        });
        if !self.samples.is_empty() {
            out["samples"] = Value::Array(self.samples.clone());
        }
        // Each figure's unit, so a comparison can say it.
        let units: Map<String, Value> = self
            .metrics
            .iter()
            .filter_map(|(name, m)| match m {
                Metric::Trend(_) => Some((name.clone(), json!("ms"))),
                Metric::Value(_, unit) => Some((name.clone(), json!(unit))),
                _ => None,
            })
            .collect();
        out["units"] = Value::Object(units);
        if let Some(label) = &self.label {
            out["label"] = json!(label);
        }
        // Whole histograms (HdrHistogram's V2 format, deflated, base64), so
        // `herald bench compare` can overlay and merge runs exactly.
        let histograms: Map<String, Value> = self
            .histograms
            .iter()
            .filter_map(|(name, h)| Some((name.clone(), json!(encode_histogram(h)?))))
            .collect();
        if !histograms.is_empty() {
            out["histograms"] = Value::Object(histograms);
        }
        out
    }

    /// A standalone HTML page: the summary, one histogram per latency and
    /// the timeline, as embedded SVG.
    pub fn html(&self) -> String {
        let mut out = String::new();
        let _ = write!(
            out,
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>herald bench {s}</title>\
             <style>body{{font-family:sans-serif;margin:2em}}pre{{background:#f6f6f6;padding:1em}}\
             svg{{background:#fff;border:1px solid #ddd;margin:.5em 0}}</style></head><body>\
             <h1>herald bench: {s}</h1><pre>{summary}</pre>",
            s = escape(&self.scenario),
            summary = escape(&self.summary()),
        );
        if !self.timeline.is_empty() {
            out.push_str("<h2>Timeline</h2>");
            type Series<'a> = (&'a str, Box<dyn Fn(&Tick) -> f64>);
            let series: [Series; 5] = [
                (
                    "open connections",
                    Box::new(|t: &Tick| t.connections as f64),
                ),
                ("sends per second", Box::new(|t: &Tick| t.sent as f64)),
                (
                    "receives per second",
                    Box::new(|t: &Tick| t.received as f64),
                ),
                ("errors per second", Box::new(|t: &Tick| t.errors as f64)),
                (
                    "p99 latency per second (ms)",
                    Box::new(|t: &Tick| t.p99_ms.unwrap_or(0.0)),
                ),
            ];
            for (title, f) in series.iter() {
                let points: Vec<(f64, f64)> = self
                    .timeline
                    .iter()
                    .map(|t| (t.second as f64, f(t)))
                    .collect();
                out.push_str(&line_chart(title, &points));
            }
        }
        if !self.histograms.is_empty() {
            out.push_str("<h2>Latency histograms</h2>");
            for (name, h) in &self.histograms {
                out.push_str(&histogram_chart(name, h));
            }
        }
        out.push_str("</body></html>\n");
        out
    }
}

/// A histogram as HdrHistogram's compressed V2 encoding in base64 (the
/// format its other implementations read too).
pub fn encode_histogram(h: &Histogram<u64>) -> Option<String> {
    use base64::Engine as _;
    use hdrhistogram::serialization::{Serializer, V2DeflateSerializer};
    let mut bytes = Vec::new();
    V2DeflateSerializer::new().serialize(h, &mut bytes).ok()?;
    Some(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// The inverse of [`encode_histogram`].
pub fn decode_histogram(text: &str) -> Result<Histogram<u64>, String> {
    use base64::Engine as _;
    use hdrhistogram::serialization::Deserializer;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| format!("not base64: {e}"))?;
    Deserializer::new()
        .deserialize(&mut &bytes[..])
        .map_err(|e| format!("not an HdrHistogram: {e:?}"))
}

pub(crate) fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn ms(v: f64) -> String {
    if v >= 1000.0 {
        format!("{:.2}s", v / 1000.0)
    } else if v >= 10.0 {
        format!("{v:.1}ms")
    } else {
        format!("{v:.2}ms")
    }
}

fn short(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

fn bytes(v: f64) -> String {
    if v.abs() >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", v / 1024.0 / 1024.0)
    } else if v.abs() >= 1024.0 {
        format!("{:.2} KiB", v / 1024.0)
    } else {
        format!("{v:.0} B")
    }
}

const W: f64 = 720.0;
const H: f64 = 180.0;
const PAD: f64 = 40.0;

fn line_chart(title: &str, points: &[(f64, f64)]) -> String {
    let xmax = points.iter().map(|p| p.0).fold(1.0, f64::max);
    let ymax = points.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-9);
    let path: Vec<String> = points
        .iter()
        .map(|(x, y)| {
            format!(
                "{:.1},{:.1}",
                PAD + x / xmax * (W - 2.0 * PAD),
                H - PAD / 2.0 - y / ymax * (H - PAD)
            )
        })
        .collect();
    format!(
        "<div><b>{t}</b><br><svg width=\"{W}\" height=\"{H}\" xmlns=\"http://www.w3.org/2000/svg\">\
         <line x1=\"{PAD}\" y1=\"{yb}\" x2=\"{xe}\" y2=\"{yb}\" stroke=\"#999\"/>\
         <text x=\"2\" y=\"{yt}\" font-size=\"11\">{ymax}</text>\
         <text x=\"{xe}\" y=\"{H}\" font-size=\"11\" text-anchor=\"end\">{xmax:.0}s</text>\
         <polyline fill=\"none\" stroke=\"#2a6fdb\" stroke-width=\"1.5\" points=\"{p}\"/></svg></div>",
        t = escape(title),
        yb = H - PAD / 2.0,
        xe = W - PAD,
        yt = PAD / 2.0 + 4.0,
        ymax = short(ymax),
        p = path.join(" "),
    )
}

/// Bars over logarithmic latency buckets (powers of two of microseconds).
fn histogram_chart(name: &str, h: &Histogram<u64>) -> String {
    if h.is_empty() {
        return format!("<div><b>{}</b>: no samples</div>", escape(name));
    }
    let mut buckets: Vec<(u64, u64)> = Vec::new();
    for v in h.iter_log(16, 2.0) {
        buckets.push((v.value_iterated_to(), v.count_since_last_iteration()));
    }
    while buckets.last().is_some_and(|b| b.1 == 0) {
        buckets.pop();
    }
    let first = buckets.iter().position(|b| b.1 > 0).unwrap_or(0);
    let buckets = &buckets[first..];
    let cmax = buckets.iter().map(|b| b.1).max().unwrap_or(1).max(1) as f64;
    let bw = (W - 2.0 * PAD) / buckets.len().max(1) as f64;
    let mut bars = String::new();
    for (i, (upto, count)) in buckets.iter().enumerate() {
        let bh = *count as f64 / cmax * (H - PAD);
        let x = PAD + i as f64 * bw;
        let _ = write!(
            bars,
            "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{bh:.1}\" fill=\"#2a6fdb\">\
             <title>≤ {} : {count}</title></rect>\
             <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"9\" text-anchor=\"middle\">{}</text>",
            H - PAD / 2.0 - bh,
            (bw - 2.0).max(1.0),
            ms(*upto as f64 / 1000.0),
            x + bw / 2.0,
            H - 4.0,
            ms(*upto as f64 / 1000.0),
        );
    }
    format!(
        "<div><b>{}</b> (count per bucket, upper bound shown)<br><svg width=\"{W}\" height=\"{H}\" \
         xmlns=\"http://www.w3.org/2000/svg\">{bars}</svg></div>",
        escape(name)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_json_and_html_use_the_same_names() {
        let mut r = Report::new("demo");
        r.seconds = 2.0;
        r.counter("ws_msgs_received", 10);
        r.rate("delivery_success", 9, 10);
        let mut h = super::super::metrics::histogram();
        for v in [1000, 2000, 3000] {
            h.record(v).unwrap();
        }
        r.trend("message_latency", h);
        r.value("generator_cpu", Some(0.5), "s");
        let text = r.summary();
        assert!(text.contains("ws_msgs_received"), "{text}");
        assert!(text.contains("90.00%"), "{text}");
        assert!(text.contains("p(99)="), "{text}");
        let j = r.json();
        assert_eq!(j["metrics"]["ws_msgs_received"], 10);
        assert_eq!(j["metrics"]["delivery_success"], 0.9);
        assert_eq!(j["metrics"]["message_latency"]["med"], 2.0);
        assert_eq!(j["per_second"]["ws_msgs_received"], 5.0);
        assert_eq!(j["units"]["generator_cpu"], "s");
        assert_eq!(j["units"]["message_latency"], "ms");
        let html = r.html();
        assert!(html.contains("<svg") && html.contains("message_latency"));
        // The histogram travels whole in the JSON.
        let h = decode_histogram(j["histograms"]["message_latency"].as_str().unwrap()).unwrap();
        assert_eq!(h.len(), 3);
        assert!(h.equivalent(h.value_at_quantile(0.5), 2000));
    }
}
