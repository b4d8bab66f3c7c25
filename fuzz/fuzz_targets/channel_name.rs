//! Channel name validation against a reference model of Pusher's rules.
#![no_main]

use herald_pusher::names::{validate_name, validate_publish_name, ChannelKind};
use libfuzzer_sys::fuzz_target;

fn model(name: &str, max: usize) -> bool {
    !name.is_empty()
        && name.len() <= max
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-=@,.;".contains(&b))
}

fuzz_target!(|data: &[u8]| {
    let Some((&max, rest)) = data.split_first() else {
        return;
    };
    let Ok(name) = std::str::from_utf8(rest) else {
        return;
    };
    let max = max as usize + 1;
    let ok = validate_name(name, max).is_ok();
    assert_eq!(ok, model(name, max), "{name:?} max {max}");
    let publish = validate_publish_name(name, max);
    if !name.starts_with("#server-to-user-") {
        assert_eq!(publish.is_ok(), ok);
    } else if publish.is_ok() {
        assert!(name.len() <= max && name.len() > "#server-to-user-".len());
    }
    let kind = ChannelKind::of(name);
    if kind.encrypted {
        assert!(kind.needs_auth && !kind.allows_client_events());
    }
    if kind.presence {
        assert!(kind.needs_auth);
    }
});
