#!/usr/bin/env bash
# A quick side-by-side of userspace WireGuard implementations: for each one, two network
# namespaces joined by a veth, the implementation on both ends, and iperf3 TCP (one stream)
# through the tunnel, repeated; prints the median Gbit/s per implementation.
#
#   sudo benches/wg-pair-throughput.sh [runs] [seconds]        (defaults: 3 runs of 5 s)
#
# Implementations: plexd-wg (built here, release), wireguard-go (Debian), and boringtun-cli
# when it is on PATH. Extra plexd-wg variants switch techniques off one by one: PLEXD_WG_GRO=0,
# PLEXD_WG_GSO=0 (UDP), PLEXD_WG_OFFLOAD=0 (TUN TSO/GRO), PLEXD_WG_MMSG=0 (recvmmsg/sendmmsg).
# Needs root, iproute2, wireguard-tools, wireguard-go, iperf3. Everything it creates carries
# this script's pid and is removed on exit. This is a developer's quick look; the full
# benchmark (streams, reverse, UDP, CPU, drops) is the project's benchmark script.
set -euo pipefail
umask 077

runs=${1:-3}
secs=${2:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$here/target}
[[ $(id -u) -eq 0 ]] || { echo "run as root (network namespaces, TUN)" >&2; exit 1; }
for tool in ip wg wireguard-go iperf3; do
  command -v "$tool" >/dev/null || { echo "missing $tool (apt-get install --no-install-recommends wireguard-tools wireguard-go iperf3 iproute2)" >&2; exit 1; }
done
# PLEXD_WG=<path> measures a binary built elsewhere instead of building one here.
plexd_wg=${PLEXD_WG:-}
if [[ -z $plexd_wg ]]; then
  (cd "$here" && cargo build --release -q -p plexd-dataplane --bin plexd-wg)
  plexd_wg=$target/release/plexd-wg
fi

id=$$
na=wgbench-$id-a nb=wgbench-$id-b
ia=wgb${id}a ib=wgb${id}b
tmp=$(mktemp -d)
cleanup() {
  for p in $(jobs -p); do kill "$p" 2>/dev/null || true; done
  ip netns pids "$na" 2>/dev/null | xargs -r kill 2>/dev/null || true
  ip netns pids "$nb" 2>/dev/null | xargs -r kill 2>/dev/null || true
  ip netns del "$na" 2>/dev/null || true
  ip netns del "$nb" 2>/dev/null || true
  rm -f "/var/run/wireguard/$ia.sock" "/var/run/wireguard/$ib.sock"
  rm -rf "$tmp"
}
trap cleanup EXIT

wait_socket() {
  for _ in $(seq 500); do [[ -S /var/run/wireguard/$1.sock ]] && return 0; sleep 0.02; done
  echo "no UAPI socket for $1" >&2; return 1
}

# one_run <label> <command...>: starts the implementation in both namespaces, measures once.
one_run() {
  local label=$1; shift
  ip netns add "$na"; ip netns add "$nb"
  ip -n "$na" link set lo up; ip -n "$nb" link set lo up
  ip link add "v$ia" netns "$na" type veth peer name "v$ib" netns "$nb"
  ip -n "$na" addr add 10.210.0.1/24 dev "v$ia"; ip -n "$na" link set "v$ia" up
  ip -n "$nb" addr add 10.210.0.2/24 dev "v$ib"; ip -n "$nb" link set "v$ib" up
  WG_PROCESS_FOREGROUND=1 ip netns exec "$na" "$@" "$ia" >"$tmp/a.log" 2>&1 &
  WG_PROCESS_FOREGROUND=1 ip netns exec "$nb" "$@" "$ib" >"$tmp/b.log" 2>&1 &
  wait_socket "$ia"; wait_socket "$ib"
  wg genkey >"$tmp/ka"; wg genkey >"$tmp/kb"
  ip netns exec "$na" wg set "$ia" listen-port 51820 private-key "$tmp/ka" \
    peer "$(wg pubkey <"$tmp/kb")" endpoint 10.210.0.2:51820 allowed-ips 10.211.0.2/32
  ip netns exec "$nb" wg set "$ib" listen-port 51820 private-key "$tmp/kb" \
    peer "$(wg pubkey <"$tmp/ka")" endpoint 10.210.0.1:51820 allowed-ips 10.211.0.1/32
  ip -n "$na" addr add 10.211.0.1/24 dev "$ia"; ip -n "$na" link set "$ia" up
  ip -n "$nb" addr add 10.211.0.2/24 dev "$ib"; ip -n "$nb" link set "$ib" up
  ip netns exec "$nb" iperf3 -s -1 -B 10.211.0.2 >/dev/null 2>&1 &
  local server=$!
  local gbps=0
  for _ in $(seq 50); do
    out=$(ip netns exec "$na" iperf3 -c 10.211.0.2 -t "$secs" -J 2>/dev/null || true)
    got=$(python3 -c 'import json,sys
try: print(round(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9, 3))
except Exception: pass' <<<"$out")
    if [[ -n $got ]]; then gbps=$got; break; fi
    sleep 0.1
  done
  wait "$server" 2>/dev/null || true
  ip netns pids "$na" | xargs -r kill 2>/dev/null || true
  ip netns pids "$nb" | xargs -r kill 2>/dev/null || true
  wait 2>/dev/null || true
  ip netns del "$na"; ip netns del "$nb"
  rm -f "/var/run/wireguard/$ia.sock" "/var/run/wireguard/$ib.sock"
  echo "$gbps"
}

measure() {
  local label=$1; shift
  local results=()
  for _ in $(seq "$runs"); do results+=("$(one_run "$label" "$@")"); done
  local median
  median=$(printf '%s\n' "${results[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  printf '%-34s median %6s Gbit/s  (runs: %s)\n' "$label" "$median" "${results[*]}"
}

echo "iperf3 TCP, one stream, ${secs}s x ${runs} runs, $(nproc) CPUs, kernel $(uname -r)"
# Techniques switched off one at a time, from the last added to the first.
measure "plexd-wg" "$plexd_wg" -f
measure "  - UDP GRO" env PLEXD_WG_GRO=0 "$plexd_wg" -f
measure "  - UDP GSO/GRO" env PLEXD_WG_GRO=0 PLEXD_WG_GSO=0 "$plexd_wg" -f
measure "  - UDP GSO/GRO, TUN TSO/GRO" env PLEXD_WG_GRO=0 PLEXD_WG_GSO=0 PLEXD_WG_OFFLOAD=0 "$plexd_wg" -f
measure "  - all, mmsg too" env PLEXD_WG_GRO=0 PLEXD_WG_GSO=0 PLEXD_WG_OFFLOAD=0 PLEXD_WG_MMSG=0 "$plexd_wg" -f
measure "wireguard-go" wireguard-go -f
if command -v boringtun-cli >/dev/null; then
  measure "boringtun-cli" boringtun-cli --disable-drop-privileges -f
fi
