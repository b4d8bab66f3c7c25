//! The frames of AnyCable's extended protocol, `actioncable-v1-ext-json`:
//! stream positions on messages of reliable streams,
//! `history` requests and their `confirm_history` / `reject_history`
//! answers, and the restored welcome. The frames are the ones
//! anycable-go 1.6.16 sends (docs/actioncable.md, "Extended protocol").

use crate::wire::json_string;
use herald_core::frame::Frame;
use herald_core::history::Entry;
use herald_core::publication::{Event, Publication, Wire};
use serde::Deserialize;
use std::collections::HashMap;

/// The subprotocol's name.
pub const PROTOCOL: &str = "actioncable-v1-ext-json";

/// Most streams one history request may name (more is a bad request).
pub const MAX_REQUEST_STREAMS: usize = 1000;

/// What one connection may ask of its streams' history (`[rpc]`).
#[derive(Debug, Clone, Copy)]
pub struct HistoryLimits {
    /// History requests per second (and the burst): `history_rate`.
    pub rate: u32,
    /// Bytes of history answers one connection may have waiting past its
    /// outbound queue's bound (`history_max_bytes`: on one node no answer
    /// can be larger than everything the node keeps).
    pub answer_room: usize,
}

/// A stream position as the client gives it.
#[derive(Debug, Deserialize, Clone, PartialEq, Eq)]
pub struct ClientPosition {
    #[serde(default)]
    pub epoch: String,
    #[serde(default)]
    pub offset: u64,
}

/// What a client asks of a subscription's history: since a Unix time in
/// seconds, and/or after given positions per stream.
#[derive(Debug, Deserialize, Default, Clone, PartialEq, Eq)]
pub struct HistoryRequest {
    #[serde(default)]
    pub since: u64,
    #[serde(default)]
    pub streams: HashMap<String, ClientPosition>,
}

impl HistoryRequest {
    /// AnyCable answers nothing to a request without either.
    pub fn is_empty(&self) -> bool {
        self.since == 0 && self.streams.is_empty()
    }
}

#[derive(Deserialize)]
struct WithHistory {
    #[serde(default)]
    history: Option<HistoryRequest>,
}

/// The `history` field of a client command (`subscribe` or `history`):
/// `Ok(None)` when absent, `Err` when present and malformed or too large.
pub fn history_request(text: &str) -> Result<Option<HistoryRequest>, String> {
    let w: WithHistory =
        serde_json::from_str(text).map_err(|e| format!("`history` is malformed: {e}"))?;
    if let Some(h) = &w.history {
        if h.streams.len() > MAX_REQUEST_STREAMS {
            return Err(format!(
                "`history` names more than {MAX_REQUEST_STREAMS} streams"
            ));
        }
    }
    Ok(w.history)
}

fn typed(kind: &str, identifier: &str) -> String {
    format!(
        r#"{{"type":{},"identifier":{}}}"#,
        json_string(kind),
        json_string(identifier)
    )
}

pub fn confirm_history(identifier: &str) -> String {
    typed("confirm_history", identifier)
}

pub fn reject_history(identifier: &str) -> String {
    typed("reject_history", identifier)
}

/// The welcome of a restored session: its new `sid` and the identifiers
/// of the subscriptions it has back.
pub fn welcome_restored(sid: &str, identifiers: &[&str]) -> String {
    let ids: Vec<String> = identifiers.iter().map(|i| json_string(i)).collect();
    format!(
        r#"{{"type":"welcome","sid":{},"restored":true,"restored_ids":[{}]}}"#,
        json_string(sid),
        ids.join(",")
    )
}

/// A message of a reliable stream: the identifier, the message (JSON
/// text), and its position.
pub fn positioned(
    identifier: &str,
    message: &str,
    stream: &str,
    epoch: &str,
    offset: u64,
) -> String {
    let id = json_string(identifier);
    let stream = json_string(stream);
    let epoch = json_string(epoch);
    let mut s = String::with_capacity(64 + id.len() + message.len() + stream.len());
    s.push_str(r#"{"identifier":"#);
    s.push_str(&id);
    s.push_str(r#","message":"#);
    s.push_str(message);
    s.push_str(r#","stream_id":"#);
    s.push_str(&stream);
    s.push_str(r#","epoch":"#);
    s.push_str(&epoch);
    s.push_str(r#","offset":"#);
    s.push_str(&offset.to_string());
    s.push('}');
    s
}

/// A history entry as the client gets it: the members of a live message
/// ([`positioned`]) with the message last, so the frame ends with the
/// stored bytes ([`herald_core::history::Data::closing`]), shared by every
/// client's answer instead of copied into each.
pub fn entry_frame(identifier: &str, stream: &str, epoch: &str, e: &Entry) -> Frame {
    let id = json_string(identifier);
    let stream = json_string(stream);
    let epoch = json_string(epoch);
    let mut head = String::with_capacity(80 + id.len() + stream.len() + epoch.len());
    head.push_str(r#"{"identifier":"#);
    head.push_str(&id);
    head.push_str(r#","stream_id":"#);
    head.push_str(&stream);
    head.push_str(r#","epoch":"#);
    head.push_str(&epoch);
    head.push_str(r#","offset":"#);
    head.push_str(&e.offset.to_string());
    head.push_str(r#","message":"#);
    Frame::text_with_prefix(head.as_bytes(), e.data.closing())
}

/// The core's encoder for `actioncable-v1-ext-json` connections: like
/// [`crate::wire::CableWire`], plus the position on reliable streams. A
/// wire of its own so `actioncable-v1-json` clients get exactly the
/// frames they always did.
pub struct ExtWire;

pub static EXT_WIRE: ExtWire = ExtWire;

impl Wire for ExtWire {
    fn name(&self) -> &'static str {
        "actioncable-ext"
    }

    fn publication(&self, p: &Publication, tag: &str) -> Frame {
        match &p.position {
            Some(pos) => {
                let stream = &p.channel;
                Frame::text(&positioned(
                    tag,
                    p.data.get(),
                    stream,
                    &pos.epoch,
                    pos.offset,
                ))
            }
            None => crate::wire::WIRE.publication(p, tag),
        }
    }

    fn event(&self, _e: &Event<'_>, _tag: &str) -> Option<Frame> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_match_anycable() {
        assert_eq!(
            positioned(r#"{"channel":"C"}"#, r#"{"n":1}"#, "chat", "zowb", 1),
            r#"{"identifier":"{\"channel\":\"C\"}","message":{"n":1},"stream_id":"chat","epoch":"zowb","offset":1}"#
        );
        assert_eq!(
            confirm_history("i"),
            r#"{"type":"confirm_history","identifier":"i"}"#
        );
        assert_eq!(
            welcome_restored("s", &["a"]),
            r#"{"type":"welcome","sid":"s","restored":true,"restored_ids":["a"]}"#
        );
    }

    #[test]
    fn history_frames_share_the_stored_message() {
        let e = Entry {
            offset: 7,
            at_ms: 0,
            data: r#"{"n":"é"}"#.into(),
        };
        let a = entry_frame("i\"1", "chat", "ep", &e);
        let b = entry_frame("i2", "chat", "ep", &e);
        let live = positioned("i\"1", &e.data, "chat", "ep", 7);
        let parse = |t: &str| serde_json::from_str::<serde_json::Value>(t).unwrap();
        assert_eq!(parse(&a.payload_text()), parse(&live));
        assert_eq!(parse(&b.payload_text())["message"]["n"], "é");
        // One copy of the message, whoever asks.
        assert_eq!(a.parts()[1].as_ptr(), e.data.closing().as_ptr());
        assert_eq!(b.parts()[1].as_ptr(), e.data.closing().as_ptr());
    }

    #[test]
    fn history_requests() {
        let r = history_request(
            r#"{"command":"history","identifier":"i","history":{"since":5,"streams":{"a":{"epoch":"e","offset":3}}}}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.since, 5);
        assert_eq!(r.streams["a"].offset, 3);
        assert_eq!(history_request(r#"{"command":"subscribe"}"#), Ok(None));
        assert!(history_request(r#"{"history":{"since":"x"}}"#).is_err());
        assert!(history_request(r#"{"history":{"streams":{"a":{"offset":-1}}}}"#).is_err());
    }
}
