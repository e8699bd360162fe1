#!/usr/bin/env python3
"""Where a ping through the tunnel waits: one line per hop, from four packet captures.

  ping_hops.py TUN_A.txt VETH_A.txt VETH_B.txt TUN_B.txt

Each file is `tcpdump -tt -n -r <pcap>` output of one capture that benches/ping-hops.sh takes
in the namespaces of a wg-bench pair (one clock for all four): the ICMP echoes on the TUN of a
and of b, and the WireGuard datagrams of the echoes' size on the veth of a and of b. An echo
request is followed from a's TUN to the datagram that carries it out of a, to b's TUN, to b's
reply, to the datagram that carries the reply out of b, to a's TUN. The datagram of an echo is
told from the others by its size (the ICMP packet plus WireGuard's 32 bytes); a round trip
longer than 50 ms, or one whose hops cannot all be found, is left out and counted.
"""
import statistics
import sys

A_NET, B_NET = "10.210.0.1.", "10.210.0.2."


def read(path):
    """(time, line) of each captured packet."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if parts:
                out.append((float(parts[0]), line))
    return out


def first_at_or_after(times, t):
    for x in times:
        if x >= t:
            return x
    return None


def main(argv):
    if len(argv) != 5:
        print(__doc__.strip(), file=sys.stderr)
        return 64
    tun_a, veth_a, veth_b, tun_b = (read(p) for p in argv[1:])
    a_req = [t for t, l in tun_a if "echo request" in l]
    a_rep = [t for t, l in tun_a if "echo reply" in l]
    b_req = [t for t, l in tun_b if "echo request" in l]
    b_rep = [t for t, l in tun_b if "echo reply" in l]
    a_out = [t for t, l in veth_a if l.split()[2].startswith(A_NET)]
    b_out = [t for t, l in veth_b if l.split()[2].startswith(B_NET)]
    names = ["a: TUN to UDP (read, encrypt, send)", "the veth, b: UDP to TUN (receive, decrypt, write)",
             "b's kernel answers the echo", "b: TUN to UDP (read, encrypt, send)",
             "the veth, a: UDP to TUN (receive, decrypt, write)", "round trip"]
    hops = [[] for _ in names]
    skipped = 0
    for t0 in a_req:
        t1 = first_at_or_after(a_out, t0)
        t3 = t1 and first_at_or_after(b_req, t1)
        t4 = t3 and first_at_or_after(b_rep, t3)
        t5 = t4 and first_at_or_after(b_out, t4)
        t7 = t5 and first_at_or_after(a_rep, t5)
        if not t7 or t7 - t0 > 0.05:
            skipped += 1
            continue
        for h, d in zip(hops, (t1 - t0, t3 - t1, t4 - t3, t5 - t4, t7 - t5, t7 - t0)):
            h.append(d * 1e6)
    if not hops[-1]:
        print("no echo could be followed through all four captures", file=sys.stderr)
        return 1
    print(f"| hop ({len(hops[-1])} echoes, {skipped} left out) | mean µs | median µs | p90 µs | max µs |")
    print("|---|---|---|---|---|")
    for name, h in zip(names, hops):
        h = sorted(h)
        print(f"| {name} | {statistics.mean(h):.0f} | {statistics.median(h):.0f} | "
              f"{h[int(len(h) * 0.9)]:.0f} | {h[-1]:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
