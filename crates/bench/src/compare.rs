//! `herald bench compare`: runs of one scenario, from several servers or
//! builds, side by side.
//!
//! Each `--json` report names its server with `--label` (or the file's
//! stem, or `LABEL=FILE` on the command line). Runs with the same label
//! are repeats: the table quotes their median, because one run on a noisy
//! machine proves little, and their histograms are merged. Runs of
//! different scenarios or settings are refused with what differs, since a
//! table that mixes them would compare the settings, not the servers.
//! Where the runs went (`url`) is not a setting.

use super::report::{decode_histogram, escape};
use hdrhistogram::Histogram;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// `herald bench compare`'s arguments.
#[derive(clap::Args)]
pub struct CompareArgs {
    /// `--json` reports of one scenario, as FILE or LABEL=FILE; runs with
    /// the same label are repeats of one server.
    #[arg(required = true, num_args = 2..)]
    runs: Vec<String>,
    /// Also write the side-by-side page (charts on shared axes) here.
    #[arg(long)]
    html: Option<std::path::PathBuf>,
    /// A setting allowed to differ between the runs (repeatable).
    #[arg(long = "ignore-param", value_name = "NAME")]
    ignore: Vec<String>,
}

/// Prints the table; exit code 2 when the runs cannot be compared.
pub fn run_cli(args: CompareArgs) -> std::process::ExitCode {
    use std::process::ExitCode;
    let runs: Result<Vec<Run>, String> = args.runs.iter().map(|a| Run::load(a)).collect();
    let runs = match runs.and_then(|runs| check(&runs, &args.ignore).map(|()| runs)) {
        Ok(runs) => runs,
        Err(e) => {
            eprintln!("herald bench compare: {e}");
            return ExitCode::from(2);
        }
    };
    print!("{}", markdown(&runs));
    if let Some(path) = &args.html {
        if let Err(e) = std::fs::write(path, html(&runs)) {
            eprintln!("herald bench compare: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// Parameters that say where a run went, not what it did. A fault's
/// command names the pid or port it kills, which differs between repeats
/// and engines; when the fault ran (`fault at`) is a setting.
const PLACES: &[&str] = &["url", "subscriber urls", "publisher urls", "fault command"];

/// One `--json` report.
#[derive(Debug)]
pub struct Run {
    pub label: String,
    pub file: String,
    pub scenario: String,
    pub params: BTreeMap<String, String>,
    pub metrics: Map<String, Value>,
    /// Figure name → unit (`ms`, `s`, `B`, `core`), as the report wrote them.
    pub units: Map<String, Value>,
    pub histograms: Vec<(String, Histogram<u64>)>,
    pub timeline: Vec<Value>,
}

impl Run {
    /// `FILE` or `LABEL=FILE`.
    pub fn load(arg: &str) -> Result<Run, String> {
        let (label, path) = match arg.split_once('=') {
            Some((l, p)) if !l.is_empty() && !l.contains('/') => (Some(l.to_string()), p),
            _ => (None, arg),
        };
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| format!("{path} is not a `herald bench --json` report: {e}"))?;
        Run::from_json(label, path, &v)
    }

    pub fn from_json(label: Option<String>, file: &str, v: &Value) -> Result<Run, String> {
        let not_a_report =
            |what: &str| format!("{file} is not a `herald bench --json` report: no {what}");
        let scenario = v["scenario"]
            .as_str()
            .ok_or_else(|| not_a_report("\"scenario\""))?;
        let metrics = v["metrics"]
            .as_object()
            .cloned()
            .ok_or_else(|| not_a_report("\"metrics\""))?;
        let params = v["params"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| {
                        (
                            k.clone(),
                            v.as_str().map_or_else(|| v.to_string(), str::to_string),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut histograms = Vec::new();
        if let Some(hs) = v["histograms"].as_object() {
            for (name, text) in hs {
                let h = text
                    .as_str()
                    .ok_or_else(|| format!("{file}: histogram {name} is not a string"))
                    .and_then(|t| {
                        decode_histogram(t).map_err(|e| format!("{file}: histogram {name}: {e}"))
                    })?;
                histograms.push((name.clone(), h));
            }
        }
        let stem = std::path::Path::new(file)
            .file_stem()
            .map_or_else(|| file.to_string(), |s| s.to_string_lossy().into_owned());
        let label = label
            .or_else(|| v["label"].as_str().map(str::to_string))
            .unwrap_or(stem);
        Ok(Run {
            label,
            file: file.to_string(),
            scenario: scenario.to_string(),
            params,
            metrics,
            units: v["units"].as_object().cloned().unwrap_or_default(),
            histograms,
            timeline: v["timeline"].as_array().cloned().unwrap_or_default(),
        })
    }
}

/// Refuses runs that do not measure the same thing, naming what differs.
pub fn check(runs: &[Run], ignore: &[String]) -> Result<(), String> {
    if runs.len() < 2 {
        return Err("compare needs at least two runs".into());
    }
    let first = &runs[0];
    if let Some(r) = runs.iter().find(|r| r.scenario != first.scenario) {
        return Err(format!(
            "{} ran `{}` and {} ran `{}`: compare runs of one scenario",
            first.file, first.scenario, r.file, r.scenario
        ));
    }
    if runs.iter().all(|r| r.label == first.label) {
        return Err(format!(
            "every run is labelled `{}`: name the servers with `herald bench … --label NAME` or LABEL=FILE",
            first.label
        ));
    }
    let names: BTreeSet<&String> = runs.iter().flat_map(|r| r.params.keys()).collect();
    let mut differ = Vec::new();
    for name in names {
        if PLACES.contains(&name.as_str()) || ignore.contains(name) {
            continue;
        }
        let value = |r: &Run| {
            r.params
                .get(name)
                .map_or("(not set)", String::as_str)
                .to_string()
        };
        if runs.iter().any(|r| value(r) != value(first)) {
            let each: Vec<String> = runs
                .iter()
                .map(|r| format!("{} = {}", r.file, value(r)))
                .collect();
            differ.push(format!("  {name}: {}", each.join(", ")));
        }
    }
    if differ.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the runs were made with different settings:\n{}\n(--ignore-param NAME compares them anyway)",
            differ.join("\n")
        ))
    }
}

/// The runs of one label.
pub struct Group<'a> {
    pub label: &'a str,
    pub runs: Vec<&'a Run>,
}

/// Runs grouped by label, in the order the labels first appear.
pub fn groups(runs: &[Run]) -> Vec<Group<'_>> {
    let mut out: Vec<Group> = Vec::new();
    for r in runs {
        match out.iter_mut().find(|g| g.label == r.label) {
            Some(g) => g.runs.push(r),
            None => out.push(Group {
                label: &r.label,
                runs: vec![r],
            }),
        }
    }
    out
}

/// One line of the table: a figure's median per group.
pub struct Row {
    pub name: String,
    pub values: Vec<Option<f64>>,
}

/// Server CPU per delivery, from the figures every delivering scenario
/// reports; the row side-by-side tables are most often about.
fn cpu_per_delivery_us(r: &Run) -> Option<f64> {
    let cpu = r.metrics.get("server_cpu")?.as_f64()?;
    let delivered = r.metrics.get("ws_msgs_received")?.as_f64()?;
    (delivered > 0.0).then(|| cpu * 1e6 / delivered)
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Every figure of the runs, latencies split into percentiles, as medians
/// per group.
pub fn rows(groups: &[Group]) -> Vec<Row> {
    let mut names: Vec<String> = Vec::new();
    for g in groups {
        for r in &g.runs {
            for (name, v) in &r.metrics {
                let expanded: Vec<String> = if v.is_object() {
                    ["med", "p95", "p99", "max"]
                        .iter()
                        .map(|p| format!("{name} {p}"))
                        .collect()
                } else {
                    vec![name.clone()]
                };
                for n in expanded {
                    if !names.contains(&n) {
                        names.push(n);
                    }
                }
            }
        }
    }
    let figure = |r: &Run, name: &str| -> Option<f64> {
        if let Some((metric, p)) = name.split_once(' ') {
            return r.metrics.get(metric)?.get(p)?.as_f64();
        }
        match r.metrics.get(name)? {
            Value::Bool(b) => Some(f64::from(u8::from(*b))),
            v => v.as_f64(),
        }
    };
    let per_group = |f: &dyn Fn(&Run) -> Option<f64>| -> Vec<Option<f64>> {
        groups
            .iter()
            .map(|g| median(g.runs.iter().filter_map(|r| f(r)).collect()))
            .collect()
    };
    let mut rows = Vec::new();
    let cpu = per_group(&cpu_per_delivery_us);
    if cpu.iter().any(Option::is_some) {
        rows.push(Row {
            name: "server_cpu_per_delivery (µs)".into(),
            values: cpu,
        });
    }
    for name in names {
        let metric = name.split(' ').next().unwrap_or(&name);
        let unit = groups
            .iter()
            .flat_map(|g| g.runs.iter())
            .find_map(|r| r.units.get(metric).and_then(Value::as_str))
            .unwrap_or("");
        // Bytes read better as MiB, or KiB when every value is under one
        // MiB (memory per connection); other units are shown as they are.
        let mut values = per_group(&|r| figure(r, &name));
        let biggest = values.iter().flatten().fold(0f64, |m, v| m.max(v.abs()));
        let (scale, shown) = match unit {
            "B" if biggest < 1024.0 * 1024.0 => (1.0 / 1024.0, "KiB"),
            "B" => (1.0 / (1024.0 * 1024.0), "MiB"),
            "core" => (1.0, "of a core"),
            u => (1.0, u),
        };
        for v in values.iter_mut().flatten() {
            *v *= scale;
        }
        let name = if shown.is_empty() {
            name
        } else {
            format!("{name} ({shown})")
        };
        if values.iter().any(Option::is_some) {
            rows.push(Row { name, values });
        }
    }
    rows
}

fn number(v: Option<f64>) -> String {
    match v {
        None => "–".into(),
        Some(v) if v.fract() == 0.0 && v.abs() < 1e15 => format!("{v:.0}"),
        Some(v) if v.abs() >= 100.0 => format!("{v:.0}"),
        Some(v) if v.abs() >= 1.0 => format!("{v:.2}"),
        Some(v) => format!("{v:.4}"),
    }
}

fn ratio(a: Option<f64>, base: Option<f64>) -> String {
    match (a, base) {
        (Some(a), Some(b)) if b != 0.0 => format!("{:.2}×", a / b),
        _ => "–".into(),
    }
}

/// A one-line statement of what was compared.
fn heading(runs: &[Run], groups: &[Group]) -> String {
    let settings: Vec<String> = runs[0]
        .params
        .iter()
        .filter(|(k, _)| !PLACES.contains(&k.as_str()))
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    let counts: Vec<String> = groups
        .iter()
        .map(|g| format!("{} ×{}", g.label, g.runs.len()))
        .collect();
    format!(
        "`{}` ({}); runs: {}; medians of each server's runs",
        runs[0].scenario,
        settings.join(", "),
        counts.join(", ")
    )
}

/// The side-by-side table as Markdown, ready for bench/RESULTS.md; each
/// later group also as a ratio to the first.
pub fn markdown(runs: &[Run]) -> String {
    let groups = groups(runs);
    let mut out = String::new();
    let _ = writeln!(out, "{}\n", heading(runs, &groups));
    let mut header = vec!["figure".to_string()];
    header.extend(groups.iter().map(|g| g.label.to_string()));
    header.extend(
        groups[1..]
            .iter()
            .map(|g| format!("{} / {}", g.label, groups[0].label)),
    );
    let _ = writeln!(out, "| {} |", header.join(" | "));
    let _ = writeln!(out, "|---|{}", "---:|".repeat(header.len() - 1));
    for row in rows(&groups) {
        let mut cells = vec![row.name.clone()];
        cells.extend(row.values.iter().map(|v| number(*v)));
        cells.extend(row.values[1..].iter().map(|v| ratio(*v, row.values[0])));
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    out
}

const COLORS: &[&str] = &[
    "#2a6fdb", "#d9480f", "#2b8a3e", "#862e9c", "#e67700", "#0b7285", "#c2255c", "#5c940d",
];

/// One line of a chart.
struct Series<'a> {
    label: &'a str,
    run: Option<&'a str>,
    color: &'static str,
    points: Vec<(f64, f64)>,
}

const W: f64 = 760.0;
const H: f64 = 240.0;
const PAD: f64 = 48.0;

/// A line chart with every series on the same axes; `xlog` plots x on a
/// log scale. Each polyline carries `data-server` (and `data-run`), so a
/// reader or a test finds each server's series.
fn chart(id: &str, title: &str, xunit: &str, series: &[Series], xlog: bool) -> String {
    let tx = |x: f64| if xlog { x.max(1e-9).log10() } else { x };
    let all = || series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1) = (f64::MAX, f64::MIN);
    let mut y1: f64 = 1e-9;
    for (x, y) in all() {
        x0 = x0.min(tx(*x));
        x1 = x1.max(tx(*x));
        y1 = y1.max(*y);
    }
    if x0 > x1 {
        return format!(
            "<div class=\"chart\" id=\"{id}\"><b>{}</b>: no data</div>",
            escape(title)
        );
    }
    if x1 - x0 < 1e-9 {
        x1 = x0 + 1.0;
    }
    let px = |x: f64| PAD + (tx(x) - x0) / (x1 - x0) * (W - 2.0 * PAD);
    let py = |y: f64| H - PAD / 2.0 - y / y1 * (H - PAD);
    let shown_x = |v: f64| if xlog { 10f64.powf(v) } else { v };
    let mut svg = format!(
        "<line x1=\"{PAD}\" y1=\"{yb}\" x2=\"{xe}\" y2=\"{yb}\" stroke=\"#999\"/>\
         <text x=\"2\" y=\"{yt}\" font-size=\"11\">{ymax}</text>\
         <text x=\"{PAD}\" y=\"{H}\" font-size=\"11\">{xmin}{xunit}</text>\
         <text x=\"{xe}\" y=\"{H}\" font-size=\"11\" text-anchor=\"end\">{xmax}{xunit}</text>",
        yb = H - PAD / 2.0,
        xe = W - PAD,
        yt = PAD / 2.0 + 4.0,
        ymax = number(Some(y1)),
        xmin = number(Some(shown_x(x0))),
        xmax = number(Some(shown_x(x1))),
    );
    for s in series {
        let points: Vec<String> = s
            .points
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
            .collect();
        let run = s
            .run
            .map(|r| format!(" data-run=\"{}\"", escape(r)))
            .unwrap_or_default();
        let _ = write!(
            svg,
            "<polyline class=\"series\" data-server=\"{}\"{run} fill=\"none\" stroke=\"{}\" \
             stroke-width=\"1.5\" points=\"{}\"><title>{}</title></polyline>",
            escape(s.label),
            s.color,
            points.join(" "),
            escape(s.label)
        );
    }
    format!(
        "<div class=\"chart\" id=\"{id}\"><b>{}</b><br><svg width=\"{W}\" height=\"{H}\" \
         xmlns=\"http://www.w3.org/2000/svg\">{svg}</svg></div>",
        escape(title)
    )
}

/// Latency by percentile: x is the percentile as "nines" (log of
/// 1/(1-q)), the usual way to see a tail; y is the latency in ms.
fn percentile_points(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    let qs: [f64; 9] = [0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9999, 1.0];
    qs.iter()
        .map(|q| {
            (
                1.0 / (1.0 - q.min(0.99999)),
                h.value_at_quantile(*q) as f64 / 1000.0,
            )
        })
        .collect()
}

/// Share of samples per bucket over boundaries shared by every run
/// (powers of 2^(1/4) µs), so histograms from different runs line up.
fn histogram_points(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    let total = h.len().max(1) as f64;
    h.iter_log(1, 2f64.powf(0.25))
        .filter(|v| v.value_iterated_to() >= h.min() / 2)
        .take_while(|v| v.value_iterated_to() <= h.max().saturating_mul(2).max(1))
        .map(|v| {
            (
                v.value_iterated_to() as f64 / 1000.0,
                100.0 * v.count_since_last_iteration() as f64 / total,
            )
        })
        .collect()
}

/// The standalone HTML page: table, latency percentiles and histograms on
/// shared axes, and each run's timeline.
pub fn html(runs: &[Run]) -> String {
    let groups = groups(runs);
    let color = |label: &str| {
        COLORS[groups.iter().position(|g| g.label == label).unwrap_or(0) % COLORS.len()]
    };
    let mut out = String::new();
    let _ = write!(
        out,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>herald bench compare: {s}</title>\
         <style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}\
         td,th{{border:1px solid #ddd;padding:.2em .6em;text-align:right}}td:first-child{{text-align:left}}\
         svg{{background:#fff;border:1px solid #ddd;margin:.5em 0}}.key{{display:inline-block;width:1em;\
         height:.6em;margin:0 .3em 0 1em}}</style></head><body><h1>herald bench compare: {s}</h1><p>{h}</p><p id=\"legend\">",
        s = escape(&runs[0].scenario),
        h = escape(&heading(runs, &groups)),
    );
    for g in &groups {
        let files: Vec<&str> = g.runs.iter().map(|r| r.file.as_str()).collect();
        let _ = write!(
            out,
            "<span class=\"server\" data-server=\"{l}\"><span class=\"key\" style=\"background:{c}\"></span>{l} \
             ({n} run{s}: {f})</span>",
            l = escape(g.label),
            c = color(g.label),
            n = g.runs.len(),
            s = if g.runs.len() == 1 { "" } else { "s" },
            f = escape(&files.join(", ")),
        );
    }
    out.push_str("</p><h2>Figures (medians)</h2><table id=\"figures\"><tr><th>figure</th>");
    for g in &groups {
        let _ = write!(out, "<th data-server=\"{0}\">{0}</th>", escape(g.label));
    }
    for g in &groups[1..] {
        let _ = write!(
            out,
            "<th>{} / {}</th>",
            escape(g.label),
            escape(groups[0].label)
        );
    }
    out.push_str("</tr>");
    for row in rows(&groups) {
        let _ = write!(out, "<tr><td>{}</td>", escape(&row.name));
        for v in &row.values {
            let _ = write!(out, "<td>{}</td>", number(*v));
        }
        for v in &row.values[1..] {
            let _ = write!(out, "<td>{}</td>", ratio(*v, row.values[0]));
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");

    let names: BTreeSet<&str> = runs
        .iter()
        .flat_map(|r| r.histograms.iter().map(|(n, _)| n.as_str()))
        .collect();
    if !names.is_empty() {
        out.push_str("<h2>Latency (each server's runs merged)</h2>");
    }
    for name in names {
        let merged: Vec<(&str, Histogram<u64>)> = groups
            .iter()
            .filter_map(|g| {
                let mut hs = g
                    .runs
                    .iter()
                    .flat_map(|r| r.histograms.iter().filter(|(n, _)| n == name));
                let mut total = hs.next()?.1.clone();
                for (_, h) in hs {
                    let _ = total.add(h);
                }
                Some((g.label, total))
            })
            .collect();
        let series = |f: fn(&Histogram<u64>) -> Vec<(f64, f64)>| -> Vec<Series> {
            merged
                .iter()
                .map(|(label, h)| Series {
                    label,
                    run: None,
                    color: color(label),
                    points: f(h),
                })
                .collect()
        };
        out.push_str(&chart(
            &format!("percentiles-{name}"),
            &format!("{name}: latency (ms) by percentile (x: 1/(1-q), 2 = median, 100 = p99)"),
            "",
            &series(percentile_points),
            true,
        ));
        out.push_str(&chart(
            &format!("histogram-{name}"),
            &format!("{name}: share of samples (%) by latency"),
            "ms",
            &series(histogram_points),
            true,
        ));
    }

    if runs.iter().any(|r| !r.timeline.is_empty()) {
        out.push_str("<h2>Timeline (each run)</h2>");
        for (field, title) in [
            ("connections", "open connections"),
            ("sent", "sends per second"),
            ("received", "receives per second"),
            ("errors", "errors per second"),
            ("p99", "p99 latency per second (ms)"),
        ] {
            let series: Vec<Series> = runs
                .iter()
                .map(|r| Series {
                    label: &r.label,
                    run: Some(&r.file),
                    color: color(&r.label),
                    points: r
                        .timeline
                        .iter()
                        .filter_map(|t| {
                            Some((t["second"].as_f64()?, t[field].as_f64().unwrap_or(0.0)))
                        })
                        .collect(),
                })
                .collect();
            out.push_str(&chart(
                &format!("timeline-{field}"),
                title,
                "s",
                &series,
                false,
            ));
        }
    }
    out.push_str("</body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(label: &str, file: &str, clients: u64, cpu: f64, received: u64) -> Run {
        let mut h = crate::metrics::histogram();
        for v in [1000, 2000, 40_000] {
            h.record(v).unwrap();
        }
        let v = json!({
            "scenario": "fanout",
            "label": label,
            "params": {"url": format!("ws://127.0.0.1:{}", 1000 + clients), "subscribers": clients.to_string()},
            "units": {"message_latency": "ms", "server_rss_peak": "B", "server_memory_per_connection": "B"},
            "metrics": {"server_cpu": cpu, "ws_msgs_received": received, "server_rss_peak": 3145728, "server_memory_per_connection": 2867.2,
                        "message_latency": {"med": 2.0, "p95": 40.0, "p99": 40.0, "max": 40.0}},
            "histograms": {"message_latency": crate::report::encode_histogram(&h).unwrap()},
            "timeline": [{"second": 1, "connections": clients, "sent": 1, "received": 2, "errors": 0, "p99": 3.0}],
        });
        Run::from_json(None, file, &v).unwrap()
    }

    #[test]
    fn medians_per_server_and_ratios_to_the_first() {
        let runs = vec![
            run("herald", "h1.json", 10, 1.0, 1_000_000),
            run("other", "o1.json", 10, 3.0, 1_000_000),
            run("herald", "h2.json", 10, 2.0, 1_000_000),
            run("herald", "h3.json", 10, 9.0, 1_000_000),
        ];
        check(&runs, &[]).unwrap();
        let g = groups(&runs);
        assert_eq!(
            g.iter()
                .map(|g| (g.label, g.runs.len()))
                .collect::<Vec<_>>(),
            [("herald", 3), ("other", 1)]
        );
        let rows = rows(&g);
        let cpu = rows
            .iter()
            .find(|r| r.name.starts_with("server_cpu_per_delivery"))
            .unwrap();
        // herald: median of 1, 2, 9 s over 1 M deliveries = 2 µs; other 3 µs.
        assert_eq!(cpu.values, [Some(2.0), Some(3.0)]);
        let text = markdown(&runs);
        assert!(
            text.contains("| server_cpu_per_delivery (µs) | 2 | 3 | 1.50× |"),
            "{text}"
        );
        assert!(
            text.contains("| message_latency p99 (ms) | 40 | 40 | 1.00× |"),
            "{text}"
        );
        assert!(
            text.contains("| server_rss_peak (MiB) | 3 | 3 | 1.00× |"),
            "{text}"
        );
        assert!(
            text.contains("| server_memory_per_connection (KiB) | 2.80 | 2.80 | 1.00× |"),
            "{text}"
        );
        let page = html(&runs);
        for server in ["herald", "other"] {
            assert!(
                page.contains(&format!("class=\"series\" data-server=\"{server}\"")),
                "{server}"
            );
        }
    }

    #[test]
    fn a_fault_s_figures_are_compared_and_its_command_may_differ() {
        let fault = |label: &str, cmd: &str, window: Option<f64>, lost: u64| {
            let v = json!({
                "scenario": "fanout",
                "label": label,
                "params": {"fault command": cmd, "fault at": "10s"},
                "units": {"fault_window": "s"},
                "metrics": {"fault_window": window, "fault_window_deliveries_lost": lost,
                            "deliveries_duplicated": 0},
            });
            Run::from_json(None, "f.json", &v).unwrap()
        };
        let runs = vec![
            fault("nats", "kill -9 101", Some(1.5), 30),
            fault("nats", "kill -9 202", Some(2.5), 50),
            fault("nats", "kill -9 303", None, 900),
            fault("redis", "kill -9 404", Some(3.0), 60),
        ];
        check(&runs, &[]).unwrap();
        let text = markdown(&runs);
        // nats: the median of 1.5 and 2.5 s (a run that never recovered
        // has no window), and of 30, 50 and 900 lost.
        assert!(text.contains("| fault_window (s) | 2 | 3 |"), "{text}");
        assert!(
            text.contains("| fault_window_deliveries_lost | 50 | 60 |"),
            "{text}"
        );
        let mut later = fault("redis", "kill -9 505", Some(1.0), 1);
        later.params.insert("fault at".into(), "20s".into());
        let e = check(&[runs.into_iter().next().unwrap(), later], &[]).unwrap_err();
        assert!(e.contains("fault at"), "{e}");
    }

    #[test]
    fn refuses_other_scenarios_and_settings_and_names_them() {
        let mut a = run("herald", "a.json", 10, 1.0, 10);
        let b = run("other", "b.json", 20, 1.0, 10);
        let e = check(&[run("herald", "a.json", 10, 1.0, 10), b], &[]).unwrap_err();
        assert!(e.contains("subscribers: a.json = 10, b.json = 20"), "{e}");
        // The url differs in every pair above and is never named.
        assert!(!e.contains("url"), "{e}");
        let b = run("other", "b.json", 20, 1.0, 10);
        check(
            &[run("herald", "a.json", 10, 1.0, 10), b],
            &["subscribers".into()],
        )
        .unwrap();
        a.scenario = "idle".into();
        let e = check(&[a, run("other", "b.json", 10, 1.0, 10)], &[]).unwrap_err();
        assert!(
            e.contains("a.json ran `idle` and b.json ran `fanout`"),
            "{e}"
        );
        let e = check(
            &[
                run("x", "a.json", 10, 1.0, 10),
                run("x", "b.json", 10, 1.0, 10),
            ],
            &[],
        )
        .unwrap_err();
        assert!(e.contains("--label"), "{e}");
    }

    #[test]
    fn a_label_on_the_command_line_wins_and_bad_files_are_named() {
        let dir = std::env::temp_dir().join(format!("herald-compare-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("run.json");
        std::fs::write(
            &path,
            json!({"scenario": "idle", "metrics": {}, "label": "inside"}).to_string(),
        )
        .unwrap();
        let p = path.to_str().unwrap();
        assert_eq!(Run::load(p).unwrap().label, "inside");
        assert_eq!(Run::load(&format!("given={p}")).unwrap().label, "given");
        std::fs::write(&path, "{\"metrics\": {}}").unwrap();
        assert!(Run::load(p).unwrap_err().contains("no \"scenario\""));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
