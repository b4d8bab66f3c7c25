//! Apps from a real PostgreSQL and a real MariaDB (Debian's packages,
//! started on loopback by the test) holding soketi's `apps` table,
//! configured with soketi's own environment (`SOKETI_APP_MANAGER_DRIVER`,
//! `SOKETI_DB_POSTGRES_*` / `SOKETI_DB_MYSQL_*`,
//! `SOKETI_APP_MANAGER_CACHE_TTL`). Rows inserted, changed and deleted
//! while clients are connected take effect within the refresh; with the
//! database down the apps read last keep working and unknown keys are
//! refused without it.

use crate::common;

use common::mariadb::MariaDb;
use common::postgres::Postgres;
use common::*;
use serde_json::json;
use std::time::{Duration, Instant};

/// soketi's documented columns for its SQL app managers (`{key}` is the
/// `key` column quoted as each database quotes it: reserved in MySQL).
const TABLE: &str = "CREATE TABLE apps (
    id varchar(255) PRIMARY KEY,
    {key} varchar(255) NOT NULL,
    secret varchar(255) NOT NULL,
    max_connections integer NOT NULL,
    enable_client_messages smallint NOT NULL,
    enabled smallint NOT NULL,
    max_backend_events_per_sec integer NOT NULL,
    max_client_events_per_sec integer NOT NULL,
    max_read_req_per_sec integer NOT NULL,
    webhooks json,
    max_presence_members_per_channel integer DEFAULT NULL,
    max_presence_member_size_in_kb integer DEFAULT NULL,
    max_channel_name_length integer DEFAULT NULL,
    max_event_channels_at_once integer DEFAULT NULL,
    max_event_name_length integer DEFAULT NULL,
    max_event_payload_in_kb integer DEFAULT NULL,
    max_event_batch_size integer DEFAULT NULL,
    enable_user_authentication smallint NOT NULL
)";

fn insert(id: &str, secret: &str) -> String {
    format!(
        "INSERT INTO apps (id, {{key}}, secret, max_connections, enable_client_messages, enabled, \
         max_backend_events_per_sec, max_client_events_per_sec, max_read_req_per_sec, webhooks, \
         enable_user_authentication) \
         VALUES ('{id}', '{id}-key', '{secret}', -1, 1, 1, -1, -1, -1, '[]', 0)"
    )
}

async fn until_established(server: &Server, key: &str) -> Client {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let mut ws = server.raw_ws(key, "?protocol=7").await;
        match next(&mut ws).await {
            Next::Frame(f) if f["event"] == "pusher:connection_established" => {
                let socket_id = data(&f)["socket_id"].as_str().unwrap().to_owned();
                return Client {
                    ws,
                    socket_id,
                    established: f,
                };
            }
            other => {
                assert!(
                    Instant::now() < deadline,
                    "{key} never connected: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn refused_with(server: &Server, key: &str) -> u16 {
    let mut ws = server.raw_ws(key, "?protocol=7").await;
    match next(&mut ws).await {
        Next::Frame(f) if f["event"] == "pusher:error" => data(&f)["code"].as_u64().unwrap() as u16,
        other => panic!("{key}: not refused: {other:?}"),
    }
}

async fn api_as(server: &Server, app: &str, secret: &str, channel: &str) -> u16 {
    let path = format!("/apps/{app}/events");
    let body = json!({ "name": "e", "channel": channel, "data": "{}" }).to_string();
    let query = herald_pusher::auth::sign_query(
        &format!("{app}-key"),
        secret,
        "POST",
        &path,
        body.as_bytes(),
        &[],
    );
    server.raw_api("POST", &path, &query, &body).await.0
}

/// Poll `check` until true, within [`TIMEOUT`].
async fn until<F: std::future::Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let deadline = Instant::now() + TIMEOUT;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The database under test, as the scenario drives it.
enum Db {
    Pg(Postgres),
    Maria(MariaDb),
}

impl Db {
    async fn exec(&self, sql: &str) {
        match self {
            Db::Pg(d) => d.exec(&sql.replace("{key}", "\"key\"")).await,
            Db::Maria(d) => d.exec(&sql.replace("{key}", "`key`")).await,
        }
    }

    fn stop(&mut self) {
        match self {
            Db::Pg(d) => d.stop(),
            Db::Maria(d) => d.stop(),
        }
    }
}

#[tokio::test]
async fn soketis_apps_table_in_postgres() {
    let pg = Postgres::start().await;
    let port = pg.port.to_string();
    let env = [
        ("SOKETI_APP_MANAGER_DRIVER", "postgres"),
        ("SOKETI_DB_POSTGRES_HOST", "127.0.0.1"),
        ("SOKETI_DB_POSTGRES_PORT", port.as_str()),
        ("SOKETI_DB_POSTGRES_USERNAME", "herald"),
        ("SOKETI_DB_POSTGRES_PASSWORD", "unused"),
        ("SOKETI_DB_POSTGRES_DATABASE", "postgres"),
        ("SOKETI_APP_MANAGER_CACHE_TTL", "1"),
    ];
    read_live_and_kept_while_down(Db::Pg(pg), &env).await;
}

#[tokio::test]
async fn soketis_apps_table_in_mariadb() {
    let maria = MariaDb::start().await;
    let port = maria.port.to_string();
    let env = [
        ("SOKETI_APP_MANAGER_DRIVER", "mysql"),
        ("SOKETI_DB_MYSQL_HOST", "127.0.0.1"),
        ("SOKETI_DB_MYSQL_PORT", port.as_str()),
        ("SOKETI_DB_MYSQL_USERNAME", "root"),
        ("SOKETI_DB_MYSQL_PASSWORD", "password"),
        ("SOKETI_DB_MYSQL_DATABASE", "main"),
        ("SOKETI_APP_MANAGER_CACHE_TTL", "1"),
    ];
    read_live_and_kept_while_down(Db::Maria(maria), &env).await;
}

/// The scenario, on either database.
async fn read_live_and_kept_while_down(mut pg: Db, env: &[(&str, &str)]) {
    pg.exec(TABLE).await;
    pg.exec(&insert("db1", "s1")).await;
    let top = "dashboard = true\ndashboard_token = \"a-dashboard-token-for-tests\"";
    let server = Server::start_with_env(top, "", env).await;

    // A row present at start works from the first connection.
    let mut one = Client::connect(&server.ws_url("db1-key", "?protocol=7")).await;
    one.subscribe("news").await;
    assert_eq!(api_as(&server, "db1", "s1", "news").await, 200);
    one.expect("e", Some("news")).await;
    // The file's app is served beside the table's; the dashboard says
    // which is which, with no secret.
    server.client().await;
    let stats = reqwest::Client::new()
        .get(server.url("/dashboard/api/stats"))
        .bearer_auth("a-dashboard-token-for-tests")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !stats.contains("\"s1\""),
        "a secret on the dashboard: {stats}"
    );
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    let source = |id: &str| {
        stats["apps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["id"] == id)
            .map(|a| a["source"].as_str().unwrap().to_owned())
    };
    assert_eq!(source(APP_ID).as_deref(), Some("file"));
    let db_source = source("db1").unwrap();
    assert!(
        ["postgres", "mysql"].contains(&db_source.as_str()),
        "{db_source}"
    );

    // Inserted while running: works within the refresh.
    pg.exec(&insert("db2", "s2")).await;
    let mut two = until_established(&server, "db2-key").await;
    pg.exec(&insert("db3", "s3")).await;
    until_established(&server, "db3-key").await;

    // A rotated secret signs from then on.
    pg.exec("UPDATE apps SET secret = 's1-rotated' WHERE id = 'db1'")
        .await;
    until("the rotated secret", || async {
        api_as(&server, "db1", "s1-rotated", "news").await == 200
    })
    .await;
    assert_eq!(api_as(&server, "db1", "s1", "news").await, 401);
    one.expect("e", Some("news")).await;

    // Disabled: its open connection is closed with 4003, new ones refused.
    pg.exec("UPDATE apps SET enabled = 0 WHERE id = 'db1'")
        .await;
    one.expect_closed_with(4003).await;
    assert_eq!(refused_with(&server, "db1-key").await, 4003);

    // Deleted: closed with 4003, then unknown (4001).
    pg.exec("DELETE FROM apps WHERE id = 'db2'").await;
    two.expect_closed_with(4003).await;
    assert_eq!(refused_with(&server, "db2-key").await, 4001);

    // The database goes away: the apps read last keep working, and a
    // flood of unknown keys is refused from memory.
    pg.stop();
    until("a failed read of the table", || async {
        server
            .scrape()
            .await
            .samples
            .iter()
            .any(|s| s.metric == "herald_apps_source_errors_total")
    })
    .await;
    let mut three = until_established(&server, "db3-key").await;
    three.subscribe("still").await;
    assert_eq!(api_as(&server, "db3", "s3", "still").await, 200);
    three.expect("e", Some("still")).await;
    for i in 0..50 {
        assert_eq!(refused_with(&server, &format!("random-{i}")).await, 4001);
    }
    assert_eq!(
        refused_with(&server, "db1-key").await,
        4003,
        "still disabled"
    );
}
