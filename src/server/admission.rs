//! Per-address admission: how many connections one client address holds
//! and how many it opened this second (`max_connections_per_address`,
//! `max_connection_rate_per_address`), decided once per accepted TCP
//! connection, before any byte is read.
//!
//! The counters live in a sharded map (dashmap) keyed by address: one
//! short shard lock at accept and one at close, nothing in between. The
//! connection carries its [`Ticket`] inside its I/O ([`Counted`]), through
//! the WebSocket upgrade, so the count falls when the socket is finally
//! dropped, whichever task drops it; reads and writes only pass through.
//!
//! IPv6 clients are counted by /64 (one subscriber line usually has a
//! whole /64 to pick addresses from); IPv4-mapped IPv6 addresses as IPv4.

use dashmap::DashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
// tokio's clock (the system's outside a paused test runtime): the rate
// window's tests move it by hand.
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// Refusals one address may have in flight (being answered 429) at once;
/// beyond them its connections are closed without an answer, so a flood
/// from one address cannot pin descriptors by being refused slowly.
pub const MAX_REFUSING_PER_ADDRESS: u32 = 64;

/// The key one client address is counted under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    V4(u32),
    /// The /64 prefix.
    V6(u64),
}

impl Key {
    fn of(ip: IpAddr) -> Key {
        match ip.to_canonical() {
            IpAddr::V4(a) => Key::V4(u32::from(a)),
            IpAddr::V6(a) => Key::V6((u128::from(a) >> 64) as u64),
        }
    }
}

#[derive(Debug, Default)]
struct Entry {
    open: u32,
    refusing: u32,
    /// The second (since the table's start) `opened` counts in.
    second: u64,
    opened: u32,
}

/// Why a connection is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The address holds `max_connections_per_address` already.
    Connections,
    /// The address opened `max_connection_rate_per_address` this second.
    Rate,
}

impl Refusal {
    /// The `reason` label of `herald_listener_refused_total`.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Connections => "address_connections",
            Refusal::Rate => "address_rate",
        }
    }
}

/// The decision for one accepted connection.
pub enum Admit {
    /// Serve it (the ticket, if any, counts it until dropped).
    Yes(Option<Ticket>),
    /// Answer 429 and close (the ticket counts the refusal in flight).
    Refuse(Refusal, Ticket),
    /// Close at once: the address has too many refusals in flight.
    Drop,
}

/// The per-address counters and limits.
pub struct Table {
    map: DashMap<Key, Entry>,
    max_open: u32,
    max_rate: u32,
    exempt: Vec<ipnet::IpNet>,
    start: Instant,
}

impl Table {
    /// `None` when neither limit is on: nothing to count.
    pub fn new(max_open: u32, max_rate: u32, exempt: Vec<ipnet::IpNet>) -> Option<Arc<Table>> {
        (max_open > 0 || max_rate > 0).then(|| {
            Arc::new(Table {
                map: DashMap::new(),
                max_open,
                max_rate,
                exempt,
                start: Instant::now(),
            })
        })
    }

    pub fn max_open(&self) -> u32 {
        self.max_open
    }

    pub fn max_rate(&self) -> u32 {
        self.max_rate
    }

    /// Decide for a connection from `ip`.
    pub fn admit(self: &Arc<Table>, ip: IpAddr) -> Admit {
        let canonical = ip.to_canonical();
        if self.exempt.iter().any(|n| n.contains(&canonical)) {
            return Admit::Yes(None);
        }
        let key = Key::of(ip);
        let second = self.start.elapsed().as_secs();
        let mut e = self.map.entry(key).or_default();
        let refusal = if self.max_open > 0 && e.open >= self.max_open {
            Some(Refusal::Connections)
        } else if self.max_rate > 0 && e.second == second && e.opened >= self.max_rate {
            Some(Refusal::Rate)
        } else {
            None
        };
        match refusal {
            None => {
                if e.second != second {
                    e.second = second;
                    e.opened = 0;
                }
                e.opened += 1;
                e.open += 1;
                Admit::Yes(Some(Ticket {
                    table: self.clone(),
                    key,
                    refusing: false,
                }))
            }
            Some(_) if e.refusing >= MAX_REFUSING_PER_ADDRESS => Admit::Drop,
            Some(r) => {
                e.refusing += 1;
                Admit::Refuse(
                    r,
                    Ticket {
                        table: self.clone(),
                        key,
                        refusing: true,
                    },
                )
            }
        }
    }

    /// Forget addresses with nothing open and nothing counted this second
    /// (run from housekeeping): the map holds only live and recent ones.
    pub fn sweep(&self) {
        let second = self.start.elapsed().as_secs();
        self.map
            .retain(|_, e| e.open > 0 || e.refusing > 0 || e.second >= second);
    }

    /// Addresses tracked now.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// One counted connection (or refusal in flight); uncounts on drop.
pub struct Ticket {
    table: Arc<Table>,
    key: Key,
    refusing: bool,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(mut e) = self.table.map.get_mut(&self.key) {
            if self.refusing {
                e.refusing = e.refusing.saturating_sub(1);
            } else {
                e.open = e.open.saturating_sub(1);
            }
        }
    }
}

/// A connection's I/O with its ticket: the ticket goes wherever the
/// socket goes (into the upgraded WebSocket) and is dropped with it.
pub struct Counted<S> {
    io: S,
    _ticket: Option<Ticket>,
}

impl<S> Counted<S> {
    pub fn new(io: S, ticket: Option<Ticket>) -> Counted<S> {
        Counted {
            io,
            _ticket: ticket,
        }
    }

    pub fn inner(&self) -> &S {
        &self.io
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn counts_open_connections_and_frees_them_on_drop() {
        let t = Table::new(2, 0, vec![]).unwrap();
        let a = t.admit(ip("10.0.0.1"));
        let b = t.admit(ip("10.0.0.1"));
        assert!(matches!(a, Admit::Yes(Some(_))));
        assert!(matches!(b, Admit::Yes(Some(_))));
        assert!(matches!(
            t.admit(ip("10.0.0.1")),
            Admit::Refuse(Refusal::Connections, _)
        ));
        // Another address is not affected; the same /64 is.
        assert!(matches!(t.admit(ip("10.0.0.2")), Admit::Yes(Some(_))));
        drop(a);
        assert!(matches!(t.admit(ip("10.0.0.1")), Admit::Yes(Some(_))));
        let v6 = Table::new(1, 0, vec![]).unwrap();
        let _x = v6.admit(ip("2001:db8::1"));
        assert!(matches!(v6.admit(ip("2001:db8::2")), Admit::Refuse(..)));
        assert!(matches!(v6.admit(ip("2001:db8:0:1::1")), Admit::Yes(_)));
    }

    #[test]
    fn rate_exemptions_and_refusals_in_flight() {
        let t = Table::new(0, 2, vec!["127.0.0.0/8".parse().unwrap()]).unwrap();
        let _a = t.admit(ip("10.0.0.1"));
        let _b = t.admit(ip("10.0.0.1"));
        let mut held = Vec::new();
        for _ in 0..MAX_REFUSING_PER_ADDRESS {
            match t.admit(ip("10.0.0.1")) {
                Admit::Refuse(Refusal::Rate, ticket) => held.push(ticket),
                _ => panic!("expected a rate refusal"),
            }
        }
        assert!(matches!(t.admit(ip("10.0.0.1")), Admit::Drop));
        held.pop();
        assert!(matches!(t.admit(ip("10.0.0.1")), Admit::Refuse(..)));
        // Exempt, also as an IPv4-mapped IPv6 address: never counted.
        for _ in 0..10 {
            assert!(matches!(t.admit(ip("127.0.0.1")), Admit::Yes(None)));
            assert!(matches!(t.admit(ip("::ffff:127.0.0.1")), Admit::Yes(None)));
        }
        assert!(Table::new(0, 0, vec![]).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn the_rate_window_starts_afresh_each_second() {
        let t = Table::new(0, 3, vec![]).unwrap();
        let mut held = Vec::new();
        for second in 0..3 {
            for _ in 0..3 {
                match t.admit(ip("10.0.0.1")) {
                    Admit::Yes(Some(ticket)) => held.push(ticket),
                    _ => panic!("refused within the rate in second {second}"),
                }
            }
            assert!(
                matches!(t.admit(ip("10.0.0.1")), Admit::Refuse(Refusal::Rate, _)),
                "the fourth in second {second} was let in"
            );
            tokio::time::advance(std::time::Duration::from_secs(1)).await;
        }
    }

    #[test]
    fn an_ipv4_mapped_address_counts_as_its_ipv4_address() {
        // A dual-stack listener sees IPv4 clients as ::ffff:a.b.c.d: they
        // must not all share one IPv6 /64 count, nor escape their own.
        let t = Table::new(1, 0, vec![]).unwrap();
        let _a = t.admit(ip("10.0.0.1"));
        assert!(matches!(
            t.admit(ip("::ffff:10.0.0.1")),
            Admit::Refuse(Refusal::Connections, _)
        ));
        assert!(matches!(
            t.admit(ip("::ffff:10.0.0.2")),
            Admit::Yes(Some(_))
        ));
    }

    #[test]
    fn sweep_keeps_only_live_addresses() {
        let t = Table::new(5, 0, vec![]).unwrap();
        let a = t.admit(ip("10.0.0.1"));
        drop(t.admit(ip("10.0.0.2")));
        t.sweep();
        assert_eq!(t.len(), 2, "this second's entries stay");
        drop(a);
        assert!(t.len() <= 2);
    }
}
