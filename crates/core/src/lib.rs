//! Herald's protocol-neutral core. Protocol adapters (Pusher, Action Cable,
//! AppSync) sit on top of it; it knows none of them.
//!
//! A message's path through the core, and where each piece lives:
//!
//! ```text
//! adapter      parses a client frame or an HTTP publish, decides what the
//!   │          channel name means, calls the node with its namespace
//!   ▼
//! node         routes: this node's subscribers at once (fan-out), other
//!   │  │       nodes through the broker; publishes reliably when asked
//!   │  │       (`reliable`: ordered per stream, positioned in the
//!   │  │       history); tells the cluster about interest and presence;
//!   │  │       answers queries for the whole cluster
//!   │  └────► broker     the cluster's interface, small traits by concern
//!   │                     (pub/sub, presence, occupancy, queries, last
//!   │                     event, counts, streams: history and sessions);
//!   │                     local engine in-process
//!   ▼
//! hub          per app: one space per namespace (channels and patterns →
//!   │          subscriptions (connection, tag), presence members, counts),
//!   │          cache slots, users, the app's connections
//!   ▼
//! fanout       a worker builds each frame once per (wire, tag) and queues
//!   │          the same bytes to every subscriber
//!   ▼
//! connection   a subscriber's bounded queue; full means too slow → closed;
//!   │          its gate orders reliable streams' live and history frames
//!   ▼
//! session      the one loop for every protocol: reads (ws), keep-alive,
//!              vectored writes of queued frames, close handshake
//! ```
//!
//! On the ground floor, what all of them name: `publication` (the
//! publication, its ids, its position, its frames built once per (wire,
//! tag), and the `Wire` an adapter implements to encode it), `future` (the
//! boxed future of the async interfaces), `namespace` (each protocol's own
//! space of channel names) and `frame` (finished WebSocket frames, shared).
//!
//! Around them: `apps` (the apps a node serves, changed while it runs),
//! `ws` (the upgrade and the client-frame decoder), `relay`
//! (a session socket in memory, for transports that carry messages: HTTP
//! fallbacks run the same session loop on it), `config`
//! (the core's settings; adapters' keys kept raw for them), `adapter` (the
//! seam: what a protocol crate hands the server: its keys, routes, tasks),
//! `reliable` (reliable publishing, what a protocol that resumes its
//! clients asks of the core: follow a stream, publish with positions, read
//! the history since a position), `history` (the bounded stream history
//! engines keep; each connection's gate is `connection::gate`),
//! `sessions` (snapshots of sessions a client restores), `metrics`,
//! `observer` (what the node decided about channels and members, for
//! webhooks and the dashboard), `origin` (which web pages may connect to
//! an app), `confirm` (subscribers waiting for the
//! broker to hold their channel's interest before they are confirmed),
//! `commands` (adapters' commands run on every node, such as a remote
//! disconnect), `load` (the recent delivery rate that decides whether write
//! coalescing is worth its delay, and the process clock), `reaper` (the
//! bounded teardown of sessions whose clients went away),
//! `deflate` (permessage-deflate: the upgrade's negotiation, each
//! publication compressed once for its subscribers, client messages
//! inflated within `max_frame_size`), and
//! `testing` (wires for tests; only with the `testing` feature, which
//! dev-dependencies enable).

pub mod adapter;
pub mod apps;
pub mod broker;
pub mod commands;
pub mod config;
pub mod confirm;
pub mod connection;
pub mod deflate;
pub mod fanout;
pub mod frame;
pub mod future;
pub mod history;
pub mod hub;
pub mod load;
pub mod metrics;
pub mod namespace;
pub mod node;
pub mod observer;
pub mod origin;
pub mod publication;
pub mod reaper;
pub mod relay;
pub mod reliable;
pub mod session;
pub mod sessions;
/// Test helpers: only with the `testing` feature (dev-dependencies) or in
/// the crate's own unit tests.
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod ws;
