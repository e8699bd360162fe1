#!/usr/bin/env bash
# The DNS benchmark (docs/benchmarks.md, "DNS"): plexd's resolver against systemd-resolved's
# stub in one broker machine (answers per second, latency), and the memory of 10,000 names.
# Root (it boots a systemd-nspawn machine). Usage: benches/dns-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
cargo build --release -p plexsphere-benches --bin dns-bench
cargo build -p plexd -p plexsphere -p plexctl --bins
DNS_BENCH="$target/release/dns-bench" cargo test -p plexsphere-e2e --test dns -- \
  --ignored benchmark_plexd_against_resolveds_stub --nocapture 2>&1 | grep -E '^--- |test result'
