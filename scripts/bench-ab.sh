#!/usr/bin/env bash
# Before/after benchmark of two builds of mlockd, interleaved in one run, on
# loopback: one node of each, and a 3-node cluster of each.
#
#   scripts/bench-ab.sh OLD_REV [NEW_REV] [DURATION]
#
# OLD_REV and NEW_REV (default: the working tree) are git revisions; both
# are built into a temporary directory. For each scenario (one node:
# uncontended, hotkey, shop; the clusters: uncontended, shop) `mlock bench`
# of the new build runs the new target against
# the old one with --vs, in interleaved rounds, and prints the ratios (new /
# old). Every process started here is stopped by its PID.
set -euo pipefail
cd "$(dirname "$0")/.."
old=${1:?usage: scripts/bench-ab.sh OLD_REV [NEW_REV] [DURATION]}
new=${2:-}
dur=${3:-6s}
tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$tmp"
}
trap cleanup EXIT

build() { # build REV DIR: mlockd and mlock of REV ("" = working tree) into DIR
	local rev=$1 out=$2 src=.
	mkdir -p "$out"
	if [ -n "$rev" ]; then
		src=$tmp/src-$(basename "$out")
		git worktree add -q --detach "$src" "$rev"
	fi
	(cd "$src" && go build -o "$out/mlockd" ./cmd/mlockd && go build -o "$out/mlock" ./cmd/mlock)
	if [ -n "$rev" ]; then git worktree remove --force "$src"; fi
}
build "$old" "$tmp/old"
build "$new" "$tmp/new"
echo "old: $old ($("$tmp/old/mlockd" --version)); new: ${new:-working tree} ($("$tmp/new/mlockd" --version))"

single() { # single NAME PORT
	"$tmp/$1/mlockd" --listen "127.0.0.1:$2" --data-dir "$tmp/$1-single.data" 2>"$tmp/$1-single.log" &
	pids+=($!)
}
cluster() { # cluster NAME BASE: nodes on BASE+1..3, raft on BASE+11..13
	local name=$1 base=$2 peers="" i
	head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/$name.secret"
	for i in 1 2 3; do peers+="n$i=127.0.0.1:$((base + 10 + i)),"; done
	for i in 1 2 3; do
		"$tmp/$name/mlockd" --listen "127.0.0.1:$((base + i))" --cluster-id "n$i" --raft-addr "127.0.0.1:$((base + 10 + i))" \
			--raft-dir "$tmp/$name-n$i.raft" --data-dir "$tmp/$name-n$i.data" --cluster-peers "${peers%,}" \
			--cluster-secret-file "$tmp/$name.secret" 2>"$tmp/$name-n$i.log" &
		pids+=($!)
	done
}
up() { # up URI: wait until the target answers
	for _ in $(seq 100); do
		if "$tmp/new/mlock" status --uri "$1" >/dev/null 2>&1; then return 0; fi
		sleep 0.2
	done
	echo "$1 did not answer" >&2
	return 1
}

single old 23400
single new 23401
cluster old 23410
cluster new 23430
up mlock://127.0.0.1:23400
up mlock://127.0.0.1:23401
up mlock://127.0.0.1:23411,127.0.0.1:23412,127.0.0.1:23413
up mlock://127.0.0.1:23431,127.0.0.1:23432,127.0.0.1:23433

for scenario in uncontended hotkey shop; do
	echo "== one node, $scenario (new vs old)"
	"$tmp/new/mlock" bench --scenario "$scenario" --duration "$dur" mlock://127.0.0.1:23401 --vs mlock://127.0.0.1:23400
done
for scenario in uncontended shop; do
	echo "== 3-node cluster, $scenario (new vs old)"
	"$tmp/new/mlock" bench --scenario "$scenario" --duration "$dur" \
		mlock://127.0.0.1:23431,127.0.0.1:23432,127.0.0.1:23433 --vs mlock://127.0.0.1:23411,127.0.0.1:23412,127.0.0.1:23413
done
