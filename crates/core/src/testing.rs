//! Wires for tests of the core and of code built on it: frames that are
//! easy to read back (`tag|event|channel|data`), and one with per-subscriber
//! ids. Not a protocol.

use crate::frame::Frame;
use crate::namespace::Namespace;
use crate::publication::{Event, Publication, Wire};

/// The namespace of the core's own tests.
pub const NS: Namespace = Namespace::new("test");

/// A wire for the core's own tests: `tag|event|channel|data`.
pub struct TestWire;

impl Wire for TestWire {
    fn name(&self) -> &'static str {
        "test"
    }
    fn publication(&self, p: &Publication, tag: &str) -> Frame {
        Frame::text(&format!("{tag}|{}|{}|{}", p.event, p.channel, p.data.get()))
    }
    fn event(&self, e: &Event<'_>, tag: &str) -> Option<Frame> {
        let text = match e {
            Event::Subscribed { channel, members } => format!(
                "{tag}|subscribed|{channel}|{}",
                members.map_or(String::new(), |m| m
                    .iter()
                    .map(|m| m.user_id)
                    .collect::<Vec<_>>()
                    .join(","))
            ),
            Event::MemberAdded { channel, member } => {
                format!("{tag}|member_added|{channel}|{}", member.user_id)
            }
            Event::MemberRemoved { channel, user_id } => {
                format!("{tag}|member_removed|{channel}|{user_id}")
            }
            Event::SubscriptionCount { channel, count } => {
                format!("{tag}|count|{channel}|{count}")
            }
            Event::CacheMiss { channel } => format!("{tag}|cache_miss|{channel}|"),
            Event::Watchlist { online, offline } => {
                format!("{tag}|watchlist|{}|{}", online.join(","), offline.join(","))
            }
        };
        Some(Frame::text(&text))
    }
}

/// A wire whose frames carry a per-subscriber id beside a shared body.
pub struct IdWire;

impl Wire for IdWire {
    fn name(&self) -> &'static str {
        "id"
    }
    fn publication(&self, p: &Publication, _tag: &str) -> Frame {
        Frame::text(p.data.get())
    }
    fn per_subscriber(&self) -> bool {
        true
    }
    fn personalize(&self, shared: &Frame, tag: &str) -> Frame {
        shared.with_prefix(format!("{tag}:").as_bytes())
    }
    fn event(&self, _e: &Event<'_>, _tag: &str) -> Option<Frame> {
        None
    }
}
