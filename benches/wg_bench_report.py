#!/usr/bin/env python3
"""Records and reports for benches/wg-bench.sh (standard library only).

  wg_bench_report.py record RAW key=value... [--iperf FILE tcp|udp] [--blast SEND RECV]
                                             [--ping FILE] [--ping-idle FILE]
      appends one JSON line to RAW: the key=value pairs (numbers where they parse), plus what
      the iperf3 JSON, udp-gso-blast's two JSON lines and the ping summaries say; derives
      Gbit/s and CPU-seconds per GB.
  wg_bench_report.py peers COUNT FILE
      writes a `wg addconf` file of COUNT peers (random keys, a /32 each, an endpoint each).
  wg_bench_report.py report RAW
      prints the Markdown tables (medians over runs) for docs/benchmarks.md.
  wg_bench_report.py criterion DIR
      prints the criterion results under DIR (<target dir>/criterion) as a Markdown table, each
      of our paths beside its crypto-only floor.
"""

import base64
import json
import os
import re
import statistics
import sys

UDP_LEN = 1392  # iperf3 -l: 1420 (tunnel MTU) - 20 (IPv4) - 8 (UDP)
REFERENCES = ["boringtun-cli", "wireguard-go", "nebula"]
OURS = "plexd-wg"
# The whole daemon: two `plexd run` nodes with the embedded data plane (wg-bench.sh).
DAEMON = "plexd-run"
TESTS = [
    ("tcp1", "TCP, 1 stream"),
    ("tcp4", "TCP, 4 streams (-P 4)"),
    ("tcpR", "TCP, reverse (-R)"),
    ("udp", "UDP flood, received (-u -b 0)"),
    ("udpgso", "UDP with GSO (QUIC-like), received"),
    ("load", "TCP, 1 stream, during the ping"),
]


def num(text):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_iperf(path, kind):
    """Gbit/s received, bytes received, seconds, loss % (UDP) or retransmits (TCP)."""
    try:
        with open(path, encoding="utf-8") as f:
            end = json.load(f)["end"]
    except (OSError, ValueError, KeyError) as e:
        return {"error": f"iperf3 gave no result ({type(e).__name__})"}
    if kind == "udp":
        s = end["sum"]
        got = max(0, s["packets"] - s["lost_packets"]) * UDP_LEN
        secs = s["seconds"] or 1.0
        return {
            "bytes": got,
            "seconds": secs,
            "gbps": got * 8 / secs / 1e9,
            "sent_gbps": s["bits_per_second"] / 1e9,
            "lost_pct": s["lost_percent"],
        }
    r = end["sum_received"]
    return {
        "bytes": r["bytes"],
        "seconds": r["seconds"],
        "gbps": r["bits_per_second"] / 1e9,
        "retransmits": end.get("sum_sent", {}).get("retransmits"),
    }


def parse_blast(send_path, recv_path):
    """udp-gso-blast's sender and receiver lines: Gbit/s received over the sending time."""
    try:
        with open(send_path, encoding="utf-8") as f:
            sent = json.loads(f.read().strip().splitlines()[-1])
        with open(recv_path, encoding="utf-8") as f:
            got = json.loads(f.read().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError) as e:
        return {"error": f"udp-gso-blast gave no result ({type(e).__name__})"}
    secs = sent.get("seconds") or 1.0
    return {
        "bytes": got["bytes"],
        "seconds": secs,
        "gbps": got["bytes"] * 8 / secs / 1e9,
        "sent_gbps": sent["bytes"] * 8 / secs / 1e9,
        "lost_pct": 100.0 * (1 - got["bytes"] / sent["bytes"]) if sent.get("bytes") else None,
        "send_errors": sent.get("errors"),
        "datagrams": got.get("datagrams"),
    }


def parse_ping(path, prefix):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return {}
    out = {}
    m = re.search(r"= ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+) ms", text)
    if m:
        out[f"{prefix}_avg_ms"] = float(m.group(2))
        out[f"{prefix}_max_ms"] = float(m.group(3))
    m = re.search(r"([\d.]+)% packet loss", text)
    if m:
        out[f"{prefix}_loss_pct"] = float(m.group(1))
    return out


def record(raw, args):
    rec = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--iperf":
            rec.update(parse_iperf(args[i + 1], args[i + 2]))
            i += 3
            continue
        if a == "--blast":
            rec.update(parse_blast(args[i + 1], args[i + 2]))
            i += 3
            continue
        if a in ("--ping", "--ping-idle"):
            rec.update(parse_ping(args[i + 1], "ping" if a == "--ping" else "idle"))
            i += 2
            continue
        key, _, value = a.partition("=")
        rec[key] = num(value)
        i += 1
    if "cpu_ticks" in rec and "clk_tck" in rec:
        rec["cpu_s"] = rec["cpu_ticks"] / rec["clk_tck"]
        if rec.get("bytes"):
            rec["cpu_s_per_gb"] = rec["cpu_s"] / (rec["bytes"] / 1e9)
    if rec.get("cp_ticks") and "clk_tck" in rec:
        rec["cp_cpu_s"] = rec["cp_ticks"] / rec["clk_tck"]
    with open(raw, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec, sort_keys=True) + "\n")
    if "error" in rec:
        print(f"  {rec.get('impl')} {rec.get('test')}: {rec['error']}", file=sys.stderr)


def peers(count, path):
    with open(path, "w", encoding="utf-8") as f:
        for i in range(count):
            key = base64.b64encode(os.urandom(32)).decode()
            ip = f"10.{100 + (i >> 16)}.{(i >> 8) & 255}.{i & 255}"
            f.write(f"[Peer]\nPublicKey = {key}\nAllowedIPs = {ip}/32\n")
            f.write(f"Endpoint = 192.0.2.{1 + i % 250}:{20000 + i}\n\n")


def med(values):
    values = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(values) if values else None


def fmt(v, digits=2):
    return "n/a" if v is None else f"{v:.{digits}f}"


def ratio(ours, refs, higher_is_better=True):
    refs = [r for r in refs if r]
    if not ours or not refs:
        return "n/a"
    best = max(refs) if higher_is_better else min(refs)
    return f"{ours / best:.2f}x" if higher_is_better else f"{best / ours:.2f}x"


def report(raw):
    with open(raw, encoding="utf-8") as f:
        recs = [json.loads(line) for line in f if line.strip()]
    meta = next((r for r in recs if r.get("kind") == "meta"), {})
    end = next((r for r in recs if r.get("kind") == "end"), {})
    runs = [r for r in recs if r.get("kind") == "test"]
    present = [i for i in [OURS, DAEMON] + REFERENCES if any(r["impl"] == i for r in runs)]
    impls = present or [OURS]
    refs_of = [i for i in impls if i in REFERENCES]
    ours_of = [i for i in impls if i not in REFERENCES]
    tests = [(t, label) for t, label in TESTS if any(r["test"] == t for r in runs)]

    def pick(impl, test, variant="all-on"):
        return [r for r in runs if r["impl"] == impl and r["test"] == test and r.get("variant", "all-on") == variant]

    def m(impl, test, key, variant="all-on"):
        return med([r.get(key) for r in pick(impl, test, variant)])

    out = []
    p = out.append
    p(f"Run of {meta.get('date', '?')}: {meta.get('nproc', '?')} vCPU ({meta.get('cpu', '?')}), "
      f"kernel {meta.get('kernel', '?')}, {meta.get('runs', '?')} runs of {meta.get('secs', '?')} s per test "
      f"(medians; [min-max] for one stream).")
    p(f"Load before: `{meta.get('load', '?')}`; after: `{end.get('load', '?')}`; "
      f"1-min load average seen at the start of each test: {fmt(min((r.get('load1', 0) for r in runs), default=None))}"
      f"-{fmt(max((r.get('load1', 0) for r in runs), default=None))}.")
    p(f"Versions: {meta.get('versions', '?')}.")
    p("")
    p("| Gbit/s (median) | " + " | ".join(impls) + "".join(f" | {o} / best reference" for o in ours_of) + " |")
    p("|---|" + "---|" * (len(impls) + len(ours_of)))
    for test, label in tests:
        cells = []
        for i in impls:
            v = m(i, test, "gbps")
            cell = fmt(v)
            if test == "tcp1" and v is not None:
                vals = [r["gbps"] for r in pick(i, test) if "gbps" in r]
                cell += f" [{min(vals):.2f}-{max(vals):.2f}]"
            if test in ("udp", "udpgso") and v is not None:
                cell += f" (sent {fmt(m(i, test, 'sent_gbps'))}, loss {fmt(m(i, test, 'lost_pct'), 1)}%)"
            cells.append(cell)
        refs = [m(i, test, "gbps") for i in refs_of]
        p(f"| {label} | " + " | ".join(cells) + "".join(f" | {ratio(m(o, test, 'gbps'), refs)}" for o in ours_of) + " |")
    p("")
    p("| CPU-seconds per GB moved, both daemons (median) | " + " | ".join(impls)
      + "".join(f" | best reference / {o}" for o in ours_of) + " |")
    p("|---|" + "---|" * (len(impls) + len(ours_of)))
    for test, label in tests:
        vals = [m(i, test, "cpu_s_per_gb") for i in impls]
        refs = [m(i, test, "cpu_s_per_gb") for i in refs_of]
        p(f"| {label} | " + " | ".join(fmt(v) for v in vals)
          + "".join(f" | {ratio(m(o, test, 'cpu_s_per_gb'), refs, False)}" for o in ours_of) + " |")
    p("")
    p("Bytes are those the receiver (iperf3, or udp-gso-blast for the GSO row) got; in the UDP rows "
      "the daemons also carried what the receiver then dropped, so those rows overstate the cost per GB.")
    if DAEMON in impls:
        p("")
        p(f"{DAEMON}: the two `plexd run` processes are counted; the control plane (`plexsphere dev`, "
          "in namespace a) is not. Its own CPU-seconds over each test (median): "
          + "; ".join(f"{label} {fmt(m(DAEMON, test, 'cp_cpu_s') or 0.0)}" for test, label in tests) + ".")
    p("")
    p("| Receiver UDP drops per run (median): nstat UdpRcvbufErrors / UdpInErrors; daemon sockets on :51820 | "
      + " | ".join(impls) + " |")
    p("|---|" + "---|" * len(impls))
    for test, label in tests:
        cells = []
        for i in impls:
            a, b, c = (m(i, test, k) for k in ("rcvbuf_errors", "in_errors", "sock_drops"))
            cells.append("n/a" if a is None else f"{a:.0f} / {b:.0f}; {c:.0f}")
        p(f"| {label} | " + " | ".join(cells) + " |")
    p("")
    p("nstat counts every UDP socket in the receiving namespace, the iperf3 receiver's own included "
      "(in the UDP flood that is most of it); the last figure is the daemons' sockets alone (`ss -m`, d).")
    if any(t == "load" for t, _ in tests):
        p("")
        p("| ping through the tunnel, ms (median of runs) | " + " | ".join(impls)
          + "".join(f" | best reference / {o}" for o in ours_of) + " |")
        p("|---|" + "---|" * (len(impls) + len(ours_of)))
        for key, label in (("idle_avg_ms", "idle, avg"), ("ping_avg_ms", "under a TCP stream, avg"),
                           ("ping_max_ms", "under a TCP stream, max"),
                           ("ping_loss_pct", "under a TCP stream, loss %")):
            vals = [m(i, "load", key) for i in impls]
            refs = [m(i, "load", key) for i in refs_of]
            r = "".join(f" | {ratio(m(o, 'load', key), refs, False) if key != 'ping_loss_pct' else ''}"
                        for o in ours_of)
            p(f"| {label} | " + " | ".join(fmt(v, 3) for v in vals) + f"{r} |")
    variants = []
    for r in runs:
        if r["impl"] == OURS and r.get("variant", "all-on") not in variants:
            variants.append(r.get("variant", "all-on"))
    if len(variants) > 1 and any(pick(OURS, "tcp1", v) for v in variants[1:]):
        base = m(OURS, "tcp1", "gbps")
        p("")
        p("| plexd-wg, TCP 1 stream, one switch from the default | Gbit/s (median) | vs all on | CPU-s/GB | best reference / this "
          "| ping under a TCP stream, avg / max ms (the stream's Gbit/s) |")
        p("|---|---|---|---|---|---|")
        refs = [m(i, "tcp1", "gbps") for i in refs_of]
        refs = [x for x in refs if x]
        for v in variants:
            if not pick(OURS, "tcp1", v):
                continue
            g = m(OURS, "tcp1", "gbps", v)
            vs = f"{g / base:.2f}x" if g and base else "n/a"
            vr = f"{g / max(refs):.2f}x" if g and refs else "n/a"
            ping = ""
            if pick(OURS, "load", v):
                ping = (f"{fmt(m(OURS, 'load', 'ping_avg_ms', v), 3)} / {fmt(m(OURS, 'load', 'ping_max_ms', v), 3)}"
                        f" ({fmt(m(OURS, 'load', 'gbps', v))})")
            p(f"| {v} | {fmt(g)} | {vs} | {fmt(m(OURS, 'tcp1', 'cpu_s_per_gb', v))} | {vr} | {ping} |")
    run_variants = []
    for r in runs:
        if r["impl"] == DAEMON and r.get("variant", "all-on") not in run_variants:
            run_variants.append(r.get("variant", "all-on"))
    if len(run_variants) > 1:
        p("")
        p(f"| {DAEMON}, the unit's priority and another | TCP 1 stream, Gbit/s (median) | CPU-s/GB "
          "| ping under a TCP stream, avg / max ms (the stream's Gbit/s) |")
        p("|---|---|---|---|")
        for v in run_variants:
            ping = ""
            if pick(DAEMON, "load", v):
                ping = (f"{fmt(m(DAEMON, 'load', 'ping_avg_ms', v), 3)} / {fmt(m(DAEMON, 'load', 'ping_max_ms', v), 3)}"
                        f" ({fmt(m(DAEMON, 'load', 'gbps', v))})")
            name = "the unit's Nice= (all-on)" if v == "all-on" else v
            p(f"| {name} | {fmt(m(DAEMON, 'tcp1', 'gbps', v))} | {fmt(m(DAEMON, 'tcp1', 'cpu_s_per_gb', v))} | {ping} |")
    gso = [v for v in variants if pick(OURS, "udpgso", v)]
    if len(gso) > 1:
        base = m(OURS, "udpgso", "gbps")
        p("")
        p("| plexd-wg, UDP with GSO (QUIC-like) | Gbit/s received (median) | vs all on | sent Gbit/s | loss % "
          "| CPU-s/GB |")
        p("|---|---|---|---|---|---|")
        for v in gso:
            g = m(OURS, "udpgso", "gbps", v)
            vs = f"{g / base:.2f}x" if g and base else "n/a"
            p(f"| {v} | {fmt(g)} | {vs} | {fmt(m(OURS, 'udpgso', 'sent_gbps', v))} | "
              f"{fmt(m(OURS, 'udpgso', 'lost_pct', v), 1)} | {fmt(m(OURS, 'udpgso', 'cpu_s_per_gb', v))} |")
    mem = [r for r in recs if r.get("kind") == "memory"]
    if mem:
        p("")
        p("| Memory, VmRSS (MiB) | interface up, no peers | with " + str(mem[0].get("peers", "?"))
          + " peers | peak (VmHWM) | time to add the peers (s) |")
        p("|---|---|---|---|---|")
        for r in mem:
            mib = lambda k: fmt(r[k] / 1024, 1) if isinstance(r.get(k), (int, float)) else "n/a"  # noqa: E731
            p(f"| {r['impl']} | {mib('idle_kb')} | {mib('peers_kb')} | {mib('hwm_kb')} | {fmt(r.get('add_s'), 1)} |")
    for r in (r for r in recs if r.get("kind") == "daemon"):
        p(f"| plexd run, wireguard.backend {r['backend']} ({r.get('how', '')}) | "
          f"{fmt(r['rss_kb'] / 1024, 1) if isinstance(r.get('rss_kb'), int) else 'n/a'} | | | |")
    paths = [r for r in recs if r.get("kind") == "path"]
    if paths:
        p("")
        p(f"{DAEMON}'s path, node a to b (`plexd status`), per run: "
          + "; ".join(f"run {r.get('run')}: {str(r.get('path', '?')).strip()}" for r in paths) + ".")
    fails = [r for r in runs if "error" in r]
    if fails:
        p("")
        p(f"{len(fails)} measurement(s) gave no result: "
          + "; ".join(f"{r['impl']} {r.get('variant', '')} {r['test']} run {r.get('run')}" for r in fails) + ".")
    print("\n".join(out))


CRITERION_PAIRS = [
    (f"{op}/plexd/{n}", f"{op}/{base}/{n}")
    for op, base in (("encapsulate", "ring-seal"), ("decapsulate", "ring-open"))
    for n in (64, 512, 1420)
] + [
    ("batch-64x1420/plexd-in-memory-pipeline", "batch-64x1420/ring-seal+open-only"),
    ("allowed-ips/lookup-10k-prefixes/1024-probes", None),
    ("device/apply-one-peer-change-at-10k-peers", None),
    ("handshake/initiation+response+confirm", None),
]


PIPELINE = "batch-64x1420/plexd-in-memory-pipeline"
DEVICES = "batch-64x1420/in-memory-devices-only"


def criterion(root):
    found = {}
    for dirpath, _, files in os.walk(root):
        if os.path.basename(dirpath) == "new" and "estimates.json" in files and "benchmark.json" in files:
            with open(os.path.join(dirpath, "benchmark.json"), encoding="utf-8") as f:
                bench = json.load(f)
            with open(os.path.join(dirpath, "estimates.json"), encoding="utf-8") as f:
                est = json.load(f)
            found[bench["full_id"]] = (est["median"]["point_estimate"], bench.get("throughput") or {})

    def show(ns, tp):
        t = f"{ns / 1000:.2f} µs" if ns >= 1000 else f"{ns:.0f} ns"
        if "Bytes" in tp:
            t += f" ({tp['Bytes'] / ns * 1e9 / 2**20:.0f} MiB/s)"
        if "Elements" in tp:
            t += f" ({ns / tp['Elements']:.1f} ns each)"
        return t

    print("| criterion bench (median) | ours | crypto-only floor | ours / floor |")
    print("|---|---|---|---|")
    for ours, floor in CRITERION_PAIRS:
        if ours not in found:
            print(f"| {ours} | not run | | |")
            continue
        ns, tp = found[ours]
        if floor and floor in found:
            fns, ftp = found[floor]
            print(f"| {ours} | {show(ns, tp)} | {floor.split('/', 1)[1]}: {show(fns, ftp)} | {ns / fns:.2f} |")
        else:
            print(f"| {ours} | {show(ns, tp)} | | |")
        if ours == PIPELINE and DEVICES in found and floor in found:
            # The pipeline less what its in-memory devices cost alone: the data plane's share.
            own = ns - found[DEVICES][0]
            print(f"| {ours} less {DEVICES.split('/', 1)[1]} ({show(found[DEVICES][0], {})}) "
                  f"| {show(own, tp)} | {floor.split('/', 1)[1]}: {show(found[floor][0], found[floor][1])} "
                  f"| {own / found[floor][0]:.2f} |")


def main(argv):
    if len(argv) >= 3 and argv[1] == "record":
        record(argv[2], argv[3:])
    elif len(argv) == 4 and argv[1] == "peers":
        peers(int(argv[2]), argv[3])
    elif len(argv) == 3 and argv[1] == "report":
        report(argv[2])
    elif len(argv) == 3 and argv[1] == "criterion":
        criterion(argv[2])
    else:
        print(__doc__, file=sys.stderr)
        return 64
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
