//! Unit tests of `config` (kept apart so config.rs stays one concept a
//! reader can hold).

use super::*;

#[test]
fn defaults_serve_the_development_app() {
    let c = Config::load(None, &Overrides::default()).unwrap();
    assert_eq!(c.port, 8080);
    assert_eq!(c.apps, vec![AppConfig::development()]);
    assert!(c.apps[0].is_development());
}

#[test]
fn unknown_key_is_named() {
    // Kept raw for the adapters; with none claiming them, refused.
    let c = Config::from_toml("prot = 1", "x.toml").unwrap();
    let err = crate::adapter::check_config(&c, &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("`prot`"), "{err}");
    let c = Config::from_toml(
        "[[apps]]\nid='a'\nkey='b'\nsecret='c'\nmax_conections=3",
        "x.toml",
    )
    .unwrap();
    let err = crate::adapter::check_config(&c, &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("apps[0].max_conections"), "{err}");
}

#[test]
fn adapter_keys_are_set_raw() {
    let mut c = Config::default();
    c.set("rpc.host", toml::Value::String("h:1".into()))
        .unwrap();
    c.set("webhook_queue", toml::Value::Integer(3)).unwrap();
    c.set("apps[0].api_keys", toml::Value::Array(vec![]))
        .unwrap();
    assert_eq!(c.sections["rpc"]["host"].as_str(), Some("h:1"));
    assert_eq!(c.sections["webhook_queue"].as_integer(), Some(3));
    assert!(c.apps[0].is_development() && c.apps[0].extra.contains_key("api_keys"));
    c.apps.push(AppConfig::development());
    assert!(c
        .set("apps[0].api_keys", toml::Value::Array(vec![]))
        .is_err());
}

#[test]
fn wrong_type_is_named() {
    let err = Config::from_toml("port = \"eighty\"", "x.toml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("port"), "{err}");
}

#[test]
fn semantic_errors_name_the_key() {
    let mut c = Config::from_toml(
        "[[apps]]\nid='a'\nkey='k'\nsecret='s'\n[[apps]]\nid='b'\nkey='k'\nsecret='s'",
        "x",
    )
    .unwrap();
    c.apply(&Overrides::default()).unwrap();
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("apps[1].key"), "{err}");
}

#[test]
fn metrics_port_must_differ_from_port() {
    let mut c = Config::from_toml("port = 9000\nmetrics_port = 9000", "x").unwrap();
    c.apply(&Overrides::default()).unwrap();
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("metrics_port"), "{err}");
}

#[test]
fn broker_settings_are_checked() {
    let c = Config::from_toml("[broker]\nurl = 'nats://u:p@127.0.0.1:4222'\nttl = 3", "x").unwrap();
    c.validate().unwrap();
    assert_eq!(c.broker.shown_url(), "nats://***@127.0.0.1:4222");
    assert_eq!(c.broker.prefix, "herald");
    for (toml, key) in [
        ("[broker]\nurl = 'http://x'", "broker.url"),
        ("[broker]\nprefix = 'a.b'", "broker.prefix"),
        ("[broker]\nttl = 0", "broker.ttl"),
    ] {
        let err = Config::from_toml(toml, "x")
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains(key), "{err}");
    }
    let err = Config::from_toml("[broker]\nurll = 'x'", "x").unwrap_err();
    assert!(err.to_string().contains("urll"), "{err}");
}

#[test]
fn keepalive_interval_is_checked() {
    let err = Config::from_toml("keepalive_interval = 0", "x")
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string();
    assert!(err.contains("keepalive_interval"), "{err}");
}

#[test]
fn connection_deadlines_and_address_limits_are_checked() {
    let c = Config::load(None, &Overrides::default()).unwrap();
    assert_eq!(c.http_header_timeout(), Duration::from_secs(10));
    assert_eq!(c.address_limits_exempt().len(), 2);
    let c =
        Config::from_toml("address_limits_exempt = ['10.0.0.0/8', '192.168.1.7']", "x").unwrap();
    c.validate().unwrap();
    assert!(
        c.address_limits_exempt()[1].contains(&"192.168.1.7".parse::<std::net::IpAddr>().unwrap())
    );
    for (toml, key) in [
        ("http_header_timeout = 0", "http_header_timeout"),
        ("http_header_timeout = 301", "http_header_timeout"),
        ("ws_idle_timeout = 0", "ws_idle_timeout"),
        (
            "address_limits_exempt = ['nope']",
            "address_limits_exempt[0]",
        ),
        (
            "address_limits_exempt = ['10.0.0.0/33']",
            "address_limits_exempt[0]",
        ),
    ] {
        let err = Config::from_toml(toml, "x")
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains(key), "{toml}: {err}");
    }
}

#[test]
fn later_layers_override_earlier_ones() {
    let mut c = Config::from_toml("port = 9000\nhost = '0.0.0.0'", "x").unwrap();
    c.apply(&Overrides {
        port: Some(9100),
        app_secret: Some("s3cret".into()),
        ..Overrides::default()
    })
    .unwrap();
    assert_eq!(c.port, 9100);
    assert_eq!(c.host, "0.0.0.0");
    assert_eq!(c.apps[0].secret, "s3cret");
    assert_eq!(c.apps[0].key, DEV_APP_KEY);
}

#[test]
fn a_log_filter_that_matches_nothing_herald_logs_is_refused() {
    for ok in [
        "info",
        "WARN",
        "herald=debug",
        "herald_core::node=trace,info",
        "hyper=debug",
        "off",
        "info,async_nats=warn",
    ] {
        check_log_filter(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    for bad in ["verbose", "info,loud", "verbose=debug", "herald=loud"] {
        let err = check_log_filter(bad).expect_err(bad);
        assert!(!err.is_empty(), "{bad}");
    }
    let mut c = Config::load(None, &Overrides::default()).unwrap();
    c.log = "verbose".into();
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("log") && err.contains("verbose"), "{err}");
}

#[test]
fn hosts_are_ip_addresses_of_either_family() {
    let ip = |host: &str| {
        let c = Config {
            host: host.into(),
            ..Config::default()
        };
        c.bind_ip().map(|ip| ip.to_string()).map_err(|e| {
            assert!(e.to_string().contains("`host`"), "{e}");
        })
    };
    assert_eq!(ip("localhost"), Ok("127.0.0.1".into()));
    assert_eq!(ip("0.0.0.0"), Ok("0.0.0.0".into()));
    assert_eq!(ip("::1"), Ok("::1".into()));
    assert_eq!(ip("[::1]"), Ok("::1".into()));
    assert_eq!(ip("::"), Ok("::".into()));
    assert_eq!(ip("[2001:db8::7]"), Ok("2001:db8::7".into()));
    assert_eq!(ip("::ffff:10.0.0.1"), Ok("10.0.0.1".into()));
    // (`::1:8080` is an address: 0:0:0:0:0:0:1:8080.)
    for bad in [
        "",
        "example.com",
        "[127.0.0.1]",
        "[::1",
        "::1]",
        "::1%lo",
        "[::1]:80",
    ] {
        assert!(ip(bad).is_err(), "{bad:?}");
    }
}
