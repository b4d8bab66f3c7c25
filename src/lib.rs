//! Herald: a self-hosted real-time messaging server.
//!
//! A message's path through the crate, and where each piece lives:
//!
//! ```text
//! server      listener, routing by path, health, graceful shutdown
//!   │
//!   ├─ session::pusher   one task per WebSocket: reads client frames,
//!   │    │               writes queued frames in batches (the connection writer)
//!   │    └─ protocol::pusher   parse/encode Pusher v7 frames, error codes
//!   ├─ api               Pusher HTTP API, request signatures (api::auth)
//!   ▼
//! hub         per app: channels, presence, cache channels, users, limits,
//!   │         auth decisions shared by every protocol (hub::channel, hub::presence)
//!   ▼ publish
//! broker      the only way to other nodes: local today, Redis/NATS next
//!   ▼ deliver
//! fanout      a Publication encoded once per protocol, bytes shared by all
//!   ▼
//! connection  a subscriber's bounded queue; full means too slow → closed
//! ```
//!
//! Around them: `config` (defaults → TOML → env → flags), `node` (the
//! process: hubs, broker, lifecycle), `signing` (re-exports the
//! `herald-signing` crate, crates/signing: HMACs in constant time),
//! and `metrics` (counters for `/metrics`). `herald bench` is its own
//! crate, crates/bench (`herald-bench`), which the binary calls.

pub mod api;
pub mod broker;
pub mod config;
pub mod connection;
pub mod fanout;
pub mod hub;
pub mod metrics;
pub mod node;
pub mod protocol;
pub mod server;
pub mod session;
pub use herald_signing as signing;
