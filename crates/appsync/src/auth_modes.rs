//! AppSync's authorization modes besides API keys, per app: Amazon Cognito
//! user pools and OpenID Connect (JWTs, [`crate::auth_jwt`]), a Lambda
//! authorizer behind an HTTP URL ([`crate::auth_lambda`]) and IAM SigV4
//! ([`crate::auth_iam`]), configured as AppSync's Event API configures
//! them: `auth_providers`, the modes allowed to connect, and default
//! publish and subscribe modes that a namespace may override.
//!
//! An app without `auth_providers` authorizes with API keys exactly as
//! [`crate::auth`] does. With providers, a request's mode is read from its
//! headers: `x-api-key` is `API_KEY`; an `Authorization` starting with
//! `AWS4-HMAC-SHA256` is `AWS_IAM`; a JWT whose `iss` is a configured
//! Cognito pool's or OIDC issuer's is that provider's; any other
//! `Authorization` goes to the Lambda authorizer. The mode must be one the
//! operation allows. Refusals are AppSync's `UnauthorizedException`.

use crate::auth::{self, Action, Denied, UNAUTHORIZED, UNAUTHORIZED_MESSAGE};
use crate::auth_iam::{AccessKey, Iam, Signed};
use crate::auth_jwt::{Jwks, Source, Verifier};
use crate::auth_lambda::Lambda;
use crate::config::{AppKeys, Keys, NamespaceConfig};
use herald_core::config::{invalid, ConfigError};
use herald_core::hub::Hub;
use herald_core::metrics::Counter;
use herald_core::node::Node;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::Duration;

/// Authorizer and JWKS calls that failed (unreachable, timed out, bad
/// answer): each refused what it was asked about.
pub static AUTH_FAILURES: Counter = Counter::new(
    "herald_appsync_authorizer_failures_total",
    "AppSync Lambda authorizer and JWKS calls that failed (unreachable, timed out, bad answer); the request was refused",
);

pub fn count_failure() {
    herald_core::metrics::count(&AUTH_FAILURES);
}

/// An authorization mode, by AppSync's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum Mode {
    #[serde(rename = "API_KEY")]
    ApiKey,
    #[serde(rename = "AMAZON_COGNITO_USER_POOLS")]
    Cognito,
    #[serde(rename = "OPENID_CONNECT")]
    Oidc,
    #[serde(rename = "AWS_LAMBDA")]
    Lambda,
    #[serde(rename = "AWS_IAM")]
    Iam,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::ApiKey => "API_KEY",
            Mode::Cognito => "AMAZON_COGNITO_USER_POOLS",
            Mode::Oidc => "OPENID_CONNECT",
            Mode::Lambda => "AWS_LAMBDA",
            Mode::Iam => "AWS_IAM",
        }
    }
}

fn skew_default() -> u64 {
    60
}
fn jwks_ttl_default() -> u64 {
    3600
}
fn timeout_default() -> u64 {
    3000
}
fn lambda_ttl_default() -> u64 {
    300
}
fn iam_skew_default() -> u64 {
    300
}

/// `OPENID_CONNECT`: AppSync's `openIDConnectConfig`, plus where the keys are.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OidcConfig {
    pub issuer: String,
    /// Must be named by the token's `aud`, `azp` or `client_id` (unset: any).
    #[serde(default)]
    pub client_id: Option<String>,
    /// Milliseconds a token stays valid after `iat` (AppSync's `iatTTL`; 0: no limit).
    #[serde(default)]
    pub iat_ttl: u64,
    /// Milliseconds after `auth_time` (AppSync's `authTTL`; 0: no limit).
    #[serde(default)]
    pub auth_ttl: u64,
    /// The JWKS URL (unset: the issuer's discovery document's `jwks_uri`).
    #[serde(default)]
    pub jwks_url: Option<String>,
    /// A JWKS file instead of any URL (air-gapped sites).
    #[serde(default)]
    pub jwks_file: Option<String>,
    #[serde(default = "jwks_ttl_default")]
    pub jwks_ttl: u64,
    #[serde(default = "timeout_default")]
    pub jwks_timeout_ms: u64,
    /// Seconds of clock difference allowed on `exp`, `nbf` and `iat`.
    #[serde(default = "skew_default")]
    pub clock_skew: u64,
}

/// `AMAZON_COGNITO_USER_POOLS`: AppSync's `cognitoConfig`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CognitoConfig {
    pub user_pool_id: String,
    /// The pool's region (unset: the prefix of `user_pool_id`).
    #[serde(default)]
    pub aws_region: Option<String>,
    /// The app client ids accepted (`aud` of id tokens, `client_id` of
    /// access tokens), a whole-string regular expression (unset: any).
    #[serde(default)]
    pub app_id_client_regex: Option<String>,
    /// A token must be in one of these `cognito:groups` (empty: any).
    #[serde(default)]
    pub groups: Vec<String>,
    /// Override of the pool's JWKS URL (`{issuer}/.well-known/jwks.json`).
    #[serde(default)]
    pub jwks_url: Option<String>,
    #[serde(default)]
    pub jwks_file: Option<String>,
    #[serde(default = "jwks_ttl_default")]
    pub jwks_ttl: u64,
    #[serde(default = "timeout_default")]
    pub jwks_timeout_ms: u64,
    #[serde(default = "skew_default")]
    pub clock_skew: u64,
}

impl CognitoConfig {
    fn region(&self) -> &str {
        self.aws_region
            .as_deref()
            .unwrap_or_else(|| self.user_pool_id.split('_').next().unwrap_or(""))
    }

    pub fn issuer(&self) -> String {
        format!(
            "https://cognito-idp.{}.amazonaws.com/{}",
            self.region(),
            self.user_pool_id
        )
    }
}

/// `AWS_LAMBDA`: AppSync's `lambdaAuthorizerConfig`, the function behind a URL.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LambdaConfig {
    /// Where Herald POSTs the authorizer request (http or https).
    pub authorizer_url: String,
    /// Seconds an answer is kept per token unless it says `ttlOverride`
    /// (AppSync's `authorizerResultTtlInSeconds`; 0: not kept).
    #[serde(default = "lambda_ttl_default")]
    pub authorizer_result_ttl_in_seconds: u64,
    /// A whole-string regular expression tokens must match before any call.
    #[serde(default)]
    pub identity_validation_expression: Option<String>,
    /// Milliseconds one call may take; longer is a refusal.
    #[serde(default = "timeout_default")]
    pub timeout_ms: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AccessKeyConfig {
    pub access_key_id: String,
    pub secret_access_key: String,
}

/// `AWS_IAM`: the access keys whose signatures are accepted.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct IamConfig {
    pub access_keys: Vec<AccessKeyConfig>,
    /// Regions a signature may be scoped to on hosts that name none
    /// (empty: any); AppSync's own hosts name theirs.
    #[serde(default)]
    pub regions: Vec<String>,
    /// Seconds `x-amz-date` may differ from now.
    #[serde(default = "iam_skew_default")]
    pub max_skew: u64,
}

/// One of an app's `auth_providers`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(tag = "type")]
pub enum ProviderConfig {
    #[serde(rename = "OPENID_CONNECT")]
    Oidc(OidcConfig),
    #[serde(rename = "AMAZON_COGNITO_USER_POOLS")]
    Cognito(CognitoConfig),
    #[serde(rename = "AWS_LAMBDA")]
    Lambda(LambdaConfig),
    #[serde(rename = "AWS_IAM")]
    Iam(IamConfig),
}

impl ProviderConfig {
    pub fn mode(&self) -> Mode {
        match self {
            ProviderConfig::Oidc(_) => Mode::Oidc,
            ProviderConfig::Cognito(_) => Mode::Cognito,
            ProviderConfig::Lambda(_) => Mode::Lambda,
            ProviderConfig::Iam(_) => Mode::Iam,
        }
    }
}

fn check_url(field: &str, url: &str) -> Result<(), ConfigError> {
    if !(url.starts_with("http://") || url.starts_with("https://"))
        || url.contains(char::is_whitespace)
    {
        return Err(invalid(field, "must be an http:// or https:// URL"));
    }
    Ok(())
}

fn whole_regex(field: &str, re: &str) -> Result<regex::Regex, ConfigError> {
    regex::RegexBuilder::new(&format!("^(?:{re})$"))
        .size_limit(1 << 20)
        .build()
        .map_err(|e| invalid(field, format!("is not a regular expression: {e}")))
}

/// Check an app's auth settings (`at` is `apps[i]`); `api_keys` says
/// whether the app has API keys in force.
pub fn check(
    at: &str,
    providers: &[ProviderConfig],
    modes: [(&str, &Option<Vec<Mode>>); 3],
    namespaces: &[NamespaceConfig],
    hosts: &[String],
    api_keys: bool,
) -> Result<(), ConfigError> {
    let mut seen = Vec::new();
    for (i, p) in providers.iter().enumerate() {
        let f = |name: &str| format!("{at}.auth_providers[{i}].{name}");
        if matches!(p.mode(), Mode::Lambda | Mode::Iam) && seen.contains(&p.mode()) {
            return Err(invalid(
                format!("{at}.auth_providers[{i}]"),
                format!(
                    "a second {} provider (an app has at most one)",
                    p.mode().name()
                ),
            ));
        }
        seen.push(p.mode());
        match p {
            ProviderConfig::Oidc(c) => {
                check_url(&f("issuer"), &c.issuer)?;
                if let Some(u) = &c.jwks_url {
                    check_url(&f("jwks_url"), u)?;
                }
                if let Some(path) = &c.jwks_file {
                    Jwks::check_file(path).map_err(|e| invalid(f("jwks_file"), e))?;
                }
                if c.jwks_timeout_ms == 0 || c.jwks_timeout_ms > 60_000 {
                    return Err(invalid(f("jwks_timeout_ms"), "must be 1 to 60000"));
                }
            }
            ProviderConfig::Cognito(c) => {
                if c.user_pool_id.is_empty()
                    || !c.user_pool_id.contains('_')
                    || !c
                        .user_pool_id
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b))
                {
                    return Err(invalid(
                        f("user_pool_id"),
                        "must be a pool id such as us-east-1_AbCdEf",
                    ));
                }
                if let Some(u) = &c.jwks_url {
                    check_url(&f("jwks_url"), u)?;
                }
                if let Some(path) = &c.jwks_file {
                    Jwks::check_file(path).map_err(|e| invalid(f("jwks_file"), e))?;
                }
                if let Some(re) = &c.app_id_client_regex {
                    whole_regex(&f("app_id_client_regex"), re)?;
                }
                if c.jwks_timeout_ms == 0 || c.jwks_timeout_ms > 60_000 {
                    return Err(invalid(f("jwks_timeout_ms"), "must be 1 to 60000"));
                }
            }
            ProviderConfig::Lambda(c) => {
                check_url(&f("authorizer_url"), &c.authorizer_url)?;
                if let Some(re) = &c.identity_validation_expression {
                    whole_regex(&f("identity_validation_expression"), re)?;
                }
                if c.timeout_ms == 0 || c.timeout_ms > 60_000 {
                    return Err(invalid(f("timeout_ms"), "must be 1 to 60000"));
                }
                if c.authorizer_result_ttl_in_seconds > crate::auth_lambda::MAX_TTL {
                    return Err(invalid(
                        f("authorizer_result_ttl_in_seconds"),
                        "must be at most 3600",
                    ));
                }
            }
            ProviderConfig::Iam(c) => {
                if c.access_keys.is_empty() {
                    return Err(invalid(f("access_keys"), "must list at least one key"));
                }
                for (j, k) in c.access_keys.iter().enumerate() {
                    if k.access_key_id.is_empty() || k.secret_access_key.is_empty() {
                        return Err(invalid(
                            f(&format!("access_keys[{j}]")),
                            "needs access_key_id and secret_access_key",
                        ));
                    }
                }
            }
        }
    }
    let available = |m: &Mode| *m == Mode::ApiKey && api_keys || seen.contains(m);
    let mut lists: Vec<(String, &Option<Vec<Mode>>)> = modes
        .iter()
        .map(|(k, v)| (format!("{at}.{k}"), *v))
        .collect();
    for (j, ns) in namespaces.iter().enumerate() {
        lists.push((
            format!("{at}.namespaces[{j}].publish_auth_modes"),
            &ns.publish_auth_modes,
        ));
        lists.push((
            format!("{at}.namespaces[{j}].subscribe_auth_modes"),
            &ns.subscribe_auth_modes,
        ));
    }
    for (field, list) in lists {
        if let Some(list) = list {
            if list.is_empty() {
                return Err(invalid(
                    field,
                    "must name at least one mode (leave it out for the default)",
                ));
            }
            if let Some(m) = list.iter().find(|m| !available(m)) {
                return Err(invalid(
                    field,
                    format!(
                        "names {} but the app has no such provider (auth_providers, api_keys)",
                        m.name()
                    ),
                ));
            }
        }
    }
    for (j, h) in hosts.iter().enumerate() {
        if h.is_empty() || h.contains(|c: char| c.is_whitespace() || c == '/') {
            return Err(invalid(
                format!("{at}.hosts[{j}]"),
                "must be a host name (with an optional :port)",
            ));
        }
    }
    Ok(())
}

struct JwtProvider {
    mode: Mode,
    verifier: Verifier,
    /// Cognito: accepted app client ids; OIDC: the client id.
    client: Client,
    groups: Vec<String>,
}

enum Client {
    Any,
    Id(String),
    Regex(regex::Regex),
}

/// An app's authorization beyond API keys, built once (its JWKS caches
/// and authorizer cache live here, shared by both APIs and HTTP publish).
#[derive(Default)]
pub struct AppAuth {
    /// Whether the app has `auth_providers` (else API keys alone decide).
    pub configured: bool,
    app_id: String,
    jwt: Vec<JwtProvider>,
    lambda: Option<Lambda>,
    iam: Option<Iam>,
    connect: Vec<Mode>,
    publish: Vec<Mode>,
    subscribe: Vec<Mode>,
    pub hosts: Vec<String>,
}

impl std::fmt::Debug for AppAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppAuth")
            .field("configured", &self.configured)
            .field("connect", &self.connect)
            .finish_non_exhaustive()
    }
}

impl AppAuth {
    /// Build from settings already checked by [`check`].
    pub fn new(
        app_id: &str,
        providers: &[ProviderConfig],
        modes: [&Option<Vec<Mode>>; 3],
        hosts: &[String],
        api_keys: bool,
    ) -> AppAuth {
        if providers.is_empty() {
            return AppAuth::default();
        }
        let mut all = Vec::new();
        if api_keys {
            all.push(Mode::ApiKey);
        }
        let mut auth = AppAuth {
            configured: true,
            app_id: app_id.to_owned(),
            hosts: hosts.iter().map(|h| h.to_ascii_lowercase()).collect(),
            ..AppAuth::default()
        };
        for p in providers {
            if !all.contains(&p.mode()) {
                all.push(p.mode());
            }
            let jwks =
                |url: &Option<String>, file: &Option<String>, default: Source, ttl, timeout_ms| {
                    let source = match (file, url) {
                        (Some(f), _) => Source::File(f.clone()),
                        (None, Some(u)) => Source::Url(u.clone()),
                        (None, None) => default,
                    };
                    Jwks::new(
                        source,
                        Duration::from_secs(ttl),
                        Duration::from_millis(timeout_ms),
                    )
                };
            match p {
                ProviderConfig::Oidc(c) => auth.jwt.push(JwtProvider {
                    mode: Mode::Oidc,
                    verifier: Verifier {
                        issuer: c.issuer.clone(),
                        jwks: jwks(
                            &c.jwks_url,
                            &c.jwks_file,
                            Source::Discovery(format!(
                                "{}/.well-known/openid-configuration",
                                c.issuer.trim_end_matches('/')
                            )),
                            c.jwks_ttl,
                            c.jwks_timeout_ms,
                        ),
                        skew: c.clock_skew,
                        iat_ttl: c.iat_ttl.div_ceil(1000),
                        auth_ttl: c.auth_ttl.div_ceil(1000),
                    },
                    client: c.client_id.clone().map_or(Client::Any, Client::Id),
                    groups: Vec::new(),
                }),
                ProviderConfig::Cognito(c) => {
                    let issuer = c.issuer();
                    auth.jwt.push(JwtProvider {
                        mode: Mode::Cognito,
                        verifier: Verifier {
                            jwks: jwks(
                                &c.jwks_url,
                                &c.jwks_file,
                                Source::Url(format!("{issuer}/.well-known/jwks.json")),
                                c.jwks_ttl,
                                c.jwks_timeout_ms,
                            ),
                            issuer,
                            skew: c.clock_skew,
                            iat_ttl: 0,
                            auth_ttl: 0,
                        },
                        client: c
                            .app_id_client_regex
                            .as_deref()
                            .and_then(|re| whole_regex("", re).ok())
                            .map_or(Client::Any, Client::Regex),
                        groups: c.groups.clone(),
                    })
                }
                ProviderConfig::Lambda(c) => {
                    auth.lambda = Some(Lambda::new(
                        c.authorizer_url.clone(),
                        c.authorizer_result_ttl_in_seconds,
                        Duration::from_millis(c.timeout_ms),
                        c.identity_validation_expression
                            .as_deref()
                            .and_then(|re| whole_regex("", re).ok()),
                    ))
                }
                ProviderConfig::Iam(c) => {
                    auth.iam = Some(Iam {
                        keys: c
                            .access_keys
                            .iter()
                            .map(|k| AccessKey {
                                id: k.access_key_id.clone(),
                                secret: k.secret_access_key.clone(),
                            })
                            .collect(),
                        regions: c.regions.clone(),
                        max_skew: c.max_skew,
                    })
                }
            }
        }
        let [connect, publish, subscribe] = modes;
        auth.connect = connect.clone().unwrap_or_else(|| all.clone());
        auth.publish = publish.clone().unwrap_or_else(|| all.clone());
        auth.subscribe = subscribe.clone().unwrap_or(all);
        auth
    }

    fn has_issuer(&self, iss: &str) -> bool {
        self.jwt.iter().any(|p| p.verifier.issuer == iss)
    }

    fn has_access_key(&self, id: &str) -> bool {
        self.iam
            .as_ref()
            .is_some_and(|i| i.keys.iter().any(|k| k.id == id))
    }
}

/// The operation being authorized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Connect,
    Publish,
    Subscribe,
}

impl Op {
    fn lambda_name(self) -> &'static str {
        match self {
            Op::Connect => "EVENT_CONNECT",
            Op::Publish => "EVENT_PUBLISH",
            Op::Subscribe => "EVENT_SUBSCRIBE",
        }
    }
}

/// What a request authorizes with: its headers (the WebSocket's `header-`
/// object, a message's `authorization`, or the HTTP request's), and the
/// request a SigV4 signature covers.
pub struct Credential<'a> {
    pub headers: &'a Map<String, Value>,
    pub method: &'a str,
    pub path: &'a str,
    pub query: &'a str,
    pub body: &'a [u8],
}

fn header<'a>(headers: &'a Map<String, Value>, name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .and_then(|(_, v)| v.as_str())
}

/// An HTTP request's headers as an object of strings (lowercase names).
pub fn headers_object(headers: &axum::http::HeaderMap) -> Map<String, Value> {
    let mut m = Map::new();
    for (k, v) in headers.iter().take(64) {
        if let Ok(v) = v.to_str() {
            m.entry(k.as_str().to_owned())
                .or_insert_with(|| Value::String(v.to_owned()));
        }
    }
    m
}

fn denied(message: impl Into<String>) -> Denied {
    Denied {
        error_type: UNAUTHORIZED,
        message: message.into(),
    }
}

/// Which mode a request's credential is, for an app with providers.
fn mode_of(auth: &AppAuth, headers: &Map<String, Value>) -> Option<Mode> {
    if header(headers, "x-api-key").is_some() {
        return Some(Mode::ApiKey);
    }
    let value = header(headers, "authorization")?;
    if value.trim_start().starts_with(crate::auth_iam::SCHEME) {
        return Some(Mode::Iam);
    }
    let token = crate::auth_jwt::token_of(value);
    if let Some(iss) = crate::auth_jwt::peek_issuer(token) {
        if let Some(p) = auth.jwt.iter().find(|p| p.verifier.issuer == iss) {
            return Some(p.mode);
        }
    }
    auth.lambda.as_ref().map(|_| Mode::Lambda)
}

/// Authorize `op` (in namespace `ns`, on channel `channel`) for an app
/// with providers. Apps without them keep [`crate::auth`]'s API-key checks.
pub async fn authorize(
    keys: &AppKeys,
    cred: &Credential<'_>,
    op: Op,
    ns: Option<&str>,
    channel: Option<&str>,
) -> Result<(), Denied> {
    let auth = &keys.auth;
    let mut allowed = match op {
        Op::Connect => &auth.connect,
        Op::Publish => &auth.publish,
        Op::Subscribe => &auth.subscribe,
    };
    if let (Some(ns), false) = (ns, keys.namespaces.is_empty()) {
        let Some(config) = keys.namespaces.iter().find(|n| n.name == ns) else {
            return Err(Denied {
                error_type: "BadRequestException",
                message: format!("Namespace {ns:?} does not exist"),
            });
        };
        let own = match op {
            Op::Publish => &config.publish_auth_modes,
            Op::Subscribe => &config.subscribe_auth_modes,
            Op::Connect => &None,
        };
        if let Some(own) = own {
            allowed = own;
        }
    }
    let Some(mode) = mode_of(auth, cred.headers) else {
        return Err(denied(UNAUTHORIZED_MESSAGE));
    };
    if !allowed.contains(&mode) {
        return Err(denied(format!(
            "{} is not allowed for this operation",
            mode.name()
        )));
    }
    match mode {
        Mode::ApiKey => {
            let key = header(cred.headers, "x-api-key").unwrap_or_default();
            match (op, ns) {
                (Op::Connect, _) | (_, None) => auth::key_in(keys.effective_api_keys(), key)
                    .then_some(())
                    .ok_or_else(|| denied(UNAUTHORIZED_MESSAGE)),
                (Op::Publish, Some(ns)) => auth::check_namespace(keys, ns, Action::Publish, key),
                (Op::Subscribe, Some(ns)) => {
                    auth::check_namespace(keys, ns, Action::Subscribe, key)
                }
            }
        }
        Mode::Iam => {
            let iam = auth
                .iam
                .as_ref()
                .ok_or_else(|| denied(UNAUTHORIZED_MESSAGE))?;
            let signed = Signed {
                method: cred.method,
                path: cred.path,
                query: cred.query,
                headers: cred
                    .headers
                    .iter()
                    .filter_map(|(k, v)| Some((k.to_ascii_lowercase(), v.as_str()?.to_owned())))
                    .collect(),
                body: cred.body,
            };
            iam.verify(&signed).map(|_| ()).map_err(denied)
        }
        Mode::Cognito | Mode::Oidc => {
            let token = crate::auth_jwt::token_of(
                header(cred.headers, "authorization").unwrap_or_default(),
            );
            let iss = crate::auth_jwt::peek_issuer(token).unwrap_or_default();
            let p = auth
                .jwt
                .iter()
                .find(|p| p.mode == mode && p.verifier.issuer == iss)
                .ok_or_else(|| denied(UNAUTHORIZED_MESSAGE))?;
            let v = p.verifier.verify(token).await.map_err(|r| denied(r.0))?;
            if mode == Mode::Cognito {
                let use_ = v.str("token_use").unwrap_or("");
                let client = match use_ {
                    "access" => v.str("client_id"),
                    "id" => v.str("aud"),
                    _ => return Err(denied("Token is not a Cognito id or access token")),
                };
                if let Client::Regex(re) = &p.client {
                    if !client.is_some_and(|c| re.is_match(c)) {
                        return Err(denied("Token is for another app client"));
                    }
                }
                if !p.groups.is_empty()
                    && !v.groups().iter().any(|g| p.groups.iter().any(|w| w == g))
                {
                    return Err(denied("Token is not in an allowed Cognito group"));
                }
            } else if let Client::Id(id) = &p.client {
                if !v.names_client(id) {
                    return Err(denied("Token is for another audience"));
                }
            }
            Ok(())
        }
        Mode::Lambda => {
            let lambda = auth
                .lambda
                .as_ref()
                .ok_or_else(|| denied(UNAUTHORIZED_MESSAGE))?;
            let token = header(cred.headers, "authorization").unwrap_or_default();
            let cx = crate::auth_lambda::Context {
                api_id: &auth.app_id,
                operation: op.lambda_name(),
                namespace: ns,
                channel,
            };
            match lambda.authorize(token, &cx, cred.headers).await {
                Ok(a) if a.authorized => Ok(()),
                Ok(_) => Err(denied(UNAUTHORIZED_MESSAGE)),
                Err(e) => {
                    tracing::debug!(error = %e, "Lambda authorizer refused");
                    Err(denied(UNAUTHORIZED_MESSAGE))
                }
            }
        }
    }
}

/// The app a request without a known API key is for: the one whose
/// `hosts` lists the request's host; else the one whose provider knows the
/// credential (a JWT's issuer, an access key id); else the only app with
/// providers, when there is one.
pub fn app_for(
    node: &Node,
    keys: &Keys,
    headers: &Map<String, Value>,
    http_host: Option<&str>,
) -> Option<(Arc<Hub>, Arc<AppKeys>)> {
    if let Some(key) = header(headers, "x-api-key") {
        return keys.app_for_key(node, key);
    }
    let with_auth: Vec<(Arc<Hub>, Arc<AppKeys>)> = node
        .hubs()
        .filter_map(|hub| {
            let k = keys.of(&hub.app.id);
            k.auth.configured.then(|| (hub.clone(), k))
        })
        .collect();
    let host = header(headers, "host")
        .or(http_host)
        .map(|h| h.to_ascii_lowercase());
    if let Some(host) = host {
        let bare = host.split(':').next().unwrap_or("").to_owned();
        if let Some(found) = with_auth
            .iter()
            .find(|(_, k)| k.auth.hosts.iter().any(|h| *h == host || *h == bare))
        {
            return Some(found.clone());
        }
    }
    let auth_value = header(headers, "authorization").unwrap_or_default();
    if let Some(iss) = crate::auth_jwt::peek_issuer(crate::auth_jwt::token_of(auth_value)) {
        if let Some(found) = with_auth.iter().find(|(_, k)| k.auth.has_issuer(&iss)) {
            return Some(found.clone());
        }
    }
    if let Some(id) = auth_value
        .split("Credential=")
        .nth(1)
        .and_then(|c| c.split('/').next())
    {
        if let Some(found) = with_auth.iter().find(|(_, k)| k.auth.has_access_key(id)) {
            return Some(found.clone());
        }
    }
    match with_auth.as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    }
}

/// The body Amplify signs for a WebSocket message with SigV4: the
/// message's `channel` and `events`, as `JSON.stringify` writes them.
pub fn signed_message_body(channel: Option<&Value>, events: Option<&Value>) -> String {
    let mut m = Map::new();
    if let Some(c) = channel {
        m.insert("channel".into(), c.clone());
    }
    if let Some(e) = events {
        m.insert("events".into(), e.clone());
    }
    Value::Object(m).to_string()
}

impl crate::session::Base {
    /// Authorize a message's `op` in namespace `ns` on `channel`: with its
    /// own `authorization` object, else the connection's headers. An app
    /// without providers checks the API key as it always did. `path` and
    /// `body` are what a SigV4 signature of the message covers.
    pub async fn authorize(
        &self,
        own: Option<&Value>,
        op: Op,
        ns: &str,
        channel: &str,
        path: &str,
        body: &str,
    ) -> Result<(), Denied> {
        let own_headers = own.and_then(Value::as_object);
        if !self.keys.auth.configured {
            let own_key = own_headers.and_then(auth::api_key_of);
            let key = self.key_for(&own_key);
            let action = if op == Op::Publish {
                Action::Publish
            } else {
                Action::Subscribe
            };
            return auth::check_namespace(&self.keys, ns, action, key);
        }
        let none = Map::new();
        let cred = Credential {
            headers: own_headers
                .or(self.auth_headers.as_deref())
                .unwrap_or(&none),
            method: "POST",
            path,
            query: "",
            body: body.as_bytes(),
        };
        authorize(&self.keys, &cred, op, Some(ns), Some(channel)).await
    }
}
