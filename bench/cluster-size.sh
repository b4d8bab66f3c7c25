#!/usr/bin/env bash
# The cost of a cluster's size for a node: N release nodes on one
# redis-server (or nats-server with ENGINE=nats), C occupied channels, all
# held by clients of node 0 (C/10 connections, 10 channels each). The last
# node serves nobody: what it pays is what the cluster's size costs a node.
#   bench/cluster-size.sh N C            # idle: 20 s held
#   CHURN=1 bench/cluster-size.sh N C    # churn: the C channels emptied and
#                                        # filled again, once a second
#   WEBHOOKS=1 ...                       # the app has occupancy webhooks
#                                        # (to a loopback receiver answering 200)
#   HERALD_BIN=/path/to/herald ...       # another build (default target/release)
# Prints one line: nodes, channels, idle node's RSS before/after (KiB), the
# other nodes' keys it keeps (herald_cluster_tally_keys), its CPU over the
# window (ms), node 0's RSS and CPU, node 1's RSS (with
# webhooks node 0 leads and node 1 is its successor: both keep the tally),
# the broker's CPU and (Redis) bytes in/out over the window.
cd "$(dirname "$0")/.."
set -u
N=${1:?nodes}; C=${2:?channels}
ENGINE=${ENGINE:-redis}; CHURN=${CHURN:-0}; WINDOW=${WINDOW:-20}; WEBHOOKS=${WEBHOOKS:-0}
bin=${HERALD_BIN:-./target/release/herald}
ulimit -n "$(ulimit -Hn)"
base=18800; bport=18799
tck=$(getconf CLK_TCK)
cpu() { awk -v t="$tck" '{print int(($14+$15)*1000/t)}' /proc/"$1"/stat; }
rss() { awk '/VmRSS/{print $2}' /proc/"$1"/status; }
if [ "$ENGINE" = nats ]; then
  nats-server -a 127.0.0.1 -p $bport >/dev/null 2>&1 & B=$!; url=nats://127.0.0.1:$bport
else
  redis-server --port $bport --bind 127.0.0.1 --save "" --appendonly no >/dev/null & B=$!; url=redis://127.0.0.1:$bport
fi
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$bport) 2>/dev/null && break; sleep 0.1; done
kill -0 "$B" 2>/dev/null || { echo "the broker did not start (port $bport taken?)" >&2; exit 1; }
cfg=()
if [ "$WEBHOOKS" = 1 ]; then
  python3 -c '
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200); self.end_headers()
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", 18798), H).serve_forever()' & W=$!
  printf '[[apps]]\nid = "app-id"\nkey = "app-key"\nsecret = "app-secret"\nwebhooks = [{ url = "http://127.0.0.1:18798/", event_types = ["channel_occupied", "channel_vacated"] }]\n' > /tmp/size-webhooks.toml
  cfg=(--config /tmp/size-webhooks.toml)
fi
P=()
# One after the other: node 0 is the oldest (the leader, with webhooks),
# node 1 the next (its successor), the last node the youngest.
for i in $(seq 0 $((N-1))); do
  "$bin" serve "${cfg[@]}" --port $((base+i)) --log warn --broker "$url" 2>/dev/null & P+=($!)
  for _ in $(seq 200); do [ "$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$((base+i))/ready)" = 200 ] && break; sleep 0.1; done
done
sleep 3  # heartbeats exchanged, leader settled
last=${P[$((N-1))]}; first=${P[0]}
rss0=$(rss "$last")
clients=$(( (C + 9) / 10 ))
if [ "$CHURN" = 1 ]; then
  # One occupying round per second: connect all, subscribe, drop them.
  end=$((SECONDS + WINDOW + 5))
  ( while [ $SECONDS -lt $end ]; do "$bin" bench idle --clients "$clients" --channels 10 --channel-pool "$C" --duration 1s --url ws://127.0.0.1:$base --threads 1 --no-progress >/dev/null 2>&1; done ) & G=$!
  sleep 5
else
  "$bin" bench idle --clients "$clients" --channels 10 --channel-pool "$C" --duration $((WINDOW + 30))s --url ws://127.0.0.1:$base --threads 1 --no-progress >/tmp/size-gen.txt 2>&1 & G=$!
  for _ in $(seq 600); do v=$(curl -s http://127.0.0.1:$base/metrics | awk '/^herald_connections[ {]/{s+=$NF} END{print s+0}'); [ "${v:-0}" -ge "$clients" ] && break; sleep 0.1; done
  sleep 3
fi
bcpu() { if [ "$ENGINE" = redis ]; then redis-cli -p $bport info cpu | awk -F: '/^used_cpu_(sys|user):/{s+=$2} END{print int(s*1000)}'; else cpu "$B"; fi; }
c1=$(cpu "$last"); f1=$(cpu "$first"); b1=$(bcpu)
if [ "$ENGINE" = redis ]; then io1=$(redis-cli -p $bport info stats | awk -F: '/total_net_input_bytes|total_net_output_bytes/{printf "%s ", $2+0}'); fi
sleep "$WINDOW"
c2=$(cpu "$last"); f2=$(cpu "$first"); b2=$(bcpu)
if [ "$ENGINE" = redis ]; then io2=$(redis-cli -p $bport info stats | awk -F: '/total_net_input_bytes|total_net_output_bytes/{printf "%s ", $2+0}'); fi
rss1=$(rss "$last"); rssf=$(rss "$first"); rss_1=$(rss "${P[1]}")
keys=$(curl -s http://127.0.0.1:$((base+N-1))/metrics | awk '/^herald_cluster_tally_keys /{print $2}')
kill "$G" 2>/dev/null; wait "$G" 2>/dev/null
io=""
if [ "$ENGINE" = redis ]; then
  read -r i1 o1 <<<"$io1"; read -r i2 o2 <<<"$io2"
  io="broker_in_b_s=$(( (i2 - i1) / WINDOW )) broker_out_b_s=$(( (o2 - o1) / WINDOW ))"
fi
echo "engine=$ENGINE churn=$CHURN webhooks=$WEBHOOKS nodes=$N channels=$C idle_node_rss_kib=$rss0->$rss1 idle_node_tally_keys=${keys:-none} idle_node_cpu_ms_per_s=$(( (c2 - c1) / WINDOW )) node0_rss_kib=$rssf node1_rss_kib=$rss_1 node0_cpu_ms_per_s=$(( (f2 - f1) / WINDOW )) broker_cpu_ms_per_s=$(( (b2 - b1) / WINDOW )) $io"
kill -9 "${P[@]}" "$B" ${W:-} 2>/dev/null; wait 2>/dev/null
