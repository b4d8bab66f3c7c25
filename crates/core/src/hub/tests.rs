use super::*;
use crate::connection::QueueLimit;
use crate::fanout::deliver;
use crate::publication::json_string;
use crate::testing::{TestWire, NS};

const LIMIT: QueueLimit = QueueLimit {
    frames: 64,
    bytes: 1 << 20,
};

fn conn(id: u64) -> Arc<Connection> {
    Arc::new(Connection::new(id, format!("1.{id}"), &TestWire, LIMIT))
}

fn texts(c: &Connection) -> Vec<String> {
    let mut out = Vec::new();
    c.take(&mut out, usize::MAX);
    out.iter().map(|f| f.payload_text()).collect()
}

fn publish(hub: &Hub, p: Publication) -> u64 {
    let p = Arc::new(p);
    hub.targets(&p).iter().map(|t| deliver(&p, t)).sum()
}

#[test]
fn subscription_counts_are_coalesced_per_flush() {
    let hub = Hub::new(AppConfig::development());
    let conns: Vec<_> = (0..50).map(conn).collect();
    for c in &conns {
        let opts = SubscribeOptions {
            count: true,
            ..SubscribeOptions::default()
        };
        assert!(hub.subscribe(c, NS, "room", opts).unwrap().new);
    }
    hub.flush_subscription_counts(1);
    hub.flush_subscription_counts(1); // nothing changed since: sends nothing
    for c in &conns {
        // Subscribed, then exactly one count, the final one.
        assert_eq!(texts(c), ["|subscribed|room|", "|count|room|50"]);
    }
}

#[test]
fn counts_are_not_tracked_unless_asked() {
    let hub = Hub::new(AppConfig::development());
    hub.subscribe(&conn(1), NS, "room", SubscribeOptions::default())
        .unwrap();
    assert!(hub.all_spaces().iter().all(|s| s.counts_changed.is_empty()));
}

#[test]
fn a_tag_makes_a_separate_subscription_of_one_connection() {
    let hub = Hub::new(AppConfig::development());
    let c = conn(1);
    for tag in [None, Some(Arc::from("a")), Some(Arc::from("b"))] {
        let opts = SubscribeOptions {
            tag,
            ..SubscribeOptions::default()
        };
        assert!(hub.subscribe(&c, NS, "news", opts).unwrap().new);
    }
    texts(&c);
    assert_eq!(
        publish(
            &hub,
            Publication::new(NS, "news".into(), "e".into(), json_string("x"))
        ),
        3
    );
    let mut got = texts(&c);
    got.sort();
    assert_eq!(got, ["a|e|news|\"x\"", "b|e|news|\"x\"", "|e|news|\"x\""]);
}

#[test]
fn a_cached_publication_is_replayed_once_to_a_late_subscriber() {
    let hub = Hub::new(AppConfig::development());
    let early = conn(1);
    let opts = || SubscribeOptions {
        cache: true,
        ..SubscribeOptions::default()
    };
    hub.subscribe(&early, NS, "cache-x", opts()).unwrap();
    assert_eq!(
        texts(&early),
        ["|subscribed|cache-x|", "|cache_miss|cache-x|"]
    );
    let p = Publication::new(NS, "cache-x".into(), "e".into(), json_string("v")).cached(true);
    assert_eq!(publish(&hub, p), 1);
    let late = conn(2);
    hub.subscribe(&late, NS, "cache-x", opts()).unwrap();
    assert_eq!(texts(&late), ["|subscribed|cache-x|", "|e|cache-x|\"v\""]);
}

#[test]
fn prefixes_end_at_every_slash() {
    assert_eq!(
        prefixes("/ns/a/b").collect::<Vec<_>>(),
        ["/", "/ns/", "/ns/a/"]
    );
    assert_eq!(prefixes("plain").count(), 0);
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A pattern subscription receives exactly the channels that start
        /// with its prefix, for any prefix ending in `/` and any channel.
        #[test]
        fn patterns_match_exactly_their_prefix(
            pattern in "(/[ab]{0,2}){0,3}/",
            channels in proptest::collection::vec("(/[ab]{0,2}){1,4}", 1..12),
        ) {
            let hub = Hub::new(AppConfig::development());
            let c = conn(1);
            let opts = SubscribeOptions { pattern: true, ..SubscribeOptions::default() };
            hub.subscribe(&c, NS, &pattern, opts).unwrap();
            texts(&c);
            for ch in &channels {
                publish(&hub, Publication::new(NS, ch.clone(), "e".into(), json_string("")));
            }
            let got: Vec<String> = texts(&c)
                .iter()
                .map(|t| t.split('|').nth(2).unwrap().to_owned())
                .collect();
            let want: Vec<String> = channels
                .iter()
                .filter(|ch| ch.starts_with(pattern.as_str()))
                .cloned()
                .collect();
            prop_assert_eq!(got, want);
        }
    }
}
