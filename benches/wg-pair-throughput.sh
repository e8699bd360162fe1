#!/usr/bin/env bash
# The quick look: iperf3 TCP one stream through plexd-wg, wireguard-go and boringtun-cli, and
# plexd-wg with each performance switch off in turn. It is benches/wg-bench.sh --quick (the
# full benchmark, see docs/benchmarks.md); kept so older notes that name it still work.
#
#   sudo benches/wg-pair-throughput.sh [runs] [seconds]        (defaults: 3 runs of 5 s)
exec "$(dirname "$0")/wg-bench.sh" --quick --runs "${1:-3}" --secs "${2:-5}"
