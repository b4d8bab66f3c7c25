//! Presence members: who is in a presence channel, on this node and, as the
//! broker reports them, on other nodes. A user with several sockets, on one
//! node or several, is one member: it is announced when its first socket
//! anywhere joins and removed when its last socket anywhere leaves.

use crate::publication::NodeId;
use serde_json::value::RawValue;

/// A member's id and info, as a member list gives them.
pub type Record = (String, Option<Box<RawValue>>);

/// A member as the adapter describes it when subscribing.
#[derive(Debug, Clone)]
pub struct Member {
    pub user_id: String,
    pub info: Option<Box<RawValue>>,
}

/// One member of one channel.
#[derive(Debug)]
pub struct MemberState {
    /// As given by the member's first socket.
    pub info: Option<Box<RawValue>>,
    /// Sockets of this user in the channel on this node.
    pub local: u32,
    /// Other nodes where the user has a socket in the channel.
    pub remote: Vec<NodeId>,
}

impl MemberState {
    pub fn new(info: Option<Box<RawValue>>) -> MemberState {
        MemberState {
            info,
            local: 0,
            remote: Vec::new(),
        }
    }

    /// A member somewhere in the cluster.
    pub fn visible(&self) -> bool {
        self.local > 0 || !self.remote.is_empty()
    }
}
