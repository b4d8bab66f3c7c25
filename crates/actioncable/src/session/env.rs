//! What a session tells the app with every call: the client's request (its
//! URL and the forwarded headers) and the states the app keeps in it
//! (`cstate`, and each subscription's `istate`), as AnyCable sends them.
//!
//! Every idle connection holds one of these for its whole life, and most
//! apps never set a state, so it is kept compact: the request as boxed
//! strings and one small list (a map with one header made room for four,
//! about 200 bytes), and the states only once the app sets one (two empty
//! maps are 96 bytes inline). The call's `Env` is built from it per call,
//! as it always was (the maps were cloned per call before).

use crate::proto::Env;
use std::collections::HashMap;
use std::net::IpAddr;

/// Most state keys kept per connection (connection and channel states).
pub const MAX_STATE_KEYS: usize = 1000;

/// A state map: key → value, as the app sets them.
pub type State = HashMap<String, String>;

/// The client's request and the app's states.
pub(super) struct SessionEnv {
    url: Box<str>,
    headers: Box<[(Box<str>, Box<str>)]>,
    /// The client's address, sent as the `REMOTE_ADDR` header. Kept as an
    /// address: as a header it took three allocations (the list, the name
    /// and the text), about 100 bytes per connection.
    peer: Option<IpAddr>,
    states: Option<Box<States>>,
}

#[derive(Default)]
struct States {
    cstate: State,
    /// Subscription identifier → its state.
    istate: HashMap<String, State>,
}

impl SessionEnv {
    pub(super) fn new(
        url: String,
        headers: Vec<(Box<str>, Box<str>)>,
        peer: Option<IpAddr>,
    ) -> SessionEnv {
        SessionEnv {
            url: url.into_boxed_str(),
            headers: headers.into_boxed_slice(),
            peer,
            states: None,
        }
    }

    /// Both states, as a restored session had them.
    pub(super) fn restore(&mut self, cstate: &State, istate: &HashMap<String, State>) {
        if cstate.is_empty() && istate.is_empty() {
            return;
        }
        let s = self.states_mut();
        s.cstate = cstate.clone();
        s.istate = istate.clone();
    }

    fn states_mut(&mut self) -> &mut States {
        self.states.get_or_insert_with(Box::default)
    }

    pub(super) fn cstate(&self) -> State {
        self.states
            .as_ref()
            .map_or_else(State::new, |s| s.cstate.clone())
    }

    pub(super) fn istate(&self) -> HashMap<String, State> {
        self.states
            .as_ref()
            .map_or_else(HashMap::new, |s| s.istate.clone())
    }

    /// One key of one subscription's state.
    pub(super) fn state_of(&self, identifier: &str, key: &str) -> Option<&str> {
        let s = self.states.as_ref()?.istate.get(identifier)?;
        s.get(key).map(String::as_str)
    }

    /// Apply the app's changes to the connection state.
    pub(super) fn merge_cstate(&mut self, changes: &State) {
        if !changes.is_empty() {
            merge(&mut self.states_mut().cstate, changes);
        }
    }

    /// Apply the app's changes to one subscription's state.
    pub(super) fn merge_istate(&mut self, identifier: &str, changes: &State) {
        if !changes.is_empty() {
            let entry = self
                .states_mut()
                .istate
                .entry(identifier.to_owned())
                .or_default();
            merge(entry, changes);
        }
    }

    /// A subscription ended: its state goes with it.
    pub(super) fn forget(&mut self, identifier: &str) {
        if let Some(s) = &mut self.states {
            s.istate.remove(identifier);
        }
    }

    fn base(&self) -> Env {
        Env {
            url: self.url.to_string(),
            headers: self
                .headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .chain(
                    self.peer
                        .map(|ip| ("REMOTE_ADDR".to_owned(), ip.to_string())),
                )
                .collect(),
            cstate: self.cstate(),
            istate: HashMap::new(),
        }
    }

    /// For `Connect`: the request alone.
    pub(super) fn for_connect(&self) -> Env {
        self.base()
    }

    /// For a command of one subscription: its own state.
    pub(super) fn for_channel(&self, identifier: &str) -> Env {
        let mut env = self.base();
        if let Some(s) = self.states.as_ref().and_then(|s| s.istate.get(identifier)) {
            env.istate = s.clone();
        }
        env
    }

    /// For `Disconnect`: every subscription's state, each as JSON.
    pub(super) fn for_disconnect(&self) -> Env {
        let mut env = self.base();
        if let Some(s) = &self.states {
            env.istate = s
                .istate
                .iter()
                .map(|(id, s)| {
                    (
                        id.clone(),
                        serde_json::to_string(s).expect("a string map serializes"),
                    )
                })
                .collect();
        }
        env
    }
}

/// Apply a state change: an empty value removes the key.
fn merge(into: &mut State, changes: &State) {
    for (k, v) in changes {
        if v.is_empty() {
            into.remove(k);
        } else if into.len() < MAX_STATE_KEYS || into.contains_key(k) {
            into.insert(k.clone(), v.clone());
        }
    }
}
