//! `write_delay_ms`: a connection's writer keeps collecting frames for that
//! long after the first, so frames that come close together share one
//! write, in order; a lone frame still goes out once the delay is over.
//! Only busy connections (`write_delay_busy_only`) on a node whose fan-out
//! delivers at least `write_delay_min_rate` frames a second wait; at light
//! load every reply and message goes out at once.

use crate::common;

use common::Server;

/// Trigger `n` events one HTTP call at a time (each call returns only after
/// its frame is queued), named `tick` with data "0".."n-1".
async fn trigger_each(s: &Server, channel: &str, n: usize) {
    for i in 0..n {
        s.trigger(channel, "tick", &i.to_string()).await;
    }
}

#[tokio::test]
async fn frames_close_together_share_one_write_in_order() {
    // The longest delay allowed, so five HTTP calls fit easily inside it
    // even on a loaded machine.
    // At any delivery rate (the behaviour before `write_delay_min_rate`).
    let s = Server::start_with(
        "write_delay_ms = 1000\nwrite_delay_busy_only = false\nwrite_delay_min_rate = 0",
        "",
    )
    .await;
    let mut c = s.client().await;
    c.subscribe("busy").await;
    let before = s.metric("herald_socket_writes_total").await;

    trigger_each(&s, "busy", 5).await;
    for i in 0..5 {
        let f = c.expect("tick", Some("busy")).await;
        assert_eq!(f["data"], i.to_string(), "frames out of order");
    }
    let writes = s.metric("herald_socket_writes_total").await - before;
    assert_eq!(
        writes, 1,
        "five frames queued within the delay took {writes} writes"
    );
}

#[tokio::test]
async fn without_a_delay_frames_are_written_as_they_come() {
    let s = Server::start_with("write_delay_ms = 0", "").await;
    let mut c = s.client().await;
    c.subscribe("eager").await;
    let before = s.metric("herald_socket_writes_total").await;
    // Each frame read before the next is sent: nothing is queued behind
    // another, so every frame is its own write.
    for i in 0..3 {
        s.trigger("eager", "tick", &i.to_string()).await;
        c.expect("tick", Some("eager")).await;
    }
    assert_eq!(s.metric("herald_socket_writes_total").await - before, 3);
}

#[tokio::test]
async fn a_lone_frame_is_delivered_and_the_connection_keeps_working() {
    let s = Server::start_with(
        "write_delay_ms = 200\nwrite_delay_busy_only = false\nwrite_delay_min_rate = 0",
        "",
    )
    .await;
    let mut c = s.client().await;
    c.subscribe("quiet").await;
    let before = s.metric("herald_socket_writes_total").await;
    trigger_each(&s, "quiet", 1).await;
    assert_eq!(c.expect("tick", Some("quiet")).await["data"], "0");
    // A lone frame goes out alone, and is not left waiting for company.
    assert_eq!(s.metric("herald_socket_writes_total").await - before, 1);
    s.trigger("quiet", "tick", "again").await;
    assert_eq!(c.expect("tick", Some("quiet")).await["data"], "again");
}

/// With `write_delay_busy_only`, a connection that was not written to in
/// the last 50 ms writes at once: the delay (the longest allowed, a second)
/// is not paid by quiet connections.
#[tokio::test]
async fn busy_only_lets_quiet_connections_write_at_once() {
    let s = Server::start_with("write_delay_ms = 1000\nwrite_delay_busy_only = true", "").await;
    let mut c = s.client().await;
    c.subscribe("calm").await;
    // The confirmation was a write: let the connection become quiet (the
    // busy window is 50 ms). A precondition, not a wait for an event.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let started = std::time::Instant::now();
    s.trigger("calm", "tick", "0").await;
    assert_eq!(c.expect("tick", Some("calm")).await["data"], "0");
    let took = started.elapsed();
    assert!(
        took < std::time::Duration::from_millis(900),
        "a quiet connection waited {took:?}: the delay applied"
    );
}

/// At light load a busy connection writes at once too: a client pinging
/// back to back (each ping right after the last pong, well within the busy
/// window) and a subscriber getting publications back to back see no
/// delay, even the longest one, because the node delivers far fewer
/// frames a second than `write_delay_min_rate` (default 10,000). Before,
/// each of these replies waited the whole delay.
#[tokio::test]
async fn at_light_load_busy_connections_write_at_once() {
    // The longest delay: a round trip that waited for it took at least a
    // second, however fast or slow the machine.
    let delay = std::time::Duration::from_millis(1000);
    let s = Server::start_with("write_delay_ms = 1000", "").await;
    let mut c = s.client().await;
    c.subscribe("light").await;
    let mut took = Vec::new();
    for _ in 0..3 {
        let at = std::time::Instant::now();
        c.send(serde_json::json!({"event": "pusher:ping", "data": {}}))
            .await;
        c.expect("pusher:pong", None).await;
        took.push(at.elapsed());
    }
    for i in 0..3 {
        let at = std::time::Instant::now();
        s.trigger("light", "tick", &i.to_string()).await;
        assert_eq!(c.expect("tick", Some("light")).await["data"], i.to_string());
        took.push(at.elapsed());
    }
    assert!(
        took.iter().all(|t| *t < delay),
        "round trips on a busy connection took {took:?}: the delay applied"
    );
}

/// Once the fan-out delivers at least `write_delay_min_rate` frames a
/// second, busy connections coalesce again: with the lowest rate (any
/// delivery counts) frames close together share writes.
#[tokio::test]
async fn at_the_min_rate_frames_close_together_share_writes() {
    let s = Server::start_with(
        "write_delay_ms = 1000\nwrite_delay_busy_only = false\nwrite_delay_min_rate = 1",
        "",
    )
    .await;
    let mut c = s.client().await;
    c.subscribe("loaded").await;
    let before = s.metric("herald_socket_writes_total").await;
    trigger_each(&s, "loaded", 5).await;
    for i in 0..5 {
        let f = c.expect("tick", Some("loaded")).await;
        assert_eq!(f["data"], i.to_string(), "frames out of order");
    }
    let writes = s.metric("herald_socket_writes_total").await - before;
    // One, or two where a stalled session saw the first frame after the
    // rate's tick had passed; never one each.
    assert!(
        writes <= 2,
        "five frames within the delay under load took {writes} writes"
    );
}
