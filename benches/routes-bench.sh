#!/usr/bin/env bash
# The routes benchmark: a client, two subnet routers and a LAN host behind them (no plexd),
# with the control plane on the host, all in network namespaces (tests/src/route_lab.rs).
# Measured in one run: one iperf3 TCP stream over the direct mesh path (client -> router's
# mesh IP) and one through the router to the LAN host (subnet route, masquerade); then 10
# failovers (SIGKILL of the primary router while the client pings the LAN host every 20 ms),
# each the longest time between two answered pings around the kill, with median and max.
#
#   sudo benches/routes-bench.sh [--secs S] [--debug]
#
# --secs: each iperf3 stream's length (default 5). --debug: measure the debug binaries (the
# default builds and measures release ones). Prints Markdown for docs/benchmarks.md on stdout.
#
# Needs root, iproute2, nftables, iperf3, cargo (scripts/deps.sh). The benchmark itself is the
# example tests/examples/routes_bench.rs.
set -euo pipefail
bench=routes-bench.sh
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

secs=5 profile=release
while (($#)); do
  case $1 in
    --secs) secs=${2:-}; shift $(($# > 1 ? 2 : 1)) ;;
    --debug) profile=debug; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "routes-bench.sh: unknown argument '$1' (see --help)" >&2; exit 64 ;;
  esac
done
[[ $secs =~ ^[0-9]+$ && $secs -ge 2 ]] || { echo "routes-bench.sh: --secs must be a number >= 2" >&2; exit 64; }
bench_root
bench_need ip nft iperf3 ping

bench_build "$profile" -p plexd --bin plexd -p plexsphere --bin plexsphere -p plexctl --bin plexctl
export ROUTES_BENCH_SECS=$secs
echo "routes-bench: running (binaries from $PLEXSPHERE_BIN_DIR)" >&2
cargo run -q "${flag[@]}" -p plexsphere-e2e --example routes_bench
