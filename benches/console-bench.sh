#!/usr/bin/env bash
# The console benchmark: `plexsphere dev` with its database seeded with 10,000 nodes (and the
# paths of a few thousand pairs where the control plane stores paths), Debian's chromium
# loading the nodes page and the mesh map N times each. Measured: time to first render (the
# console's `performance` marks plexsphere:nodes-rendered / plexsphere:map-rendered, ms from
# the navigation's start; median and p99) and plexsphere's CPU per page view (utime+stime from
# /proc/<pid>/stat around the loads).
#
#   benches/console-bench.sh [--nodes N] [--pairs P] [--loads L] [--debug]
#
# Defaults: 10000 nodes, 3000 pairs, 20 loads per page. --debug: measure the debug binaries
# (the default builds and measures release ones). Prints Markdown for docs/benchmarks.md.
# Needs chromium, chromium-driver and sqlite3 (scripts/deps.sh). The benchmark itself is the
# example tests/examples/console_bench.rs.
set -euo pipefail
bench=console-bench.sh
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

nodes=10000 pairs=3000 loads=20 profile=release
while (($#)); do
  case $1 in
    --nodes) nodes=${2:-}; shift $(($# > 1 ? 2 : 1)) ;;
    --pairs) pairs=${2:-}; shift $(($# > 1 ? 2 : 1)) ;;
    --loads) loads=${2:-}; shift $(($# > 1 ? 2 : 1)) ;;
    --debug) profile=debug; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "console-bench.sh: unknown argument '$1' (see --help)" >&2; exit 64 ;;
  esac
done
for v in "$nodes" "$pairs" "$loads"; do
  [[ $v =~ ^[0-9]+$ ]] || { echo "console-bench.sh: --nodes, --pairs and --loads take numbers" >&2; exit 64; }
done
((loads >= 1 && nodes >= 1)) || { echo "console-bench.sh: --nodes and --loads must be at least 1" >&2; exit 64; }
bench_need chromium chromedriver sqlite3

bench_build "$profile" -p plexsphere --bin plexsphere -p plexctl --bin plexctl
export CONSOLE_BENCH_NODES=$nodes CONSOLE_BENCH_PAIRS=$pairs CONSOLE_BENCH_LOADS=$loads
echo "console-bench: running (binaries from $PLEXSPHERE_BIN_DIR)" >&2
cargo run -q "${flag[@]}" -p plexsphere-e2e --example console_bench
