#!/usr/bin/env bash
# Run one `herald bench` scenario against a fresh release build of Herald:
# builds, starts the server on a free loopback port, runs the bench with
# --server-pid (so server CPU and memory are reported), stops the server.
#
#   bench/run.sh broadcast
#   bench/run.sh connect --sweep 1000,2000,5000,10000,20000
#   bench/run.sh fanout --clients 10000 --channels 10 --rate 1000
#   bench/run.sh idle --clients 10000
#
# Extra flags go to `herald bench <scenario>` (see `herald bench <scenario> --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,12p' "$0"; exit 2; }
cargo build --release --quiet
bin=./target/release/herald
port="${HERALD_BENCH_PORT:-18080}"
# Tens of thousands of connections need as many file descriptors, on both sides.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
"$bin" serve --port "$port" --log warn &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.1
done
"$bin" bench "$@" --url "ws://127.0.0.1:$port" --server-pid "$pid"
