//! permessage-deflate (RFC 7692): WebSocket messages compressed with raw
//! DEFLATE, negotiated at the upgrade.
//!
//! Herald accepts an offer only as `server_no_context_takeover` and
//! `client_no_context_takeover`, both of which a server may ask for
//! whatever the client offered (RFC 7692 7.1.1). Every message, in either
//! direction, is then compressed on its own, which is what lets Herald:
//! - compress a publication **once** per encoding and send the same bytes
//!   to every subscriber that negotiated deflate (the frame cache of
//!   [`crate::publication`]), instead of once per subscriber;
//! - keep **no** compression state per connection: a client's message is
//!   inflated by a per-thread inflater reset for each message, so an idle
//!   connection holds nothing more than without deflate.
//!
//! Per-message choice (RFC 7692 6): a frame too small to gain, or that does
//! not shrink, goes uncompressed (RSV1 clear), and only publications are
//! compressed; Herald's own short replies never are.
//!
//! A client message counts its *inflated* size against the app's
//! `max_frame_size`: inflation stops one byte past it and the connection is
//! closed with 1009, so a small frame that inflates to gigabytes (a
//! compression bomb) costs at most `max_frame_size` bytes and the work to
//! produce them.

use axum::http::{header, HeaderMap};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The extension's answer in a `101` response.
pub const RESPONSE: &str =
    "permessage-deflate; server_no_context_takeover; client_no_context_takeover";

/// The tail a sender strips from each compressed message and the receiver
/// appends before inflating (RFC 7692 7.2.1/7.2.2).
const TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// DEFLATE level of publications: compressed once and shared, so the ratio
/// is worth more than the time (measured in bench/RESULTS.md).
const LEVEL: u32 = 6;

/// Default smallest payload compressed (`websocket_compression_min_bytes`).
pub const DEFAULT_MIN_BYTES: usize = 256;

static MIN_BYTES: AtomicUsize = AtomicUsize::new(DEFAULT_MIN_BYTES);

/// A measurement switch, not a setting: compress each subscriber's frame
/// for that subscriber (as a library with per-connection compression
/// would), to measure what compressing once saves (bench/RESULTS.md).
static PER_SUBSCRIBER: AtomicBool = AtomicBool::new(false);

/// Set the node's smallest compressed payload; read by every encoding.
pub fn set_min_bytes(n: usize) {
    MIN_BYTES.store(n, Ordering::Relaxed);
}

/// Read `HERALD_DEFLATE_PER_SUBSCRIBER=1` (measurement only; see
/// [`PER_SUBSCRIBER`]).
pub fn read_experiment_switch() {
    let on = std::env::var("HERALD_DEFLATE_PER_SUBSCRIBER").is_ok_and(|v| v == "1");
    PER_SUBSCRIBER.store(on, Ordering::Relaxed);
}

/// Whether each subscriber's frame is compressed for it alone (measurement).
pub fn per_subscriber() -> bool {
    PER_SUBSCRIBER.load(Ordering::Relaxed)
}

thread_local! {
    // Reset before each use: no message sees another's history.
    static DEFLATER: RefCell<Option<Compress>> = const { RefCell::new(None) };
    static INFLATER: RefCell<Option<Decompress>> = const { RefCell::new(None) };
}

/// Whether the upgrade request offers permessage-deflate in a form Herald
/// accepts: at least one offer whose parameters are all known, valid and
/// not repeated, and that does not ask the server for a window smaller
/// than 32 KiB (Herald compresses once for everyone with the full window;
/// such an offer is declined, as RFC 7692 7.1.2.1 lets a server).
pub fn accepts(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::SEC_WEBSOCKET_EXTENSIONS)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(acceptable)
}

/// One offer: `permessage-deflate` and its `; name[=value]` parameters.
fn acceptable(offer: &str) -> bool {
    let mut parts = offer.split(';').map(str::trim);
    if !parts
        .next()
        .is_some_and(|n| n.eq_ignore_ascii_case("permessage-deflate"))
    {
        return false;
    }
    let mut seen = [false; 4];
    for p in parts {
        let (name, value) = match p.split_once('=') {
            Some((n, v)) => (n.trim(), Some(v.trim().trim_matches('"'))),
            None => (p, None),
        };
        let (i, ok) = match name.to_ascii_lowercase().as_str() {
            "server_no_context_takeover" => (0, value.is_none()),
            "client_no_context_takeover" => (1, value.is_none()),
            // Only the full window: a smaller one would need its own
            // compression of every publication.
            "server_max_window_bits" => (2, value == Some("15")),
            // Any window the client limits itself to inflates with ours.
            "client_max_window_bits" => (3, value.is_none_or(window_bits)),
            _ => return false,
        };
        if !ok || std::mem::replace(&mut seen[i], true) {
            return false;
        }
    }
    true
}

/// A valid `*_max_window_bits` value: 8 to 15, no leading zero.
fn window_bits(v: &str) -> bool {
    !v.starts_with('0') && v.parse::<u8>().is_ok_and(|n| (8..=15).contains(&n))
}

/// `payload` compressed as one message (without the stripped tail), or
/// `None` when it is under the node's threshold or would not shrink.
pub fn compress(payload: &[u8]) -> Option<Vec<u8>> {
    if payload.len() < MIN_BYTES.load(Ordering::Relaxed) {
        return None;
    }
    DEFLATER.with(|d| {
        let mut d = d.borrow_mut();
        let d = d.get_or_insert_with(|| Compress::new(Compression::new(LEVEL), false));
        d.reset();
        // Worth sending only if it shrinks: the output may not exceed the
        // input (plus the tail, stripped below).
        let mut out = Vec::with_capacity(payload.len() + TAIL.len());
        match d.compress_vec(payload, &mut out, FlushCompress::Sync) {
            Ok(Status::Ok) | Ok(Status::StreamEnd)
                if d.total_in() == payload.len() as u64
                    && out.len() < out.capacity()
                    && out.ends_with(&TAIL) =>
            {
                out.truncate(out.len() - TAIL.len());
                (out.len() < payload.len()).then_some(out)
            }
            _ => None,
        }
    })
}

/// Why a compressed client message could not be inflated.
#[derive(Debug, PartialEq, Eq)]
pub enum InflateError {
    /// It inflates past the limit.
    TooLarge,
    /// Not valid DEFLATE data (or it used a context it may not).
    Invalid,
}

/// Inflate one client message (`data` without the tail), refusing output
/// past `max` bytes: the inflater stops at `max + 1`.
pub fn inflate(data: &[u8], max: usize) -> Result<Vec<u8>, InflateError> {
    let mut input = Vec::with_capacity(data.len() + TAIL.len());
    input.extend_from_slice(data);
    input.extend_from_slice(&TAIL);
    INFLATER.with(|i| {
        let mut i = i.borrow_mut();
        let i = i.get_or_insert_with(|| Decompress::new(false));
        i.reset(false);
        let limit = max.saturating_add(1);
        let mut out: Vec<u8> = Vec::with_capacity(data.len().saturating_mul(4).clamp(1, limit));
        let mut at = 0;
        loop {
            if out.len() == out.capacity() {
                if out.len() >= limit {
                    return Err(InflateError::TooLarge);
                }
                out.reserve_exact(out.capacity().max(64).min(limit - out.len()));
            }
            let (was_in, was_out) = (i.total_in(), out.len());
            let status = i
                .decompress_vec(&input[at..], &mut out, FlushDecompress::Sync)
                .map_err(|_| InflateError::Invalid)?;
            at += (i.total_in() - was_in) as usize;
            if out.len() > max {
                return Err(InflateError::TooLarge);
            }
            // A final block ends the message (a sender may set BFINAL);
            // anything after it is ignored.
            if status == Status::StreamEnd {
                return Ok(out);
            }
            if at == input.len() && (out.len() < out.capacity() || out.len() == was_out) {
                // All input taken and everything flushed.
                return Ok(out);
            }
            if i.total_in() == was_in && out.len() == was_out {
                // No progress with input left and room to write.
                return Err(InflateError::Invalid);
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn offers(v: &str) -> bool {
        let mut h = HeaderMap::new();
        h.insert(
            header::SEC_WEBSOCKET_EXTENSIONS,
            HeaderValue::from_str(v).unwrap(),
        );
        accepts(&h)
    }

    #[test]
    fn negotiation() {
        // Browsers, the `ws` package, Firefox.
        assert!(offers("permessage-deflate; client_max_window_bits"));
        assert!(offers("permessage-deflate"));
        assert!(offers(
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover; client_max_window_bits=10"
        ));
        assert!(offers("permessage-deflate; server_max_window_bits=\"15\""));
        // A smaller server window, then a fallback offer: the fallback.
        assert!(offers(
            "permessage-deflate; server_max_window_bits=10, permessage-deflate"
        ));
        assert!(!offers("permessage-deflate; server_max_window_bits=10"));
        assert!(!offers("permessage-deflate; client_max_window_bits=16"));
        assert!(!offers("permessage-deflate; client_max_window_bits=08"));
        assert!(!offers("permessage-deflate; server_no_context_takeover=1"));
        assert!(!offers("permessage-deflate; mystery"));
        assert!(!offers(
            "permessage-deflate; client_no_context_takeover; client_no_context_takeover"
        ));
        assert!(!offers("x-webkit-deflate-frame"));
        assert!(!accepts(&HeaderMap::new()));
    }

    #[test]
    fn roundtrip_and_threshold() {
        let text = r#"{"id":1,"name":"item","price":"19.99"}"#.repeat(60);
        let c = compress(text.as_bytes()).expect("compresses");
        assert!(c.len() * 4 < text.len(), "{} of {}", c.len(), text.len());
        assert_eq!(inflate(&c, 1 << 20).unwrap(), text.as_bytes());
        // Each message stands alone: the same bytes a second time.
        assert_eq!(compress(text.as_bytes()).unwrap(), c);
        assert!(compress(b"short").is_none());
    }

    #[test]
    fn inflation_is_bounded() {
        let zeros = vec![0u8; 10 << 20];
        let bomb = {
            // The threshold does not apply to this test's own compressor.
            let mut d = Compress::new(Compression::best(), false);
            let mut out = Vec::with_capacity(64 << 10);
            d.compress_vec(&zeros, &mut out, FlushCompress::Sync)
                .unwrap();
            out.truncate(out.len() - 4);
            out
        };
        assert!(bomb.len() < 20 << 10);
        assert_eq!(inflate(&bomb, 64 << 10), Err(InflateError::TooLarge));
        assert_eq!(inflate(&bomb, 10 << 20).unwrap().len(), 10 << 20);
        assert_eq!(
            inflate(&[0xff, 0xff, 0xff], 1024),
            Err(InflateError::Invalid)
        );
        assert_eq!(inflate(&[], 1024), Ok(Vec::new()));
    }
}
