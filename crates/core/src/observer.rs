//! Observers: what the node decided about an app's channels and members,
//! for whoever registered to hear it (an adapter's webhooks, the
//! dashboard). The core never calls out otherwise.
//!
//! What is reported, and who decides it:
//!
//! - `Occupied` / `Vacated`: a channel's first subscriber joined, its last
//!   left. The node asks the broker ([`crate::broker::Occupancy::occupancy`])
//!   whether that changed the channel for the whole cluster, so exactly one
//!   node reports it; with one node the node's own count decides. An
//!   engine may have another node report it instead
//!   ([`crate::broker::Inbox::observed`]), as it does for a dead node's
//!   channels.
//! - `MemberAdded` / `MemberRemoved`: a presence member's first socket
//!   anywhere joined, its last one anywhere left, decided the same way
//!   ([`crate::broker::Occupancy::member`]).
//! - `CacheMiss`: a subscriber asked for a channel's last event and there
//!   was none.
//! - `SubscriptionCount`: a counted channel's count changed (coalesced, as
//!   the count pushes are; the cluster's total, reported by the node with
//!   the lowest id among those with subscribers).
//! - `Published`: a publication passed through this node's `publish`, only
//!   while somebody watches ([`crate::node::Node::watch_publications`]).
//! - `ClientEvent`: reported by an adapter ([`crate::node::Node::notify`])
//!   when a client published on a channel.
//!
//! Observers are called on the task that made the change: they must not
//! block (queue the work and return).

use crate::future::BoxFuture;
use crate::namespace::Namespace;
use crate::publication::Publication;
use std::time::Instant;

/// Something that happened in one app, in one namespace (observers are
/// told which, beside the change).
#[derive(Debug, Clone, Copy)]
pub enum Change<'a> {
    Occupied {
        channel: &'a str,
    },
    Vacated {
        channel: &'a str,
    },
    MemberAdded {
        channel: &'a str,
        user_id: &'a str,
    },
    MemberRemoved {
        channel: &'a str,
        user_id: &'a str,
    },
    CacheMiss {
        channel: &'a str,
    },
    SubscriptionCount {
        channel: &'a str,
        count: usize,
    },
    Published(&'a Publication),
    /// A client's own publication (its `exclude` is the sender's socket,
    /// its `user_id` the sender's user where the protocol has one).
    ClientEvent(&'a Publication),
}

/// Hears about changes in every app of a node.
pub trait Observer: Send + Sync {
    fn changed(&self, app_id: &str, ns: Namespace, change: &Change<'_>);

    /// A channel occupied or vacated, or a member added or removed, in the
    /// cluster, that another node reports: for displays of the whole
    /// cluster (a dashboard's console), never for notifications (those go
    /// out once, from the node that reports it, through `changed`).
    fn seen(&self, _app_id: &str, _ns: Namespace, _change: &Change<'_>) {}

    /// A member removed (or a channel vacated) for the whole cluster
    /// because the node that held it is gone (it left, or the engine
    /// declared it dead): reported once, by the node the engine picks.
    /// Nobody announced these leaves (the node that could is gone), so an
    /// adapter that announces leaves itself does it here. By default, as
    /// any other change.
    fn gone(&self, app_id: &str, ns: Namespace, change: &Change<'_>) {
        self.changed(app_id, ns, change)
    }

    /// Graceful shutdown: finish pending work before `deadline`.
    fn flush(&self, _deadline: Instant) -> BoxFuture<()> {
        Box::pin(std::future::ready(()))
    }
}
