//! AnyCable's extended protocol, `actioncable-v1-ext-json`: what it adds to
//! Action Cable, in one place.
//!
//! ```text
//! protocol   its frames: positions on reliable streams' messages,
//!            `history` requests and their answers, the restored welcome;
//!            its wire (`EXT_WIRE`); what one connection may ask of the
//!            history
//! presence   presence (`join`, `leave`, `presence`) and whispers: which
//!            streams allow them, the members, their frames, the members
//!            of a node that died
//! resume     reliable streams' history bounds (the core publishes with
//!            positions: `herald_core::reliable`) and the sessions a
//!            reconnecting client restores (snapshots in the broker's
//!            session store)
//! ```
//!
//! A session's side of it (answering history requests, restoring,
//! presence and whisper commands) is in `crate::session`'s children
//! `history` and `membership`.

pub mod presence;
pub mod protocol;
pub mod resume;
