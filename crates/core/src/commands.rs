//! Adapters' commands for the whole cluster: an adapter registers a
//! handler for its namespace ([`crate::node::Node::on_command`]); a command
//! given to any node ([`crate::node::Node::command`]) runs there and, as
//! the broker's `Control::Command`, on every other node. Action Cable's
//! remote disconnect is one. Kept apart from the node so the node's file
//! stays about routing.

use crate::hub::Hub;
use crate::namespace::Namespace;
use parking_lot::RwLock;
use std::sync::Arc;

/// Runs a command's text in an app's hub. Called on the broker's task (or
/// the caller's): it must not block (close connections, queue work).
pub type CommandHandler = Arc<dyn Fn(&Arc<Hub>, &str) + Send + Sync>;

/// The handlers, by namespace (a handful, registered at start).
#[derive(Default)]
pub struct Commands(RwLock<Vec<(Namespace, CommandHandler)>>);

impl Commands {
    pub fn add(&self, ns: Namespace, handler: CommandHandler) {
        self.0.write().push((ns, handler));
    }

    /// Run `body` with every handler of the namespace named `ns`.
    pub fn run(&self, hub: &Arc<Hub>, ns: &str, body: &str) {
        for (n, handler) in self.0.read().iter() {
            if n.as_str() == ns {
                handler(hub, body);
            }
        }
    }
}
