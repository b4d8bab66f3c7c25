#!/usr/bin/env bash
# One `herald bench` run across many herald nodes and several generator
# processes: starts a broker (redis-server or nats-server) and NODES
# release `herald serve` nodes on loopback ports, then runs
#   herald bench SCENARIO --url <every node> --server-pid <every node>
#                         --processes PROCESSES [flags...]
# and prints the broker's CPU and memory over the run (the bench reports
# each node's). Every process here may hold 20,000 descriptors, so 100,000
# connections need >= 6 nodes and >= 6 generator processes:
#
#   bench/cluster-multi.sh 6 6 redis idle --clients 100000 --duration 30s
#   bench/cluster-multi.sh 6 6 redis fanout --clients 100000 --channels 100 --rate 20 --duration 30s
#   bench/cluster-multi.sh 1 1 local idle --clients 16667 --duration 30s   # one node at the same load
#
# BROKER: redis, nats, or local (one node, no broker). Reports go where
# the flags say (--json FILE). Loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 4 ] || { sed -n '2,17p' "$0"; exit 2; }
nodes=$1 procs=$2 kind=$3 scenario=$4; shift 4
[ "${SKIP_BUILD:-}" ] || cargo build --release --quiet
bin=./target/release/herald
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
base="${HERALD_BENCH_PORT:-18800}"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }
cpu() { awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat"; }
rss() { awk '/^VmRSS/ { print $2 " kB" }' "/proc/$1/status"; }

bport=$((base + 99))
broker_pid=""
case "$kind" in
  redis) redis-server --port "$bport" --bind 127.0.0.1 --save "" --appendonly no >/dev/null & broker_pid=$!; url="redis://127.0.0.1:$bport" ;;
  nats) nats-server -a 127.0.0.1 -p "$bport" >/dev/null 2>&1 & broker_pid=$!; url="nats://127.0.0.1:$bport" ;;
  local) [ "$nodes" = 1 ] || { echo "local: one node only" >&2; exit 2; }; url="local" ;;
  *) echo "BROKER: redis, nats or local" >&2; exit 2 ;;
esac
[ -n "$broker_pid" ] && { pids+=("$broker_pid"); wait_port "$bport"; }
urls=() node_pids=()
for i in $(seq 0 $((nodes - 1))); do
  port=$((base + i))
  "$bin" serve --port "$port" --log warn --broker "$url" & pids+=($!); node_pids+=($!)
  urls+=("ws://127.0.0.1:$port")
done
for i in $(seq 0 $((nodes - 1))); do
  for _ in $(seq 200); do
    kill -0 "${node_pids[$i]}" 2>/dev/null || { echo "node $i exited (port $((base + i)) taken? set HERALD_BENCH_PORT)" >&2; exit 1; }
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$((base + i))/ready")" = 200 ] && break
    sleep 0.1
  done
done
[ -n "$broker_pid" ] && b0=$(cpu "$broker_pid")
t0=$(date +%s.%N)
"$bin" bench "$scenario" --url "$(IFS=,; echo "${urls[*]}")" \
  --server-pid "$(IFS=,; echo "${node_pids[*]}")" --processes "$procs" "$@"
t1=$(date +%s.%N)
if [ -n "$broker_pid" ]; then
  b=$(echo "$(cpu "$broker_pid") - $b0" | bc)
  echo "--- $kind-server over the bench run ($(echo "$t1 - $t0" | bc) s wall): CPU $b s, RSS $(rss "$broker_pid")"
fi
