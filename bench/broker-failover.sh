#!/usr/bin/env bash
# What a broker failover loses: starts real broker servers and
# three release `herald serve` nodes on loopback, runs
#   herald bench fanout --url <the three nodes> --fault-cmd <the fault> ...
# and prints the report (the window until deliveries were whole again,
# what was lost, duplicated). ENGINE and its fault:
#
#   redis-cluster  six redis-server in cluster mode (redis-cli --cluster
#                  create --cluster-replicas 1, node timeout 1 s); the
#                  master holding most of the bench's shard channels is
#                  SIGKILLed, its replica promoted
#   sentinel       a master, a replica and three sentinels (down after 1 s,
#                  failover timeout 3 s); the master is SIGKILLed
#   nats-cluster   three routed nats-server, node i given server i first
#                  and the others after; the server with the most client
#                  connections is SIGKILLed
#   node           one redis-server; herald node 0 is SIGKILLed (its
#                  subscribers return to the others 1 s later)
#
#   bench/broker-failover.sh nats-cluster
#   CLIENTS=3000 CHANNELS=100 RATE=50 DURATION=30s FAULT_AT=10s \
#     bench/broker-failover.sh redis-cluster --json /tmp/rc.json
#
# The load comes from the environment (defaults above); other flags go to
# `herald bench fanout` as they are. SKIP_BUILD=1 uses the release binary
# as it is (HERALD_BIN: another server binary; HERALD_GEN: another
# generator, so that two servers are loaded by one); HERALD_BENCH_PORT
# moves the ports (default 19400..19520).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,25p' "$0"; exit 2; }
engine=$1; shift
case "$engine" in redis-cluster|sentinel|nats-cluster|node) ;; *) sed -n '2,25p' "$0"; exit 2 ;; esac
[ "${SKIP_BUILD:-}" ] || cargo build --release --quiet --bin herald
bin=${HERALD_BIN:-${CARGO_TARGET_DIR:-./target}/release/herald}
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
base="${HERALD_BENCH_PORT:-19400}"
dir=$(mktemp -d /tmp/herald-failover.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
wait_port() { for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.05; done; echo "port $1 never opened" >&2; exit 1; }
# wait_for WHAT CMD...: until CMD succeeds, at most 30 s.
wait_for() {
  local what=$1; shift
  for _ in $(seq 300); do "$@" >/dev/null 2>&1 && return; sleep 0.1; done
  echo "timed out waiting for $what" >&2; exit 1
}
cli() { local p=$1; shift; redis-cli -h 127.0.0.1 -p "$p" "$@"; }

echo "--- $(date -u +%FT%TZ) $engine; load before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
bp=$((base + 10))
node_broker=()
case "$engine" in
  redis-cluster)
    ports=()
    for i in 0 1 2 3 4 5; do
      port=$((bp + i)); ports+=("$port")
      redis-server --port "$port" --cluster-port $((bp + 100 + i)) --bind 127.0.0.1 \
        --cluster-enabled yes --cluster-config-file "nodes-$port.conf" \
        --cluster-node-timeout 1000 --save "" --appendonly no --dir "$dir" >/dev/null &
      pids+=($!); echo $! > "$dir/pid-$port"
    done
    for p in "${ports[@]}"; do wait_port "$p"; done
    timeout 30 redis-cli --cluster create $(printf '127.0.0.1:%s ' "${ports[@]}") \
      --cluster-replicas 1 --cluster-yes >/dev/null
    cluster_ok() {
      for p in "${ports[@]}"; do
        cli "$p" cluster info | grep -q 'cluster_state:ok' || return 1
        if cli "$p" role | head -1 | grep -q slave; then
          cli "$p" info replication | grep -q 'master_link_status:up' || return 1
        fi
      done
    }
    wait_for "the cluster to be ok and the replicas in sync" cluster_ok
    url="redis-cluster://127.0.0.1:${ports[0]},127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}"
    for i in 0 1 2; do node_broker+=("$url"); done
    # The fault: the master with the most shard channels subscribed now.
    cat > "$dir/fault.sh" <<EOF
best= most=-1
for p in ${ports[*]}; do
  redis-cli -h 127.0.0.1 -p \$p role 2>/dev/null | head -1 | grep -q master || continue
  n=\$(redis-cli -h 127.0.0.1 -p \$p pubsub shardchannels | grep -c . || true)
  [ "\$n" -gt "\$most" ] && { best=\$p; most=\$n; }
done
[ -n "\$best" ] || exit 1
echo "killed the master on \$best, holding \$most of the shard channels" > "$dir/fault.log"
kill -9 "\$(cat "$dir/pid-\$best")"
EOF
    fault="sh $dir/fault.sh"
    ;;
  sentinel)
    master=$bp replica=$((bp + 1))
    redis-server --port "$master" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" >/dev/null &
    pids+=($!); master_pid=$!
    wait_port "$master"
    redis-server --port "$replica" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
      --replicaof 127.0.0.1 "$master" >/dev/null &
    pids+=($!)
    wait_port "$replica"
    synced() { cli "$replica" info replication | grep -q 'master_link_status:up'; }
    wait_for "the replica to sync" synced
    sentinels=()
    for i in 0 1 2; do
      port=$((bp + 2 + i)); sentinels+=("127.0.0.1:$port")
      printf 'port %s\nbind 127.0.0.1\ndir %s\nsentinel monitor heraldmaster 127.0.0.1 %s 2\nsentinel down-after-milliseconds heraldmaster 1000\nsentinel failover-timeout heraldmaster 3000\nsentinel parallel-syncs heraldmaster 1\n' \
        "$port" "$dir" "$master" > "$dir/sentinel-$port.conf"
      redis-server "$dir/sentinel-$port.conf" --sentinel >/dev/null &
      pids+=($!)
      wait_port "$port"
    done
    known() {
      for i in 0 1 2; do
        local m; m=$(cli $((bp + 2 + i)) sentinel master heraldmaster)
        echo "$m" | grep -A1 -x 'num-other-sentinels' | tail -1 | grep -qx 2 || return 1
        echo "$m" | grep -A1 -x 'num-slaves' | tail -1 | grep -qx 1 || return 1
      done
    }
    wait_for "the sentinels to know each other and the replica" known
    url="redis-sentinel://$(IFS=,; echo "${sentinels[*]}")/heraldmaster"
    for i in 0 1 2; do node_broker+=("$url"); done
    fault="kill -9 $master_pid"
    ;;
  nats-cluster)
    for i in 0 1 2; do
      routes=()
      for k in 0 1 2; do [ "$k" = "$i" ] || routes+=("nats://127.0.0.1:$((bp + 10 + k))"); done
      nats-server -a 127.0.0.1 -p $((bp + i)) -m $((bp + 20 + i)) \
        --cluster "nats://127.0.0.1:$((bp + 10 + i))" --cluster_name herald-failover \
        --routes "$(IFS=,; echo "${routes[*]}")" --server_name "n$i" >/dev/null 2>&1 &
      pids+=($!); nats_pids[$i]=$!
    done
    for i in 0 1 2; do wait_port $((bp + i)); done
    routed() { for i in 0 1 2; do curl -s "http://127.0.0.1:$((bp + 20 + i))/routez" | grep -q '"num_routes": *2' || return 1; done; }
    wait_for "the NATS routes" routed
    for i in 0 1 2; do
      list="nats://127.0.0.1:$((bp + i))"
      for k in 0 1 2; do [ "$k" = "$i" ] || list+=",nats://127.0.0.1:$((bp + k))"; done
      node_broker+=("$list")
    done
    # The fault: the server with the most client connections now (the
    # nodes' NATS clients pick a server of their list at random, so the
    # first of node 0's list may serve nobody).
    for i in 0 1 2; do echo "${nats_pids[$i]}" > "$dir/pid-$((bp + 20 + i))"; done
    cat > "$dir/fault.sh" <<EOF
best= most=-1
for m in $((bp + 20)) $((bp + 21)) $((bp + 22)); do
  n=\$(curl -s "http://127.0.0.1:\$m/varz" | grep -o '"connections": *[0-9]*' | grep -o '[0-9]*\$')
  [ -n "\$n" ] && [ "\$n" -gt "\$most" ] && { best=\$m; most=\$n; }
done
[ -n "\$best" ] || exit 1
echo "killed the nats-server monitored on \$best, holding \$most client connections" > "$dir/fault.log"
kill -9 "\$(cat "$dir/pid-\$best")"
EOF
    fault="sh $dir/fault.sh"
    ;;
  node)
    redis-server --port "$bp" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" >/dev/null &
    pids+=($!)
    wait_port "$bp"
    for i in 0 1 2; do node_broker+=("redis://127.0.0.1:$bp"); done
    ;;
esac

urls=() node_pids=()
for i in 0 1 2; do
  port=$((base + i))
  "$bin" serve --port "$port" --log warn --broker "${node_broker[$i]}" 2>>"$dir/node-$i.log" &
  pids+=($!); node_pids+=($!)
  urls+=("ws://127.0.0.1:$port")
done
for i in 0 1 2; do
  for _ in $(seq 300); do
    kill -0 "${node_pids[$i]}" 2>/dev/null || { echo "node $i exited:" >&2; cat "$dir/node-$i.log" >&2; exit 1; }
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$((base + i))/ready")" = 200 ] && break
    sleep 0.1
  done
done
[ "$engine" = node ] && fault="kill -9 ${node_pids[0]}"
# When the fault ran, on the wall clock (the nodes' logs use it too).
fault="date -u +%T.%N > $dir/fault-at; $fault"

"${HERALD_GEN:-$bin}" bench fanout --url "$(IFS=,; echo "${urls[*]}")" \
  --clients "${CLIENTS:-3000}" --channels "${CHANNELS:-100}" --rate "${RATE:-50}" \
  --duration "${DURATION:-30s}" --fault-at "${FAULT_AT:-10s}" --fault-cmd "$fault" "$@"
[ -f "$dir/fault.log" ] && echo "--- $(cat "$dir/fault.log")"
echo "--- the fault ran at $(cat "$dir/fault-at" 2>/dev/null) UTC"
# Each node's own count of what it could not pass on to the others.
for i in 0 1 2; do
  m=$(curl -s "http://127.0.0.1:$((base + i))/metrics" | grep -E '^herald_broker_(dropped|outages|recovered|unrecovered|duplicates|refused)_total' | tr '\n' ' ' || true)
  echo "--- node $i: ${m:-gone}"
done
echo "--- load after: $(cut -d' ' -f1-3 /proc/loadavg)"
for i in 0 1 2; do
  if [ -s "$dir/node-$i.log" ]; then
    echo "--- node $i log (last 5 lines):"; tail -5 "$dir/node-$i.log"
  fi
done
