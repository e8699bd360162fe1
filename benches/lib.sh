# shellcheck shell=bash
# Sourced by the whole-system benchmarks (console-, reach-, routes-bench.sh): the checks and the
# build every one of them starts with. `bench` must hold the script's name for messages.
# shellcheck disable=SC2154 # `bench` is set by the script that sources this file

# bench_need TOOL...: every tool is on PATH, else say which is missing and exit 1.
bench_need() {
  local t
  for t in "$@"; do
    command -v "$t" >/dev/null || { echo "$bench: $t is missing: run scripts/deps.sh" >&2; exit 1; }
  done
}

# bench_root: network namespaces and nftables need root.
bench_root() {
  [[ $(id -u) -eq 0 ]] || { echo "$bench: run as root (network namespaces, nftables)" >&2; exit 1; }
}

# bench_build PROFILE CARGO-ARGS...: cd to the repository, build the binaries in PROFILE
# (release or debug) and export PLEXSPHERE_BIN_DIR to where they are. Leaves `flag` holding
# cargo's profile flag for the benchmark's own `cargo run`.
bench_build() {
  local profile=$1
  flag=()
  shift
  cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
  # shellcheck source=../scripts/env.sh
  source scripts/env.sh
  [[ $profile == release ]] && flag=(--release)
  echo "$bench: building the $profile binaries" >&2
  cargo build -q "${flag[@]}" "$@" >&2
  export PLEXSPHERE_BIN_DIR=$CARGO_TARGET_DIR/$profile RUST_BACKTRACE=0
}
