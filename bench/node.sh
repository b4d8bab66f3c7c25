#!/usr/bin/env bash
# Start, stop or restart one node of a bench cluster: the command for
# `herald bench storm --restart-cmd 'bench/node.sh restart {n} {signal}'`
# (bench/rolling.sh writes the node files and runs it).
#
#   NODE_DIR=/tmp/rolling bench/node.sh start N
#   NODE_DIR=/tmp/rolling bench/node.sh stop N [TERM|KILL]
#   NODE_DIR=/tmp/rolling bench/node.sh restart N [TERM|KILL]
#
# In $NODE_DIR: node-N.cmd, the node's command line (bash execs it, so
# the pid is the node's: give variables with `env VAR=value cmd`); node-N.port, the port it listens on; optional
# node-N.ready, a URL that answers 200 once the node serves (Herald's
# /ready: connected to its broker). The node's pid goes to node-N.pid, its
# output to node-N.log. `start` returns once the node listens (and is
# ready), at most 60 s; `stop` once the process is gone: SIGTERM (the
# default) is a graceful shutdown, waited for up to 60 s before SIGKILL.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,16p' "$0"; exit 2; }
action=$1; n=$2; sig=${3:-TERM}
dir=${NODE_DIR:?NODE_DIR: the directory with node-N.cmd and node-N.port}
case "$sig" in TERM|KILL) ;; *) echo "signal: TERM or KILL, not $sig" >&2; exit 2 ;; esac

# Alive: one of its threads is not a zombie yet. (The node's parent, this
# script, is gone and whoever inherits it may be slow to reap; after
# SIGKILL the main thread turns zombie before the others have exited, and
# the sockets, the listener's among them, close only with the last.)
alive() {
  local t
  for t in /proc/"$1"/task/*/stat; do
    [ -r "$t" ] && [ "$(awk '{print $3}' "$t" 2>/dev/null)" != Z ] && return 0
  done
  return 1
}

stop() {
  local pid
  [ -f "$dir/node-$n.pid" ] || return 0
  pid=$(cat "$dir/node-$n.pid")
  alive "$pid" || { rm -f "$dir/node-$n.pid"; return 0; }
  kill -s "$sig" "$pid" 2>/dev/null || true
  for _ in $(seq 600); do alive "$pid" || break; sleep 0.1; done
  if alive "$pid"; then
    echo "node $n (pid $pid) still running 60 s after SIG$sig: SIGKILL" >&2
    kill -s KILL "$pid" 2>/dev/null || true
    for _ in $(seq 50); do alive "$pid" || break; sleep 0.1; done
  fi
  rm -f "$dir/node-$n.pid"
}

start() {
  local port pid log=$dir/node-$n.log from
  port=$(cat "$dir/node-$n.port")
  from=$(($(stat -c %s "$log" 2>/dev/null || echo 0) + 1))
  # The node's own process (exec), so node-N.pid is what gets the signal.
  nohup bash -c "exec $(cat "$dir/node-$n.cmd")" </dev/null >>"$log" 2>&1 &
  pid=$!
  echo "$pid" >"$dir/node-$n.pid"
  for _ in $(seq 600); do
    if ! alive "$pid"; then
      # The port still held by what is closing (at most 10 s): try again.
      if [ "${tries:-0}" -lt 50 ] && tail -c "+$from" "$log" | grep -q "Address already in use"; then
        tries=$((${tries:-0} + 1)); sleep 0.2; start; return
      fi
      echo "node $n exited at start; its log:" >&2; tail -c "+$from" "$log" | tail -20 >&2; exit 1
    fi
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      [ -f "$dir/node-$n.ready" ] || return 0
      [ "$(curl -s -o /dev/null -w '%{http_code}' "$(cat "$dir/node-$n.ready")")" = 200 ] && return 0
    fi
    sleep 0.1
  done
  echo "node $n not listening on $port after 60 s" >&2
  exit 1
}

case "$action" in
  start) start ;;
  stop) stop ;;
  restart) stop; start ;;
  *) echo "action: start, stop or restart" >&2; exit 2 ;;
esac
