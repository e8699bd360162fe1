#!/usr/bin/env bash
# The reach benchmark: per NAT topology (routing only, both EIM, both EDM, one router dropping
# UDP, one EIM router whose input accepts the unsolicited with one routed node, both such
# routers), two plexd nodes behind their routers with the control plane and two relays on a
# public segment, all in network namespaces (tests/src/nat.rs). Measured in one run: the time
# from both daemons up to the first ping over the mesh and to a direct path, and one iperf3
# TCP stream over the path each topology gives (direct, relay over UDP, relay over TCP) with
# the relays' and the daemons' CPU-seconds per GB (/proc/<pid>/stat utime+stime).
#
#   sudo benches/reach-bench.sh [--secs S] [--debug] [--only WORDS]
#
# --secs: the iperf3 stream's length (default 5). --debug: measure the debug binaries (the
# default builds and measures release ones). --only: only the topologies whose names contain
# one of these comma-separated words (for example --only "routing,drops UDP").
# The relays run with their default per-node budgets unless PLEXSPHERE_RELAY_NODE_FRAMES_PER_SEC
# and PLEXSPHERE_RELAY_NODE_BYTES_PER_SEC say otherwise (0: no budget). Prints a Markdown table for docs/benchmarks.md
# on stdout. A topology that cannot run (a piece not built yet, such as `plexsphere relay`)
# gets a row saying why, and the script exits 1 after measuring the others.
#
# Needs root, iproute2, nftables, conntrack, iperf3, wireguard-tools, cargo (scripts/deps.sh).
# The benchmark itself is the example tests/examples/reach_bench.rs.
set -euo pipefail
bench=reach-bench.sh
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

secs=5 profile=release only=
while (($#)); do
  case $1 in
    --only) only=${2:-}; shift $(($# > 1 ? 2 : 1)) ;;
    --secs) secs=${2:-}; shift $(($# > 1 ? 2 : 1)) ;;
    --debug) profile=debug; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "reach-bench.sh: unknown argument '$1' (see --help)" >&2; exit 64 ;;
  esac
done
[[ $secs =~ ^[0-9]+$ && $secs -ge 2 ]] || { echo "reach-bench.sh: --secs must be a number >= 2" >&2; exit 64; }
bench_root
bench_need ip nft conntrack iperf3 wg

bench_build "$profile" -p plexd --bin plexd -p plexsphere --bin plexsphere \
  -p plexctl --bin plexctl -p plexd-dataplane --bin plexd-wg
export REACH_BENCH_SECS=$secs REACH_BENCH_ONLY=$only
echo "reach-bench: running (binaries from $PLEXSPHERE_BIN_DIR)" >&2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
status=0
cargo run -q "${flag[@]}" -p plexsphere-e2e --example reach_bench >"$out" || status=$?
grep '^|' "$out" || true
if ((status)); then
  echo "reach-bench: some topologies could not run (rows above say why)" >&2
  exit 1
fi
