#!/usr/bin/env bash
# `herald bench fanout` against a three-node cluster: starts a broker
# (redis-server or nats-server) and three release `herald serve` nodes on
# free loopback ports, runs the bench with publishers on node 0 and
# subscribers spread over the three, and prints each process's CPU (from
# /proc, user + system) over the bench run.
#
#   bench/cluster.sh redis --clients 3000 --channels 10 --rate 100 --duration 15s
#   bench/cluster.sh nats  --clients 3000 --channels 10 --rate 100 --duration 15s
#   bench/cluster.sh single --clients 3000 --channels 10 --rate 100 --duration 15s
#
# `single` is the same load on one node with the local broker, for
# comparison. Extra flags go to `herald bench fanout`.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,14p' "$0"; exit 2; }
kind="$1"; shift
cargo build --release --quiet
bin=./target/release/herald
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
base="${HERALD_BENCH_PORT:-18600}"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }
# CPU seconds (user + system) of a pid.
cpu() { awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat"; }

bport=$((base + 9))
case "$kind" in
  redis) redis-server --port "$bport" --bind 127.0.0.1 --save "" --appendonly no >/dev/null & pids+=($!); url="redis://127.0.0.1:$bport" ;;
  nats) nats-server -a 127.0.0.1 -p "$bport" >/dev/null 2>&1 & pids+=($!); url="nats://127.0.0.1:$bport" ;;
  single) url="local" ;;
  *) echo "first argument: redis, nats or single" >&2; exit 2 ;;
esac
broker_pid=""
[ "$kind" != single ] && { broker_pid="${pids[0]}"; wait_port "$bport"; }
n=3; [ "$kind" = single ] && n=1
nodes=(); subs=()
for i in $(seq 0 $((n - 1))); do
  port=$((base + i))
  "$bin" serve --port "$port" --log warn --broker "$url" & pids+=($!); nodes+=($!)
  subs+=("ws://127.0.0.1:$port")
done
for i in $(seq 0 $((n - 1))); do
  port=$((base + i))
  for _ in $(seq 100); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/ready")" = 200 ] && break
    sleep 0.1
  done
done
all=("${nodes[@]}"); [ -n "$broker_pid" ] && all+=("$broker_pid")
declare -A before
for p in "${all[@]}"; do before[$p]=$(cpu "$p"); done
t0=$(date +%s.%N)
sub_urls=$(IFS=,; echo "${subs[*]}")
"$bin" bench fanout --url "ws://127.0.0.1:$base" --subscriber-url "$sub_urls" --server-pid "${nodes[0]}" "$@" &
gen=$!
wait "$gen"
t1=$(date +%s.%N)
echo "--- CPU over the whole bench run ($(echo "$t1 - $t0" | bc) s wall):"
for i in "${!nodes[@]}"; do
  p=${nodes[$i]}
  echo "node $i: $(echo "$(cpu "$p") - ${before[$p]}" | bc) s"
done
[ -n "$broker_pid" ] && echo "$kind-server: $(echo "$(cpu "$broker_pid") - ${before[$broker_pid]}" | bc) s"
echo "(generator: see its own report)"
