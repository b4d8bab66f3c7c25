//! The WebSocket decoder of client frames: any bytes, split anywhere, never
//! panic; every message it yields respects the size limit, and texts are
//! valid UTF-8 by type.
#![no_main]
use herald_core::ws::{Decoder, Incoming};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split, bytes)) = data.split_first() else {
        return;
    };
    let mut d = Decoder::new(512);
    let step = (split as usize).max(1);
    for chunk in bytes.chunks(step) {
        d.feed(chunk);
        while let Some(m) = d.next() {
            match m {
                Ok(Incoming::Text(t)) => assert!(t.len() <= 512),
                Ok(Incoming::Binary(b)) => assert!(b.len() <= 512),
                Ok(Incoming::Ping(p)) => assert!(p.len() <= 125),
                _ => {}
            }
        }
    }
});
