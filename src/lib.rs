//! Herald: a self-hosted real-time messaging server. This crate is the
//! `herald` binary's library: the server around the core and its adapters.
//!
//! ```text
//! crates/core     herald-core: node, hub (a namespace per protocol),
//!                 fan-out, connections, the session loop, the broker's
//!                 traits and its in-process engine, stream history
//!                 (`history`), the adapter seam (`adapter`). Knows no
//!                 protocol.
//! crates/pusher   herald-pusher: Pusher Channels v7 (wire, sessions, the
//!                 HTTP API, signatures), on the core only.
//! crates/actioncable  herald-actioncable: Action Cable (actioncable-v1-json,
//!                 and actioncable-v1-ext-json's history and session
//!                 restore on one node) with AnyCable-compatible RPC (gRPC,
//!                 HTTP) to the app, `/_broadcast` and the broadcast
//!                 adapters, on the core only.
//! crates/anycable-proto  herald-anycable-proto: AnyCable's RPC messages,
//!                 shared by the adapter and the bench's RPC server
//! crates/appsync  herald-appsync: AWS AppSync's GraphQL pub/sub and Events
//!                 APIs (wires, sessions, HTTP publish), on the core only.
//! crates/broker   herald-broker: the Redis and NATS cluster engines behind
//!                 the core's broker traits
//! examples/echo-adapter  test-only: a fourth protocol through the seam
//! src/cli         this crate: the `herald` command, for any list of adapters
//! src/server      this crate: one listener, routing by path to each
//!                 adapter's routes, the adapters' tasks, health, metrics,
//!                 TLS, graceful shutdown
//! src/effective   this crate: the effective configuration, layer by layer
//!                 (defaults, file, peers' variables, `HERALD_*`, flags)
//! src/peers       this crate: the settings of the servers Herald replaces
//!                 (Reverb, soketi, AnyCable), read as they are
//! src/env_file    this crate: Laravel and Rails `.env` files, bounded
//! src/apps_db     this crate: apps from a PostgreSQL or MySQL/MariaDB table
//!                 in soketi's layout, read again every `refresh`
//! src/build_info  this crate: version, commit and date (`/version`)
//! adapters()      this crate: the adapters `herald` serves (the binary is
//!                 the core plus this list; see docs/architecture.md)
//! crates/signing  herald-signing: Pusher's HMAC/MD5 signatures, shared by
//!                 the server and the bench
//! crates/bench    herald-bench: `herald bench`, the load generator
//! ```
//!
//! A message's path: an adapter (a client event on a Pusher socket, or the
//! HTTP API) → `node.publish` → the hub's subscriber snapshot for this
//! node, queued on a fan-out worker, and the broker for other nodes →
//! frames built once per (protocol, tag) → each connection's bounded queue
//! → its session loop writes them, several per vectored write. See
//! docs/architecture.md.

pub mod apps_db;
pub mod build_info;
pub mod cli;
pub mod effective;
pub mod env_file;
pub mod peers;
pub mod server;

use herald_core::adapter::Adapters;
use std::sync::Arc;

/// The adapters `herald` serves: the core plus this list is the server
/// (docs/architecture.md, "The adapter seam"). A new protocol is a crate
/// with an adapter value and one line here.
pub fn adapters() -> Adapters {
    vec![
        Arc::new(herald_pusher::Pusher),
        Arc::new(herald_actioncable::ActionCable),
        Arc::new(herald_appsync::AppSync),
    ]
}
