//! Presence `channel_data`: never panics, and what it accepts is in limits.
#![no_main]

use herald_pusher::presence_data::{parse_channel_data, MemberLimits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&limit, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let limits = MemberLimits {
        max_user_id: (limit as usize % 64) + 1,
        max_user_info: (limit as usize) * 4 + 1,
    };
    if let Ok(m) = parse_channel_data(text, &limits) {
        // Only an object is channel_data (serde also reads structs from
        // arrays).
        assert!(text.trim_start().starts_with('{'), "{text:?}");
        assert!(!m.user_id.is_empty());
        assert!(m.user_id.chars().count() <= limits.max_user_id);
        if let Some(info) = &m.user_info {
            assert!(info.get().len() <= limits.max_user_info);
            // Grammar only: `1E605` is valid JSON that `serde_json::Value`
            // refuses as out of range.
            serde_json::from_str::<Box<serde_json::value::RawValue>>(info.get())
                .expect("user_info is JSON");
        }
    }
});
