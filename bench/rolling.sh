#!/usr/bin/env bash
# A rolling restart of a three-node cluster under `herald bench storm`
# (reliable streams, resumable sessions): a broker, `herald bench rpc-server` as the app, three nodes
# (bench/node.sh), and the storm with --node-url and --restart-cmd, each
# node stopped (SIGTERM, or SIGKILL with SIGNAL=kill) and started in turn
# while its clients reconnect to the others.
#
#   bench/rolling.sh herald-redis  TAG [storm flags, e.g. --clients 10000 --rate 100]
#   bench/rolling.sh herald-nats   TAG [...]   # nats-server -js
#   bench/rolling.sh anycable-nats TAG [...]   # anycable-go --broker=nats --pubsub=nats
#
# HERALD: the herald binary (default target/release/herald, built here if
# missing); ANYCABLE: anycable-go (default anycable-go on PATH); PROTOCOL:
# actioncable-ext (default) or actioncable; SIGNAL: term (default) or
# kill; OUT: where TAG.json and the logs go (default /tmp/rolling-bench).
# Prints the bench's summary and the load before and after; the nodes'
# logs stay in $OUT/TAG/node-N.log.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n '2,17p' "$0"; exit 2; }
kind=$1; tag=$2; shift 2
BIN=${HERALD:-target/release/herald}
ANY=${ANYCABLE:-anycable-go}
PROTOCOL=${PROTOCOL:-actioncable-ext}
SIGNAL=${SIGNAL:-term}
OUT=${OUT:-/tmp/rolling-bench}
[ -x "$BIN" ] || cargo build --release --quiet
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
base=${ROLLING_PORT:-18700}
rpc=$((base + 10)); bport=$((base + 9))
dir="$OUT/$tag"
rm -rf "$dir"; mkdir -p "$dir"
pids=()
cleanup() {
  for n in 0 1 2; do NODE_DIR=$dir bench/node.sh stop "$n" KILL 2>/dev/null || true; done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
wait_port() { for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.05; done; echo "port $1 never opened" >&2; exit 1; }

case "$kind" in
  herald-redis)
    redis-server --port "$bport" --bind 127.0.0.1 --save "" --appendonly no >"$dir/broker.log" 2>&1 & pids+=($!)
    broker="redis://127.0.0.1:$bport" ;;
  herald-nats|anycable-nats)
    nats-server -js -sd "$dir/jetstream" -a 127.0.0.1 -p "$bport" >"$dir/broker.log" 2>&1 & pids+=($!)
    broker="nats://127.0.0.1:$bport" ;;
  *) echo "first argument: herald-redis, herald-nats or anycable-nats" >&2; exit 2 ;;
esac
wait_port "$bport"
"$BIN" bench rpc-server --port "$rpc" --threads 1 \
  --broadcast-url "http://127.0.0.1:$base/_broadcast" 2>"$dir/app.log" & pids+=($!)
wait_port "$rpc"

urls=()
for n in 0 1 2; do
  port=$((base + n))
  echo "$port" >"$dir/node-$n.port"
  if [ "$kind" = anycable-nats ]; then
    echo "env ANYCABLE_DISABLE_TELEMETRY=true $ANY --host=127.0.0.1 --port=$port --rpc_host=127.0.0.1:$rpc \
--broadcast_adapter=http --http_broadcast_port=$port --broker=nats --pubsub=nats \
--nats_servers=$broker --log_level=warn" >"$dir/node-$n.cmd"
    echo "http://127.0.0.1:$port/health" >"$dir/node-$n.ready"
  else
    echo "$BIN serve --port $port --log warn --rpc-host 127.0.0.1:$rpc --broker $broker" >"$dir/node-$n.cmd"
    echo "http://127.0.0.1:$port/ready" >"$dir/node-$n.ready"
  fi
  NODE_DIR=$dir bench/node.sh start "$n"
  urls+=("ws://127.0.0.1:$port")
done
node_urls=$(IFS=,; echo "${urls[*]}")
sleep 1
echo "== $tag $kind $PROTOCOL SIG${SIGNAL^^} $(date -u +%FT%TZ) load: $(cat /proc/loadavg)"
"$BIN" bench storm --protocol "$PROTOCOL" --node-url "$node_urls" \
  --restart-cmd "NODE_DIR=$dir bench/node.sh restart {n} {signal}" --restart-signal "$SIGNAL" \
  --no-progress --json "$OUT/$tag.json" "$@"
echo "load after: $(cat /proc/loadavg)"
