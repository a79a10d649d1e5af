#!/usr/bin/env python3
"""What one profiled step spent its GPU time on (tessera-train --profile-step writes the trace).

Usage: scripts/profile-summary.py <out>/profile/rank0.json [--top N]
Prints the step's span, the GPU's busy share (kernels' union over the span), the kernel count,
and the kernels grouped by kind and by name with their share of the busy time."""
import argparse
import collections
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    try:
        events = json.load(open(a.trace))["traceEvents"]
    except (OSError, ValueError, KeyError) as e:
        print(f"profile-summary: {a.trace}: {e}", file=sys.stderr)
        return 2
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    kernels = [e for e in spans if e.get("cat") == "kernel"]
    if not spans:
        print(f"profile-summary: {a.trace}: no timed events", file=sys.stderr)
        return 2
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
