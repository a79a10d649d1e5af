#!/usr/bin/env python3
"""What one profiled step spent its GPU time on (tessera-train --profile-step writes the trace).

Usage: scripts/profile-summary.py <out>/profile/rank0.json[.gz] [--top N] [--compare OTHER]
Prints the step's span, the GPU's busy share (kernels' union over the span), the kernel count,
and the kernels grouped by kind and by name with their share of the busy time. With --compare,
two profiled steps side by side instead: their spans and counts, then the host operators and the
kernels whose time differs most between them, by name (a host operator's self time: its span
less the spans of the operators it called)."""
import argparse
import collections
import gzip
import json
import re
import sys

KINDS = [  # first match wins
    ("attention", r"fmha|flash|attention|efficient_attention|cutlassF|cutlassB"),
    ("matmul", r"gemm|sm90_xmma|cutlass|cublas|nvjet|matmul|s16816|wgmma"),
    ("reduction", r"reduce|softmax|norm|sum|max"),
    ("copy/cast", r"copy|cast|convert|memcpy|memset|cat|index|gather|scatter|take"),
    ("elementwise", r"elementwise|vectorized|unrolled|pointwise"),
]


def kind_of(name):
    low = name.lower()
    for kind, pattern in KINDS:
        if re.search(pattern, low):
            return kind
    return "other"


def load_spans(path):
    """The trace's timed events, or None after saying why on stderr."""
    try:
        with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
            events = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError) as e:
        print(f"profile-summary: {path}: {e}", file=sys.stderr)
        return None
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    if not spans:
        print(f"profile-summary: {path}: no timed events", file=sys.stderr)
        return None
    return spans


def host_self_time(spans):
    """Per host operator name: (count, self time in µs). Operators nest within one thread; an
    operator's self time is its span less its direct children's."""
    by_thread = collections.defaultdict(list)
    for e in spans:
        if e.get("cat") == "cpu_op":
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    count, self_us = collections.Counter(), collections.Counter()

    def close(op):  # op: [end, name, span, the spans of its children]
        count[op[1]] += 1
        self_us[op[1]] += max(0.0, op[2] - op[3])

    for ops in by_thread.values():
        ops.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in ops:
            while stack and e["ts"] >= stack[-1][0]:
                close(stack.pop())
            if stack:
                stack[-1][3] += e["dur"]
            stack.append([e["ts"] + e["dur"], e["name"], e["dur"], 0.0])
        while stack:
            close(stack.pop())
    return count, self_us


def compare(a, b, top):
    """Two profiled steps side by side: what differs most, host operators and kernels."""
    sides = []
    for path in (a, b):
        spans = load_spans(path)
        if spans is None:
            return 2
        kernels = collections.Counter(), collections.Counter()
        for e in spans:
            if e.get("cat") == "kernel":
                kernels[0][e["name"]] += 1
                kernels[1][e["name"]] += e["dur"]
        begin = min(e["ts"] for e in spans)
        end = max(e["ts"] + e["dur"] for e in spans)
        sides.append((end - begin, host_self_time(spans), kernels))
    (span_a, (hc_a, hs_a), (kc_a, kt_a)), (span_b, (hc_b, hs_b), (kc_b, kt_b)) = sides
    print(f"span {1e-3 * span_a:.1f} ms against {1e-3 * span_b:.1f} ms; host operators "
          f"{sum(hc_a.values())} against {sum(hc_b.values())}, their self time "
          f"{1e-3 * sum(hs_a.values()):.1f} against {1e-3 * sum(hs_b.values()):.1f} ms; kernels "
          f"{sum(kc_a.values())} against {sum(kc_b.values())}")
    for title, (ca, ta), (cb, tb) in (("host operators (self time)", (hc_a, hs_a), (hc_b, hs_b)),
                                      ("kernels", (kc_a, kt_a), (kc_b, kt_b))):
        names = sorted(set(ca) | set(cb), key=lambda n: -abs(ta[n] - tb[n]))[:top]
        print(f"{title} differing most, first against second:")
        for n in names:
            print(f"  {1e-3 * ta[n]:9.2f} ms x{ca[n]:<6d} {1e-3 * tb[n]:9.2f} ms x{cb[n]:<6d} "
                  f"{n[:90]}")
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--compare", metavar="OTHER", help="a second profiled step to set beside it")
    a = ap.parse_args()
    if a.compare:
        return compare(a.trace, a.compare, a.top)
    spans = load_spans(a.trace)
    if spans is None:
        return 2
    kernels = [e for e in spans if e.get("cat") == "kernel"]
    begin = min(e["ts"] for e in spans)
    end = max(e["ts"] + e["dur"] for e in spans)
    busy, last = 0.0, begin
    for e in sorted(kernels, key=lambda e: e["ts"]):
        s, t = max(e["ts"], last), e["ts"] + e["dur"]
        if t > s:
            busy += t - s
            last = t
    total = sum(e["dur"] for e in kernels) or 1.0
    ops = sum(1 for e in spans if e.get("cat") == "cpu_op")
    print(f"span {1e-3 * (end - begin):.1f} ms, GPU busy {1e-3 * busy:.1f} ms "
          f"({100 * busy / (end - begin):.0f}%), {len(kernels)} kernels, {ops} host operators")
    by_kind = collections.Counter()
    by_name = collections.Counter()
    count = collections.Counter()
    for e in kernels:
        by_kind[kind_of(e["name"])] += e["dur"]
        by_name[e["name"]] += e["dur"]
        count[e["name"]] += 1
    print("kernel time by kind:")
    for kind, d in by_kind.most_common():
        print(f"  {kind:12s} {1e-3 * d:9.1f} ms  {100 * d / total:5.1f}%")
    print(f"top {a.top} kernels:")
    for name, d in by_name.most_common(a.top):
        print(f"  {1e-3 * d:8.1f} ms {100 * d / total:5.1f}% x{count[name]:<5d} {name[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
