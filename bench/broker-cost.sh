#!/usr/bin/env bash
# What the broker engine costs per delivery (issue 33): one `herald serve`
# node on a real redis-server or nats-server (every publication goes
# through the engine: numbered, kept in the journal, sent to the broker),
# loaded by `herald bench broadcast` or `fanout` with --server-pid, so the
# report has the server's CPU per delivery. Several server binaries are run
# in turn, round after round (interleaved), with one generator:
#
#   bench/broker-cost.sh ENGINE SCENARIO ROUNDS OUTDIR LABEL=BIN [LABEL=BIN...]
#   bench/broker-cost.sh redis broadcast 5 /tmp/cost base=/work/base/herald new=./target/debug/herald
#
# ENGINE: redis | nats. SCENARIO: broadcast (--clients 200 --duration 15s)
# or fanout (--clients 500 --channels 10 --rate 50 --duration 10s); more
# flags from $BENCH_FLAGS replace those. GEN is the generator (default:
# the first binary). Each run writes OUTDIR/SCENARIO-ENGINE-LABEL-ROUND.json
# and prints one line: label, round, server CPU per delivery (µs),
# deliveries, lost, duplicated.
set -euo pipefail
[ $# -ge 5 ] || { sed -n '2,18p' "$0"; exit 2; }
engine=$1 scenario=$2 rounds=$3 out=$4; shift 4
bins=("$@")
gen=${GEN:-${bins[0]#*=}}
case "$scenario" in
  broadcast) flags=${BENCH_FLAGS:---clients 200 --duration 15s} ;;
  fanout) flags=${BENCH_FLAGS:---clients 500 --channels 10 --rate 50 --duration 10s} ;;
  *) sed -n '2,18p' "$0"; exit 2 ;;
esac
mkdir -p "$out"
port=${HERALD_BENCH_PORT:-19700}
bport=$((port + 1))
dir=$(mktemp -d /tmp/herald-cost.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
wait_port() { for _ in $(seq 300); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.05; done; echo "port $1 never opened" >&2; exit 1; }
case "$engine" in
  redis) redis-server --port "$bport" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" >/dev/null &
         pids+=($!); url="redis://127.0.0.1:$bport" ;;
  nats) nats-server -a 127.0.0.1 -p "$bport" >/dev/null 2>&1 &
        pids+=($!); url="nats://127.0.0.1:$bport" ;;
  *) sed -n '2,18p' "$0"; exit 2 ;;
esac
wait_port "$bport"
echo "--- $(date -u +%FT%TZ) $engine $scenario $flags; load $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
for r in $(seq "$rounds"); do
  for lb in "${bins[@]}"; do
    label=${lb%%=*} bin=${lb#*=}
    ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
    "$bin" serve --port "$port" --broker "$url" --log warn >"$dir/serve.log" 2>&1 &
    pid=$!
    wait_port "$port"
    for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/ready" >/dev/null && break; sleep 0.1; done
    json="$out/$scenario-$engine-$label-$r.json"
    # shellcheck disable=SC2086
    "$gen" bench "$scenario" $flags --url "ws://127.0.0.1:$port" --server-pid "$pid" \
      --label "$label" --json "$json" --no-progress >"$dir/bench.log" 2>&1 || { cat "$dir/bench.log" >&2; }
    kill "$pid"; wait "$pid" 2>/dev/null || true
    python3 - "$json" "$label" "$r" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["metrics"]
got = m["deliveries_received"]
print(sys.argv[2], sys.argv[3], f"cpu_per_delivery_us={m['server_cpu'] * 1e6 / max(got, 1):.2f}",
      f"server_cpu={m['server_cpu']}", f"deliveries={got}", f"lost={m['deliveries_lost']}",
      f"duplicated={m['deliveries_duplicated']}", f"p99_ms={m['message_latency']['p99']}")
PY
  done
done

