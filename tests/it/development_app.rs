//! Zero-configuration start: `herald serve` with no config file and no
//! `HERALD_*` variables serves the development app (`app-id`/`app-key`/
//! `app-secret`) and warns on stderr that its credentials are public; a
//! server with its own credentials does not warn.

use crate::common;

use common::*;
use serde_json::json;
use std::path::PathBuf;

const WARNING: &str = "serving with the DEVELOPMENT credentials";

fn scratch_path(n: usize) -> PathBuf {
    std::env::temp_dir().join(format!("herald-dev-{}-{n}", std::process::id()))
}

fn scratch(n: usize) -> PathBuf {
    let dir = scratch_path(n);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `herald serve --port <free> <extra>` with `env` (and no other `HERALD_*`
/// variable); retried on a lost port.
async fn serve(n: usize, extra: &[&str], env: &[(&str, &str)]) -> (Spawned, u16) {
    let dir = scratch(n);
    let mut last = String::new();
    for _ in 0..5 {
        let port = free_port();
        let port_s = port.to_string();
        let mut args = vec!["--port", &port_s];
        args.extend_from_slice(extra);
        let mut h = Spawned::serve(&dir, &args, env);
        match h.ready_on("127.0.0.1", port, &[]).await {
            Ok(()) => return (h, port),
            Err(log) => last = log,
        }
    }
    panic!("herald never started; last attempt:\n{last}");
}

#[tokio::test]
async fn no_config_serves_the_development_app_and_warns() {
    let (h, port) = serve(0, &[], &[]).await;
    let log = h.log();
    assert!(log.contains(WARNING), "no development warning in:\n{log}");
    assert!(log.contains("WARN"), "logged at warn level:\n{log}");

    // The development key accepts a connection...
    let mut c = Client::connect(&format!(
        "ws://127.0.0.1:{port}/app/app-key?protocol=7&client=js&version=8.4.0"
    ))
    .await;
    c.subscribe("dev-channel").await;
    // ...and the development secret signs HTTP API calls for app-id.
    let path = "/apps/app-id/events";
    let body = json!({ "name": "hello", "channel": "dev-channel", "data": "hi" }).to_string();
    let query = herald_pusher::auth::sign_query(
        "app-key",
        "app-secret",
        "POST",
        path,
        body.as_bytes(),
        &[],
    );
    let resp = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}{path}?{query}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("API request");
    assert_eq!(resp.status(), 200);
    let f = c.expect("hello", Some("dev-channel")).await;
    assert_eq!(f["data"], "hi");
    drop(h);
    let _ = std::fs::remove_dir_all(scratch_path(0));
}

#[tokio::test]
async fn own_credentials_do_not_warn() {
    // A replaced secret on the single app: no longer the public one.
    let (h, port) = serve(1, &[], &[("HERALD_APP_SECRET", "not-public")]).await;
    let mut c = Client::connect(&format!(
        "ws://127.0.0.1:{port}/app/app-key?protocol=7&client=js&version=8.4.0"
    ))
    .await;
    c.send(json!({ "event": "pusher:ping", "data": {} })).await;
    c.expect("pusher:pong", None).await;
    let log = h.log();
    assert!(log.contains("herald listening"), "logs at info:\n{log}");
    assert!(
        !log.contains(WARNING),
        "warned with a private secret:\n{log}"
    );

    // Apps from a config file, logging at `info`: no warning.
    let dir = scratch(2);
    let file = dir.join("herald.toml");
    std::fs::write(
        &file,
        "log = \"info\"\n[[apps]]\nid = \"own\"\nkey = \"own-key\"\nsecret = \"own-secret\"\n",
    )
    .unwrap();
    let (h, _) = serve(2, &["--config", file.to_str().unwrap()], &[]).await;
    let log = h.log();
    assert!(log.contains("herald listening"), "logs at info:\n{log}");
    assert!(
        !log.contains(WARNING),
        "warned with configured apps:\n{log}"
    );
    drop(h);
    for n in [1, 2] {
        let _ = std::fs::remove_dir_all(scratch_path(n));
    }
}
