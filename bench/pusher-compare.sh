#!/bin/bash
# One run of `herald bench SCENARIO` (Pusher protocol) against Herald or
# AnyCable in its Pusher compatibility mode (`--pusher_app_id`, public mode,
# in-memory broker, HTTP broadcasts on its own port), a fresh server per
# run, both on loopback with the development app's id, key and secret.
# Prints the bench's summary; the JSON report goes to $OUT/TAG.json,
# labelled with the server's name for `herald bench compare`.
#
#   HERALD=target/release/herald ANYCABLE=/path/to/anycable-go \
#     bench/pusher-compare.sh herald|anycable TAG fanout --clients 10000 --channels 10 --rate 100 --duration 20s
#
# HERALD_SERVER runs that binary as the Herald server instead of $HERALD
# (which stays the generator): two builds compared with one generator.
# PERF=1 records the server with `perf record -g` (cpu-clock) to
# $OUT/TAG.perf.data while the bench runs.
set -u
ulimit -n "$(ulimit -Hn)"
which=$1; tag=$2; scenario=$3; shift 3
BIN=${HERALD:-target/release/herald}
SERVER_BIN=${HERALD_SERVER:-$BIN}
ANY=${ANYCABLE:-anycable-go}
OUT=${OUT:-/tmp/pusher-bench}
mkdir -p "$OUT"
wait_port() { for _ in $(seq 200); do (echo > /dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 not open"; return 1; }
if [ "$which" = herald ]; then
  PORT=18953
  $SERVER_BIN serve --port $PORT --log warn 2>"$OUT/$tag.server.log" & SRV=$!
else
  PORT=18954
  ANYCABLE_DISABLE_TELEMETRY=true $ANY --host=127.0.0.1 --port=$PORT \
    --pusher_app_id=app-id --pusher_app_key=app-key --pusher_secret=app-secret \
    --norpc --public --broker=memory --broadcast_adapter=http --http_broadcast_port=$PORT \
    --log_level=warn 2>"$OUT/$tag.server.log" & SRV=$!
fi
wait_port $PORT
sleep 1
PERFPID=
if [ "${PERF:-}" ]; then
  perf record -e cpu-clock -g -p $SRV -o "$OUT/$tag.perf.data" 2>/dev/null & PERFPID=$!
fi
echo "== $tag $which $(date -u +%FT%TZ) load: $(cat /proc/loadavg)"
$BIN bench "$scenario" --url ws://127.0.0.1:$PORT --server-pid $SRV --label "$which" --no-progress --json "$OUT/$tag.json" "$@"
echo "load after: $(cat /proc/loadavg)"
[ -n "$PERFPID" ] && { kill -INT $PERFPID; wait $PERFPID 2>/dev/null; }
kill $SRV; wait $SRV 2>/dev/null
