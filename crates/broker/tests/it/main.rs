//! herald-broker's integration tests: one test binary, one module per
//! behaviour, each against real redis-server / nats-server processes
//! started by `herald_broker::testing`. Run one module with
//! `cargo test -p herald-broker --test it -- MODULE::`.

mod engines;
mod jetstream_history;
mod jetstream_sessions;
mod redis_sessions;
mod shard_follow;
