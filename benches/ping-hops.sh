#!/usr/bin/env bash
# Where a ping through the tunnel waits while one TCP stream fills it: wg-bench's "ping under
# a TCP stream" test for one implementation, with four packet captures taken meanwhile in its
# two namespaces (the ICMP echoes on each TUN, the echoes' WireGuard datagrams on each veth),
# then benches/ping_hops.py prints the time of each hop (mean, median, p90, max).
#
#   sudo benches/ping-hops.sh [plexd-wg|plexd-run|boringtun-cli|wireguard-go]   (plexd-wg)
#
# The binaries are wg-bench.sh's (PLEXD_WG=, PLEXD=, ... as there). Needs tcpdump (installed
# with apt-get when missing). The stream runs 14 s; the captures take 4 s of it, from 6 s on
# (after the idle pings and the stream's ramp). Everything is wg-bench's and goes with it.
set -euo pipefail
impl=${1:-plexd-wg}
[[ $(id -u) -eq 0 ]] || { echo "ping-hops.sh: run as root" >&2; exit 1; }
case $impl in plexd-wg | plexd-run | boringtun-cli | wireguard-go) ;;
  *) echo "ping-hops.sh: unknown implementation '$impl'" >&2; exit 64 ;; esac
command -v tcpdump >/dev/null || apt-get install -y -q --no-install-recommends tcpdump >/dev/null
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d /tmp/ping-hops.XXXXXX)
SECS=14 IMPLS=$impl TESTS=load VARIANTS= RUN_VARIANT=0 RUNS=1 "$here/benches/wg-bench.sh" --no-memory \
  >"$out/bench.md" 2>"$out/bench.err" &
bench=$!
ns=""
for _ in $(seq 600); do # the pair is up within 60 s (plexd-run enrolls first)
  ns=$(ip netns list | grep -o "wgbench-$bench-a" || true)
  [[ -n $ns ]] && ip netns exec "$ns" pgrep -x iperf3 >/dev/null 2>&1 && break
  kill -0 "$bench" 2>/dev/null || break
  sleep 0.1
done
[[ -n $ns ]] || { echo "ping-hops.sh: wg-bench did not bring the pair up:" >&2; tail "$out/bench.err" >&2; exit 1; }
sleep 4 # the stream ramps up, the pings under it start
na=wgbench-$bench-a nb=wgbench-$bench-b ia=wgb${bench}a ib=wgb${bench}b
ip netns exec "$na" timeout 4 tcpdump -n -i "$ia" -w "$out/ta.pcap" icmp 2>/dev/null &
ip netns exec "$na" timeout 4 tcpdump -n -i "v$ia" -w "$out/va.pcap" 'udp and less 200' 2>/dev/null &
ip netns exec "$nb" timeout 4 tcpdump -n -i "v$ib" -w "$out/vb.pcap" 'udp and less 200' 2>/dev/null &
ip netns exec "$nb" timeout 4 tcpdump -n -i "$ib" -w "$out/tb.pcap" icmp 2>/dev/null &
wait "$bench" || true
wait
# ping's default 56 data bytes: an 84-byte IPv4 echo, 116 bytes of WireGuard payload.
for f in ta tb; do tcpdump -tt -n -r "$out/$f.pcap" 2>/dev/null >"$out/$f.txt"; done
for f in va vb; do tcpdump -tt -n -r "$out/$f.pcap" 2>/dev/null | awk '/length 116$/' >"$out/$f.txt"; done
echo "$impl, ping under one TCP stream ($(grep -o 'load average.*' "$out/bench.err" | tail -n 1)):"
python3 "$here/benches/ping_hops.py" "$out/ta.txt" "$out/va.txt" "$out/vb.txt" "$out/tb.txt"
echo "(captures and wg-bench's output in $out)"
