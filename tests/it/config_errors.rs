//! `herald serve` refuses bad configuration: it exits with status 2 before
//! listening, with a message that names the offending key. (`herald config`
//! runs the same checks, the broker URL's included.)
//!
//! Every run points herald at a port another socket already listens on and
//! has a deadline: a case that is wrongly accepted fails to bind (status
//! 1, not the 2 asserted) or is killed at the deadline, and either way the
//! test fails fast and says so instead of hanging.

use crate::common;

use common::{herald_command, occupied_port, output_within, TIMEOUT};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// `herald serve ARGS` on an occupied loopback port, with no `HERALD_*`
/// variable from the test's environment; `env` is applied last.
fn serve(args: &[&str], env: &[(&str, &str)]) -> Output {
    let (_occupied, port) = occupied_port();
    let mut cmd: Command = herald_command();
    cmd.arg("serve").args(args);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("HERALD_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("HERALD_HOST", "127.0.0.1")
        .env("HERALD_PORT", port.to_string())
        .envs(env.iter().copied());
    output_within(&mut cmd, TIMEOUT)
}

fn serve_with(toml: &str) -> Output {
    let dir = std::env::temp_dir().join(format!(
        "herald-cfg-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.toml");
    std::fs::write(&path, toml).unwrap();
    let out = serve(&["--config", path.to_str().unwrap()], &[]);
    let _ = std::fs::remove_dir_all(&dir);
    out
}

/// Refused as a configuration error (status 2, not a failure to bind),
/// naming `key`.
fn assert_config_error(out: &Output, case: &str, key: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{case}: not refused as a configuration error: {stderr}"
    );
    assert!(
        stderr.contains(key),
        "error for {case} does not name `{key}`: {stderr}"
    );
}

fn assert_rejected(toml: &str, key: &str) {
    assert_config_error(&serve_with(toml), &format!("\n{toml}"), key);
}

#[test]
fn the_occupied_port_makes_an_accepted_config_fail_fast() {
    // The guard itself: a valid configuration fails to bind (status 1),
    // which assert_config_error tells apart from a refusal.
    let out = serve_with("log = \"warn\"\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot listen"), "{stderr}");
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
    assert_rejected(
        "[[apps]]\nid = \"a\"\nkey = \"k\"\nsecret = \"s\"\nmax_cache_bytes = 40959\n",
        "apps[0].max_cache_bytes",
    );
    assert_rejected("webhook_queue_bytes = 1000\n", "webhook_queue_bytes");
    assert_rejected("http_session_timeout_ms = 10\n", "http_session_timeout_ms");
    assert_rejected("http_max_sessions = 0\n", "http_max_sessions");
    assert_rejected("http_fallback = \"yes\"\n", "http_fallback");
    assert_rejected("[rpc]\ndisconnect_queue = 0\n", "rpc.disconnect_queue");
    assert_rejected(
        "[rpc]\ndisconnect_queue_bytes = 1000\n",
        "rpc.disconnect_queue_bytes",
    );
}

#[test]
fn invalid_toml_and_missing_file_fail() {
    assert_config_error(
        &serve_with("this is = = not toml"),
        "invalid TOML",
        "bad.toml",
    );
    assert_config_error(
        &serve(&["--config", "/nonexistent/herald.toml"], &[]),
        "a missing file",
        "/nonexistent/herald.toml",
    );
}

#[test]
fn every_error_of_a_file_is_reported_at_once() {
    // Values of the wrong type (each with TOML's snippet), a semantic
    // error, an unknown key, an app's and an adapter's: all six in one run,
    // each named, not only the first.
    let out = serve_with(
        "port = \"eighty\"\nactivity_timeout = 0\nprot = 1\n\
         [broker]\nttl = \"x\"\n\
         [rpc]\ndisconnect_queue = 0\n\
         [[apps]]\nid = \"a\"\nkey = \"k\"\nsecret = \"\"\n",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("herald: 6 configuration errors:\n"),
        "{stderr}"
    );
    for key in [
        "`port`",
        "`activity_timeout`",
        "`prot`",
        "`broker.ttl`",
        "`rpc.disconnect_queue`",
        "`apps[0].secret`",
    ] {
        assert!(stderr.contains(key), "{key} not named: {stderr}");
    }
    // TOML's snippet: the line and a caret under the value.
    assert!(stderr.contains("1 | port = \"eighty\""), "{stderr}");
    assert!(stderr.contains("5 | ttl = \"x\""), "{stderr}");
    assert!(stderr.contains("^^^^^^^^"), "{stderr}");

    // Within one adapter's keys too: two of [rpc], two of the webhook
    // settings, one of an app's webhooks and one of its AppSync keys.
    let out = serve_with(
        "webhook_batch_size = 0\nwebhook_queue_bytes = 1000\n\
         [rpc]\ntimeout_ms = 0\ndisconnect_queue = 0\n\
         [[apps]]\nid = \"a\"\nkey = \"k\"\nsecret = \"s\"\n\
         webhooks = [{ url = \"ftp://x\", event_types = [\"channel_occupied\"] }]\n\
         api_keys = [\"\"]\n",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("herald: 6 configuration errors:\n"),
        "{stderr}"
    );
    for key in [
        "`webhook_batch_size`",
        "`webhook_queue_bytes`",
        "`rpc.timeout_ms`",
        "`rpc.disconnect_queue`",
        "`apps[0].webhooks[0].url`",
        "`apps[0].api_keys[0]`",
    ] {
        assert!(stderr.contains(key), "{key} not named: {stderr}");
    }

    // Syntax errors on two lines: both, each with its snippet.
    let out = serve_with("port = = 1\nhost = \"127.0.0.1\"\nlog = [\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("herald: 2 configuration errors:\n"),
        "{stderr}"
    );
    assert!(stderr.contains("1 | port = = 1"), "{stderr}");
    assert!(stderr.contains("3 | log = ["), "{stderr}");

    // `herald config --check` says the same.
    let dir = std::env::temp_dir().join(format!("herald-cfg-all-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.toml");
    std::fs::write(&path, "activity_timeout = 0\npong_timeout = 0\n").unwrap();
    let out = config(&["--check", "--config", path.to_str().unwrap()], &[]);
    let _ = std::fs::remove_dir_all(&dir);
    let shown = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(2), "{shown}");
    assert!(shown.contains("2 configuration errors"), "{shown}");
    assert!(
        shown.contains("`activity_timeout`") && shown.contains("`pong_timeout`"),
        "{shown}"
    );
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
        let out = serve(&[], &[(var, value)]);
        assert_config_error(&out, &format!("{var}={value}"), var);
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
    // A bare word is a `tracing` target: it would silence every line.
    assert_rejected("log = \"verbose\"\n", "verbose");
    assert_config_error(&serve(&["--log", "verbose"], &[]), "--log verbose", "log");
    assert_config_error(
        &serve(&[], &[("HERALD_LOG", "info,loud")]),
        "HERALD_LOG=info,loud",
        "loud",
    );
    // Not a port number at all (the same-port rule is a unit test of the
    // config: here the server's port is an occupied one picked per run).
    assert_rejected("metrics_port = 70000\n", "metrics_port");
    assert_rejected("webhook_batch_size = 0\n", "webhook_batch_size");
}

/// Every form of a bad `broker.url`, from the file, the environment and
/// the flag, is refused at start naming the setting, and the password in
/// it is never printed.
#[test]
fn bad_broker_urls_are_named_without_their_credentials() {
    let bad = [
        "http://127.0.0.1:6379",
        "redis://127.0.0.1:notaport",
        "redis://:hunter2secret@127.0.0.1:99999",
        "redis://127.0.0.1:6379/notadb",
        "redis://a:6379,redis://b:6379",
        "nats://",
        "nats://127.0.0.1:4222,",
        "nats://127.0.0.1:4222,,nats://127.0.0.1:4223",
        "nats://127.0.0.1:notaport",
        "nats://127.0.0.1:4222,redis://127.0.0.1:6379",
        "nats://u:hunter2secret@127.0.0.1:4222,nats://127.0.0.1:4223",
        "redis-sentinel://:hunter2secret@127.0.0.1:26379",
        "redis-sentinel://:hunter2secret@127.0.0.1:notaport/mymaster",
        "redis-sentinel://127.0.0.1:26379,,127.0.0.1:26380/mymaster",
        "redis-sentinel://127.0.0.1:26379/bad name",
        "rediss-sentinel://127.0.0.1:26379/",
        "redis-cluster://",
        "redis-cluster://127.0.0.1:7000,",
        "redis-cluster://127.0.0.1",
        "redis-cluster://127.0.0.1:notaport",
        "redis-cluster://:hunter2secret@127.0.0.1:99999,127.0.0.1:7001",
        "redis-cluster://127.0.0.1:7000/1",
        "rediss-cluster://:hunter2secret@a:7000,:other@b:7001",
        "redis-clusterx://127.0.0.1:7000",
    ];
    for url in bad {
        let file = serve_with(&format!("[broker]\nurl = \"{url}\"\n"));
        let env = serve(&[], &[("HERALD_BROKER", url)]);
        let flag = serve(&["--broker", url], &[]);
        for (how, out) in [("file", &file), ("env", &env), ("flag", &flag)] {
            assert_config_error(out, &format!("{url} ({how})"), "broker.url");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!stderr.contains("hunter2secret"), "{url} ({how}): {stderr}");
        }
        // `herald config` (and `--check`) refuse it the same way, with the
        // same message and prefix, on standard error.
        let serve_msg = String::from_utf8_lossy(&flag.stderr).trim().to_owned();
        assert!(serve_msg.starts_with("herald: "), "{serve_msg}");
        for args in [&["--broker", url][..], &["--check", "--broker", url][..]] {
            let out = config(args, &[]);
            let stdout = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "config {args:?}: {stdout}");
            assert_eq!(stdout.trim(), serve_msg, "config {args:?}");
            assert!(
                !stdout.contains("hunter2secret"),
                "config {args:?}: {stdout}"
            );
        }
    }
}

/// `herald config ARGS` with no `HERALD_*` variable from the test's
/// environment.
fn config(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd: Command = herald_command();
    cmd.arg("config").args(args);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("HERALD_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    output_within(&mut cmd, TIMEOUT)
}

/// Good Sentinel URLs pass the check (`herald config --check` exits 0;
/// `serve` gets past the configuration to the occupied port).
#[test]
fn sentinel_urls_are_accepted() {
    for url in [
        "redis-sentinel://127.0.0.1:26379/mymaster",
        "redis-sentinel://:pw@127.0.0.1:26379,127.0.0.1:26380,127.0.0.1:26381/mymaster",
        "rediss-sentinel://sentinel.internal:26379/mymaster",
    ] {
        let out = config(&["--check", "--broker", url], &[]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{url}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let out = serve(
        &["--broker", "redis-sentinel://127.0.0.1:26379/mymaster"],
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot listen"), "{stderr}");
}

/// Several NATS servers, comma-separated, are accepted (the node then
/// fails to bind the occupied port: status 1, past the configuration).
#[test]
fn a_list_of_nats_servers_is_accepted() {
    accepted_past_the_configuration("nats://127.0.0.1:4222, nats://127.0.0.1:4223,127.0.0.1:4224");
}

/// Redis Cluster seeds, comma-separated, likewise.
#[test]
fn redis_cluster_seeds_are_accepted() {
    accepted_past_the_configuration("redis-cluster://127.0.0.1:7000, 127.0.0.1:7001");
    accepted_past_the_configuration("rediss-cluster://:pw@127.0.0.1:7000,127.0.0.1:7001");
}

fn accepted_past_the_configuration(url: &str) {
    let out = serve(&["--broker", url], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot listen"), "{stderr}");
}

#[test]
fn bad_journal_bounds_are_named() {
    assert_rejected("[broker]\noutbox = 0\n", "broker.outbox");
    assert_rejected("[broker]\noutbox = 1048577\n", "broker.outbox");
    assert_rejected(
        "[broker]\nrecovery_window = 3601\n",
        "broker.recovery_window",
    );
    assert_rejected("[broker]\nrecovery_max = 10000001\n", "broker.recovery_max");
    assert_rejected(
        "[broker]\njournal_max_bytes = 1000\n",
        "broker.journal_max_bytes",
    );
}

#[test]
fn bad_confirm_timeouts_are_named() {
    assert_rejected("[broker]\nconfirm_timeout = 0\n", "broker.confirm_timeout");
    assert_rejected("[broker]\nconfirm_timeout = 61\n", "broker.confirm_timeout");
}

#[test]
fn bad_canary_settings_are_named() {
    assert_rejected("[broker]\ncanary_timeout = 0\n", "broker.canary_timeout");
    assert_rejected("[broker]\ncanary_timeout = 61\n", "broker.canary_timeout");
    assert_rejected(
        "[broker]\ncanary_interval = 3601\n",
        "broker.canary_interval",
    );
}

#[test]
fn bad_jetstream_replicas_are_named() {
    assert_rejected(
        "[broker]\njetstream_replicas = 0\n",
        "broker.jetstream_replicas",
    );
    assert_rejected(
        "[broker]\njetstream_replicas = 6\n",
        "broker.jetstream_replicas",
    );
}

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// The broker's TLS settings: each bad one, from the file, the environment
/// and the flags, is refused at start (status 2, before listening) naming
/// the setting, and nothing of a key file is printed. Good ones get past
/// the configuration (to the occupied port).
#[test]
fn bad_broker_tls_settings_are_named() {
    let dir = std::env::temp_dir().join(format!("herald-cfg-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let garbage = dir.join("garbage.pem");
    std::fs::write(
        &garbage,
        "-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let garbage = garbage.display().to_string();
    let (ca, cert, key) = (
        fixture("broker-ca.pem"),
        fixture("broker-client-cert.pem"),
        fixture("broker-client-key.pem"),
    );
    let other_key = fixture("broker-server-key.pem");
    let missing = dir.join("missing.pem").display().to_string();
    let tls_url = "rediss://127.0.0.1:6380";
    // (broker.url, tls_ca, tls_cert, tls_key, the setting named)
    type Case<'a> = (
        &'a str,
        Option<&'a str>,
        Option<&'a str>,
        Option<&'a str>,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (tls_url, Some(&garbage), None, None, "broker.tls_ca"),
        (tls_url, Some(&missing), None, None, "broker.tls_ca"),
        (tls_url, Some(&key), None, None, "broker.tls_ca"),
        (tls_url, None, Some(&cert), None, "broker.tls_key"),
        (tls_url, None, None, Some(&key), "broker.tls_cert"),
        (tls_url, None, Some(&garbage), Some(&key), "broker.tls_cert"),
        (tls_url, None, Some(&cert), Some(&cert), "broker.tls_key"),
        (tls_url, None, Some(&cert), Some(&garbage), "broker.tls_key"),
        (
            tls_url,
            None,
            Some(&cert),
            Some(&other_key),
            "broker.tls_key",
        ),
        (
            "redis://127.0.0.1:6379",
            Some(&ca),
            None,
            None,
            "broker.tls_ca",
        ),
        (
            "redis-cluster://127.0.0.1:7000",
            Some(&ca),
            None,
            None,
            "broker.tls_ca",
        ),
        (
            "redis-sentinel://127.0.0.1:26379/m",
            Some(&ca),
            None,
            None,
            "broker.tls_ca",
        ),
        (
            "nats://127.0.0.1:4222",
            None,
            Some(&cert),
            Some(&key),
            "broker.tls_cert",
        ),
        ("local", Some(&ca), None, None, "broker.tls_ca"),
    ];
    for (i, (url, ca, cert, key, named)) in cases.into_iter().enumerate() {
        let case = format!("case {i}: {url} {ca:?} {cert:?} {key:?}");
        let mut toml = format!("[broker]\nurl = \"{url}\"\n");
        let mut env = vec![("HERALD_BROKER", url)];
        let mut flags = vec!["--broker", url];
        for (k, v, var, flag) in [
            ("tls_ca", ca, "HERALD_BROKER_TLS_CA", "--broker-tls-ca"),
            (
                "tls_cert",
                cert,
                "HERALD_BROKER_TLS_CERT",
                "--broker-tls-cert",
            ),
            ("tls_key", key, "HERALD_BROKER_TLS_KEY", "--broker-tls-key"),
        ] {
            if let Some(v) = v {
                toml.push_str(&format!("{k} = \"{v}\"\n"));
                env.push((var, v));
                flags.extend([flag, v]);
            }
        }
        let outs = [
            ("file", serve_with(&toml)),
            ("env", serve(&[], &env)),
            ("flag", serve(&flags, &[])),
        ];
        for (how, out) in &outs {
            assert_config_error(out, &format!("{case} ({how})"), named);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!stderr.contains("PRIVATE KEY"), "{case} ({how}): {stderr}");
            assert!(!stderr.contains("MIG"), "{case} ({how}): {stderr}");
        }
    }
    // Good settings: past the configuration.
    for (url, with_ca) in [
        ("rediss://127.0.0.1:6380", true),
        ("rediss-cluster://127.0.0.1:7000,127.0.0.1:7001", true),
        ("rediss-sentinel://127.0.0.1:26379/m", false),
        ("tls://127.0.0.1:4222", true),
    ] {
        let mut flags = vec![
            "--broker",
            url,
            "--broker-tls-cert",
            &cert,
            "--broker-tls-key",
            &key,
        ];
        if with_ca {
            flags.extend(["--broker-tls-ca", &ca]);
        }
        let out = serve(&flags, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{url}: {stderr}");
        assert!(stderr.contains("cannot listen"), "{url}: {stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The development app's secret is public: on a host other machines can
/// reach it is refused (by `config --check` as by `serve`, which runs the
/// same checks before it binds), unless the operator allows it or gives
/// an app of their own. Only checked, never bound: tests stay on loopback.
#[test]
fn development_credentials_are_refused_off_loopback() {
    for host in ["0.0.0.0", "192.0.2.7"] {
        let out = config(&["--check", "--host", host], &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{host}: {stderr}");
        assert!(
            stderr.contains("allow_development_credentials") && stderr.contains("DEVELOPMENT"),
            "{host}: {stderr}"
        );
        assert!(!stderr.contains("app-secret"), "{stderr}");
    }
    let allowed = config(
        &["--check", "--host", "0.0.0.0"],
        &[("HERALD_ALLOW_DEVELOPMENT_CREDENTIALS", "true")],
    );
    assert_eq!(allowed.status.code(), Some(0), "{allowed:?}");
    let own = config(
        &["--check", "--host", "0.0.0.0"],
        &[
            ("HERALD_APP_ID", "my-app"),
            ("HERALD_APP_KEY", "my-key"),
            ("HERALD_APP_SECRET", "a-secret-of-my-own"),
        ],
    );
    assert_eq!(own.status.code(), Some(0), "{own:?}");
    let loopback = config(&["--check", "--host", "127.0.0.1"], &[]);
    assert_eq!(loopback.status.code(), Some(0), "{loopback:?}");
}

/// What a newcomer reads: `--check` says "ok"; an error names the flag or
/// variable they typed, with the one `herald:` prefix; TOML's snippet
/// keeps its lines; a missing secret "is required"; `--changed` shows only
/// what differs from the defaults; values shown are the ones in effect.
#[test]
fn config_answers_a_newcomer_can_read() {
    let ok = config(&["--check"], &[]);
    assert_eq!(String::from_utf8_lossy(&ok.stdout).trim(), "ok");
    for (out, given) in [
        (
            serve(&["--activity-timeout", "0"], &[]),
            "--activity-timeout",
        ),
        (
            serve(&[], &[("HERALD_ACTIVITY_TIMEOUT", "0")]),
            "HERALD_ACTIVITY_TIMEOUT",
        ),
        (
            config(&["--activity-timeout", "0"], &[]),
            "--activity-timeout",
        ),
    ] {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.starts_with("herald: "), "{stderr}");
        assert!(stderr.contains(&format!("`{given}`")), "{stderr}");
    }
    let out = serve_with("port = \"x\"\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("\n1 | port = \"x\"\n") && stderr.contains('^'),
        "TOML's snippet lost its lines: {stderr}"
    );
    assert_rejected("[[apps]]\nid = \"a\"\nkey = \"b\"\n", "is required");
    let changed = config(&["--changed", "--port", "9001"], &[]);
    let text = String::from_utf8_lossy(&changed.stdout);
    assert_eq!(changed.status.code(), Some(0), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.starts_with("port = 9001"), "{text}");
    let all = config(&[], &[]);
    let text = String::from_utf8_lossy(&all.stdout);
    assert!(text.contains("rpc.path = \"/cable\""), "{text}");
}

/// A scratch directory holding `name` with `bytes`; returns (dir, path).
fn scratch_file(name: &str, bytes: &[u8]) -> (std::path::PathBuf, String) {
    let dir = std::env::temp_dir().join(format!(
        "herald-cfg-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    let shown = path.to_string_lossy().into_owned();
    (dir, shown)
}

/// Secrets a Laravel `.env` holds after the line a test breaks: none may
/// ever be printed.
const ENV_SECRETS: &str = "DB_PASSWORD=hunter2secret\nREVERB_APP_SECRET=reverbsecret99\n\
     AWS_SECRET_ACCESS_KEY=awsSecretAKIA42\nAPP_KEY=base64:appkeysecret=\n";

fn assert_no_env_secrets(out: &Output, case: &str) {
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for secret in [
        "hunter2secret",
        "reverbsecret99",
        "awsSecretAKIA42",
        "appkeysecret",
        "Acme",
        "Shop",
    ] {
        assert!(!all.contains(secret), "{case}: printed {secret:?}:\n{all}");
    }
}

/// A `.env` line that cannot be read is refused by `serve`, `config` and
/// `config --check` (status 2) with the file, the line number and the
/// variable's name, and nothing of any value: not the broken line's, not
/// the secrets after it.
#[test]
fn a_broken_env_file_line_names_file_line_and_variable_only() {
    let cases: [(&str, &str, &str); 6] = [
        ("an unclosed double quote", "APP_NAME=\"Acme\n", "APP_NAME"),
        ("an unclosed single quote", "APP_NAME='Acme\n", "APP_NAME"),
        (
            "text after a closing quote",
            "APP_NAME='Bob's Shop'\n",
            "APP_NAME",
        ),
        ("an unclosed ${", "APP_NAME=${Acme\n", "APP_NAME"),
        ("a NUL byte in a value", "APP_NAME=\"Ac\0me\"\n", "APP_NAME"),
        // A line that is no NAME=value: its text may itself be a secret
        // (a wrapped line), so only its number is given.
        ("no `=`", "hunter2secretShop\n", "not a NAME=value"),
    ];
    for (case, broken, named) in cases {
        let text = format!("APP_ENV=production\n# a comment\n\n{broken}{ENV_SECRETS}");
        let (dir, path) = scratch_file(".env", text.as_bytes());
        let serve_out = serve(&["--env-file", &path], &[]);
        let config_out = config(&["--env-file", &path], &[]);
        let check_out = config(&["--check", "--env-file", &path], &[]);
        for (how, out) in [
            ("serve", &serve_out),
            ("config", &config_out),
            ("config --check", &check_out),
        ] {
            let case = format!("{case} ({how})");
            assert_config_error(out, &case, &path);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(stderr.contains("line 4"), "{case}: {stderr}");
            assert!(stderr.contains(named), "{case}: {stderr}");
            assert_no_env_secrets(out, &case);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Laravel and Rails `.env` spellings Herald reads (the lines the broken
/// cases above are near misses of): an apostrophe inside an unquoted
/// value, `export`, quotes, escapes, comments, `${VAR}` and `$VAR`, a
/// value spanning lines in double quotes; the environment wins.
#[test]
fn env_file_spellings_are_read() {
    let text = "export HERALD_APP_ID=shop\n\
                NAME=Bob's Shop # a comment\n\
                HERALD_APP_KEY=\"${NAME}-key\"\n\
                HERALD_APP_SECRET='lit$NAME\\n'\n\
                HERALD_LOG=\"warn\"\n\
                HERALD_SHUTDOWN_GRACE=$GRACE\n\
                MULTI=\"one\ntwo\"\n";
    let (dir, path) = scratch_file(".env", text.as_bytes());
    let out = config(&["--env-file", &path], &[("GRACE", "7")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |key: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(&format!("{key} = ")))
            .unwrap_or_else(|| panic!("no {key}:\n{stdout}"))
            .to_owned()
    };
    assert!(line("apps[0].id").contains("\"shop\""), "{stdout}");
    assert!(
        line("apps[0].key").contains("\"Bob's Shop-key\""),
        "{stdout}"
    );
    assert!(line("log").contains("\"warn\""), "{stdout}");
    assert!(line("shutdown_grace").contains("= 7 "), "{stdout}");
    // The environment beats the file.
    let out = config(
        &["--env-file", &path],
        &[("HERALD_APP_ID", "env-id"), ("GRACE", "7")],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("apps[0].id = \"env-id\""), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `${VAR}` expansion is bounded: 42 lines each doubling the one before
/// (2^42 bytes) are refused as a configuration error naming the line and
/// variable, instead of exhausting memory. The process runs with an
/// address-space limit of 1 GiB, so the old unbounded expansion aborts
/// (or the test fails fast) rather than taking the machine's memory.
#[test]
fn env_file_expansion_and_size_are_bounded() {
    let mut text = String::from("A0=xxx\n");
    for i in 1..42 {
        text.push_str(&format!("A{i}=${{A{}}}${{A{}}}\n", i - 1, i - 1));
    }
    text.push_str(ENV_SECRETS);
    let (dir, path) = scratch_file(".env", text.as_bytes());
    for sub in [&["config"][..], &["config", "--check"][..]] {
        let mut cmd = herald_command();
        cmd.args(sub).args(["--env-file", &path]);
        limit_memory(&mut cmd, 1 << 30);
        let out = output_within(&mut cmd, TIMEOUT);
        let case = format!("{sub:?} with a doubling .env");
        assert_config_error(&out, &case, &path);
        let stderr = String::from_utf8_lossy(&out.stderr);
        // A0=xxx: A15 (96 KiB) is the first over the bound of a value.
        assert!(
            stderr.contains("line 16") && stderr.contains("A15"),
            "{stderr}"
        );
        assert!(stderr.contains("65536"), "{stderr}");
        assert_no_env_secrets(&out, &case);
    }
    let _ = std::fs::remove_dir_all(&dir);

    // Many values each under the bound, together over the total's bound.
    let mut text = format!("B=\"{}\"\n", "b".repeat(60_000));
    for i in 0..80 {
        text.push_str(&format!("C{i}=${{B}}\n"));
    }
    let (dir, path) = scratch_file(".env", text.as_bytes());
    let out = config(&["--check", "--env-file", &path], &[]);
    assert_config_error(&out, "a .env expanding past 4 MiB", &path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("4194304"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);

    // A file over 1 MiB is not read at all.
    let mut big = "# padding\n".repeat(104_858).into_bytes();
    big.extend_from_slice(ENV_SECRETS.as_bytes());
    assert!(big.len() > 1 << 20);
    let (dir, path) = scratch_file(".env", &big);
    let out = serve(&["--env-file", &path], &[]);
    assert_config_error(&out, "a .env over 1 MiB", &path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("1048576"), "{stderr}");
    assert_no_env_secrets(&out, "a .env over 1 MiB");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Limit `cmd`'s address space to `bytes` (RLIMIT_AS).
fn limit_memory(cmd: &mut Command, bytes: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: only setrlimit, async-signal-safe, between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// An AppSync API key selects one app: the same key in two apps (as an
/// API key, or in a namespace's `publish_keys` / `subscribe_keys`) is
/// refused at start by `serve` and `config --check`, naming where the key
/// is set in both apps and never the key itself.
#[test]
fn an_appsync_key_of_two_apps_is_refused_without_printing_it() {
    let a = "[[apps]]\nid = \"a\"\nkey = \"ka\"\nsecret = \"sa\"\napi_keys = [\"a-own\", \"da2-sharedsecret\"]\n";
    let b = "[[apps]]\nid = \"b\"\nkey = \"kb\"\nsecret = \"sb\"\n";
    let cases = [
        (
            format!("{a}{b}api_keys = [\"da2-sharedsecret\"]\n"),
            "apps[1].api_keys[0]",
        ),
        (
            format!(
                "{a}{b}api_keys = [\"b-own\"]\n[[apps.namespaces]]\nname = \"chat\"\n\
                 publish_keys = [\"b-own\", \"da2-sharedsecret\"]\n"
            ),
            "apps[1].namespaces[0].publish_keys[1]",
        ),
        (
            format!(
                "{a}[[apps.namespaces]]\nname = \"chat\"\nsubscribe_keys = [\"b-only\"]\n\
                 {b}api_keys = [\"b-only\"]\n"
            ),
            "apps[1].api_keys[0]",
        ),
    ];
    for (toml, named) in cases {
        let out = serve_with(&toml);
        assert_config_error(&out, &toml, named);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("apps[0]."),
            "names the first app's too: {stderr}"
        );
        assert!(!stderr.contains("sharedsecret"), "{stderr}");
        assert!(!stderr.contains("b-only\""), "{stderr}");
        let (dir, path) = scratch_file("herald.toml", toml.as_bytes());
        let out = config(&["--check", "--config", &path], &[]);
        let stdout = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{toml}\n{stdout}");
        assert!(stdout.contains(named), "{stdout}");
        assert!(!stdout.contains("sharedsecret"), "{stdout}");
        let _ = std::fs::remove_dir_all(&dir);
    }
    // One app may name its own key in its namespaces and its API keys.
    let own = format!(
        "{a}[[apps.namespaces]]\nname = \"chat\"\npublish_keys = [\"a-own\"]\n{b}api_keys = [\"b-own\"]\n"
    );
    let out = serve_with(&own);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot listen"), "{stderr}");
}

/// `herald serve --host H` on a port taken on every address (IPv4 and
/// IPv6): status 2 if `H` is refused, 1 ("cannot listen") once past it.
fn serve_host(host: &str) -> Output {
    let occupied = std::net::TcpListener::bind("[::]:0").expect("bind [::]:0");
    let port = occupied.local_addr().unwrap().port();
    let mut cmd: Command = herald_command();
    cmd.arg("serve")
        .args(["--host", host, "--port", &port.to_string()]);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("HERALD_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(OWN_APP.iter().copied());
    output_within(&mut cmd, TIMEOUT)
}

/// An app of the operator's own: the development one is refused off
/// loopback, which is not what the host tests are about.
const OWN_APP: [(&str, &str); 3] = [
    ("HERALD_APP_ID", "own-app"),
    ("HERALD_APP_KEY", "own-key"),
    ("HERALD_APP_SECRET", "own-secret-for-tests"),
];

/// `herald config --check` refuses exactly the hosts `serve` refuses:
/// IPv4, IPv6 (bracketed or not, `::`, IPv4-mapped) and `localhost` pass
/// both; names and malformed addresses are refused by both, naming `host`.
#[test]
fn config_check_and_serve_agree_on_the_host() {
    let good = [
        "127.0.0.1",
        "0.0.0.0",
        "localhost",
        "::1",
        "[::1]",
        "::",
        "[::]",
        "::ffff:127.0.0.1",
    ];
    let bad = [
        "example.com",
        "::1%lo",
        "[::1",
        "::1]",
        "[::1]:8080",
        "127.0.0.1:8080",
        "1.2.3.4.5",
        "",
    ];
    for (host, accepted) in good
        .iter()
        .map(|h| (*h, true))
        .chain(bad.iter().map(|h| (*h, false)))
    {
        let check = config(&["--check", "--host", host], &OWN_APP);
        let stdout = format!(
            "{}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
        let served = serve_host(host);
        let stderr = String::from_utf8_lossy(&served.stderr);
        if accepted {
            assert_eq!(check.status.code(), Some(0), "check {host:?}: {stdout}");
            assert_eq!(served.status.code(), Some(1), "serve {host:?}: {stderr}");
            assert!(stderr.contains("cannot listen"), "serve {host:?}: {stderr}");
        } else {
            assert_eq!(check.status.code(), Some(2), "check {host:?}: {stdout}");
            assert!(stdout.contains("host"), "check {host:?}: {stdout}");
            assert_config_error(&served, &format!("serve {host:?}"), "host");
        }
    }
}
