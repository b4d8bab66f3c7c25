//! HTTP API bodies (`POST events`, `POST batch_events`): never panic, and
//! an accepted event is within the app's limits.
#![no_main]

use herald_pusher::api::{parse_batch, parse_event, Checked, MAX_BATCH_EVENTS, MAX_CHANNELS_PER_EVENT};
use herald_core::config::AppConfig;
use herald_pusher::names::validate_publish_name;
use libfuzzer_sys::fuzz_target;

fn within_limits(app: &AppConfig, ev: &Checked) {
    assert!(!ev.name.is_empty() && ev.name.chars().count() <= app.max_event_name);
    assert!(!ev.name.starts_with("pusher:"));
    let data: String = serde_json::from_str(ev.data.get()).expect("data is a JSON string");
    assert!(data.len() <= app.max_payload);
    assert!((1..=MAX_CHANNELS_PER_EVENT).contains(&ev.channels.len()));
    for c in &ev.channels {
        assert!(validate_publish_name(c, app.max_channel_name).is_ok());
    }
    assert!(ev
        .attrs
        .iter()
        .all(|a| a == "user_count" || (a == "subscription_count" && app.subscription_count)));
}

fuzz_target!(|data: &[u8]| {
    // The first byte picks small limits, so inputs cross them often.
    let Some((&knobs, body)) = data.split_first() else {
        return;
    };
    let app = AppConfig {
        max_event_name: (knobs as usize % 16) + 1,
        max_payload: (knobs as usize % 64) + 1,
        max_channel_name: (knobs as usize % 32) + 1,
        subscription_count: knobs & 1 == 1,
        ..AppConfig::development()
    };
    if let Ok(ev) = parse_event(&app, body) {
        within_limits(&app, &ev);
    }
    if let Ok(evs) = parse_batch(&app, body) {
        assert!(evs.len() <= MAX_BATCH_EVENTS);
        evs.iter().for_each(|ev| within_limits(&app, ev));
    }
});
