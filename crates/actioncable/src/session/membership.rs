//! A session's presence memberships and whispers (`actioncable-v1-ext-json`):
//! its `join`, `leave`, `presence` and `whisper` commands, and what becomes
//! of its memberships when a subscription or the connection ends (a child
//! of `session`, which it extends; the protocol's part is
//! `crate::ext::presence`).

use super::*;
use crate::ext::presence as p;
use herald_core::broker::Scope;
use herald_core::hub::Refused;
use herald_core::namespace::ChannelId;
use herald_core::publication::Publication;

impl CableSession {
    /// The stream a subscription's state enables for `key` (`$p`, `$w`).
    fn enabled_stream(&self, identifier: &str, key: &str) -> Option<String> {
        self.env
            .state_of(identifier, key)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    }

    /// A `$pubsub` subscription's state: presence and whispers on its
    /// stream as `rpc.streams_presence` / `rpc.streams_whisper` say
    /// (always on a public stream), as anycable-go decides them.
    pub(super) fn pubsub_state(&mut self, identifier: &str, stream: &str, public: bool) {
        let s = &self.cable.presence;
        let mut state = HashMap::new();
        if public || s.streams_presence {
            state.insert(p::PRESENCE_STATE.to_owned(), stream.to_owned());
        }
        if public || s.streams_whisper {
            state.insert(p::WHISPER_STATE.to_owned(), stream.to_owned());
        }
        self.env.merge_istate(identifier, &state);
    }

    fn refuse_presence(&self, identifier: &str, why: &str) {
        metrics::count(&m::CABLE_PRESENCE_REFUSED);
        tracing::debug!(sid = %self.conn.socket_id, why, "presence command refused");
        self.send(&p::error_frame(identifier, why));
    }

    /// The presence stream of a confirmed subscription, after the rate
    /// check; `None` when the command was answered (or, for an unknown
    /// subscription, ignored as every command for one is).
    fn presence_stream(&mut self, identifier: &str) -> Option<String> {
        if self.find(identifier).is_none() {
            metrics::count(&metrics::BAD_MESSAGES);
            tracing::debug!(sid = %self.conn.socket_id, "presence for an unknown identifier");
            return None;
        }
        let rate = self.cable.presence.presence_rate;
        if !self.rare().presence.commands.take(rate) {
            self.refuse_presence(
                identifier,
                "too many presence commands: over rpc.presence_rate",
            );
            return None;
        }
        let stream = self.enabled_stream(identifier, p::PRESENCE_STATE);
        if stream.is_none() {
            self.refuse_presence(identifier, "presence is not enabled for this subscription");
        }
        stream
    }

    /// `join`, or a `subscribe` that carries the member (a client
    /// subscribing again after a reconnect).
    pub(super) async fn join(&mut self, identifier: &str, text: &str) -> Next {
        let Some(stream) = self.presence_stream(identifier) else {
            return Next::Continue;
        };
        let member = match p::member(text, self.cable.presence.max_info) {
            Ok(Some(m)) => m,
            Ok(None) => {
                self.refuse_presence(
                    identifier,
                    "`presence` (the member's id and info) is missing",
                );
                return Next::Continue;
            }
            Err(e) => {
                self.refuse_presence(identifier, &e);
                return Next::Continue;
            }
        };
        if let Err(why) = self.join_as(identifier, stream, member).await {
            self.refuse_presence(identifier, &why);
        }
        Next::Continue
    }

    /// The app's `presence` in a command answer (AnyCable's
    /// `CommandResponse.presence`, field 9): join or leave the
    /// subscription's presence stream (`$p` in its state, as the answer
    /// left it) on the connection's behalf, as anycable-go's
    /// `handlePresenceReply` does. The limits of a client's join apply,
    /// not its rate (the app asked). A refused one is not the client's
    /// doing: counted and logged, nothing sent. `ttl` is ignored, as
    /// anycable-go 1.6.16 ignores it (members linger `rpc.presence_ttl`).
    pub(super) async fn app_presence(
        &mut self,
        identifier: &str,
        presence: crate::proto::PresenceResponse,
    ) {
        let sid = self.conn.socket_id.clone();
        let refused = |why: &str| {
            metrics::count(&m::CABLE_PRESENCE_REFUSED);
            tracing::debug!(%sid, why, "the app's presence refused");
        };
        if self.find(identifier).is_none() {
            return;
        }
        let Some(stream) = self.enabled_stream(identifier, p::PRESENCE_STATE) else {
            return refused("presence is not enabled for this subscription ($p)");
        };
        match presence.kind.as_str() {
            "join" => match p::app_member(presence.id, presence.info, self.cable.presence.max_info)
            {
                Ok(member) => {
                    if let Err(why) = self.join_as(identifier, stream, member).await {
                        refused(&why);
                    }
                }
                Err(why) => refused(&why),
            },
            "leave" => self.leave_joined(identifier).await,
            _ => refused("unknown presence type (join or leave)"),
        }
    }

    /// `member` joins `stream` for subscription `identifier`; `Err` says
    /// why not.
    async fn join_as(
        &mut self,
        identifier: &str,
        stream: String,
        member: p::Member,
    ) -> Result<(), String> {
        let joined = self.joined();
        if let Some((_, _, id)) = joined
            .iter()
            .find(|(i, s, _)| &**i == identifier && *s == stream)
        {
            if *id != member.id {
                return Err("this subscription joined as another id: leave first".into());
            }
            // Joined already as this id: nothing changes (as AnyCable).
            return Ok(());
        }
        if joined.len() >= self.cable.presence.max_joins {
            return Err(format!(
                "joined {} presence streams already (rpc.presence_max_joins)",
                joined.len()
            ));
        }
        let tag: Arc<str> = Arc::from(identifier);
        let opts = SubscribeOptions {
            tag: Some(tag.clone()),
            member: Some(herald_core::hub::presence::Member {
                user_id: member.id.clone(),
                info: member.info.clone(),
            }),
            max_members: self.cable.presence.max_members,
            ..SubscribeOptions::default()
        };
        match self
            .cable
            .node
            .subscribe(&self.cable.hub, &self.conn, p::NAMESPACE, &stream, opts)
            .await
        {
            Ok(j) => {
                self.rare()
                    .presence
                    .joined
                    .push((tag, stream.clone(), member.id.clone()));
                if j.member_added {
                    let event = p::join_event(&member.id, member.info.as_deref());
                    p::announce(&self.cable.node, &self.cable.hub, &stream, event).await;
                }
                Ok(())
            }
            Err(Refused::OverLimit(_)) => Err(format!(
                "the stream's presence is full: {} members (rpc.presence_max_members)",
                self.cable.presence.max_members
            )),
            Err(e) => Err(e.to_string()),
        }
    }

    pub(super) async fn leave_presence(&mut self, identifier: &str) -> Next {
        if self.presence_stream(identifier).is_some() {
            self.leave_joined(identifier).await;
        }
        Next::Continue
    }

    /// Leave the presence a subscription joined (on `leave`, and when the
    /// subscription ends), announcing a member no connection is left for.
    pub(super) async fn leave_joined(&mut self, identifier: &str) {
        let (mine, rest): (Vec<_>, Vec<_>) = self
            .take_joined()
            .into_iter()
            .partition(|(i, _, _)| &**i == identifier);
        if !rest.is_empty() {
            self.rare().presence.joined = rest;
        }
        p::remove_all(&self.cable.node, &self.cable.hub, &self.conn, mine).await;
    }

    /// `presence`: how many members the stream has, and who (up to
    /// `rpc.presence_max_records`), the cluster's as this node knows them,
    /// or as the broker lists them where no member is on this node.
    pub(super) async fn presence_info(&mut self, identifier: &str, text: &str) -> Next {
        let Some(stream) = self.presence_stream(identifier) else {
            return Next::Continue;
        };
        let max = self.cable.presence.max_records;
        let (total, records) = match self.cable.hub.members(p::NAMESPACE, &stream, max) {
            Some(known) => known,
            None => {
                let scope = Scope::Channel(ChannelId(p::NAMESPACE, stream.clone()));
                let remote = self
                    .cable
                    .node
                    .broker
                    .members(&self.cable.hub.app.id, &scope, self.cable.node.id)
                    .await;
                let mut seen = std::collections::HashSet::new();
                let mut records = Vec::new();
                for (_, id, info) in remote {
                    if seen.insert(id.clone()) && records.len() < max {
                        records.push((id, info));
                    }
                }
                (seen.len(), records)
            }
        };
        let records = p::wants_records(text).then_some(records.as_slice());
        self.send(&p::info_frame(identifier, total, records));
        Next::Continue
    }

    /// `whisper`: to the stream's other subscribers, never back to the
    /// sender, without a position (never in the history). Not allowed or
    /// over the rate: dropped without an answer, as anycable-go does.
    pub(super) async fn whisper(&mut self, identifier: &str, data: String) -> Next {
        if self.find(identifier).is_none() {
            metrics::count(&metrics::BAD_MESSAGES);
            tracing::debug!(sid = %self.conn.socket_id, "whisper for an unknown identifier");
            return Next::Continue;
        }
        let Some(stream) = self.enabled_stream(identifier, p::WHISPER_STATE) else {
            metrics::count(&m::CABLE_WHISPERS_DROPPED);
            tracing::debug!(sid = %self.conn.socket_id, "whisper on a subscription that may not whisper");
            return Next::Continue;
        };
        let rate = self.cable.presence.whisper_rate;
        if !self.rare().presence.whispers.take(rate) {
            metrics::count(&m::CABLE_WHISPERS_DROPPED);
            tracing::debug!(sid = %self.conn.socket_id, "whisper over rpc.whisper_rate");
            return Next::Continue;
        }
        let Ok(data) = serde_json::value::RawValue::from_string(data) else {
            return Next::Continue;
        };
        metrics::count(&m::CABLE_WHISPERS);
        let publication = Publication::new(crate::NAMESPACE, stream, String::new(), data)
            .sent_by(self.conn.socket_id.to_string());
        let _ = self.cable.node.publish(&self.cable.hub, publication).await;
        Next::Continue
    }

    /// The connection ended: its memberships stay for `rpc.presence_ttl`
    /// (a restored or reconnected client joins again within it).
    pub(super) fn linger_presence(&mut self) {
        let joined = self.take_joined();
        p::linger(
            self.cable.node.clone(),
            self.cable.hub.clone(),
            self.conn.clone(),
            joined,
            self.cable.presence.ttl,
        );
    }
}
