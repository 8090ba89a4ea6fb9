#!/usr/bin/env bash
# A local 3-node mlockd cluster on loopback, in one command.
#
#   scripts/cluster.sh start    build mlockd and mlock into ./bin, start nodes a, b, c
#   scripts/cluster.sh status   the cluster as node a sees it
#   scripts/cluster.sh stop     stop the three nodes (by their PIDs)
#
# Clients: mlock://127.0.0.1:12341,127.0.0.1:12342,127.0.0.1:12343
# Data, logs and PIDs live in ./cluster.data (delete it to start afresh).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=cluster.data
uri=mlock://127.0.0.1:12341,127.0.0.1:12342,127.0.0.1:12343
peers=a=127.0.0.1:12401,b=127.0.0.1:12402,c=127.0.0.1:12403

start() {
	go build -o bin/mlockd ./cmd/mlockd
	go build -o bin/mlock ./cmd/mlock
	mkdir -p "$dir"
	chmod 700 "$dir"
	[ -s "$dir/secret" ] || head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/secret"
	chmod 600 "$dir/secret"
	local i=1
	for id in a b c; do
		if [ -s "$dir/$id.pid" ] && kill -0 "$(cat "$dir/$id.pid")" 2>/dev/null; then
			echo "node $id already runs (pid $(cat "$dir/$id.pid"))"
		else
			bin/mlockd --listen 127.0.0.1:1234$i --cluster-id $id --raft-addr 127.0.0.1:1240$i \
				--raft-dir "$dir/$id.raft" --data-dir "$dir/$id.data" --cluster-peers "$peers" \
				--cluster-secret-file "$dir/secret" 2>>"$dir/$id.log" &
			echo $! >"$dir/$id.pid"
			echo "node $id: pid $!, clients 127.0.0.1:1234$i, raft 127.0.0.1:1240$i, log $dir/$id.log"
		fi
		i=$((i + 1))
	done
	for _ in $(seq 50); do
		if bin/mlock status --uri "$uri" 2>/dev/null | grep -q "leader [a-c] "; then
			echo "cluster up, leader elected: $uri"
			return 0
		fi
		sleep 0.2
	done
	echo "the cluster did not answer within 10 s; see $dir/*.log" >&2
	return 1
}

stop() {
	for id in a b c; do
		if [ -s "$dir/$id.pid" ]; then
			kill "$(cat "$dir/$id.pid")" 2>/dev/null || true
			rm -f "$dir/$id.pid"
		fi
	done
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) bin/mlock status --uri "$uri" ;;
*)
	echo "usage: $0 start|status|stop" >&2
	exit 2
	;;
esac
