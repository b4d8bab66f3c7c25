//! `herald serve` refuses bad configuration: it exits with status 2 before
//! listening, with a message that names the offending key. (`herald config`
//! runs the same checks, the broker URL's included.)
//!
//! Every run points herald at a port another socket already listens on and
//! has a deadline: a case that is wrongly accepted fails to bind (status
//! 1, not the 2 asserted) or is killed at the deadline, and either way the
//! test fails fast and says so instead of hanging.

mod common;

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
        // same message, on stdout as its other configuration errors.
        let serve_msg = String::from_utf8_lossy(&flag.stderr)
            .trim()
            .trim_start_matches("herald: ")
            .to_owned();
        for args in [&["--broker", url][..], &["--check", "--broker", url][..]] {
            let out = config(args, &[]);
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert_eq!(out.status.code(), Some(2), "config {args:?}: {stdout}");
            assert_eq!(
                stdout.trim(),
                format!("error: {serve_msg}"),
                "config {args:?}"
            );
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
