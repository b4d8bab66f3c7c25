//! The settings of the servers Herald replaces, read as they are: a real
//! `herald serve` started with Laravel Reverb's `.env` (through
//! `--env-file`), soketi's and AnyCable's documented variables; a real
//! client against it with the credentials those variables gave; and
//! `herald config` naming each value's source, masking secrets, and
//! `--check` failing on malformed values.

use crate::common;

use common::{free_port, herald_command, output_within, Client, Spawned, TIMEOUT};
use serde_json::json;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

static NEXT: AtomicUsize = AtomicUsize::new(0);

fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "herald-peers-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Start `herald serve args` with `env` on `port` (retrying on a lost
/// port is the caller's, through `port`), wait until ready.
async fn start(dir: &std::path::Path, args: &[&str], env: &[(&str, &str)], port: u16) -> Spawned {
    let mut s = Spawned::serve(dir, args, env);
    if let Err(log) = s.ready_on("127.0.0.1", port, &[]).await {
        panic!("herald did not start: {log}");
    }
    s
}

/// A Pusher client on `key` receives an event triggered through the HTTP
/// API signed with `id` and `secret`: the credentials are the ones in force.
async fn round_trip(port: u16, id: &str, key: &str, secret: &str) {
    let mut c = Client::connect(&format!(
        "ws://127.0.0.1:{port}/app/{key}?protocol=7&client=js&version=8.4.0"
    ))
    .await;
    c.subscribe("news").await;
    let body = json!({ "name": "headline", "channel": "news", "data": "{\"n\":1}" }).to_string();
    let path = format!("/apps/{id}/events");
    let query = herald_pusher::auth::sign_query(key, secret, "POST", &path, body.as_bytes(), &[]);
    let resp = tokio::time::timeout(
        TIMEOUT,
        reqwest::Client::new()
            .post(format!("http://127.0.0.1:{port}{path}?{query}"))
            .header("content-type", "application/json")
            .body(body)
            .send(),
    )
    .await
    .expect("trigger timed out")
    .expect("trigger");
    assert_eq!(
        resp.status(),
        200,
        "{}",
        resp.text().await.unwrap_or_default()
    );
    let event = c.expect("headline", Some("news")).await;
    assert_eq!(event["data"], "{\"n\":1}");
}

/// `herald config args` with exactly `env` among the peers' and Herald's
/// variables; (exit code, stdout then stderr, where errors go).
fn config(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = herald_command();
    cmd.arg("config").args(args);
    for (k, _) in std::env::vars() {
        if [
            "HERALD_",
            "REVERB_",
            "SOKETI_",
            "ANYCABLE_",
            "PUSHER_",
            "REDIS_",
        ]
        .iter()
        .any(|p| k.starts_with(p))
        {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    let out = output_within(&mut cmd, Duration::from_secs(10));
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The `key = value  # source` line of `key`.
fn line<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(&format!("{key} = ")))
        .unwrap_or_else(|| panic!("no {key} in:\n{out}"))
}

/// A Laravel `.env` as Reverb's documentation shows it (credentials, the
/// client-side host, port and scheme, Vite's copies), plus the server's
/// address and Laravel's Redis connection.
fn reverb_env_file(dir: &std::path::Path, port: u16) -> String {
    let path = dir.join(".env");
    std::fs::write(
        &path,
        format!(
            "APP_NAME=Laravel\nAPP_ENV=local\nBROADCAST_CONNECTION=reverb\n\n\
             REVERB_APP_ID=my-app-id\nREVERB_APP_KEY=my-app-key\nREVERB_APP_SECRET=my-app-secret\n\
             REVERB_HOST=\"localhost\"\nREVERB_PORT=8080\nREVERB_SCHEME=http\n\
             REVERB_SERVER_HOST=127.0.0.1\nREVERB_SERVER_PORT={port}\n\n\
             REDIS_CLIENT=phpredis\nREDIS_HOST=127.0.0.1\nREDIS_PASSWORD=null\nREDIS_PORT=6379\n\n\
             VITE_REVERB_APP_KEY=\"${{REVERB_APP_KEY}}\"\nVITE_REVERB_HOST=\"${{REVERB_HOST}}\"\n"
        ),
    )
    .unwrap();
    path.to_string_lossy().into_owned()
}

#[tokio::test]
async fn reverb_env_file_serves_its_app() {
    let dir = scratch();
    let port = free_port();
    let env_file = reverb_env_file(&dir, port);
    let s = start(&dir, &["--env-file", &env_file], &[], port).await;
    round_trip(port, "my-app-id", "my-app-key", "my-app-secret").await;
    let log = s.log();
    assert!(
        log.contains("read the settings of the server Herald replaces"),
        "{log}"
    );
    assert!(
        log.contains("REVERB_APP_SECRET") && log.contains("REVERB_SERVER_PORT"),
        "{log}"
    );
    assert!(
        !log.contains("my-app-secret"),
        "the secret must not be logged:\n{log}"
    );
    // The client-side settings are named as read, with nothing to do.
    assert!(
        log.contains("REVERB_SCHEME read: nothing for the server to do"),
        "{log}"
    );

    let (code, out) = config(&["--env-file", &env_file], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        line(&out, "apps[0].key").contains("\"my-app-key\""),
        "{out}"
    );
    assert!(
        line(&out, "apps[0].key").contains("REVERB_APP_KEY (Laravel Reverb, from --env-file)"),
        "{out}"
    );
    assert!(line(&out, "apps[0].secret").contains("\"****\""), "{out}");
    assert!(!out.contains("my-app-secret"), "{out}");
    assert!(line(&out, "port").contains(&format!("= {port} ")), "{out}");
    // Scaling is off: Laravel's Redis settings are not a broker.
    assert!(line(&out, "broker.url").contains("\"local\""), "{out}");
    assert!(
        line(&out, "host").contains("default") || line(&out, "host").contains("REVERB_SERVER_HOST"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn reverb_scaling_uses_laravels_redis_connection() {
    let (code, out) = config(
        &[],
        &[
            ("REVERB_SCALING_ENABLED", "true"),
            ("REVERB_SCALING_CHANNEL", "reverb"),
            ("REDIS_HOST", "10.0.0.5"),
            ("REDIS_USERNAME", "null"),
            ("REDIS_PASSWORD", "pa ss"),
            ("REDIS_DB", "2"),
        ],
    );
    assert_eq!(code, 0, "{out}");
    let broker = line(&out, "broker.url");
    // Password masked; host, Laravel's default port and the database kept.
    assert!(
        broker.contains("\"redis://***@10.0.0.5:6379/2\""),
        "{broker}"
    );
    assert!(
        broker.contains("REVERB_SCALING_ENABLED+REDIS_HOST+REDIS_PASSWORD+REDIS_DB"),
        "{broker}"
    );
    assert!(line(&out, "broker.prefix").contains("\"reverb\""), "{out}");
}

#[tokio::test]
async fn soketi_variables_serve_its_app() {
    let dir = scratch();
    let port = free_port();
    let port_s = port.to_string();
    let env = [
        ("SOKETI_DEFAULT_APP_ID", "sk-id"),
        ("SOKETI_DEFAULT_APP_KEY", "sk-key"),
        ("SOKETI_DEFAULT_APP_SECRET", "sk-secret"),
        ("SOKETI_HOST", "127.0.0.1"),
        ("SOKETI_PORT", port_s.as_str()),
        ("SOKETI_DEFAULT_APP_ENABLE_CLIENT_MESSAGES", "true"),
        ("SOKETI_SHUTDOWN_GRACE_PERIOD", "3000"),
        // soketi's default app manager: the default app.
        ("SOKETI_APP_MANAGER_DRIVER", "array"),
    ];
    let _s = start(&dir, &[], &env, port).await;
    round_trip(port, "sk-id", "sk-key", "sk-secret").await;
    // A database Herald cannot read yet is refused, naming the variable,
    // rather than served without its apps.
    let (code, out) = config(&["--check"], &[("SOKETI_APP_MANAGER_DRIVER", "dynamodb")]);
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("SOKETI_APP_MANAGER_DRIVER") && out.contains("not supported yet"),
        "{out}"
    );

    let (code, out) = config(&[], &env);
    assert_eq!(code, 0, "{out}");
    assert!(line(&out, "shutdown_grace").contains("= 3 "), "{out}");
    assert!(
        line(&out, "apps[0].id").contains("SOKETI_DEFAULT_APP_ID (soketi)"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn soketi_adapters_become_the_broker() {
    let (_, out) = config(
        &[],
        &[
            ("SOKETI_ADAPTER_DRIVER", "redis"),
            ("SOKETI_DB_REDIS_HOST", "redis.internal"),
            ("SOKETI_DB_REDIS_PASSWORD", "pw"),
            ("SOKETI_ADAPTER_REDIS_PREFIX", "soketi"),
        ],
    );
    assert!(
        line(&out, "broker.url").contains("\"redis://***@redis.internal:6379/0\""),
        "{out}"
    );
    assert!(line(&out, "broker.prefix").contains("\"soketi\""), "{out}");
    let (_, out) = config(
        &[],
        &[
            ("SOKETI_ADAPTER_DRIVER", "nats"),
            ("SOKETI_ADAPTER_NATS_SERVERS", "nats-1:4222,nats-2:4222"),
            ("SOKETI_ADAPTER_NATS_TOKEN", "tok"),
        ],
    );
    assert!(
        line(&out, "broker.url").contains("\"nats://***@nats-1:4222\""),
        "{out}"
    );
    let hooks = r#"[{"url":"https://hooks.example.com/pusher?token=x","event_types":["channel_occupied"]}]"#;
    let (code, out) = config(
        &[],
        &[
            ("SOKETI_DEFAULT_APP_WEBHOOKS", hooks),
            ("SOKETI_WEBHOOKS_BATCHING", "false"),
        ],
    );
    assert_eq!(code, 0, "{out}");
    // The query (a credential) is not shown.
    assert!(
        line(&out, "apps[0].webhooks[0].url").contains("\"https://hooks.example.com/pusher\""),
        "{out}"
    );
    assert!(line(&out, "webhook_batch_ms").contains("= 1 "), "{out}");
    let (code, out) = config(&["--check"], &[("SOKETI_ADAPTER_DRIVER", "cluster")]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("SOKETI_ADAPTER_DRIVER") && out.contains("cluster"),
        "{out}"
    );
}

#[tokio::test]
async fn anycable_variables_serve_pusher_and_broadcasts() {
    let dir = scratch();
    let port = free_port();
    let port_s = port.to_string();
    let env = [
        ("ANYCABLE_HOST", "127.0.0.1"),
        ("ANYCABLE_PORT", port_s.as_str()),
        ("ANYCABLE_PUSHER_APP_ID", "ac-id"),
        ("ANYCABLE_PUSHER_APP_KEY", "ac-key"),
        ("ANYCABLE_PUSHER_SECRET", "ac-secret"),
        ("ANYCABLE_BROADCAST_ADAPTER", "http"),
        ("ANYCABLE_BROADCAST_KEY", "bk-123"),
        ("ANYCABLE_SECRET", "app-secret-xyz"),
        ("ANYCABLE_JWT_ID_KEY", "jwt-old-name"),
    ];
    let _s = start(&dir, &[], &env, port).await;
    round_trip(port, "ac-id", "ac-key", "ac-secret").await;
    // The broadcast key from ANYCABLE_BROADCAST_KEY guards /_broadcast.
    let http = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/_broadcast");
    let body = r#"{"stream":"room","data":"{}"}"#;
    let no_key = http.post(&url).body(body).send().await.unwrap();
    assert_eq!(no_key.status(), 401);
    let with_key = http
        .post(&url)
        .bearer_auth("bk-123")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(with_key.status(), 201);

    let (code, out) = config(&[], &env);
    assert_eq!(code, 0, "{out}");
    assert!(
        line(&out, "rpc.streams_secret").contains("ANYCABLE_SECRET (AnyCable)"),
        "{out}"
    );
    assert!(
        line(&out, "rpc.jwt_secret").contains("ANYCABLE_JWT_ID_KEY (AnyCable)"),
        "{out}"
    );
    assert!(
        !out.contains("app-secret-xyz") && !out.contains("bk-123"),
        "{out}"
    );
    // Herald does not derive the HTTP RPC secret from ANYCABLE_SECRET: said.
    assert!(out.contains("ANYCABLE_HTTP_RPC_SECRET"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn anycable_brokers_and_rpc() {
    let (code, out) = config(
        &[],
        &[
            ("ANYCABLE_RPC_HOST", "http://127.0.0.1:3000/_anycable"),
            ("ANYCABLE_HTTP_RPC_SECRET", "rpc-s"),
            ("ANYCABLE_BROADCAST_ADAPTER", "nats"),
            ("ANYCABLE_NATS_SERVERS", "nats://127.0.0.1:4222"),
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        line(&out, "rpc.host").contains("\"http://127.0.0.1:3000/_anycable\""),
        "{out}"
    );
    assert!(line(&out, "rpc.secret").contains("\"****\""), "{out}");
    assert!(
        line(&out, "broker.url").contains("\"nats://127.0.0.1:4222\""),
        "{out}"
    );
    assert!(
        line(&out, "rpc.broadcast_adapter").contains("\"nats\""),
        "{out}"
    );
}

#[tokio::test]
async fn herald_names_win_and_conflicts_are_reported() {
    let dir = scratch();
    let port = free_port();
    let port_s = port.to_string();
    let env = [
        ("HERALD_PORT", port_s.as_str()),
        ("HERALD_APP_KEY", "herald-key"),
        ("REVERB_APP_ID", "rv-id"),
        ("REVERB_APP_KEY", "rv-key"),
        ("REVERB_APP_SECRET", "rv-secret"),
        ("REVERB_SERVER_PORT", "1"),
        ("SOKETI_DEFAULT_APP_KEY", "sk-key"),
        ("ANYCABLE_UNHEARD_OF", "x"),
    ];
    let s = start(&dir, &[], &env, port).await;
    round_trip(port, "rv-id", "herald-key", "rv-secret").await;
    let log = s.log();
    assert!(
        log.contains("apps[0].key from environment HERALD_APP_KEY wins over REVERB_APP_KEY"),
        "{log}"
    );
    assert!(
        log.contains("port from environment HERALD_PORT wins over REVERB_SERVER_PORT"),
        "{log}"
    );
    assert!(
        log.contains("REVERB_APP_KEY and SOKETI_DEFAULT_APP_KEY disagree on apps[0].key"),
        "{log}"
    );
    assert!(
        log.contains("ANYCABLE_UNHEARD_OF is not a variable of any server"),
        "{log}"
    );

    // A flag beats everything, and says so.
    let (code, out) = config(&["--port", "9001"], &env);
    assert_eq!(code, 0, "{out}");
    assert!(line(&out, "port").contains("flag --port"), "{out}");
    // --check prints only problems and "ok", and succeeds with warnings.
    let (code, out) = config(&["--check"], &env);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out.lines().last(), Some("ok"), "{out}");
    assert!(
        out.lines().all(|l| l.starts_with("warning: ") || l == "ok"),
        "{out}"
    );
    assert!(out.contains("ANYCABLE_UNHEARD_OF"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn malformed_peer_variables_are_named() {
    for (var, value) in [
        ("SOKETI_PORT", "sixty"),
        ("REVERB_SCALING_ENABLED", "maybe"),
        ("SOKETI_DEFAULT_APP_WEBHOOKS", "[{\"url\":\"https://x\"}]"),
        ("ANYCABLE_PATH", "/cable,/admin/cable"),
        ("SOKETI_DEFAULT_APP_MAX_CONNS", "lots"),
    ] {
        let (code, out) = config(&["--check"], &[(var, value)]);
        assert_eq!(code, 2, "{var}={value}: {out}");
        assert!(out.contains(var), "{var}: {out}");
        // serve refuses too, naming the variable on stderr.
        let dir = scratch();
        let mut cmd = herald_command();
        cmd.arg("serve").env(var, value).env("HERALD_PORT", "0");
        let out = output_within(&mut cmd, Duration::from_secs(10));
        assert_eq!(out.status.code(), Some(2), "{var}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(var),
            "{var}: {out:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
    // An invalid result of valid variables is an invalid configuration.
    let (code, out) = config(
        &["--check"],
        &[
            ("REVERB_SCALING_ENABLED", "true"),
            ("REVERB_SCALING_CHANNEL", "a.b c"),
        ],
    );
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("broker.prefix"), "{out}");
    let (code, out) = config(&["--env-file", "/nonexistent/.env"], &[]);
    assert_eq!(code, 2, "{out}");
}

/// The reliable streams' and resumable sessions' settings by AnyCable's names, Herald's variables and flags,
/// and a malformed one named.
#[test]
fn history_and_sessions_settings_by_every_name() {
    let (code, out) = config(
        &["--history-ttl", "30"],
        &[
            ("ANYCABLE_HISTORY_LIMIT", "50"),
            ("HERALD_SESSIONS_TTL", "60"),
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert!(line(&out, "rpc.history_limit").contains("50"), "{out}");
    assert!(line(&out, "rpc.history_ttl").contains("30"), "{out}");
    assert!(line(&out, "rpc.sessions_ttl").contains("60"), "{out}");
    for (name, bad) in [
        ("HERALD_HISTORY_LIMIT", "-1"),
        ("ANYCABLE_SESSIONS_TTL", "soon"),
    ] {
        let (code, out) = config(&["--check"], &[(name, bad)]);
        assert_ne!(code, 0, "{name}={bad} accepted: {out}");
    }
}
