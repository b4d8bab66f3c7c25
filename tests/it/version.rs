//! Build facts seen from outside: `herald --version` names the version and
//! the commit, `/version` serves the same as JSON, and `/metrics` carries
//! them as labels of `herald_build_info`.

use crate::common;

use common::{herald_command, output_within, Server, TIMEOUT};
use std::time::Duration;

/// The commit the binary should report: this checkout's HEAD (the tests run
/// from the repository), or `unknown` when there is no git to ask.
fn expected_commit() -> Option<String> {
    let out = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[test]
fn version_flag_names_version_and_commit() {
    let out = output_within(herald_command().arg("--version"), Duration::from_secs(10));
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with(&format!("herald {} (commit ", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    if let Some(commit) = expected_commit() {
        // HEAD at test time is the commit the binary was built from, unless
        // a commit landed in between; the prefix is what matters.
        assert!(text.contains(&commit), "{text} should name {commit}");
    }
}

#[tokio::test]
async fn version_endpoint_and_build_info_metric_agree() {
    let server = Server::start().await;
    let resp = tokio::time::timeout(TIMEOUT, reqwest::get(server.url("/version")))
        .await
        .expect("GET /version timed out")
        .expect("GET /version");
    assert_eq!(resp.status(), 200);
    let body: serde_json::Value = resp.json().await.expect("JSON body");
    assert_eq!(body["version"], env!("CARGO_PKG_VERSION"));
    let commit = body["commit"].as_str().expect("commit").to_string();
    assert!(!commit.is_empty());
    if let Some(expected) = expected_commit() {
        assert!(commit.starts_with(&expected), "{commit} vs {expected}");
    }
    let scrape = server.scrape().await;
    let info = scrape
        .samples
        .iter()
        .find(|s| s.metric == "herald_build_info")
        .expect("herald_build_info in /metrics");
    assert_eq!(info.labels.get("version"), Some(env!("CARGO_PKG_VERSION")));
    assert_eq!(info.labels.get("commit"), Some(commit.as_str()));
    assert!(matches!(info.value, prometheus_parse::Value::Gauge(v) if v == 1.0));
}

/// `herald health`, the image's health check: 0 while /up answers 200, 1
/// when nothing listens.
#[tokio::test]
async fn health_command_follows_up() {
    let server = Server::start().await;
    let url = server.url("/up");
    let ok = output_within(
        herald_command().args(["health", "--url", &url]),
        Duration::from_secs(10),
    );
    assert!(ok.status.success(), "{ok:?}");
    let port = common::free_port();
    let down = output_within(
        herald_command().args(["health", "--url", &format!("http://127.0.0.1:{port}/up")]),
        Duration::from_secs(10),
    );
    assert_eq!(down.status.code(), Some(1), "{down:?}");
    assert!(String::from_utf8_lossy(&down.stderr).contains(&port.to_string()));
}

/// HERALD_REFUSE_ROOT=true refuses uid 0 (checked where the tests run as
/// root, as in containers and CI here); unset, root is not refused.
#[test]
fn refuse_root_only_when_asked() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: not running as root");
        return;
    }
    let out = output_within(
        herald_command()
            .args(["serve", "--port", "0"])
            .env("HERALD_REFUSE_ROOT", "true"),
        Duration::from_secs(10),
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("HERALD_REFUSE_ROOT"));
}
