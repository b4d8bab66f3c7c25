//! Apps from a PostgreSQL or MySQL/MariaDB table in soketi's layout (`apps`: `id`, `key`,
//! `secret`, `enabled`, `max_connections`, `enable_client_messages`, the
//! `max_*` limits, `webhooks` JSON; each column also in camelCase, `-1`
//! for no limit), beside the config file's apps.
//!
//! The whole table is read every `apps_database.refresh` seconds and
//! applied through [`herald_core::apps`], like a SIGHUP's file: a row
//! inserted, changed or deleted takes effect within the interval on every
//! node (each reads the table itself). Connections and API calls look
//! apps up in memory only, so the database's load does not grow with the
//! traffic, and a flood of random keys never reaches it (an unknown key is
//! refused from memory, 4001). While the database is unreachable or slow
//! (a read is bounded by [`READ_TIMEOUT`]) the apps read last keep
//! working; the failure is logged once per interval and counted in
//! `herald_apps_source_errors_total`.
//!
//! A row that does not make a valid app (an empty key, a key another app
//! has, a limit out of range) is left out and logged, never the secret;
//! the others still apply.

use herald_core::apps::Source;
use herald_core::config::{AppConfig, AppsDatabase, Config};
use herald_core::future::BoxFuture;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

/// Longest a read of the table (connecting included) may take.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The file's apps and the table's, file first: an id or key in both is
/// the file's.
pub struct DbSource(Arc<Inner>);

struct Inner {
    file: Arc<dyn Source>,
    db: AppsDatabase,
    /// PostgreSQL: one connection, made again after an error.
    client: Mutex<Option<tokio_postgres::Client>>,
    /// MySQL/MariaDB: the driver's pool (it reconnects by itself).
    mysql: Option<mysql_async::Pool>,
    /// The ids the table gave at the last read (the others are the file's).
    from_table: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl DbSource {
    pub fn new(file: Arc<dyn Source>, db: AppsDatabase) -> Arc<DbSource> {
        let mysql = db
            .url
            .as_deref()
            .filter(|u| u.starts_with("mysql://"))
            .and_then(|u| mysql_async::Opts::from_url(u).ok())
            .map(mysql_async::Pool::new);
        Arc::new(DbSource(Arc::new(Inner {
            file,
            db,
            client: Mutex::new(None),
            mysql,
            from_table: Default::default(),
        })))
    }

    /// Seconds between reads of the table.
    pub fn refresh(&self) -> Duration {
        Duration::from_secs(self.0.db.refresh)
    }
}

impl Inner {
    /// Every row of the table, as JSON objects.
    async fn rows(&self) -> Result<Vec<Value>, String> {
        match &self.mysql {
            Some(pool) => self.mysql_rows(pool).await,
            None => self.postgres_rows().await,
        }
    }

    /// MySQL's text protocol gives every value as text: the row's reader
    /// takes numbers and booleans written as text too.
    async fn mysql_rows(&self, pool: &mysql_async::Pool) -> Result<Vec<Value>, String> {
        use mysql_async::prelude::Queryable;
        let mut conn = pool
            .get_conn()
            .await
            .map_err(|e| format!("cannot connect to the apps database: {e}"))?;
        let sql = format!("SELECT * FROM `{}`", self.db.table);
        let rows: Vec<mysql_async::Row> = conn
            .query(sql)
            .await
            .map_err(|e| format!("cannot read the apps table {:?}: {e}", self.db.table))?;
        Ok(rows
            .iter()
            .map(|row| {
                let mut obj = serde_json::Map::new();
                for (i, column) in row.columns_ref().iter().enumerate() {
                    let v = match row.as_ref(i) {
                        None | Some(mysql_async::Value::NULL) => Value::Null,
                        Some(mysql_async::Value::Bytes(b)) => {
                            Value::String(String::from_utf8_lossy(b).into_owned())
                        }
                        Some(mysql_async::Value::Int(n)) => Value::from(*n),
                        Some(mysql_async::Value::UInt(n)) => Value::from(*n),
                        Some(mysql_async::Value::Float(f)) => Value::from(*f),
                        Some(mysql_async::Value::Double(f)) => Value::from(*f),
                        Some(_) => Value::Null,
                    };
                    obj.insert(column.name_str().into_owned(), v);
                }
                Value::Object(obj)
            })
            .collect())
    }

    async fn postgres_rows(&self) -> Result<Vec<Value>, String> {
        let url = self.db.url.as_deref().ok_or("no apps_database.url")?;
        let mut client = self.client.lock().await;
        if client.as_ref().is_none_or(|c| c.is_closed()) {
            let (c, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                .await
                .map_err(|e| format!("cannot connect to the apps database: {e}"))?;
            tokio::spawn(async move {
                let _ = connection.await;
            });
            *client = Some(c);
        }
        let c = client.as_ref().expect("connected above");
        // One JSON object per row: every column, whatever its SQL type
        // (soketi's docs use integers, smallints, booleans and JSON).
        let sql = format!("SELECT row_to_json(t)::text FROM \"{}\" t", self.db.table);
        let rows = c
            .query(sql.as_str(), &[])
            .await
            .map_err(|e| format!("cannot read the apps table {:?}: {e}", self.db.table));
        let rows = match rows {
            Ok(r) => r,
            Err(e) => {
                *client = None;
                return Err(e);
            }
        };
        rows.iter()
            .map(|r| {
                let text: String = r.get(0);
                serde_json::from_str(&text).map_err(|e| e.to_string())
            })
            .collect()
    }

    async fn load_all(&self) -> Result<Vec<AppConfig>, String> {
        let mut apps = self.file.load().await?;
        let rows = tokio::time::timeout(READ_TIMEOUT, self.rows())
            .await
            .map_err(|_| {
                format!(
                    "the apps database did not answer within {} s",
                    READ_TIMEOUT.as_secs()
                )
            })??;
        let from_file = apps.len();
        let mut ids: std::collections::HashSet<String> =
            apps.iter().map(|a| a.id.clone()).collect();
        let mut keys: std::collections::HashSet<String> =
            apps.iter().map(|a| a.key.clone()).collect();
        for (i, row) in rows.iter().enumerate() {
            match app_of_row(row) {
                Ok(app) if ids.contains(&app.id) || keys.contains(&app.key) => {
                    tracing::warn!(
                        row = i,
                        app_id = %app.id,
                        "apps table: an app with this id or key exists already; row left out"
                    );
                }
                Ok(app) => {
                    ids.insert(app.id.clone());
                    keys.insert(app.key.clone());
                    apps.push(app);
                }
                Err(e) => tracing::warn!(row = i, error = %e, "apps table: row left out"),
            }
        }
        *self.from_table.lock().unwrap_or_else(|e| e.into_inner()) =
            apps[from_file..].iter().map(|a| a.id.clone()).collect();
        Ok(apps)
    }
}

impl Source for DbSource {
    fn name(&self) -> &'static str {
        match self.0.mysql {
            Some(_) => "mysql",
            None => "postgres",
        }
    }

    fn source_of(&self, id: &str) -> &'static str {
        let table = self.0.from_table.lock().unwrap_or_else(|e| e.into_inner());
        match table.contains(id) {
            true => self.name(),
            false => "file",
        }
    }

    fn load(&self) -> BoxFuture<Result<Vec<AppConfig>, String>> {
        let inner = self.0.clone();
        Box::pin(async move { inner.load_all().await })
    }
}

/// Read the table every `refresh` seconds and apply it to `node`'s apps,
/// until the node shuts down.
pub fn spawn(node: Arc<herald_core::node::Node>, every: Duration) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = node.shutdown.cancelled() => return,
            }
            match node.apps.reload().await {
                Ok(Some((_, changes))) if !changes.is_empty() => tracing::info!(
                    added = ?changes.added,
                    changed = ?changes.changed,
                    closed = ?changes.closed,
                    "apps changed in the database"
                ),
                Ok(_) => {}
                Err(e) => {
                    herald_core::metrics::apps_source_error();
                    tracing::error!(error = %e, "apps database: keeping the apps read last");
                }
            }
        }
    });
}

/// A column by its snake_case or camelCase name, `null` as absent.
fn col<'a>(row: &'a Value, snake: &str) -> Option<&'a Value> {
    let camel: String = {
        let mut out = String::new();
        let mut up = false;
        for c in snake.chars() {
            if c == '_' {
                up = true;
            } else if up {
                out.extend(c.to_uppercase());
                up = false;
            } else {
                out.push(c);
            }
        }
        out
    };
    row.get(snake)
        .or_else(|| row.get(camel.as_str()))
        .filter(|v| !v.is_null())
}

fn text(row: &Value, name: &str) -> Result<String, String> {
    match col(row, name) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Number(n)) => Ok(n.to_string()),
        _ => Err(format!("`{name}` is missing or not text")),
    }
}

fn flag(row: &Value, name: &str, default: bool) -> Result<bool, String> {
    Ok(match col(row, name) {
        None => default,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_i64() != Some(0),
        Some(Value::String(s)) => matches!(s.as_str(), "1" | "true" | "t" | "yes"),
        Some(other) => return Err(format!("`{name}` is not a boolean: {other}")),
    })
}

/// A limit: `None` when absent, `Some(None)` for `-1` (no limit).
fn limit(row: &Value, name: &str) -> Result<Option<Option<u64>>, String> {
    let n = match col(row, name) {
        None => return Ok(None),
        Some(Value::Number(n)) => n.as_f64().unwrap_or(-2.0),
        Some(Value::String(s)) => s.trim().parse::<f64>().unwrap_or(-2.0),
        Some(other) => return Err(format!("`{name}` is not a number: {other}")),
    };
    match n {
        -1.0 => Ok(Some(None)),
        n if n >= 0.0 && n <= u32::MAX as f64 => Ok(Some(Some(n as u64))),
        _ => Err(format!("`{name}` must be -1 or a count")),
    }
}

/// One row as an app, checked as a file's app is.
pub fn app_of_row(row: &Value) -> Result<AppConfig, String> {
    let mut app = AppConfig {
        id: text(row, "id")?,
        key: text(row, "key")?,
        secret: text(row, "secret")?,
        enabled: flag(row, "enabled", true)?,
        // soketi's default.
        client_events: flag(row, "enable_client_messages", false)?,
        ..AppConfig::default()
    };
    if let Some(n) = limit(row, "max_connections")? {
        app.max_connections = n.unwrap_or(0).min(u32::MAX as u64) as u32;
    }
    if let Some(n) = limit(row, "max_client_events_per_sec")? {
        // No limit: as many as a connection may send at all.
        app.client_event_rate = n.map_or(u32::MAX, |n| n.max(1) as u32);
    }
    let sizes = [
        ("max_presence_members_per_channel", 1),
        ("max_presence_member_size_in_kb", 1024),
        ("max_channel_name_length", 1),
        ("max_event_name_length", 1),
        ("max_event_payload_in_kb", 1024),
    ];
    for (name, unit) in sizes {
        let Some(Some(n)) = limit(row, name)? else {
            continue;
        };
        let n = (n as usize).saturating_mul(unit);
        match name {
            "max_presence_members_per_channel" => app.max_presence_members = n,
            "max_presence_member_size_in_kb" => app.max_presence_user_info = n,
            "max_channel_name_length" => app.max_channel_name = n,
            "max_event_name_length" => app.max_event_name = n,
            _ => {
                app.max_payload = n;
                app.max_cache_bytes = app.max_cache_bytes.max(4 * n);
                app.max_frame_size = app.max_frame_size.max(n + 4096);
            }
        }
    }
    match col(row, "allowed_origins") {
        None => {}
        Some(Value::Array(list)) => {
            app.allowed_origins = list
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        }
        Some(Value::String(s)) => {
            app.allowed_origins = match serde_json::from_str::<Vec<String>>(s) {
                Ok(list) => list,
                Err(_) => s.split(',').map(|o| o.trim().to_owned()).collect(),
            }
        }
        Some(other) => return Err(format!("`allowed_origins` is not a list: {other}")),
    }
    if app.allowed_origins.is_empty() {
        app.allowed_origins = vec!["*".into()];
    }
    // The same checks as the file's apps (ids, keys, limits, origins).
    let check = Config {
        apps: vec![app.clone()],
        ..Config::default()
    };
    check.validate().map_err(|e| {
        format!(
            "app {:?}: {}",
            app.id,
            e.to_string().replace("apps[0].", "")
        )
    })?;
    Ok(app)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn soketi_rows_become_apps() {
        let row = json!({
            "id": "1", "key": "k", "secret": "s", "max_connections": -1,
            "enable_client_messages": 1, "enabled": 0, "max_client_events_per_sec": 5,
            "max_event_payload_in_kb": 20, "webhooks": null,
            "maxPresenceMembersPerChannel": 7,
        });
        let app = app_of_row(&row).unwrap();
        assert_eq!(
            (app.max_connections, app.client_events, app.enabled),
            (0, true, false)
        );
        assert_eq!((app.client_event_rate, app.max_payload), (5, 20 * 1024));
        assert_eq!(app.max_presence_members, 7);
        assert!(app_of_row(&json!({ "id": "1", "key": "", "secret": "s" })).is_err());
        assert!(app_of_row(&json!({ "id": "1", "key": "k" })).is_err());
    }
}
