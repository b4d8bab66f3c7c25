//! What a session tells the app with every call: the client's request (its
//! URL, its address and the forwarded headers) and the states the app
//! keeps in it (`cstate`, and each subscription's `istate`), as AnyCable
//! sends them.
//!
//! Every idle connection holds one of these for its whole life, inside
//! its task, and most apps never set a state, so it is kept compact: the
//! request as one text (a list of boxed strings and a box around them
//! took 64 bytes more per connection, bench/RESULTS.md "Idle memory"),
//! and the states only once the app sets one (two empty maps are 96 bytes
//! inline). The call's `Env` is built from it per call, as it always was
//! (the maps were cloned per call before).

use crate::proto::Env;
use std::collections::HashMap;
use std::net::IpAddr;

/// Most state keys kept per connection (connection and channel states).
pub const MAX_STATE_KEYS: usize = 1000;

/// A state map: key → value, as the app sets them.
pub type State = HashMap<String, String>;

/// The header the client's address is sent as.
const REMOTE_ADDR: &str = "REMOTE_ADDR";

/// The client's request and the app's states.
pub(super) struct SessionEnv {
    /// One line each: the URL, the client's address (empty when unknown),
    /// then each forwarded header's name and value. No part holds a line
    /// feed: a header value `to_str` accepts and a URI cannot have one, and
    /// [`SessionEnv::new`] drops any part that would.
    request: Box<str>,
    states: Option<Box<States>>,
}

#[derive(Default)]
struct States {
    cstate: State,
    /// Subscription identifier → its state.
    istate: HashMap<String, State>,
}

impl SessionEnv {
    pub(super) fn new(url: String, headers: &[(&str, &str)], peer: Option<IpAddr>) -> SessionEnv {
        let clean = |t: &str| !t.contains('\n');
        let mut request = if clean(&url) { url } else { String::new() };
        request.push('\n');
        if let Some(ip) = peer {
            use std::fmt::Write;
            let _ = write!(request, "{ip}");
        }
        for (name, value) in headers.iter().filter(|(n, v)| clean(n) && clean(v)) {
            request.push('\n');
            request.push_str(name);
            request.push('\n');
            request.push_str(value);
        }
        SessionEnv {
            request: request.into_boxed_str(),
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
        let mut lines = self.request.split('\n');
        let url = lines.next().unwrap_or_default().to_owned();
        let peer = lines.next().filter(|p| !p.is_empty());
        let mut headers = HashMap::new();
        while let (Some(name), Some(value)) = (lines.next(), lines.next()) {
            headers.insert(name.to_owned(), value.to_owned());
        }
        if let Some(ip) = peer {
            headers.insert(REMOTE_ADDR.to_owned(), ip.to_owned());
        }
        Env {
            url,
            headers,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_comes_back_whole() {
        let env = SessionEnv::new(
            "http://example.com/cable?x=1".into(),
            &[("cookie", "a=b; c=d"), ("x-api-key", "k\tv")],
            Some("2001:db8::1".parse().unwrap()),
        );
        let e = env.for_connect();
        assert_eq!(e.url, "http://example.com/cable?x=1");
        assert_eq!(e.headers.len(), 3);
        assert_eq!(e.headers["cookie"], "a=b; c=d");
        assert_eq!(e.headers["x-api-key"], "k\tv");
        assert_eq!(e.headers["REMOTE_ADDR"], "2001:db8::1");
    }

    #[test]
    fn no_address_no_headers() {
        let e = SessionEnv::new("ws://h/cable".into(), &[], None).for_connect();
        assert_eq!(e.url, "ws://h/cable");
        assert!(e.headers.is_empty());
        let e = SessionEnv::new(String::new(), &[("cookie", "")], None).for_connect();
        assert_eq!(e.url, "");
        assert_eq!(e.headers.len(), 1);
        assert_eq!(e.headers["cookie"], "");
    }

    /// A part with a line feed would shift every later line: it is
    /// dropped, and the rest stays as it was.
    #[test]
    fn a_part_with_a_line_feed_is_dropped() {
        let env = SessionEnv::new(
            "http://h/\nx".into(),
            &[("bad", "a\nb"), ("cookie", "c")],
            Some("127.0.0.1".parse().unwrap()),
        );
        let e = env.for_connect();
        assert_eq!(e.url, "");
        assert_eq!(e.headers.len(), 2);
        assert_eq!(e.headers["cookie"], "c");
        assert_eq!(e.headers["REMOTE_ADDR"], "127.0.0.1");
    }
}
