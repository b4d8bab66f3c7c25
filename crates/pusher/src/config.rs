//! Pusher's settings: the webhook delivery keys at the top of the config
//! file (`webhook_*`) and each app's `webhooks`, parsed and checked here
//! (the core keeps them raw; see `herald_core::adapter`). Names and
//! meanings as they always were; docs/configuration.md lists them.

use herald_core::adapter::{app_keys, top_keys};
use herald_core::config::{invalid, Config, ConfigError};
use serde::{Deserialize, Serialize};

/// The top-level keys this adapter owns.
pub const TOP_KEYS: &[&str] = &[
    "webhook_batch_ms",
    "webhook_batch_size",
    "webhook_leave_delay_ms",
    "webhook_timeout_ms",
    "webhook_retry_ms",
    "webhook_retry_for",
    "webhook_queue",
    "webhook_queue_bytes",
    "http_fallback",
    "http_session_timeout_ms",
    "http_heartbeat_ms",
    "http_max_sessions",
];

/// The top-level keys of pusher-js's HTTP transports (`crate::xhr`).
pub const HTTP_KEYS: &[&str] = &[
    "http_fallback",
    "http_session_timeout_ms",
    "http_heartbeat_ms",
    "http_max_sessions",
];

/// pusher-js's HTTP transports (`xhr_streaming`, `xhr_polling`), server-wide.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HttpSettings {
    /// Serve `/pusher/app/{key}/{server}/{session}/xhr_streaming`, `/xhr`
    /// and `/xhr_send`.
    pub http_fallback: bool,
    /// How long a session may go without a receiving request (a held poll
    /// or stream) before it is closed, in milliseconds.
    pub http_session_timeout_ms: u64,
    /// Longest silence on a held poll or stream before an `h` frame, in
    /// milliseconds (also at most half of `activity_timeout`).
    pub http_heartbeat_ms: u64,
    /// Most HTTP sessions one node holds at once; more are refused (503).
    pub http_max_sessions: usize,
}

impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings {
            http_fallback: true,
            http_session_timeout_ms: 15_000,
            http_heartbeat_ms: 25_000,
            http_max_sessions: 10_000,
        }
    }
}

impl HttpSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        if !(1000..=300_000).contains(&self.http_session_timeout_ms) {
            return Err(invalid(
                "http_session_timeout_ms",
                "must be from 1000 to 300000 (five minutes)",
            ));
        }
        if !(100..=60_000).contains(&self.http_heartbeat_ms) {
            return Err(invalid("http_heartbeat_ms", "must be from 100 to 60000"));
        }
        if self.http_max_sessions == 0 {
            return Err(invalid("http_max_sessions", "must be positive"));
        }
        Ok(())
    }
}

/// The keys of an app this adapter owns.
pub const APP_KEYS: &[&str] = &["webhooks"];

/// Webhook delivery, server-wide.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WebhookSettings {
    /// Longest wait before a batch is sent, in milliseconds.
    pub webhook_batch_ms: u64,
    /// Most events in one request.
    pub webhook_batch_size: usize,
    /// How long `channel_vacated` and `member_removed` wait, in
    /// milliseconds, and are dropped if the channel or member comes back.
    pub webhook_leave_delay_ms: u64,
    /// One request's time limit, in milliseconds.
    pub webhook_timeout_ms: u64,
    /// First retry delay in milliseconds (doubling, with jitter, up to a
    /// minute).
    pub webhook_retry_ms: u64,
    /// Seconds after which a failing request is given up.
    pub webhook_retry_for: u64,
    /// Events one app may have waiting; more are dropped.
    pub webhook_queue: usize,
    /// Bytes of webhook events one app may have waiting (a slow receiver
    /// and large client events must not grow memory without bound).
    pub webhook_queue_bytes: usize,
}

impl Default for WebhookSettings {
    fn default() -> Self {
        WebhookSettings {
            webhook_batch_ms: 250,
            webhook_batch_size: 20,
            webhook_leave_delay_ms: 3000,
            webhook_timeout_ms: 5000,
            webhook_retry_ms: 1000,
            webhook_retry_for: 300,
            webhook_queue: 10_000,
            webhook_queue_bytes: 16 * 1024 * 1024,
        }
    }
}

impl WebhookSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        let mut errors = Vec::new();
        let positive = [
            ("webhook_batch_ms", self.webhook_batch_ms as usize),
            ("webhook_batch_size", self.webhook_batch_size),
            ("webhook_timeout_ms", self.webhook_timeout_ms as usize),
            ("webhook_retry_ms", self.webhook_retry_ms as usize),
            ("webhook_queue", self.webhook_queue),
        ];
        for (field, value) in positive {
            if value == 0 {
                errors.push(invalid(field, "must be positive"));
            }
        }
        if self.webhook_batch_ms > 60_000 || self.webhook_leave_delay_ms > 60_000 {
            errors.push(invalid(
                "webhook_batch_ms/webhook_leave_delay_ms",
                "must be at most 60000 (a minute)",
            ));
        }
        if self.webhook_queue_bytes < 64 * 1024 {
            errors.push(invalid(
                "webhook_queue_bytes",
                "must be at least 65536 (it must hold the largest client event)",
            ));
        }
        if self.webhook_batch_size > 1000 {
            errors.push(invalid("webhook_batch_size", "must be at most 1000"));
        }
        ConfigError::all(errors)
    }
}

/// An app's Pusher keys.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AppSettings {
    /// Where to send webhooks, and which events.
    pub webhooks: Vec<WebhookConfig>,
}

/// Everything this adapter reads from the configuration, checked.
#[derive(Debug, Clone, Default)]
pub struct PusherConfig {
    pub webhook: WebhookSettings,
    pub http: HttpSettings,
    /// Per app, in the order of `config.apps`.
    pub apps: Vec<AppSettings>,
}

impl PusherConfig {
    /// Parse and check this adapter's keys of `config`.
    pub fn load(config: &Config) -> Result<PusherConfig, ConfigError> {
        // Every error at once: the top-level keys', then each app's.
        let mut errors = Vec::new();
        let webhook_keys: Vec<&str> = TOP_KEYS
            .iter()
            .filter(|k| !HTTP_KEYS.contains(k))
            .copied()
            .collect();
        let webhook = match top_keys::<WebhookSettings>(config, &webhook_keys) {
            Ok(w) => {
                errors.extend(w.validate().err());
                w
            }
            Err(e) => {
                errors.push(e);
                WebhookSettings::default()
            }
        };
        let http = match top_keys::<HttpSettings>(config, HTTP_KEYS) {
            Ok(h) => {
                errors.extend(h.validate().err());
                h
            }
            Err(e) => {
                errors.push(e);
                HttpSettings::default()
            }
        };
        let mut apps = Vec::with_capacity(config.apps.len());
        for i in 0..config.apps.len() {
            let app = match app_keys::<AppSettings>(config, i, APP_KEYS) {
                Ok(app) => app,
                Err(e) => {
                    errors.push(e);
                    AppSettings::default()
                }
            };
            for (j, hook) in app.webhooks.iter().enumerate() {
                if let Err((field, msg)) = validate_webhook(hook) {
                    errors.push(invalid(format!("apps[{i}].webhooks[{j}]{field}"), msg));
                }
            }
            apps.push(app);
        }
        ConfigError::all(errors).map(|()| PusherConfig {
            webhook,
            http,
            apps,
        })
    }

    /// The keys with their defaults, shaped as the file (for `herald config`).
    pub fn shown(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(&self.webhook).unwrap_or_default();
        if let (Some(v), Ok(serde_json::Value::Object(http))) =
            (v.as_object_mut(), serde_json::to_value(&self.http))
        {
            v.extend(http);
        }
        v["apps"] = serde_json::to_value(&self.apps).unwrap_or_default();
        v
    }
}

/// The webhook event types an app may ask for.
pub const WEBHOOK_EVENT_TYPES: [&str; 7] = [
    "channel_occupied",
    "channel_vacated",
    "member_added",
    "member_removed",
    "client_event",
    "cache_miss",
    "subscription_count",
];

/// One webhook endpoint of an app, written as soketi and sockudo configs
/// write it: `{ url, event_types, headers, filter }`.
#[derive(Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    pub url: String,
    pub event_types: Vec<String>,
    /// Extra request headers (e.g. a token for the receiver).
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub filter: WebhookFilter,
}

/// Only events on channels whose names match are sent.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WebhookFilter {
    pub channel_name_starts_with: Option<String>,
    pub channel_name_ends_with: Option<String>,
}

impl WebhookFilter {
    pub fn matches(&self, channel: &str) -> bool {
        self.channel_name_starts_with
            .as_deref()
            .is_none_or(|p| channel.starts_with(p))
            && self
                .channel_name_ends_with
                .as_deref()
                .is_none_or(|p| channel.ends_with(p))
    }
}

/// Header values and URL queries may hold credentials: Debug shows only
/// the URL's origin and the header names.
impl std::fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("url", &redact_url(&self.url))
            .field("event_types", &self.event_types)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("filter", &self.filter)
            .finish()
    }
}

/// A URL as logs may show it (the core's, re-exported for callers here).
pub use herald_core::config::redact_url;

/// Check one webhook: an http(s) URL, known event types, sendable headers.
/// Errors name the field (relative to the webhook) and what is wrong.
fn validate_webhook(hook: &WebhookConfig) -> Result<(), (String, String)> {
    let url = url::Url::parse(&hook.url)
        .map_err(|e| (".url".to_string(), format!("is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err((
            ".url".into(),
            "must be an http:// or https:// URL with a host".into(),
        ));
    }
    if hook.event_types.is_empty() {
        return Err((
            ".event_types".into(),
            format!(
                "must list at least one of {}",
                WEBHOOK_EVENT_TYPES.join(", ")
            ),
        ));
    }
    for t in &hook.event_types {
        if !WEBHOOK_EVENT_TYPES.contains(&t.as_str()) {
            return Err((
                ".event_types".into(),
                format!(
                    "has unknown event type {t:?} (known: {})",
                    WEBHOOK_EVENT_TYPES.join(", ")
                ),
            ));
        }
    }
    for (name, value) in &hook.headers {
        let token = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !token {
            return Err((
                format!(".headers.{name}"),
                "is not a valid header name".into(),
            ));
        }
        let lower = name.to_ascii_lowercase();
        if matches!(lower.as_str(), "content-type" | "content-length" | "host") {
            return Err((
                format!(".headers.{name}"),
                "is set by Herald and cannot be overridden".into(),
            ));
        }
        if value.chars().any(|c| c.is_control()) {
            return Err((
                format!(".headers.{name}"),
                "must not contain control characters".into(),
            ));
        }
    }
    Ok(())
}
