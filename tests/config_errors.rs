//! `herald serve` refuses bad configuration: it exits non-zero before
//! listening, with a message that names the offending key.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

static NEXT: AtomicUsize = AtomicUsize::new(0);

fn serve_with(toml: &str) -> (bool, String) {
    let dir = std::env::temp_dir().join(format!(
        "herald-cfg-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.toml");
    std::fs::write(&path, toml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_herald"))
        .arg("serve")
        .arg("--config")
        .arg(&path)
        // Never actually serve if a case is unexpectedly accepted.
        .env("HERALD_PORT", "1")
        .output()
        .expect("run herald");
    let _ = std::fs::remove_dir_all(&dir);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_rejected(toml: &str, key: &str) {
    let (ok, stderr) = serve_with(toml);
    assert!(!ok, "config accepted:\n{toml}");
    assert!(
        stderr.contains(key),
        "error for\n{toml}\ndoes not name `{key}`: {stderr}"
    );
}

#[test]
fn unknown_top_level_key_is_named() {
    assert_rejected("prot = 8080\n", "prot");
}

#[test]
fn unknown_app_key_is_named() {
    assert_rejected(
        "[[apps]]\nid = \"a\"\nkey = \"k\"\nsecret = \"s\"\nmax_conections = 3\n",
        "max_conections",
    );
}

#[test]
fn wrong_type_is_named() {
    assert_rejected("port = \"eighty\"\n", "port");
}

#[test]
fn semantic_errors_are_named() {
    assert_rejected("activity_timeout = 0\n", "activity_timeout");
    assert_rejected("write_delay_ms = 1001\n", "write_delay_ms");
    assert_rejected(
        "[[apps]]\nid = \"a\"\nkey = \"k\"\nsecret = \"\"\n",
        "apps[0].secret",
    );
    assert_rejected(
        "[[apps]]\nid = \"a\"\nkey = \"k\"\nsecret = \"s\"\nmax_frame_size = 10\n",
        "max_frame_size",
    );
}

#[test]
fn invalid_toml_and_missing_file_fail() {
    let (ok, stderr) = serve_with("this is = = not toml");
    assert!(!ok);
    assert!(stderr.contains("bad.toml"), "{stderr}");
    let out = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["serve", "--config", "/nonexistent/herald.toml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/herald.toml"));
}

#[test]
fn bad_environment_values_name_their_variable() {
    for (var, value) in [
        ("HERALD_PORT", "abc"),
        ("HERALD_PORT", "70000"),
        ("HERALD_ACTIVITY_TIMEOUT", "soon"),
        ("HERALD_SHUTDOWN_GRACE", "-1"),
        ("HERALD_WRITE_DELAY_MS", "5ms"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_herald"))
            .arg("serve")
            .env_remove("HERALD_CONFIG")
            .env(var, value)
            .output()
            .expect("run herald");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{var}={value} accepted: {stderr}"
        );
        assert!(
            stderr.contains(var),
            "{var}={value}: error does not name it: {stderr}"
        );
    }
}

#[test]
fn webhook_dashboard_and_metrics_errors_are_named() {
    let app = "[[apps]]\nid = \"a\"\nkey = \"k\"\nsecret = \"s\"\n";
    assert_rejected(
        &format!(
            "{app}webhooks = [{{ url = \"ftp://x\", event_types = [\"channel_occupied\"] }}]\n"
        ),
        "apps[0].webhooks[0].url",
    );
    assert_rejected(
        &format!("{app}webhooks = [{{ url = \"http://127.0.0.1/h\", event_types = [\"channel_ocupied\"] }}]\n"),
        "channel_ocupied",
    );
    assert_rejected(
        &format!("{app}webhooks = [{{ url = \"http://127.0.0.1/h\", event_types = [] }}]\n"),
        "apps[0].webhooks[0].event_types",
    );
    assert_rejected(
        &format!("{app}webhooks = [{{ url = \"http://127.0.0.1/h\", event_types = [\"cache_miss\"], lambda_function = \"f\" }}]\n"),
        "lambda_function",
    );
    assert_rejected(
        &format!("{app}webhooks = [{{ url = \"http://127.0.0.1/h\", event_types = [\"cache_miss\"], headers = {{ \"Content-Type\" = \"x\" }} }}]\n"),
        "headers.Content-Type",
    );
    assert_rejected("dashboard = true\n", "dashboard_token");
    assert_rejected(
        "dashboard = true\ndashboard_token = \"short\"\n",
        "dashboard_token",
    );
    assert_rejected("log_format = \"xml\"\n", "log_format");
    // HERALD_PORT is 1 in these runs.
    assert_rejected("metrics_port = 1\n", "metrics_port");
    assert_rejected("webhook_batch_size = 0\n", "webhook_batch_size");
}
