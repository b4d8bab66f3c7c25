//! Subjects and publications: the subject of a (namespaced) channel or
//! pattern, publishing to it, interest (the wanted set the transport
//! subscribes to), and subscription counts on a channel's subject.

#[allow(unused_imports)]
use super::*;

impl Shared {
    pub(super) fn channel_subject(&self, app: &str, ns: Namespace, channel: &str) -> String {
        subject::channel(&self.prefix, app, ns, channel)
    }

    pub(super) fn want_subject(
        &self,
        app: &str,
        ns: Namespace,
        channel: &str,
        pattern: bool,
    ) -> String {
        if pattern {
            subject::pattern(&self.prefix, app, ns, channel, self.wildcard)
        } else {
            self.channel_subject(app, ns, channel)
        }
    }
}

impl PubSub for Engine {
    /// Kept in the journal (numbered, held until the broker takes it, then
    /// for the window), queued at once while the broker is up.
    fn publish(&self, app_id: &str, p: &Publication) -> Result<(), Full> {
        let sh = &self.shared;
        let subject = if p.to_user.is_some() {
            sh.all()
        } else {
            sh.channel_subject(app_id, p.ns, &p.channel)
        };
        let me = sh.me();
        sh.journal.publish(
            subject,
            |s| {
                serde_json::to_vec(&PubRef::Pub {
                    n: me,
                    a: app_id,
                    p,
                    s,
                })
                .unwrap_or_default()
            },
            &sh.out,
        )
    }

    fn interest(
        &self,
        _node: NodeId,
        app_id: &str,
        ns: Namespace,
        channel: &str,
        pattern: bool,
        on: bool,
    ) {
        let sh = &self.shared;
        let subject = sh.want_subject(app_id, ns, channel, pattern);
        {
            let mut s = sh.state.lock();
            if on {
                if s.wanted.contains_key(&subject) {
                    return;
                }
                s.wanted.insert(
                    subject.clone(),
                    Want {
                        app: app_id.to_owned(),
                        ns,
                        channel: channel.to_owned(),
                        pattern,
                    },
                );
            } else {
                if s.wanted.remove(&subject).is_none() {
                    return;
                }
                if !pattern {
                    let channel = ChannelId(ns, channel.to_owned());
                    let key = (app_id.to_owned(), Scope::Channel(channel));
                    for scopes in s.remote.values_mut() {
                        scopes.remove(&key);
                    }
                }
            }
            s.dirty.insert(subject);
        }
        sh.wake.notify_one();
    }

    fn holding(&self) -> bool {
        self.shared.is_holding()
    }

    fn held(&self, within: Duration) -> BoxFuture<bool> {
        super::interest::held(&self.shared, within)
    }
}

impl Counts for Engine {
    fn counts(&self, node: NodeId, app_id: &str, ns: Namespace, counts: Vec<(String, usize)>) {
        let sh = &self.shared;
        for (channel, c) in counts {
            let subject = sh.channel_subject(app_id, ns, &channel);
            let msg = Msg::Count {
                n: node,
                a: app_id.to_owned(),
                ns,
                ch: channel,
                c,
            };
            sh.send_msg(subject, &msg);
        }
    }
}
