//! A TCP relay on loopback that holds every byte for a fixed delay, each
//! direction in order: a slow link between two test servers (a NATS route
//! that passes interest along late, [`crate::testing::NatsCluster::start_slow_route`]).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// Listens on a free loopback port and relays each connection to `to`,
/// every chunk `delay` late. Lives as long as the test process (its
/// threads end when the connections close).
pub struct DelayRelay {
    pub port: u16,
}

impl DelayRelay {
    pub fn start(to: u16, delay: Duration) -> DelayRelay {
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("bind the relay");
        let port = listener.local_addr().expect("relay address").port();
        thread::spawn(move || {
            for inbound in listener.incoming().flatten() {
                let Ok(outbound) = TcpStream::connect(("127.0.0.1", to)) else {
                    continue;
                };
                let (a, b) = (inbound.try_clone(), outbound.try_clone());
                let (Ok(a), Ok(b)) = (a, b) else { continue };
                pipe(inbound, outbound, delay);
                pipe(b, a, delay);
            }
        });
        DelayRelay { port }
    }
}

/// Copy `from` to `to`, each chunk written `delay` after it was read.
fn pipe(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
    });
    thread::spawn(move || {
        for (due, bytes) in rx {
            thread::sleep(due.saturating_duration_since(Instant::now()));
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
