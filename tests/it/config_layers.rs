//! Configuration layering seen from outside the process: `herald serve`
//! takes its address from the TOML file (`--config` or `HERALD_CONFIG`),
//! then `HERALD_HOST`/`HERALD_PORT`, then `--host`/`--port`, each layer
//! overriding the one before; and the server actually listens where the
//! winning layer says.

use crate::common;

use common::{free_port, is_ready, Spawned, TIMEOUT};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

static NEXT: AtomicUsize = AtomicUsize::new(0);

fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "herald-layers-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A config file binding `host:port`, with one app (so no development
/// credentials are involved).
fn config_file(dir: &Path, name: &str, host: &str, port: u16) -> String {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            "host = \"{host}\"\nport = {port}\nlog = \"warn\"\n\
             [[apps]]\nid = \"layers\"\nkey = \"layers-key\"\nsecret = \"layers-secret\"\n"
        ),
    )
    .unwrap();
    path.to_string_lossy().into_owned()
}

/// Run `case` with fresh ports until the server did not lose its port to
/// another process (at most 5 tries).
async fn with_ports<F, Fut>(case: F)
where
    F: Fn(PathBuf, [u16; 3]) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let mut last = String::new();
    for _ in 0..5 {
        let dir = scratch();
        let ports = [free_port(), free_port(), free_port()];
        let outcome = case(dir.clone(), ports).await;
        let _ = std::fs::remove_dir_all(&dir);
        match outcome {
            Ok(()) => return,
            Err(log) => last = log,
        }
    }
    panic!("herald never started; last attempt:\n{last}");
}

#[tokio::test]
async fn port_flag_beats_env_which_beats_the_file() {
    with_ports(|dir, [a, b, c]| async move {
        let file = config_file(&dir, "herald.toml", "127.0.0.1", a);
        let (b_s, c_s) = (b.to_string(), c.to_string());
        let others = [("127.0.0.1", a), ("127.0.0.1", b)];

        // File says A, HERALD_PORT says B, --port says C: C wins.
        let mut h = Spawned::serve(
            &dir,
            &["--config", &file, "--port", &c_s],
            &[("HERALD_PORT", &b_s)],
        );
        h.ready_on("127.0.0.1", c, &others).await?;
        assert!(!is_ready("127.0.0.1", a).await && !is_ready("127.0.0.1", b).await);
        drop(h);

        // Without the flag, HERALD_PORT (B) beats the file (A).
        let mut h = Spawned::serve(&dir, &["--config", &file], &[("HERALD_PORT", &b_s)]);
        h.ready_on("127.0.0.1", b, &[("127.0.0.1", a)]).await?;
        assert!(!is_ready("127.0.0.1", a).await);
        drop(h);

        // With neither, the file's port (A).
        let mut h = Spawned::serve(&dir, &["--config", &file], &[]);
        h.ready_on("127.0.0.1", a, &[]).await
    })
    .await;
}

#[tokio::test]
async fn herald_config_names_the_file_and_config_flag_beats_it() {
    with_ports(|dir, [a, b, _]| async move {
        let file_a = config_file(&dir, "a.toml", "127.0.0.1", a);
        let file_b = config_file(&dir, "b.toml", "127.0.0.1", b);

        // HERALD_CONFIG alone is read: the server listens on its port.
        let mut h = Spawned::serve(&dir, &[], &[("HERALD_CONFIG", &file_a)]);
        h.ready_on("127.0.0.1", a, &[]).await?;
        // ...and the file's app is served, not the development app.
        let (status, _) = api_get_channels(a, "layers", "layers-key", "layers-secret").await;
        assert_eq!(status, 200, "the app from HERALD_CONFIG's file is served");
        let (status, _) = api_get_channels(a, "app-id", "app-key", "app-secret").await;
        assert_eq!(
            status, 404,
            "no development app when the file configures apps"
        );
        drop(h);

        // --config beats HERALD_CONFIG.
        let mut h = Spawned::serve(&dir, &["--config", &file_b], &[("HERALD_CONFIG", &file_a)]);
        h.ready_on("127.0.0.1", b, &[("127.0.0.1", a)]).await
    })
    .await;
}

#[tokio::test]
async fn host_flag_beats_env_which_beats_the_file() {
    with_ports(|dir, [p, _, _]| async move {
        // All of 127.0.0.0/8 is loopback on Linux.
        let file = config_file(&dir, "herald.toml", "127.0.0.1", p);
        let others = [("127.0.0.1", p), ("127.0.0.2", p)];

        let mut h = Spawned::serve(
            &dir,
            &["--config", &file, "--host", "127.0.0.3"],
            &[("HERALD_HOST", "127.0.0.2")],
        );
        h.ready_on("127.0.0.3", p, &others).await?;
        assert!(!is_ready("127.0.0.1", p).await && !is_ready("127.0.0.2", p).await);
        drop(h);

        let mut h = Spawned::serve(&dir, &["--config", &file], &[("HERALD_HOST", "127.0.0.2")]);
        h.ready_on("127.0.0.2", p, &[("127.0.0.1", p)]).await?;
        assert!(!is_ready("127.0.0.1", p).await);
        Ok(())
    })
    .await;
}

/// IPv6 is served: `--host ::1` (bracketed or not) listens on [::1] only,
/// `::` on IPv6 and IPv4 alike (dual-stack), and an IPv4-mapped address on
/// its IPv4 address.
#[tokio::test]
async fn ipv6_hosts_are_served() {
    with_ports(|dir, [p, _, _]| async move {
        let port = p.to_string();
        for host in ["::1", "[::1]"] {
            let mut h = Spawned::serve(&dir, &["--host", host, "--port", &port], &[]);
            h.ready_on("[::1]", p, &[("127.0.0.1", p)]).await?;
            assert!(!is_ready("127.0.0.1", p).await, "{host} serves IPv4 too");
            drop(h);
        }
        // Every address: the development app is refused there, so an app
        // of the test's own.
        let own = [
            ("HERALD_APP_ID", "v6"),
            ("HERALD_APP_KEY", "v6-key"),
            ("HERALD_APP_SECRET", "v6-secret-for-tests"),
        ];
        let mut h = Spawned::serve(&dir, &["--host", "::", "--port", &port], &own);
        h.ready_on("[::1]", p, &[]).await?;
        assert!(is_ready("127.0.0.1", p).await, ":: serves IPv4 too");
        drop(h);
        let mut h = Spawned::serve(&dir, &["--host", "::ffff:127.0.0.1", "--port", &port], &[]);
        h.ready_on("127.0.0.1", p, &[("[::1]", p)]).await?;
        assert!(!is_ready("[::1]", p).await);
        Ok(())
    })
    .await;
}

/// `GET /apps/{id}/channels`, signed with `key`/`secret`.
async fn api_get_channels(port: u16, id: &str, key: &str, secret: &str) -> (u16, String) {
    let path = format!("/apps/{id}/channels");
    let query = herald_pusher::auth::sign_query(key, secret, "GET", &path, b"", &[]);
    let resp = tokio::time::timeout(
        TIMEOUT,
        reqwest::get(format!("http://127.0.0.1:{port}{path}?{query}")),
    )
    .await
    .expect("API request timed out")
    .expect("API request");
    (
        resp.status().as_u16(),
        resp.text().await.unwrap_or_default(),
    )
}
