#!/usr/bin/env bash
# One `herald bench` run across many server nodes and several generator
# processes: starts a broker (redis-server, a six-server Redis Cluster or
# nats-server) and NODES server nodes on loopback ports, then runs
#   herald bench SCENARIO --url <every node> --server-pid <every node>
#                         --processes PROCESSES [flags...]
# and prints the broker's CPU and memory over the run (the bench reports
# each node's). Every process here may hold 20,000 descriptors, so 100,000
# connections need >= 6 nodes and >= 6 generator processes:
#
#   bench/cluster-multi.sh 6 6 redis idle --clients 100000 --duration 30s
#   bench/cluster-multi.sh 6 6 redis-cluster fanout --clients 100000 --channels 100 --rate 20 --duration 30s
#   bench/cluster-multi.sh 1 1 local idle --clients 16667 --duration 30s   # one node at the same load
#   SERVER=sockudo SOCKUDO_BIN=/path/to/sockudo bench/cluster-multi.sh 6 6 redis-cluster idle ...
#
# BROKER: redis, redis-cluster (six cluster-enabled redis-server, three
# masters with a replica each, made by `redis-cli --cluster create`), nats,
# or local (one node, no broker). SERVER: herald (default) or sockudo (a
# peer built outside this repository, at SOCKUDO_BIN; redis, redis-cluster
# or local; the bench's development app, limits and rate limiting off).
# Reports go where the flags say (--json FILE). Loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 4 ] || { sed -n '2,21p' "$0"; exit 2; }
nodes=$1 procs=$2 kind=$3 scenario=$4; shift 4
server="${SERVER:-herald}"
[ "${SKIP_BUILD:-}" ] || cargo build --release --quiet
bin=./target/release/herald
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
base="${HERALD_BENCH_PORT:-18800}"
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }
cpu() { awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat"; }
rss_kb() { awk '/^VmRSS/ { print $2 }' "/proc/$1/status"; }

bport=$((base + 99))
broker_pids=()
case "$kind" in
  redis) redis-server --port "$bport" --bind 127.0.0.1 --save "" --appendonly no >/dev/null & broker_pids+=($!); pids+=($!)
    wait_port "$bport"; url="redis://127.0.0.1:$bport" ;;
  redis-cluster)
    # Client ports base+100..105, bus ports base+110..115. A 5 s node
    # timeout: on a loaded 2-core machine 1 s can fail a master over
    # without a fault.
    seeds=()
    for i in 0 1 2 3 4 5; do
      p=$((base + 100 + i))
      redis-server --port "$p" --cluster-port $((base + 110 + i)) --bind 127.0.0.1 \
        --cluster-enabled yes --cluster-config-file "nodes-$p.conf" --cluster-node-timeout 5000 \
        --save "" --appendonly no --dir "$work" >/dev/null & broker_pids+=($!); pids+=($!)
      seeds+=("127.0.0.1:$p")
    done
    for s in "${seeds[@]}"; do wait_port "${s#*:}"; done
    timeout 30 redis-cli --cluster create "${seeds[@]}" --cluster-replicas 1 --cluster-yes >/dev/null
    for s in "${seeds[@]}"; do
      for _ in $(seq 300); do
        redis-cli -p "${s#*:}" cluster info | grep -q '^cluster_state:ok' && break
        sleep 0.1
      done
      redis-cli -p "${s#*:}" cluster info | grep -q '^cluster_state:ok' || { echo "Redis Cluster node $s not ok" >&2; exit 1; }
    done
    url="redis-cluster://$(IFS=,; echo "${seeds[*]}")" ;;
  nats) nats-server -a 127.0.0.1 -p "$bport" >/dev/null 2>&1 & broker_pids+=($!); pids+=($!)
    wait_port "$bport"; url="nats://127.0.0.1:$bport" ;;
  local) [ "$nodes" = 1 ] || { echo "local: one node only" >&2; exit 2; }; url="local" ;;
  *) echo "BROKER: redis, redis-cluster, nats or local" >&2; exit 2 ;;
esac

# A node of the server under test on $1, in the background; sets $node_pid.
start_node() {
  local port=$1 i=$2
  case "$server" in
    herald) "$bin" serve --port "$port" --log warn --broker "$url" & node_pid=$! ;;
    sockudo)
      [ -x "${SOCKUDO_BIN:-}" ] || { echo "SERVER=sockudo needs SOCKUDO_BIN (an executable)" >&2; exit 2; }
      local adapter=local nodes_env=""
      case "$kind" in
        redis) adapter=redis ;;
        redis-cluster) adapter=redis-cluster; nodes_env="${url#redis-cluster://}" ;;
        local) ;;
        *) echo "SERVER=sockudo: redis, redis-cluster or local" >&2; exit 2 ;;
      esac
      # Its own empty directory: sockudo reads config/config.{toml,json}
      # from the working directory when present. A clustered sockudo
      # refuses to start with a node-local cache (its idempotency keys),
      # so the cache goes to the same Redis.
      mkdir -p "$work/sockudo-$i"
      (cd "$work/sockudo-$i" && exec env HOST=127.0.0.1 PORT="$port" METRICS_ENABLED=false \
        RATE_LIMITER_ENABLED=false SOCKUDO_MAX_CONNECTIONS=0 INSTANCE_PROCESS_ID="bench-node-$i" \
        ADAPTER_DRIVER="$adapter" CACHE_DRIVER="${adapter/local/memory}" ADAPTER_FALLBACK_TO_LOCAL=false REDIS_URL="redis://127.0.0.1:$bport" \
        ${nodes_env:+REDIS_CLUSTER_NODES="$nodes_env"} \
        SOCKUDO_DEFAULT_APP_ID=app-id SOCKUDO_DEFAULT_APP_KEY=app-key SOCKUDO_DEFAULT_APP_SECRET=app-secret \
        SOCKUDO_DEFAULT_APP_MAX_CONNECTIONS=1000000 SOCKUDO_DEFAULT_APP_MAX_BACKEND_EVENTS_PER_SECOND=1000000 \
        SOCKUDO_DEFAULT_APP_MAX_CLIENT_EVENTS_PER_SECOND=1000000 SOCKUDO_DEFAULT_APP_MAX_READ_REQUESTS_PER_SECOND=1000000 \
        SOCKUDO_DEFAULT_APP_MAX_PRESENCE_MEMBERS_PER_CHANNEL=100000 SOCKUDO_DEFAULT_APP_ENABLE_CLIENT_MESSAGES=true \
        RUST_LOG=warn "$SOCKUDO_BIN" >"$work/sockudo-$i.log" 2>&1) & node_pid=$! ;;
    *) echo "SERVER: herald or sockudo" >&2; exit 2 ;;
  esac
}
ready_path() { case "$server" in herald) echo /ready ;; sockudo) echo /up ;; esac; }

urls=() node_pids=()
for i in $(seq 0 $((nodes - 1))); do
  port=$((base + i))
  start_node "$port" "$i"; pids+=("$node_pid"); node_pids+=("$node_pid")
  urls+=("ws://127.0.0.1:$port")
done
for i in $(seq 0 $((nodes - 1))); do
  for _ in $(seq 300); do
    kill -0 "${node_pids[$i]}" 2>/dev/null || { echo "node $i exited (port $((base + i)) taken? set HERALD_BENCH_PORT)" >&2; cat "$work/sockudo-$i.log" 2>/dev/null | tail -5 >&2; exit 1; }
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$((base + i))$(ready_path)")" = 200 ] && break
    sleep 0.1
  done
done
bcpu() { local s=0; for p in "${broker_pids[@]}"; do s=$(echo "$s + $(cpu "$p")" | bc); done; echo "$s"; }
[ ${#broker_pids[@]} -gt 0 ] && b0=$(bcpu)
t0=$(date +%s.%N)
"$bin" bench "$scenario" --url "$(IFS=,; echo "${urls[*]}")" \
  --server-pid "$(IFS=,; echo "${node_pids[*]}")" --processes "$procs" "$@"
t1=$(date +%s.%N)
if [ ${#broker_pids[@]} -gt 0 ]; then
  per="" rss=0
  for p in "${broker_pids[@]}"; do
    per="$per $(printf '%.2f' "$(cpu "$p")")"; rss=$((rss + $(rss_kb "$p")))
  done
  printf -- '--- %s (%d broker processes) over the bench run (%.1f s wall): CPU %.2f s, RSS %d kB all together; CPU since start, each:%s s\n' \
    "$kind" "${#broker_pids[@]}" "$(echo "$t1 - $t0" | bc)" "$(echo "$(bcpu) - $b0" | bc)" "$rss" "$per"
fi
if [ "$server" = sockudo ]; then
  for i in $(seq 0 $((nodes - 1))); do
    [ -s "$work/sockudo-$i.log" ] && { echo "--- sockudo node $i log (last 5 lines):"; tail -5 "$work/sockudo-$i.log"; }
  done
fi
