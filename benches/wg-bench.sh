#!/usr/bin/env bash
# The whole-system benchmark of plexd's userspace WireGuard (plexd-wg) against the references,
# boringtun-cli and Debian's wireguard-go, in the same run. For each implementation, repeated
# RUNS times (implementations interleaved, so a drifting machine load hits all alike): two
# network namespaces joined by a veth, the implementation on both ends (MTU 1420), and through
# the tunnel: iperf3 TCP one stream, four streams, reverse, a UDP flood, and ping idle and
# under a TCP stream. Per test: Gbit/s, CPU-seconds per GB of both daemons (/proc/<pid>/stat
# utime+stime), the receiving namespace's UDP drops (nstat UdpRcvbufErrors/UdpInErrors, and
# the daemons' own sockets on :51820 from `ss -m`). Then plexd-wg with each performance switch
# off on its own (TCP one stream), and memory: VmRSS with an interface up and no peers, and
# with PEERS peers added through `wg addconf`; and `plexd run`'s own VmRSS.
#
#   sudo benches/wg-bench.sh [--runs N] [--secs S] [--peers N] [--quick] [--no-memory]
#
# --quick: TCP one stream and the technique rows only (what wg-pair-throughput.sh runs).
# Prints a Markdown block for docs/benchmarks.md on stdout (progress goes to stderr) and keeps
# /tmp/wg-bench-<pid>.jsonl (raw numbers, one JSON object per measurement) and
# /tmp/wg-bench-<pid>.md. Everything else it creates (namespaces, veths, TUNs, UAPI sockets,
# processes, files) carries its pid and is removed on exit; traffic stays inside its namespaces.
#
# Needs root, iproute2, wireguard-tools, wireguard-go, iperf3, python3, cargo; missing Debian
# packages are installed with apt-get --no-install-recommends; boringtun-cli is built with
# `cargo install --locked` into $BORINGTUN_ROOT (default /var/cache/plexsphere/cargo-bin) when
# it is not on PATH. PLEXD_WG=<path> / PLEXD=<path> measure binaries built elsewhere.
set -euo pipefail
umask 077

RUNS=${RUNS:-3} SECS=${SECS:-5} PEERS=${PEERS:-10000}
quick=0 memory=1
while (($#)); do
  case $1 in
    --runs) RUNS=${2:-}; shift $(($# > 1 ? 2 : 1)) ;;
    --secs) SECS=${2:-}; shift $(($# > 1 ? 2 : 1)) ;;
    --peers) PEERS=${2:-}; shift $(($# > 1 ? 2 : 1)) ;;
    --quick) quick=1 memory=0; shift ;;
    --no-memory) memory=0; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "wg-bench.sh: unknown argument '$1' (see --help)" >&2; exit 64 ;;
  esac
done
[[ $RUNS =~ ^[1-9][0-9]*$ && $SECS =~ ^[0-9]+$ && $SECS -ge 3 && $PEERS =~ ^[0-9]+$ ]] ||
  { echo "wg-bench.sh: --runs must be >= 1, --secs >= 3, --peers a number" >&2; exit 64; }
[[ $(id -u) -eq 0 ]] || { echo "wg-bench.sh: run as root (network namespaces, TUN devices)" >&2; exit 1; }

here=$(cd "$(dirname "$0")/.." && pwd)
report="python3 $here/benches/wg_bench_report.py"
say() { echo "wg-bench: $*" >&2; }

# --- the tools and the implementations -------------------------------------------------------
need=()
for t in ip:iproute2 ss:iproute2 nstat:iproute2 wg:wireguard-tools wireguard-go:wireguard-go \
         iperf3:iperf3 ping:iputils-ping python3:python3 timeout:coreutils; do
  command -v "${t%%:*}" >/dev/null || need+=("${t#*:}")
done
if ((${#need[@]})); then
  say "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "${need[@]}" >&2 ||
    { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends "${need[@]}" >&2; }
fi
command -v cargo >/dev/null || [[ -n ${PLEXD_WG:-} ]] ||
  { echo "wg-bench.sh: cargo is not on PATH (sudo may drop it: sudo env PATH=\"\$PATH\" ...)" >&2; exit 1; }
target=${CARGO_TARGET_DIR:-$here/target}
plexd_wg=${PLEXD_WG:-} plexd=${PLEXD:-}
if [[ -z $plexd_wg ]]; then
  say "building plexd-wg (release)"
  (cd "$here" && cargo build --release -q -p plexd-dataplane --bin plexd-wg)
  plexd_wg=$target/release/plexd-wg
fi
if ((memory)) && [[ -z $plexd ]]; then
  say "building plexd (release)"
  if (cd "$here" && cargo build --release -q -p plexd --bin plexd); then
    plexd=$target/release/plexd
  else
    say "plexd did not build; its own memory row is skipped"
  fi
fi
bt_root=${BORINGTUN_ROOT:-/var/cache/plexsphere/cargo-bin}
boringtun=$(command -v boringtun-cli || true)
[[ -n $boringtun ]] || [[ ! -x $bt_root/bin/boringtun-cli ]] || boringtun=$bt_root/bin/boringtun-cli
if ((!quick)) && [[ -z $boringtun ]]; then
  say "installing boringtun-cli into $bt_root (cargo install --locked, about a minute)"
  cargo install --locked -q boringtun-cli --root "$bt_root" >&2
  boringtun=$bt_root/bin/boringtun-cli
fi

# --- what this run creates, all named after its pid ------------------------------------------
id=$$
na=wgbench-$id-a nb=wgbench-$id-b
ia=wgb${id}a ib=wgb${id}b
tmp=$(mktemp -d "/tmp/wg-bench-$id.XXXXXX")
raw=/tmp/wg-bench-$id.jsonl md=/tmp/wg-bench-$id.md
: >"$raw"
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do stop_pid "$p"; done
  for n in "$na" "$nb"; do
    ip netns pids "$n" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$n" 2>/dev/null || true
  done
  rm -f "/var/run/wireguard/$ia.sock" "/var/run/wireguard/$ib.sock"
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# stop_pid <pid>: SIGTERM, up to 5 s to go, then SIGKILL.
stop_pid() {
  kill "$1" 2>/dev/null || return 0
  for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
status_kb() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status" 2>/dev/null || true; }
clk=$(getconf CLK_TCK)
load1() { cut -d' ' -f1 /proc/loadavg; }

# select_impl <label>: sets impl (the family), impl_env and impl_cmd (the interface name follows).
select_impl() {
  impl_env=(WG_PROCESS_FOREGROUND=1)
  case $1 in
    plexd-wg*) impl="plexd-wg"; impl_cmd=("$plexd_wg" -f) ;;
    wireguard-go) impl="wireguard-go"; impl_cmd=(wireguard-go -f) ;;
    boringtun-cli) impl="boringtun-cli"
      impl_cmd=("$boringtun" -f --disable-drop-privileges --log "$tmp/boringtun.log") ;;
  esac
}

# start_daemon <ns> <iface> <log>: the selected implementation; sets started_pid (the daemon's
# own pid: ip netns exec and env both exec). Waits (10 s at most) for its UAPI socket.
start_daemon() {
  ip netns exec "$1" env "${impl_env[@]}" "${impl_cmd[@]}" "$2" >"$3" 2>&1 &
  started_pid=$!
  pids+=("$started_pid")
  for _ in $(seq 500); do
    [[ -S /var/run/wireguard/$2.sock ]] && return 0
    kill -0 "$started_pid" 2>/dev/null || break
    sleep 0.02
  done
  say "$impl did not serve /var/run/wireguard/$2.sock within 10 s; its log:"; cat "$3" >&2
  return 1
}

netns_up() {
  local n
  for n in "$@"; do ip netns add "$n"; ip -n "$n" link set lo up; done
}

netns_down() {
  local p
  for p in "${pids[@]}"; do stop_pid "$p"; done
  pids=()
  for n in "$na" "$nb"; do
    ip netns pids "$n" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$n" 2>/dev/null || true
  done
  rm -f "/var/run/wireguard/$ia.sock" "/var/run/wireguard/$ib.sock"
}

# pair_up: the selected implementation in na and nb, a tunnel 10.211.0.1 <-> 10.211.0.2 over
# the veth 10.210.0.1 <-> 10.210.0.2; answers once a ping crosses it (10 s at most).
pair_up() {
  netns_up "$na" "$nb"
  ip link add "v$ia" netns "$na" type veth peer name "v$ib" netns "$nb"
  ip -n "$na" addr add 10.210.0.1/24 dev "v$ia"; ip -n "$na" link set "v$ia" up
  ip -n "$nb" addr add 10.210.0.2/24 dev "v$ib"; ip -n "$nb" link set "v$ib" up
  start_daemon "$na" "$ia" "$tmp/a.log"; pa=$started_pid
  start_daemon "$nb" "$ib" "$tmp/b.log"; pb=$started_pid
  [[ -s $tmp/ka ]] || { wg genkey >"$tmp/ka"; wg genkey >"$tmp/kb"; }
  ip netns exec "$na" wg set "$ia" listen-port 51820 private-key "$tmp/ka" \
    peer "$(wg pubkey <"$tmp/kb")" endpoint 10.210.0.2:51820 allowed-ips 10.211.0.2/32
  ip netns exec "$nb" wg set "$ib" listen-port 51820 private-key "$tmp/kb" \
    peer "$(wg pubkey <"$tmp/ka")" endpoint 10.210.0.1:51820 allowed-ips 10.211.0.1/32
  ip -n "$na" link set "$ia" mtu 1420; ip -n "$nb" link set "$ib" mtu 1420
  ip -n "$na" addr add 10.211.0.1/24 dev "$ia"; ip -n "$na" link set "$ia" up
  ip -n "$nb" addr add 10.211.0.2/24 dev "$ib"; ip -n "$nb" link set "$ib" up
  for _ in $(seq 20); do
    ip netns exec "$na" ping -c 1 -W 0.5 -q 10.211.0.2 >/dev/null 2>&1 && return 0
  done
  say "$impl: no ping crossed the tunnel within 10 s"
  return 1
}

# snap <ns>: "<cpu ticks of both daemons> <UdpRcvbufErrors> <UdpInErrors> <drops on :51820>"
snap() {
  local t n d
  t=$(($(ticks "$pa") + $(ticks "$pb")))
  n=$(ip netns exec "$1" env NSTAT_HISTORY="$tmp/nstat" nstat -asz UdpRcvbufErrors UdpInErrors |
    awk '$1 == "UdpRcvbufErrors" {r = $2} $1 == "UdpInErrors" {e = $2} END {print r + 0, e + 0}')
  d=$(ip netns exec "$1" ss -uanmH 'sport = :51820' |
    grep -o ',d[0-9]*)' | tr -dc '0-9\n' | awk '{s += $1} END {print s + 0}')
  echo "$t $n $d"
}

# iperf_server: a one-test iperf3 server in nb, listening within 5 s; sets srv.
iperf_server() {
  ip netns exec "$nb" iperf3 -s -1 -B 10.211.0.2 >/dev/null 2>&1 &
  srv=$!
  for _ in $(seq 100); do
    ip netns exec "$nb" ss -ltnH 'sport = :5201' | grep -q . && return 0
    sleep 0.05
  done
  say "iperf3 did not listen in $nb within 5 s"
}

# measure <label> <variant> <run> <test> <receiving ns> [iperf3 args]: one iperf3 test, one record.
measure() {
  local label=$1 variant=$2 run=$3 test=$4 rns=$5 kind=tcp; shift 5
  [[ " $* " == *" -u "* ]] && kind=udp
  local l b a
  l=$(load1)
  iperf_server
  read -r -a b <<<"$(snap "$rns")"
  timeout $((SECS + 20)) ip netns exec "$na" iperf3 -c 10.211.0.2 --connect-timeout 3000 \
    -t "$SECS" -J "$@" >"$tmp/iperf.json" 2>/dev/null || true
  read -r -a a <<<"$(snap "$rns")"
  stop_pid "$srv"
  $report record "$raw" kind=test impl="$impl" variant="$variant" run="$run" test="$test" \
    load1="$l" clk_tck="$clk" cpu_ticks=$((a[0] - b[0])) rcvbuf_errors=$((a[1] - b[1])) \
    in_errors=$((a[2] - b[2])) sock_drops=$((a[3] - b[3])) --iperf "$tmp/iperf.json" "$kind"
}

# ping_under_load <run> [variant]: ping idle, then ping (20 a second, so the maximum means
# something) while a TCP stream runs; one record.
ping_under_load() {
  local l b a load
  l=$(load1)
  ip netns exec "$na" ping -c 10 -i 0.1 -W 1 -q 10.211.0.2 >"$tmp/idle.txt" 2>&1 || true
  iperf_server
  read -r -a b <<<"$(snap "$nb")"
  timeout $((SECS + 20)) ip netns exec "$na" iperf3 -c 10.211.0.2 --connect-timeout 3000 \
    -t "$SECS" -J >"$tmp/iperf.json" 2>/dev/null &
  load=$!
  sleep 1 # the stream ramps up
  ip netns exec "$na" ping -c $(((SECS - 2) * 20)) -i 0.05 -W 1 -q 10.211.0.2 >"$tmp/ping.txt" 2>&1 || true
  wait "$load" || true
  read -r -a a <<<"$(snap "$nb")"
  stop_pid "$srv"
  $report record "$raw" kind=test impl="$impl" variant="${2:-all-on}" run="$1" test=load \
    load1="$l" clk_tck="$clk" cpu_ticks=$((a[0] - b[0])) rcvbuf_errors=$((a[1] - b[1])) \
    in_errors=$((a[2] - b[2])) sock_drops=$((a[3] - b[3])) --iperf "$tmp/iperf.json" tcp \
    --ping "$tmp/ping.txt" --ping-idle "$tmp/idle.txt"
}

# --- the run ---------------------------------------------------------------------------------
load_before=$(uptime)
versions="plexd-wg $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$here" diff --quiet HEAD -- agent/dataplane 2>/dev/null || echo '+local changes')"
versions+=", wireguard-go $(dpkg-query -W -f='${Version}' wireguard-go 2>/dev/null || echo '?')"
[[ -n $boringtun ]] && versions+=", $("$boringtun" --version 2>/dev/null || echo 'boringtun-cli ?')"
versions+=", iperf3 $(iperf3 --version | awk 'NR == 1 {print $2}')"
$report record "$raw" kind=meta date="$(date -u +%Y-%m-%dT%H:%MZ)" nproc="$(nproc)" \
  kernel="$(uname -r)" cpu="$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)" \
  runs="$RUNS" secs="$SECS" load="$load_before" versions="$versions"
say "load before: $load_before"

impls=(plexd-wg wireguard-go)
[[ -n $boringtun ]] && impls=(plexd-wg boringtun-cli wireguard-go)
((quick)) && tests=(tcp1) || tests=(tcp1 tcp4 tcpR udp load)
for run in $(seq "$RUNS"); do
  for label in "${impls[@]}"; do
    select_impl "$label"
    say "run $run/$RUNS: $label"
    if pair_up; then
      for t in "${tests[@]}"; do
        case $t in
          tcp1) measure "$label" all-on "$run" tcp1 "$nb" ;;
          tcp4) measure "$label" all-on "$run" tcp4 "$nb" -P 4 ;;
          tcpR) measure "$label" all-on "$run" tcpR "$na" -R ;;
          udp) measure "$label" all-on "$run" udp "$nb" -u -b 0 -l 1392 ;;
          load) ping_under_load "$run" ;;
        esac
      done
    fi
    netns_down
  done
done

# plexd-wg with one technique off at a time (TCP one stream); then the four throughput ones
# off. The latency techniques (the queue in front of the cipher, its AQM, small packets first,
# the packet threads' priority) are measured with the ping under load too.
variants=("PLEXD_WG_GRO=0" "PLEXD_WG_GSO=0" "PLEXD_WG_OFFLOAD=0" "PLEXD_WG_MMSG=0"
  "PLEXD_WG_GRO=0 PLEXD_WG_GSO=0 PLEXD_WG_OFFLOAD=0 PLEXD_WG_MMSG=0"
  "PLEXD_WG_QUEUE=0" "PLEXD_WG_AQM=0" "PLEXD_WG_PRIORITY=0" "PLEXD_WG_NICE=0"
  "PLEXD_WG_QUEUE=0 PLEXD_WG_NICE=0")
for run in $(seq "$RUNS"); do
  for v in "${variants[@]}"; do
    select_impl plexd-wg
    read -r -a extra <<<"$v"
    impl_env+=("${extra[@]}")
    say "run $run/$RUNS: plexd-wg $v"
    if pair_up; then
      measure plexd-wg "$v" "$run" tcp1 "$nb"
      case $v in *QUEUE* | *AQM* | *PRIORITY* | *NICE*) ((quick)) || ping_under_load "$run" "$v" ;; esac
    fi
    netns_down
  done
done

# --- memory ----------------------------------------------------------------------------------
if ((memory)); then
  $report peers "$PEERS" "$tmp/peers.conf"
  for label in "${impls[@]}"; do
    select_impl "$label"
    say "memory: $label, no peers, then $PEERS peers"
    netns_up "$na"
    start_daemon "$na" "$ia" "$tmp/a.log"; pa=$started_pid
    [[ -s $tmp/ka ]] || wg genkey >"$tmp/ka"
    ip netns exec "$na" wg set "$ia" listen-port 51820 private-key "$tmp/ka"
    ip -n "$na" addr add 10.211.0.1/24 dev "$ia"; ip -n "$na" link set "$ia" up
    sleep 2 # settle: every implementation is idle by then
    idle=$(status_kb "$pa" VmRSS)
    t0=$(date +%s.%N)
    timeout 300 ip netns exec "$na" wg addconf "$ia" "$tmp/peers.conf" >/dev/null 2>&1 ||
      say "$label: wg addconf of $PEERS peers failed or took over 300 s"
    n=0
    for _ in $(seq 600); do
      n=$(ip netns exec "$na" wg show "$ia" peers 2>/dev/null | wc -l)
      ((n >= PEERS)) && break
      sleep 0.1
    done
    t1=$(date +%s.%N)
    sleep 2
    $report record "$raw" kind=memory impl="$label" peers="$n" idle_kb="${idle:-0}" \
      peers_kb="$(status_kb "$pa" VmRSS)" hwm_kb="$(status_kb "$pa" VmHWM)" \
      add_s="$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')"
    netns_down
  done
  if [[ -n $plexd ]]; then
    # plexd run with a registered identity written by hand and an API that refuses connections
    # (nothing listens at 127.0.0.1:9 in its namespace): the daemon stays up, retrying.
    for backend in none userspace; do
      say "memory: plexd run, wireguard.backend $backend"
      root=$tmp/plexd-$backend
      mkdir -m 700 "$root" "$root/etc" "$root/state" "$root/run"
      printf 'api_url: https://127.0.0.1:9\nwireguard:\n  backend: %s\n  interface: %s\n' \
        "$backend" "$ia" >"$root/etc/config.yaml"
      wg genkey >"$root/state/wireguard.key"
      cred=$(head -c 32 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')
      cat >"$root/state/identity.json" <<EOF
{"version":1,"node_id":"00000000-0000-4000-8000-000000000001","domain_id":"00000000-0000-4000-8000-000000000002","project_id":"00000000-0000-4000-8000-000000000003","mesh_ip":"10.64.0.1","mesh_cidr":"10.64.0.0/16","node_credential":"pxnk_00000000-0000-4000-8000-000000000001_$cred","domain_signing_public_key":"$(head -c 32 /dev/urandom | base64)","api_url":"https://127.0.0.1:9","intervals":{"heartbeat_secs":30,"endpoint_report_secs":60,"state_poll_secs":300,"ingest_secs":60},"registered_at":"2026-01-01T00:00:00Z"}
EOF
      netns_up "$na"
      ip netns exec "$na" env PLEXD_CONFIG="$root/etc/config.yaml" PLEXD_STATE_DIR="$root/state" \
        PLEXD_RUN_DIR="$root/run" PLEXD_LOG=warn "$plexd" run >"$root/log" 2>&1 &
      pa=$!; pids+=("$pa")
      sleep 3 # settle
      how="registered identity, unreachable API, 3 s after start"
      [[ $backend == none ]] && how+=", no interface"
      [[ $backend == userspace ]] && ! ip -n "$na" link show "$ia" >/dev/null 2>&1 &&
        how+=", interface not up"
      [[ $backend == userspace ]] && ip -n "$na" link show "$ia" >/dev/null 2>&1 && how+=", interface created"
      kill -0 "$pa" 2>/dev/null || { how="exited: $(tail -n 1 "$root/log")"; }
      $report record "$raw" kind=daemon backend="$backend" how="$how" rss_kb="$(status_kb "$pa" VmRSS)"
      netns_down
    done
  fi
fi

$report record "$raw" kind=end load="$(uptime)"
say "load after: $(uptime)"
$report report "$raw" | tee "$md"
say "raw numbers: $raw; this table: $md"
