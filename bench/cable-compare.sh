#!/bin/bash
# One run of `herald bench $SCENARIO --protocol $PROTOCOL` (SCENARIO:
# broadcast by default; storm, slow, soak; PROTOCOL: actioncable by default,
# actioncable-ext for storm) against Herald or AnyCable, each with a fresh `herald bench rpc-server` as its app (gRPC
# RPC; BenchmarkChannel broadcasting through the server's HTTP broadcast
# endpoint on the server's own port). Prints the bench's summary and the
# app's CPU; the JSON report goes to $OUT/TAG.json.
#
#   HERALD=target/release/herald ANYCABLE=/path/to/anycable-go [SCENARIO=storm] \
#     [PROTOCOL=actioncable-ext] [HERALD_CONFIG=file.toml] [ANYCABLE_FLAGS="--broker=memory"] \
#     bench/cable-compare.sh herald|anycable TAG [bench flags, e.g. --clients 500 --duration 30s]
#
# HERALD_SERVER runs that binary as the Herald server instead of $HERALD (which
# stays the generator and the app): two builds compared with one generator.
# HERALD_CONFIG is read by `herald serve` itself (its config file, e.g.
# `[rpc]` `history_limit = 0`); ANYCABLE_FLAGS are added to anycable-go's.
set -u
ulimit -n "$(ulimit -Hn)"
SCENARIO=${SCENARIO:-broadcast}
PROTOCOL=${PROTOCOL:-actioncable}
ANYCABLE_FLAGS=${ANYCABLE_FLAGS:-}
which=$1; tag=$2; shift 2
BIN=${HERALD:-target/release/herald}
SERVER_BIN=${HERALD_SERVER:-$BIN}
ANY=${ANYCABLE:-anycable-go}
OUT=${OUT:-/tmp/cable-bench}
mkdir -p "$OUT"
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
wait_port() { for i in $(seq 200); do (echo > /dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 not open"; return 1; }
if [ "$which" = herald ]; then
  PORT=18951; RPC=50161
  $BIN bench rpc-server --port $RPC --threads 1 --broadcast-url http://127.0.0.1:$PORT/_broadcast 2>$OUT/$tag.app.log & APP=$!
  $SERVER_BIN serve --port $PORT --log warn --rpc-host 127.0.0.1:$RPC 2>$OUT/$tag.server.log & SRV=$!
else
  PORT=18952; RPC=50162
  $BIN bench rpc-server --port $RPC --threads 1 --broadcast-url http://127.0.0.1:$PORT/_broadcast 2>$OUT/$tag.app.log & APP=$!
  ANYCABLE_DISABLE_TELEMETRY=true $ANY --host=127.0.0.1 --port=$PORT --rpc_host=127.0.0.1:$RPC \
    --broadcast_adapter=http --http_broadcast_port=$PORT --log_level=warn $ANYCABLE_FLAGS 2>$OUT/$tag.server.log & SRV=$!
fi
wait_port $RPC; wait_port $PORT
sleep 1
A0=$(cpu $APP)
echo "== $tag $which $(date -u +%FT%TZ) load: $(cat /proc/loadavg)"
$BIN bench $SCENARIO --protocol $PROTOCOL --url ws://127.0.0.1:$PORT --server-pid $SRV --no-progress --json $OUT/$tag.json "$@"
A1=$(cpu $APP)
echo "app cpu ticks: $((A1-A0)) (1/100 s)  load after: $(cat /proc/loadavg)"
kill $SRV $APP; wait $SRV $APP 2>/dev/null
