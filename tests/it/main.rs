//! The herald package's integration tests: one test binary, one module per
//! behaviour. Each module starts real `herald` processes (and, where it
//! needs them, real redis-server / nats-server processes) through `common`
//! and drives them with real clients over loopback.
//!
//! One binary rather than one per file: each binary links the whole server,
//! and fifty links cost a fresh CI run minutes. Run one module with
//! `cargo test --test it -- MODULE::`.

#[macro_use]
mod common;

mod actioncable;
mod actioncable_broker;
mod actioncable_ext;
mod actioncable_ext_answers;
mod actioncable_ext_cluster;
mod actioncable_ext_nats;
mod actioncable_ext_nats_cluster;
mod actioncable_ext_redis;
mod actioncable_ext_redis_sessions;
mod actioncable_ext_rpc_presence;
mod actioncable_remote;
mod actioncable_sse;
mod api_body_prop;
mod apps_database;
mod apps_reload;
mod appsync;
mod bad_input;
mod bench_actioncable;
mod bench_fault;
mod bench_processes;
mod bench_reliable;
mod bench_rolling;
mod bench_scenarios;
mod broker_canary;
mod broker_tls;
mod channels;
mod cluster;
mod config_errors;
mod config_layers;
mod connection;
mod dashboard;
mod deflate;
mod development_app;
mod direct_writes;
mod harness;
mod hostile_conns;
mod http_api;
mod limits;
mod maps;
mod memory_bounds;
mod metrics;
mod nats_cluster;
mod open_files;
mod origins;
mod parsers_prop;
mod peer_settings;
mod redis_cluster;
mod redis_sentinel;
mod shutdown;
mod slow_client;
mod tls;
mod version;
mod webhook_tally;
mod webhooks;
mod worst_day;
mod worst_day_protocols;
mod write_delay;
