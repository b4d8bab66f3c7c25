//! `latency`: what one request costs at light load, the load most apps
//! have. A few clients (one by default), each doing one thing at a time,
//! paced (`--interval` apart, 15 ms by default), time round trips of each
//! kind their protocol has:
//!
//! - `ping`: Pusher `pusher:ping` → `pusher:pong`;
//! - `perform`: Action Cable `BenchmarkChannel#echo` → its transmission
//!   (through the server's RPC app, `herald bench rpc-server`);
//! - `subscribe`: a subscription to a fresh bench channel → its
//!   confirmation (Pusher `subscription_succeeded`, Action Cable
//!   `confirm_subscription`, AppSync `start_ack` / `subscribe_success`);
//!   the client then leaves it, unmeasured;
//! - `publish`: an HTTP publish to the client's own bench channel (Pusher
//!   HTTP API, AnyCable broadcast API, AppSync publish) → the message at
//!   the subscriber, timed from just before the request.
//!
//! Each kind is a trend `latency_<kind>` (milliseconds), so `herald bench
//! compare` sets servers' runs side by side. Clients take turns with the
//! kinds in a fixed order, one request outstanding per client, so no
//! frame of one round trip can keep company with another's.

use super::client::{bench_data, next_text, ClientError, Conn};
use super::ledger::MsgId;
use super::metrics::histogram;
use super::proto::{Broadcast, Proto, Publisher};
use super::{actioncable, appsync, BenchError, CpuMeter, Report, Target};
use hdrhistogram::Histogram;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The protocols `latency` speaks.
pub const PROTOCOLS: &[Proto] = &[
    Proto::Pusher,
    Proto::ActionCable,
    Proto::AppsyncGraphql,
    Proto::AppsyncEvents,
];

/// Round trips of one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Ping,
    Perform,
    Subscribe,
    Publish,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Ping => "ping",
            Kind::Perform => "perform",
            Kind::Subscribe => "subscribe",
            Kind::Publish => "publish",
        }
    }

    /// The kinds `proto` has, in the order each client runs them.
    pub fn of(proto: Proto) -> &'static [Kind] {
        match proto {
            Proto::Pusher => &[Kind::Ping, Kind::Subscribe, Kind::Publish],
            Proto::ActionCable | Proto::ActionCableExt => {
                &[Kind::Perform, Kind::Subscribe, Kind::Publish]
            }
            _ => &[Kind::Subscribe, Kind::Publish],
        }
    }
}

pub struct LatencyParams {
    pub target: Target,
    pub protocol: Proto,
    pub broadcast: Broadcast,
    /// Clients, each timing its own round trips.
    pub clients: usize,
    /// Round trips of each kind per client.
    pub rounds: usize,
    /// From one round trip's start to the next one's, per client.
    pub interval: Duration,
    pub timeout: Duration,
    pub server_pid: Option<u32>,
}

impl LatencyParams {
    pub fn new(target: Target) -> LatencyParams {
        LatencyParams {
            target,
            protocol: Proto::Pusher,
            broadcast: Broadcast::default(),
            clients: 1,
            rounds: 90,
            interval: Duration::from_millis(15),
            timeout: Duration::from_secs(10),
            server_pid: None,
        }
    }
}

/// What one client measured: a histogram per kind (µs), and failures.
struct Measured {
    kinds: Vec<Histogram<u64>>,
    failed: u64,
    error: Option<String>,
}

pub async fn run(p: &LatencyParams) -> Result<Report, BenchError> {
    p.protocol.check("latency", PROTOCOLS)?;
    if p.clients == 0 || p.rounds == 0 {
        return super::err("latency needs at least one client and one round");
    }
    let publisher = Publisher::new(p.protocol, &p.target, &p.broadcast);
    p.protocol.preflight(&p.target, Some(&publisher)).await?;
    let cpu = CpuMeter::start(p.server_pid);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..p.clients {
        let (target, publisher) = (p.target.clone(), publisher.clone());
        let (proto, rounds, interval, timeout) = (p.protocol, p.rounds, p.interval, p.timeout);
        // Clients start spread over one interval, so they do not keep
        // step with one another.
        let offset = interval.mul_f64(i as f64 / p.clients as f64);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(offset).await;
            client(i, proto, &target, &publisher, rounds, interval, timeout).await
        }));
    }
    let kinds = Kind::of(p.protocol);
    let mut totals: Vec<Histogram<u64>> = kinds.iter().map(|_| histogram()).collect();
    let mut failed = 0;
    let mut errors = Vec::new();
    for t in tasks {
        let m = t
            .await
            .map_err(|e| BenchError(format!("a latency client panicked: {e}")))?;
        for (total, h) in totals.iter_mut().zip(&m.kinds) {
            total.add(h).expect("same bounds");
        }
        failed += m.failed;
        errors.extend(m.error);
    }
    let mut r = Report::new("latency");
    r.param("protocol", p.protocol.name());
    r.param("clients", p.clients);
    r.param("rounds", p.rounds);
    r.param("interval", format!("{:?}", p.interval));
    r.param("url", p.target.ws_url());
    r.seconds = started.elapsed().as_secs_f64();
    let done: u64 = totals.iter().map(|h| h.len()).sum();
    r.counter("round_trips", done);
    r.counter("round_trips_failed", failed);
    for (kind, h) in kinds.iter().zip(totals) {
        r.trend(&format!("latency_{}", kind.name()), h);
    }
    cpu.finish(&mut r);
    for e in errors {
        r.notes.push(format!("error: {e}"));
    }
    Ok(r)
}

/// One client: connect, subscribe to its own bench channel, then each
/// round every kind once, `interval` apart. A failed round trip is
/// counted and the client stops (its connection's state is unknown).
async fn client(
    i: usize,
    proto: Proto,
    target: &Target,
    publisher: &Publisher,
    rounds: usize,
    interval: Duration,
    timeout: Duration,
) -> Measured {
    let kinds = Kind::of(proto);
    let mut m = Measured {
        kinds: kinds.iter().map(|_| histogram()).collect(),
        failed: 0,
        error: None,
    };
    let own = format!("latency-{i}");
    let setup = async {
        let mut conn = proto.open(target, None, timeout).await?;
        if proto.is_cable() {
            // `BenchmarkChannel` itself for the echo, and the
            // subscription whose stream is bench channel `own`.
            let ids = [
                actioncable::IDENTIFIER.to_string(),
                actioncable::identifier_for(&own),
            ];
            actioncable::subscribe_identifiers(&mut conn, &ids, timeout).await?;
        } else {
            proto
                .subscribe(&mut conn, target, &[&own], "", timeout)
                .await?;
        }
        Ok::<_, ClientError>(conn)
    };
    let mut conn = match setup.await {
        Ok(c) => c,
        Err(e) => {
            m.failed += 1;
            m.error = Some(proto.explain(&e, target));
            return m;
        }
    };
    let mut next = tokio::time::Instant::now();
    let mut seq = 0u64;
    for round in 0..rounds {
        for (k, kind) in kinds.iter().enumerate() {
            tokio::time::sleep_until(next).await;
            next += interval;
            seq += 1;
            let id = MsgId {
                sender: i as u64,
                seq,
            };
            let result = tokio::time::timeout(
                timeout,
                once(*kind, proto, &mut conn, target, publisher, &own, round, id),
            )
            .await
            .unwrap_or(Err(ClientError::Timeout(
                "waiting for the round trip's answer",
            )));
            match result {
                Ok(took) => {
                    m.kinds[k].saturating_record(took.as_micros().max(1) as u64);
                }
                Err(e) => {
                    m.failed += 1;
                    m.error = Some(format!(
                        "{} round trip: {}",
                        kind.name(),
                        proto.explain(&e, target)
                    ));
                    conn.close().await;
                    return m;
                }
            }
        }
    }
    conn.close().await;
    m
}

/// One round trip of `kind`; returns how long it took.
#[allow(clippy::too_many_arguments)]
async fn once(
    kind: Kind,
    proto: Proto,
    conn: &mut Conn,
    target: &Target,
    publisher: &Publisher,
    own: &str,
    round: usize,
    id: MsgId,
) -> Result<Duration, ClientError> {
    match kind {
        Kind::Ping => {
            let at = Instant::now();
            conn.send(r#"{"event":"pusher:ping","data":{}}"#.into())
                .await?;
            wait(proto, conn, |t| t.contains("pusher:pong")).await?;
            Ok(at.elapsed())
        }
        Kind::Perform => {
            let n = id.seq;
            let data = json!({"action": "echo", "n": n}).to_string();
            let command = json!({
                "command": "message",
                "identifier": actioncable::IDENTIFIER,
                "data": data,
            })
            .to_string();
            let at = Instant::now();
            conn.send(command).await?;
            wait(proto, conn, |t| {
                let v: Value = serde_json::from_str(t).unwrap_or(Value::Null);
                v["message"]["action"] == "echo" && v["message"]["n"] == n
            })
            .await?;
            Ok(at.elapsed())
        }
        Kind::Subscribe => subscribe_round(proto, conn, target, own, round).await,
        Kind::Publish => {
            let data = bench_data(super::now_us(), id);
            let at = Instant::now();
            publisher.publish(own, "latency", &data).await?;
            loop {
                let text = next_frame(proto, conn).await?;
                if proto.scan(&text, "latency").id == Some(id) {
                    return Ok(at.elapsed());
                }
            }
        }
    }
}

/// Subscribe to a fresh bench channel, timed until its confirmation; then
/// leave it again (waiting for the leave's answer where there is one, so
/// it is not read as the next round trip's).
async fn subscribe_round(
    proto: Proto,
    conn: &mut Conn,
    target: &Target,
    own: &str,
    round: usize,
) -> Result<Duration, ClientError> {
    let name = format!("{own}-s{round}");
    let far = Duration::from_secs(3600);
    match proto {
        Proto::Pusher => {
            let at = Instant::now();
            conn.send(json!({"event": "pusher:subscribe", "data": {"channel": name}}).to_string())
                .await?;
            wait(proto, conn, |t| {
                t.contains("pusher_internal:subscription_succeeded") && t.contains(&name)
            })
            .await?;
            let took = at.elapsed();
            conn.send(
                json!({"event": "pusher:unsubscribe", "data": {"channel": name}}).to_string(),
            )
            .await?;
            Ok(took)
        }
        Proto::ActionCable | Proto::ActionCableExt => {
            let identifier = actioncable::identifier_for(&name);
            let at = Instant::now();
            actioncable::subscribe_identifiers(conn, std::slice::from_ref(&identifier), far)
                .await?;
            let took = at.elapsed();
            conn.send(json!({"command": "unsubscribe", "identifier": identifier}).to_string())
                .await?;
            Ok(took)
        }
        _ => {
            let at = Instant::now();
            appsync::subscribe(conn, target, &name, far, proto).await?;
            let took = at.elapsed();
            let (stop, done) = match proto {
                Proto::AppsyncGraphql => ("stop", "complete"),
                _ => ("unsubscribe", "unsubscribe_success"),
            };
            conn.send(json!({"type": stop, "id": name}).to_string())
                .await?;
            wait(proto, conn, |t| t.contains(done)).await?;
            Ok(took)
        }
    }
}

/// The next text frame (Pusher's answering server pings on the way).
async fn next_frame(proto: Proto, conn: &mut Conn) -> Result<String, ClientError> {
    Ok(match proto {
        Proto::Pusher => conn.recv().await?.to_string(),
        _ => next_text(&mut conn.ws).await?.to_string(),
    })
}

/// Read frames until one `is` the answer.
async fn wait(proto: Proto, conn: &mut Conn, is: impl Fn(&str) -> bool) -> Result<(), ClientError> {
    loop {
        let text = next_frame(proto, conn).await?;
        if is(&text) {
            return Ok(());
        }
    }
}
