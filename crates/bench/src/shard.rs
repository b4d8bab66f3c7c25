//! The child's side of a `--processes` run: which clients this generator
//! process owns, and the line protocol with its parent over stdin/stdout.
//!
//! Client `i` (a connection, a virtual user, a publisher) of the run
//! belongs to child `i mod N`, so each child holds about 1/N of every kind
//! of client, and a client keeps the global number it would have had in
//! one process (its channel, node and source address follow from it).
//! Numbers a child makes up during the run (connection and message ids)
//! are `local × N + index`, so they are unique across the children and
//! still dense: the receivers' bitmaps stay one bit per message.
//!
//! The children meet at barriers: a child writes `TAG JSON` on a line to
//! stdout and waits; once every child has written the same tag, the parent
//! answers each with `TAG [JSON of child 0, JSON of child 1, ...]`. That is
//! how they start together, how the parent measures the server while all
//! are open, and how each child learns what the others published, so that
//! it can tell exactly which messages its own receivers were owed. At the
//! end the child writes `report JSON` ([`super::merge::encode`]) and exits.

use super::BenchError;
use serde_json::Value;
use std::io::{BufRead, Write};

/// This process's part of a run of `count` generator processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl Shard {
    /// `INDEX/COUNT@EPOCH` (the hidden `--shard` flag): the child's place
    /// and the bench clock's zero in microseconds of `CLOCK_MONOTONIC`.
    pub fn parse(s: &str) -> Result<(Shard, u64), String> {
        let bad = || format!("--shard {s:?}: expected INDEX/COUNT@EPOCH");
        let (place, epoch) = s.split_once('@').ok_or_else(bad)?;
        let (i, n) = place.split_once('/').ok_or_else(bad)?;
        let index: usize = i.parse().map_err(|_| bad())?;
        let count: usize = n.parse().map_err(|_| bad())?;
        let epoch: u64 = epoch.parse().map_err(|_| bad())?;
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok((Shard { index, count }, epoch))
    }

    /// Whether client `i` of the run is this child's.
    pub fn owns(&self, i: usize) -> bool {
        i % self.count == self.index
    }

    /// How many of `n` clients are this child's.
    pub fn share(&self, n: usize) -> usize {
        (0..n).filter(|&i| self.owns(i)).count()
    }

    /// The run-wide number of this child's `local`-th id.
    pub fn global(&self, local: u64) -> u64 {
        local * self.count as u64 + self.index as u64
    }
}

/// Whether client `i` is this process's: every client when it runs alone.
pub fn owns(shard: Option<Shard>, i: usize) -> bool {
    shard.is_none_or(|s| s.owns(i))
}

/// How many of `n` clients this process runs.
pub fn share(shard: Option<Shard>, n: usize) -> usize {
    shard.map_or(n, |s| s.share(n))
}

/// The run-wide number of this process's `local`-th id.
pub fn global(shard: Option<Shard>, local: u64) -> u64 {
    shard.map_or(local, |s| s.global(local))
}

/// Reach barrier `tag` with `payload` and wait for the parent: every
/// child's payload for it, in child order. Alone (no shard), the answer is
/// this process's payload only.
pub async fn sync(
    shard: Option<Shard>,
    tag: &'static str,
    payload: Value,
) -> Result<Vec<Value>, BenchError> {
    if shard.is_none() {
        return Ok(vec![payload]);
    }
    let line = format!("{tag} {payload}\n");
    tokio::task::spawn_blocking(move || {
        let mut out = std::io::stdout().lock();
        out.write_all(line.as_bytes())
            .and_then(|_| out.flush())
            .map_err(|e| BenchError(format!("cannot write to the parent process: {e}")))?;
        drop(out);
        let mut answer = String::new();
        std::io::stdin()
            .lock()
            .read_line(&mut answer)
            .map_err(|e| BenchError(format!("cannot read from the parent process: {e}")))?;
        let rest = answer
            .strip_prefix(tag)
            .and_then(|r| r.strip_prefix(' '))
            .ok_or_else(|| {
                BenchError(format!(
                    "the parent process answered {:?} at barrier {tag:?} (it ended, or another \
                     child failed)",
                    answer.chars().take(40).collect::<String>()
                ))
            })?;
        match serde_json::from_str(rest) {
            Ok(Value::Array(all)) => Ok(all),
            _ => Err(BenchError(format!(
                "the parent's answer at barrier {tag:?} is not a JSON array"
            ))),
        }
    })
    .await
    .map_err(|e| BenchError(format!("barrier {tag:?}: {e}")))?
}

/// Hand the finished report to the parent.
pub fn send_report(report: &super::Report) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "report {}", super::merge::encode(report))?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_every_client_once() {
        let (s, epoch) = Shard::parse("1/3@12345").unwrap();
        assert_eq!((s.index, s.count, epoch), (1, 3, 12345));
        let shards: Vec<Shard> = (0..3).map(|index| Shard { index, count: 3 }).collect();
        for i in 0..10 {
            assert_eq!(shards.iter().filter(|s| s.owns(i)).count(), 1);
        }
        assert_eq!(shards.iter().map(|s| s.share(10)).sum::<usize>(), 10);
        let ids: std::collections::BTreeSet<u64> = shards
            .iter()
            .flat_map(|s| (0..4).map(|l| s.global(l)))
            .collect();
        assert_eq!(ids, (0..12).collect());
        assert!(Shard::parse("3/3@1").is_err());
        assert!(Shard::parse("0/0@1").is_err());
        assert!(Shard::parse("0/2").is_err());
        assert!(owns(None, 7) && share(None, 7) == 7 && global(None, 7) == 7);
    }
}
