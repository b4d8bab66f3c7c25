//! The in-process broker, Herald's default: with one node there is nobody
//! else to tell, and several nodes created in one process (tests) share one
//! instance and reach each other through it.

use super::{Broker, Inbox, NodeId};
use crate::fanout::Publication;
use std::sync::{Arc, RwLock};

#[derive(Default)]
pub struct LocalBroker {
    inboxes: RwLock<Vec<(NodeId, Arc<dyn Inbox>)>>,
}

impl LocalBroker {
    pub fn new() -> LocalBroker {
        LocalBroker::default()
    }
}

impl Broker for LocalBroker {
    fn attach(&self, node: NodeId, inbox: Arc<dyn Inbox>) {
        self.inboxes
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push((node, inbox));
    }

    fn publish(&self, origin: NodeId, app_id: &str, publication: Arc<Publication>) {
        let inboxes = self.inboxes.read().unwrap_or_else(|e| e.into_inner());
        for (node, inbox) in inboxes.iter() {
            if *node != origin {
                inbox.deliver(app_id, publication.clone());
            }
        }
    }

    fn name(&self) -> &'static str {
        "local"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    struct Recorder(Mutex<Vec<String>>);
    impl Inbox for Recorder {
        fn deliver(&self, app_id: &str, p: Arc<Publication>) {
            self.0
                .lock()
                .unwrap()
                .push(format!("{app_id}/{}", p.channel));
        }
    }

    #[test]
    fn delivers_to_other_nodes_only() {
        let broker = LocalBroker::new();
        let a = Arc::new(Recorder(Mutex::new(vec![])));
        let b = Arc::new(Recorder(Mutex::new(vec![])));
        broker.attach(1, a.clone());
        broker.attach(2, b.clone());
        let p = Arc::new(Publication::new(
            "news".into(),
            "e".into(),
            crate::fanout::json_string("x"),
            None,
            None,
        ));
        broker.publish(1, "app", p);
        assert!(a.0.lock().unwrap().is_empty());
        assert_eq!(*b.0.lock().unwrap(), vec!["app/news".to_string()]);
    }
}
