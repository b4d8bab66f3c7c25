#!/usr/bin/env bash
# permessage-deflate, measured side by side in one sitting: `fanout` with
# 2 KiB JSON events (bytes on the wire, server CPU per delivery) and `idle`
# (memory per connection), in alternating rounds of
#   plain      the bench offers no extension (frames go uncompressed)
#   deflate    the bench offers it, as browsers do (compressed once per
#              publication, shared by every subscriber)
#   per-sub    the same, with the server compressing each subscriber's
#              frame for it alone (HERALD_DEFLATE_PER_SUBSCRIBER=1, a
#              measurement switch): what compressing once saves
# Each run gets a fresh server. Reports go to $OUT (JSON per run);
# SKIP_IDLE=1 runs `fanout` only.
#
#   bench/deflate.sh [ROUNDS] [fanout flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
shift || true
bin="${HERALD_BIN:-./target/release/herald}"
out="${OUT:-/tmp/herald-deflate}"
mkdir -p "$out"
port="${HERALD_BENCH_PORT:-18090}"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

serve() { # env... -- starts the server, sets $pid
  env "$@" "$bin" serve --port "$port" --log warn &
  pid=$!
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return
    sleep 0.1
  done
  echo "server did not start" >&2
  exit 1
}
stop() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
trap stop EXIT

fanout=(--clients 1000 --channels 10 --publishers 10 --rate 100 --duration 20s
  --payload-bytes 2048 "$@")
for r in $(seq "$rounds"); do
  for mode in plain deflate per-sub; do
    envs=(HERALD_X=1)
    flags=()
    [ "$mode" != plain ] && flags=(--deflate)
    [ "$mode" = per-sub ] && envs=(HERALD_DEFLATE_PER_SUBSCRIBER=1)
    serve "${envs[@]}"
    "$bin" bench fanout "${fanout[@]}" "${flags[@]}" --url "ws://127.0.0.1:$port" \
      --server-pid "$pid" --no-progress --json "$out/fanout-$mode-$r.json" >"$out/fanout-$mode-$r.txt"
    # The fan-out workers' own time (compression included) and the
    # frames compressed, beside the process's CPU.
    curl -s "http://127.0.0.1:$port/metrics" |
      grep -E '^herald_(fanout_(jobs|microseconds)|frames_(compressed|encoded|delivered)|direct_writes|socket_writes)_total' \
      >"$out/metrics-$mode-$r.txt" || true
    stop
  done
  [ -n "${SKIP_IDLE:-}" ] && continue
  for mode in plain deflate; do
    flags=()
    [ "$mode" = deflate ] && flags=(--deflate)
    serve HERALD_X=1
    "$bin" bench idle --clients 5000 --duration 10s "${flags[@]}" --url "ws://127.0.0.1:$port" \
      --server-pid "$pid" --no-progress --json "$out/idle-$mode-$r.json" >"$out/idle-$mode-$r.txt"
    stop
  done
done
echo "reports in $out"
