#!/usr/bin/env bash
# The whole-system benchmark of plexd's userspace WireGuard (plexd-wg) against the references,
# boringtun-cli, Debian's wireguard-go and Debian's Nebula (a userspace mesh VPN of its own
# protocol: two nodes with certificates of one CA, static host map, no lighthouse), in the
# same run, and of the whole daemon: two
# `plexd run` nodes (plexd-run: userspace backend, the embedded data plane) enrolled against a
# local control plane (`plexsphere dev`, in namespace a on the veth's address). For each
# implementation, repeated RUNS times (implementations interleaved, so a drifting machine load
# hits all alike): two network namespaces joined by a veth, the implementation on both ends
# (MTU 1420), and through the tunnel: iperf3 TCP one stream, four streams, reverse, a UDP
# flood, UDP with GSO (udp-gso-blast: 1200-byte datagrams, 64 KiB per send, as QUIC stacks
# send), and ping idle and under a TCP stream. Per test: Gbit/s, CPU-seconds per GB of both
# daemons (/proc/<pid>/stat utime+stime; for plexd-run the two plexd processes, the control
# plane's CPU recorded apart), the receiving namespace's UDP drops (nstat
# UdpRcvbufErrors/UdpInErrors, and the daemons' own sockets on :51820 from `ss -m`). Then
# plexd-wg with each performance switch off on its own (TCP one stream; USO off with the GSO
# row), and memory: VmRSS with an interface up and no peers, and with PEERS peers added
# through `wg addconf`; and `plexd run`'s own VmRSS.
#
#   sudo benches/wg-bench.sh [--runs N] [--secs S] [--peers N] [--quick] [--no-memory]
#
# --quick: TCP one stream, UDP with GSO and the technique rows only (what wg-pair-throughput.sh
# runs).
# IMPLS="plexd-wg plexd-run" (say) measures only those implementations (default: all five).
# Nebula has no UAPI: it is left out of the memory rows (no `wg addconf`); its relay mode is
# not measured (it needs a third node as relay and a lighthouse).
# Prints a Markdown block for docs/benchmarks.md on stdout (progress goes to stderr) and keeps
# /tmp/wg-bench-<pid>.jsonl (raw numbers, one JSON object per measurement) and
# /tmp/wg-bench-<pid>.md. Everything else it creates (namespaces, veths, TUNs, UAPI sockets,
# processes, files) carries its pid and is removed on exit; traffic stays inside its namespaces.
#
# Needs root, iproute2, wireguard-tools, wireguard-go, nebula, iperf3, python3, cargo; missing Debian
# packages are installed with apt-get --no-install-recommends; boringtun-cli is built with
# `cargo install --locked` into $BORINGTUN_ROOT (default /var/cache/plexsphere/cargo-bin) when
# it is not on PATH. PLEXD_WG=<path> / PLEXD=<path> / PLEXSPHERE=<path> / PLEXCTL=<path> /
# BLAST=<path> (udp-gso-blast) / VIEWS=<path> (policy-views) measure binaries built elsewhere.
# plexd-run's two plexd run at the Nice= of systemd/plexd.service, as the unit runs them;
# PLEXD_RUN_NICE=<n> runs them at n instead (0: the process priority of a plexd started by hand).
# When that is not 0, plexd-run is also measured at nice 0 (TCP one stream and the ping under
# it), to show what the priority buys; RUN_VARIANT=0 leaves that out.
# TESTS="tcp1 load" runs only those tests (of tcp1 tcp4 tcpR udp udpgso load);
# VARIANTS='PLEXD_WG_NICE=0;PLEXD_WG_QUEUE=0' only those plexd-wg variants (';' between them,
# VARIANTS= none).
# The variant PLEXD_WG_POLICY_RULES=1000 runs plexd-wg with a 1,000-rule access policy's filter
# on both ends (issue 25; views compiled by the policy-views bin, loaded via PLEXD_WG_POLICY_VIEWS).
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
run_nice=${PLEXD_RUN_NICE:-$(sed -n 's/^Nice=//p' "$here/systemd/plexd.service")}
[[ $run_nice =~ ^-?[0-9]+$ && $run_nice -ge -20 && $run_nice -le 19 ]] ||
  { echo "wg-bench.sh: PLEXD_RUN_NICE (or systemd/plexd.service's Nice=) must be -20..19, not '$run_nice'" >&2; exit 64; }
report="python3 $here/benches/wg_bench_report.py"
say() { echo "wg-bench: $*" >&2; }

# --- the tools and the implementations -------------------------------------------------------
need=()
for t in ip:iproute2 ss:iproute2 nstat:iproute2 wg:wireguard-tools wireguard-go:wireguard-go \
         nebula:nebula nebula-cert:nebula iperf3:iperf3 ping:iputils-ping python3:python3 timeout:coreutils; do
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
plexd_wg=${PLEXD_WG:-} plexd=${PLEXD:-} plexsphere=${PLEXSPHERE:-} plexctl=${PLEXCTL:-} blast=${BLAST:-}
if [[ -z $plexd_wg ]]; then
  say "building plexd-wg (release)"
  (cd "$here" && cargo build --release -q -p plexd-dataplane --bin plexd-wg)
  plexd_wg=$target/release/plexd-wg
fi
if [[ -z $blast ]]; then
  say "building udp-gso-blast (release)"
  (cd "$here" && cargo build --release -q -p plexsphere-benches --bin udp-gso-blast)
  blast=$target/release/udp-gso-blast
fi
views=${VIEWS:-}
if [[ -z $views ]]; then
  say "building policy-views (release)"
  (cd "$here" && cargo build --release -q -p plexsphere-benches --bin policy-views)
  views=$target/release/policy-views
fi
if [[ -z $plexd ]]; then
  say "building plexd (release)"
  if (cd "$here" && cargo build --release -q -p plexd --bin plexd); then
    plexd=$target/release/plexd
  else
    say "plexd did not build; plexd-run and its own memory row are skipped"
  fi
fi
if [[ -n $plexd && ( -z $plexsphere || -z $plexctl ) ]]; then
  say "building plexsphere and plexctl (release) for plexd-run's control plane"
  if (cd "$here" && cargo build --release -q -p plexsphere --bin plexsphere -p plexctl --bin plexctl); then
    plexsphere=${plexsphere:-$target/release/plexsphere} plexctl=${plexctl:-$target/release/plexctl}
  else
    say "plexsphere or plexctl did not build; plexd-run is skipped"
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
# The Project plexd-run's nodes join: the lab seed's lab-nodes (no sub-range).
run_project=019a0816-0000-7000-8000-000000000002
ta=10.211.0.1 tb=10.211.0.2 # the tunnel addresses; plexd-run's are the mesh IPs it is given
pc=""                       # plexd-run's control plane (its CPU is recorded, not counted)
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
    plexd-run) impl="plexd-run"; impl_cmd=() ;;
    wireguard-go) impl="wireguard-go"; impl_cmd=(wireguard-go -f) ;;
    nebula) impl="nebula"; impl_cmd=() ;;
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
  ta=10.211.0.1 tb=10.211.0.2 pc=""
}

# pair_up: the selected implementation in na and nb, a tunnel 10.211.0.1 <-> 10.211.0.2 over
# the veth 10.210.0.1 <-> 10.210.0.2; answers once a ping crosses it (10 s at most).
pair_up() {
  netns_up "$na" "$nb"
  ip link add "v$ia" netns "$na" type veth peer name "v$ib" netns "$nb"
  ip -n "$na" addr add 10.210.0.1/24 dev "v$ia"; ip -n "$na" link set "v$ia" up
  ip -n "$nb" addr add 10.210.0.2/24 dev "v$ib"; ip -n "$nb" link set "v$ib" up
  [[ $impl == plexd-run ]] && { run_pair_up; return; }
  [[ $impl == nebula ]] && { nebula_pair_up; return; }
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

# nebula_pair_up (on pair_up's veth): a CA and a certificate per side (10.211.0.1/24 and
# .2/24: the tunnel addresses the others use), `nebula` in na and nb on UDP 51820 with the
# other's veth address in its static host map, no lighthouse, a firewall that lets everything
# in (as the WireGuard pairs filter nothing), MTU 1420, 10 MiB socket buffers (Nebula's own
# advice for throughput; its default drops under a stream); sets pa/pb. Answers once a ping crosses
# the tunnel (10 s at most).
nebula_pair_up() {
  local pki=$tmp/nebula side ns iface peer_ip peer_veth
  if [[ ! -s $pki/ca.crt ]]; then
    mkdir -p "$pki"
    nebula-cert ca -name wg-bench -out-crt "$pki/ca.crt" -out-key "$pki/ca.key" >/dev/null
    nebula-cert sign -ca-crt "$pki/ca.crt" -ca-key "$pki/ca.key" -name a -ip 10.211.0.1/24 \
      -out-crt "$pki/a.crt" -out-key "$pki/a.key" >/dev/null
    nebula-cert sign -ca-crt "$pki/ca.crt" -ca-key "$pki/ca.key" -name b -ip 10.211.0.2/24 \
      -out-crt "$pki/b.crt" -out-key "$pki/b.key" >/dev/null
  fi
  for side in a b; do
    ns=$na iface=$ia peer_ip=10.211.0.2 peer_veth=10.210.0.2
    [[ $side == b ]] && ns=$nb iface=$ib peer_ip=10.211.0.1 peer_veth=10.210.0.1
    cat >"$pki/$side.yml" <<EOF
pki: {ca: $pki/ca.crt, cert: $pki/$side.crt, key: $pki/$side.key}
static_host_map: {"$peer_ip": ["$peer_veth:51820"]}
lighthouse: {am_lighthouse: false, interval: 60, hosts: []}
listen: {host: 0.0.0.0, port: 51820, read_buffer: 10485760, write_buffer: 10485760}
punchy: {punch: false}
tun: {disabled: false, dev: $iface, mtu: 1420}
logging: {level: warning, format: text}
firewall:
  outbound: [{port: any, proto: any, host: any}]
  inbound: [{port: any, proto: any, host: any}]
EOF
    ip netns exec "$ns" nebula -config "$pki/$side.yml" >"$tmp/$side.log" 2>&1 &
    started_pid=$!; pids+=("$started_pid")
    if [[ $side == a ]]; then pa=$started_pid; else pb=$started_pid; fi
  done
  for _ in $(seq 20); do
    ip netns exec "$na" ping -c 1 -W 0.5 -q 10.211.0.2 >/dev/null 2>&1 && return 0
  done
  say "nebula: no ping crossed the tunnel within 10 s; its logs:"
  tail -n 20 "$tmp/a.log" "$tmp/b.log" >&2
  return 1
}

# plexd_env <node dir>: the environment `plexd` runs with for the node in that directory.
plexd_env() {
  echo "PLEXD_CONFIG=$1/etc/config.yaml PLEXD_STATE_DIR=$1/state PLEXD_RUN_DIR=$1/run" \
    "PLEXD_UNIT_DIR=$1/units PLEXD_MACHINE_ID_FILE=$1/etc/machine-id"
}

# run_pair_up (on pair_up's veth): `plexsphere dev` in na on 10.210.0.1:8443 (the lab seed,
# no local machines), a node token each, and `plexd run` in na and nb (userspace backend,
# interfaces ia/ib, MTU 1420 and port 51820 by default) that enroll on first start; sets
# pa/pb (the two plexd), pc (the control plane), ta/tb (their mesh IPs). Answers once a ping
# crosses the mesh (60 s at most in all).
run_pair_up() {
  local cp=$tmp/cp node side ns iface e token
  rm -rf "$cp" "$tmp/node-a" "$tmp/node-b"
  mkdir -m 700 "$cp"
  ip netns exec "$na" env PLEXSPHERE_NO_LOCAL_MACHINES=1 PLEXSPHERE_LOG=warn "$plexsphere" dev \
    --data-dir "$cp" --listen 10.210.0.1:8443 --san 10.210.0.1 >"$cp.log" 2>&1 &
  pc=$!; pids+=("$pc")
  for _ in $(seq 300); do
    grep -q 'listening on https://' "$cp.log" 2>/dev/null && break
    kill -0 "$pc" 2>/dev/null || break
    sleep 0.1
  done
  grep -q 'listening on https://' "$cp.log" 2>/dev/null ||
    { say "plexsphere dev did not listen within 30 s; its log:"; tail -n 20 "$cp.log" >&2; return 1; }
  for side in a b; do
    node=$tmp/node-$side ns=$na iface=$ia
    [[ $side == b ]] && ns=$nb iface=$ib
    mkdir -m 700 "$node" && mkdir "$node/etc" "$node/state" "$node/run" "$node/units"
    head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$node/etc/machine-id"
    token=$(ip netns exec "$na" env PLEXCTL_CONFIG="$cp/plexctl.yaml" "$plexctl" bootstrap-token \
      issue --project "$run_project" --kind node --env-prefix lab --ttl 1h --output json |
      python3 -c 'import json, sys; print(json.load(sys.stdin)["token"])') ||
      { say "plexctl could not issue a node token"; return 1; }
    printf '%s\n' "$token" >"$node/etc/bootstrap-token"
    printf 'api_url: https://10.210.0.1:8443\ntoken_file: %s\nstate_dir: %s\ntls:\n  ca_file: %s\nregistration:\n  project_id: %s\n  resource_handle: bench-%s\nwireguard:\n  backend: userspace\n  interface: %s\n' \
      "$node/etc/bootstrap-token" "$node/state" "$cp/tls/ca.crt" "$run_project" "$side" "$iface" \
      >"$node/etc/config.yaml"
    read -r -a e <<<"$(plexd_env "$node")"
    ip netns exec "$ns" nice -n "$run_nice" env "${e[@]}" PLEXD_LOG=warn "$plexd" run >"$node/log" 2>&1 &
    started_pid=$!; pids+=("$started_pid")
    if [[ $side == a ]]; then pa=$started_pid; else pb=$started_pid; fi
  done
  # Enrolled (an identity each), then a ping over the mesh.
  for _ in $(seq 300); do
    [[ -s $tmp/node-a/state/identity.json && -s $tmp/node-b/state/identity.json ]] && break
    if ! kill -0 "$pa" 2>/dev/null || ! kill -0 "$pb" 2>/dev/null; then break; fi
    sleep 0.1
  done
  ta=$(mesh_ip "$tmp/node-a") tb=$(mesh_ip "$tmp/node-b")
  if [[ -z $ta || -z $tb ]]; then
    say "plexd-run: the nodes did not enroll within 30 s; their logs:"
    tail -n 20 "$tmp/node-a/log" "$tmp/node-b/log" >&2
    return 1
  fi
  local crossed=0 path=""
  for _ in $(seq 60); do
    ip netns exec "$na" ping -c 1 -W 0.5 -q "$tb" >/dev/null 2>&1 && { crossed=1; break; }
    sleep 0.5
  done
  if ((!crossed)); then
    say "plexd-run: no ping crossed the mesh ($ta -> $tb) within 60 s; their logs:"
    tail -n 20 "$tmp/node-a/log" "$tmp/node-b/log" >&2
    return 1
  fi
  # The reach runtime may start on the dev relay: measure the direct path over the veth, as
  # the other implementations use (20 s at most; the path is recorded either way).
  for _ in $(seq 40); do
    path=$(run_path)
    [[ $path == direct* ]] && break
    sleep 0.5
  done
  $report record "$raw" kind=path impl=plexd-run run="$run" path="${path:-not reported}"
  [[ $path == direct* ]] || say "plexd-run: node a's path to b is '${path:-not reported}', not direct"
  return 0
}

# run_path: node a's path to its peer as its `plexd status` reports it: "<kind> <endpoint or
# relay> [transport]".
run_path() {
  local e
  read -r -a e <<<"$(plexd_env "$tmp/node-a")"
  ip netns exec "$na" env "${e[@]}" "$plexd" status --output json 2>/dev/null | python3 -c '
import json, sys
for p in json.load(sys.stdin).get("peers") or []:
    path = p.get("path") or {}
    print(path.get("kind", "?"), path.get("endpoint") or path.get("relay") or "", path.get("transport") or "")
    break' 2>/dev/null || true
}

# mesh_ip <node dir>: the mesh IP its identity holds (nothing before it enrolled).
mesh_ip() {
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["mesh_ip"])' \
    "$1/state/identity.json" 2>/dev/null || true
}

# snap <ns>: "<cpu ticks of both daemons> <UdpRcvbufErrors> <UdpInErrors> <drops on :51820>
# <cpu ticks of plexd-run's control plane (0 for the others)>"
snap() {
  local t n d c=0
  t=$(($(ticks "$pa") + $(ticks "$pb")))
  [[ -n $pc ]] && c=$(ticks "$pc")
  n=$(ip netns exec "$1" env NSTAT_HISTORY="$tmp/nstat" nstat -asz UdpRcvbufErrors UdpInErrors |
    awk '$1 == "UdpRcvbufErrors" {r = $2} $1 == "UdpInErrors" {e = $2} END {print r + 0, e + 0}')
  d=$(ip netns exec "$1" ss -uanmH 'sport = :51820' |
    grep -o ',d[0-9]*)' | tr -dc '0-9\n' | awk '{s += $1} END {print s + 0}')
  echo "$t $n $d $c"
}

# iperf_server: a one-test iperf3 server in nb, listening within 5 s; sets srv.
iperf_server() {
  ip netns exec "$nb" iperf3 -s -1 -B "$tb" >/dev/null 2>&1 &
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
  timeout $((SECS + 20)) ip netns exec "$na" iperf3 -c "$tb" --connect-timeout 3000 \
    -t "$SECS" -J "$@" >"$tmp/iperf.json" 2>/dev/null || true
  read -r -a a <<<"$(snap "$rns")"
  stop_pid "$srv"
  $report record "$raw" kind=test impl="$impl" variant="$variant" run="$run" test="$test" \
    load1="$l" clk_tck="$clk" cpu_ticks=$((a[0] - b[0])) rcvbuf_errors=$((a[1] - b[1])) \
    in_errors=$((a[2] - b[2])) sock_drops=$((a[3] - b[3])) cp_ticks=$((a[4] - b[4])) --iperf "$tmp/iperf.json" "$kind"
}

# measure_udpgso <variant> <run>: udp-gso-blast from na to a receiver in nb for SECS (UDP_SEGMENT
# of 1200-byte datagrams, 64 KiB per send, as fast as the socket takes them); one record.
measure_udpgso() {
  local l b a rcv
  l=$(load1)
  ip netns exec "$nb" "$blast" recv "$tb:7001" --secs $((SECS + 10)) >"$tmp/recv.json" 2>"$tmp/recv.err" &
  rcv=$!
  for _ in $(seq 100); do
    ip netns exec "$nb" ss -ulnH 'sport = :7001' | grep -q . && break
    sleep 0.05
  done
  read -r -a b <<<"$(snap "$nb")"
  timeout $((SECS + 10)) ip netns exec "$na" "$blast" send "$tb:7001" --secs "$SECS" \
    >"$tmp/send.json" 2>"$tmp/send.err" || true
  # The receiver ends 1 s after the last datagram (SECS + 10 s at most).
  wait "$rcv" || true
  read -r -a a <<<"$(snap "$nb")"
  $report record "$raw" kind=test impl="$impl" variant="$1" run="$2" test=udpgso \
    load1="$l" clk_tck="$clk" cpu_ticks=$((a[0] - b[0])) rcvbuf_errors=$((a[1] - b[1])) \
    in_errors=$((a[2] - b[2])) sock_drops=$((a[3] - b[3])) cp_ticks=$((a[4] - b[4])) \
    --blast "$tmp/send.json" "$tmp/recv.json"
}

# ping_under_load <run> [variant]: ping idle, then ping (20 a second, so the maximum means
# something) while a TCP stream runs; one record.
ping_under_load() {
  local l b a load
  l=$(load1)
  ip netns exec "$na" ping -c 10 -i 0.1 -W 1 -q "$tb" >"$tmp/idle.txt" 2>&1 || true
  iperf_server
  read -r -a b <<<"$(snap "$nb")"
  timeout $((SECS + 20)) ip netns exec "$na" iperf3 -c "$tb" --connect-timeout 3000 \
    -t "$SECS" -J >"$tmp/iperf.json" 2>/dev/null &
  load=$!
  sleep 1 # the stream ramps up
  ip netns exec "$na" ping -c $(((SECS - 2) * 20)) -i 0.05 -W 1 -q "$tb" >"$tmp/ping.txt" 2>&1 || true
  wait "$load" || true
  read -r -a a <<<"$(snap "$nb")"
  stop_pid "$srv"
  $report record "$raw" kind=test impl="$impl" variant="${2:-all-on}" run="$1" test=load \
    load1="$l" clk_tck="$clk" cpu_ticks=$((a[0] - b[0])) rcvbuf_errors=$((a[1] - b[1])) \
    in_errors=$((a[2] - b[2])) sock_drops=$((a[3] - b[3])) cp_ticks=$((a[4] - b[4])) --iperf "$tmp/iperf.json" tcp \
    --ping "$tmp/ping.txt" --ping-idle "$tmp/idle.txt"
}

# --- the run ---------------------------------------------------------------------------------
load_before=$(uptime)
versions="plexd-wg $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$here" diff --quiet HEAD -- agent/dataplane 2>/dev/null || echo '+local changes')"
[[ -n $plexd && -n $plexsphere && -n $plexctl ]] && versions+=" (plexd-run: plexd run at nice $run_nice and plexsphere dev of the same tree)"
versions+=", wireguard-go $(dpkg-query -W -f='${Version}' wireguard-go 2>/dev/null || echo '?')"
[[ -n $boringtun ]] && versions+=", $("$boringtun" --version 2>/dev/null || echo 'boringtun-cli ?')"
versions+=", nebula $(dpkg-query -W -f='${Version}' nebula 2>/dev/null || echo '?')"
versions+=", iperf3 $(iperf3 --version | awk 'NR == 1 {print $2}')"
$report record "$raw" kind=meta date="$(date -u +%Y-%m-%dT%H:%MZ)" nproc="$(nproc)" \
  kernel="$(uname -r)" cpu="$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)" \
  runs="$RUNS" secs="$SECS" load="$load_before" versions="$versions"
say "load before: $load_before"

impls=(plexd-wg)
[[ -n $plexd && -n $plexsphere && -n $plexctl ]] && impls+=(plexd-run)
[[ -n $boringtun ]] && impls+=(boringtun-cli)
impls+=(wireguard-go nebula)
if [[ -n ${IMPLS:-} ]]; then
  read -r -a want <<<"$IMPLS"
  keep=()
  for label in "${impls[@]}"; do [[ " ${want[*]} " == *" $label "* ]] && keep+=("$label"); done
  impls=("${keep[@]}")
  ((${#impls[@]})) || { echo "wg-bench.sh: IMPLS='$IMPLS' names none of plexd-wg plexd-run boringtun-cli wireguard-go nebula (or it is not built)" >&2; exit 64; }
fi
((quick)) && tests=(tcp1 udpgso) || tests=(tcp1 tcp4 tcpR udp udpgso load)
if [[ -n ${TESTS:-} ]]; then
  read -r -a tests <<<"$TESTS"
  for t in "${tests[@]}"; do
    [[ " tcp1 tcp4 tcpR udp udpgso load " == *" $t "* ]] ||
      { echo "wg-bench.sh: TESTS names '$t'; the tests are tcp1 tcp4 tcpR udp udpgso load" >&2; exit 64; }
  done
fi
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
          udpgso) measure_udpgso all-on "$run" ;;
          load) ping_under_load "$run" ;;
        esac
      done
    fi
    netns_down
  done
done

# plexd-wg with one technique off at a time (TCP one stream); then the four throughput ones
# off; then plexd's own protocol implementation inline, and with the ordered crypto pool of
# one and two workers (switches that turn something on). The latency techniques (the queue in front of the cipher, its AQM, small packets first,
# the packet threads' priority) are measured with the ping under load too; TUN USO, which
# TCP never uses, with the UDP GSO row instead.
variants=("PLEXD_WG_GRO=0" "PLEXD_WG_GSO=0" "PLEXD_WG_OFFLOAD=0" "PLEXD_WG_MMSG=0"
  "PLEXD_WG_GRO=0 PLEXD_WG_GSO=0 PLEXD_WG_OFFLOAD=0 PLEXD_WG_MMSG=0"
  "PLEXD_WG_QUEUE=0" "PLEXD_WG_AQM=0" "PLEXD_WG_PRIORITY=0" "PLEXD_WG_NICE=0"
  "PLEXD_WG_QUEUE=0 PLEXD_WG_NICE=0" "PLEXD_WG_USO=0"
  "PLEXD_WG_PROTOCOL=plexd" "PLEXD_WG_CRYPTO_WORKERS=1" "PLEXD_WG_CRYPTO_WORKERS=2"
  "PLEXD_WG_POLICY_RULES=1000")
[[ -n ${VARIANTS+set} ]] && IFS=';' read -r -a variants <<<"$VARIANTS"
[[ " ${impls[*]} " == *" plexd-wg "* ]] || variants=()
for run in $(seq "$RUNS"); do
  for v in "${variants[@]}"; do
    select_impl plexd-wg
    read -r -a extra <<<"$v"
    impl_env+=("${extra[@]}")
    # PLEXD_WG_POLICY_RULES=N: both ends enforce an N-rule access policy (issue 25) that lets
    # a open tcp/udp 5201 and icmp on b; the views are compiled here, plexd-wg loads them.
    for e in "${extra[@]}"; do
      if [[ $e == PLEXD_WG_POLICY_RULES=* ]]; then
        mkdir -p "$tmp/views"
        "$views" "${e#*=}" "$tmp/views/$ia.json" "$tmp/views/$ib.json" "$ta" "$tb"
        impl_env+=("PLEXD_WG_POLICY_VIEWS=$tmp/views")
      fi
    done
    say "run $run/$RUNS: plexd-wg $v"
    if pair_up; then
      case $v in
        *USO*) measure_udpgso "$v" "$run" ;;
        *) measure plexd-wg "$v" "$run" tcp1 "$nb" ;;
      esac
      case $v in *QUEUE* | *AQM* | *PRIORITY* | *NICE* | *PROTOCOL* | *CRYPTO*) ((quick)) || ping_under_load "$run" "$v" ;; esac
    fi
    netns_down
  done
done

# plexd-run at the applications' priority (nice 0) beside the unit's Nice=: what the unit's
# priority buys the whole daemon (TCP one stream and the ping under it).
if [[ " ${impls[*]} " == *" plexd-run "* && $run_nice != 0 && ${RUN_VARIANT:-1} != 0 ]]; then
  unit_nice=$run_nice
  for run in $(seq "$RUNS"); do
    select_impl plexd-run
    run_nice=0
    say "run $run/$RUNS: plexd-run at nice 0"
    if pair_up; then
      measure plexd-run "nice 0" "$run" tcp1 "$nb"
      ((quick)) || ping_under_load "$run" "nice 0"
    fi
    netns_down
    run_nice=$unit_nice
  done
fi

# --- memory ----------------------------------------------------------------------------------
if ((memory)); then
  $report peers "$PEERS" "$tmp/peers.conf"
  for label in "${impls[@]}"; do
    [[ $label == plexd-run ]] && continue # its own rows follow (plexd run, no peers)
    [[ $label == nebula ]] && continue    # no UAPI to add peers through
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
