#!/usr/bin/env bash
# How many connections three nodes hold together: a redis-server and three
# release nodes on loopback, one `herald bench idle` generator per node
# (each process has its own open-file limit), N clients each, held 10 s.
#   bench/cluster-idle.sh 19500
cd "$(dirname "$0")/.."
set -u
N=${1:-15000}
bin=./target/release/herald
ulimit -n "$(ulimit -Hn)"
redis-server --port 18709 --bind 127.0.0.1 --save "" --appendonly no >/dev/null & R=$!
sleep 0.5
P=()
for i in 0 1 2; do "$bin" serve --port $((18700+i)) --log warn --broker redis://127.0.0.1:18709 & P+=($!); done
for i in 0 1 2; do for _ in $(seq 100); do [ "$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$((18700+i))/ready)" = 200 ] && break; sleep 0.1; done; done
G=()
for i in 0 1 2; do "$bin" bench idle --clients "$N" --duration 10s --url ws://127.0.0.1:$((18700+i)) --server-pid ${P[$i]} --threads 1 --no-progress > /tmp/idle-$i.txt 2>&1 & G+=($!); done
# While held: each node's own count, and the cluster's view from node 0.
sleep 1
for t in $(seq 120); do
  c=0; for i in 0 1 2; do v=$(curl -s http://127.0.0.1:$((18700+i))/metrics | awk '/^herald_connections[ {]/{s+=$NF} END{print s+0}'); c=$((c + ${v:-0})); done
  [ "$c" -ge $((3 * N)) ] && { echo "held together: $c connections at $(date +%H:%M:%S)"; for i in 0 1 2; do echo "node $i: $(curl -s http://127.0.0.1:$((18700+i))/metrics | awk '/^herald_connections[ {]/{s+=$NF} END{print s+0}') connections, rss $(awk '/VmRSS/{print $2" "$3}' /proc/${P[$i]}/status)"; done; echo "redis rss $(awk '/VmRSS/{print $2" "$3}' /proc/$R/status)"; break; }
  sleep 0.5
done
wait "${G[@]}"
for i in 0 1 2; do echo "--- generator $i"; grep -E "connections|held|success|error|rss|memory|per_conn|failed" /tmp/idle-$i.txt | head -12; done
kill "${P[@]}" $R; wait 2>/dev/null
