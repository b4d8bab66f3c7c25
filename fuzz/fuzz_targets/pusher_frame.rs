//! A client text frame, as the session hands it to the parser.
#![no_main]

use herald_pusher::names::{validate_name, ChannelKind};
use herald_pusher::wire::{parse, ClientMessage};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The WebSocket layer only ever passes valid UTF-8 text.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse(text) {
        Ok(ClientMessage::Subscribe { channel, .. }) => {
            let _ = validate_name(&channel, 164);
            let _ = ChannelKind::of(&channel);
        }
        Ok(ClientMessage::ClientEvent {
            event,
            channel,
            data,
        }) => {
            assert!(event.starts_with("client-"));
            let _ = ChannelKind::of(&channel).allows_client_events();
            // Relayed data must be valid JSON on its own. Grammar only: a
            // lone surrogate escape ("\ud800") is valid RFC 8259 JSON that
            // `serde_json::Value` refuses, and browsers accept it.
            serde_json::from_str::<Box<serde_json::value::RawValue>>(data.get())
                .expect("client event data is valid JSON");
        }
        Ok(_) | Err(_) => {}
    }
});
