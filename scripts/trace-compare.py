#!/usr/bin/env python3
"""Two recorded runs of one plan compared op by op: where one executor's step is longer.

Usage: scripts/trace-compare.py RUN_A RUN_B [--rank R] [--skip K] [--top N]
(scripts/gpu-check.sh ab runs it on a traced run of each arm)
RUN_A and RUN_B are tessera-train output folders (trace/rank<R>.json, recorded with
--trace-steps). Both ran the same Program, so their ops match by index within an iteration. For
each op, over the traced iterations after the first K (default 2): its median duration and the
median gap before it on its lane (the time since the lane's previous op ended: on a GPU the
device waiting for the host between two ops, the CUDA events at op boundaries being the clock).
Prints the median step of each run, each lane's summed durations and gaps per step, and the N ops
(default 12) whose duration and whose gap differ most between the runs."""
import argparse
import json
import os
import statistics
import sys


def load(run, rank):
    path = os.path.join(run, "trace", f"rank{rank}.json")
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    lanes = {e["tid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    steps = [e["dur"] for e in events if e.get("ph") == "X" and e.get("cat") == "step"]
    ops = [e for e in events if e.get("ph") == "X" and "op_id" in e.get("args", {})]
    return path, lanes, steps, ops


def per_op(ops, skip):
    """{(index, name, lane): ([durations], [gaps])} over the iterations from `skip` on."""
    out = {}
    last_end = {}  # (iteration, lane) -> end of the lane's previous op
    for e in sorted(ops, key=lambda e: e["ts"]):
        it, _, index = e["args"]["op_id"].split(".")
        iteration, index = int(it[2:]), int(index)
        key = (iteration, e["tid"])
        gap = e["ts"] - last_end[key] if key in last_end else 0.0
        last_end[key] = max(last_end.get(key, 0.0), e["ts"] + e["dur"])
        if iteration < skip:
            continue
        durations, gaps = out.setdefault((index, e["name"], e["tid"]), ([], []))
        durations.append(e["dur"])
        gaps.append(max(0.0, gap))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run_a")
    ap.add_argument("run_b")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--skip", type=int, default=2)
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args()
    try:
        path_a, lanes, steps_a, ops_a = load(a.run_a, a.rank)
        path_b, _, steps_b, ops_b = load(a.run_b, a.rank)
    except (OSError, KeyError, ValueError) as e:
        print(f"trace-compare: {e}", file=sys.stderr)
        return 2
    op_a, op_b = per_op(ops_a, a.skip), per_op(ops_b, a.skip)
    if not op_a or not op_b:
        print(f"trace-compare: no traced iteration from {a.skip} on in {path_a} or {path_b}",
              file=sys.stderr)
        return 2
    if set(op_a) != set(op_b):
        print(f"trace-compare: the runs' ops differ ({len(set(op_a) ^ set(op_b))} not in both): "
              "not the same plan", file=sys.stderr)
        return 2
    iterations = max(1, len(next(iter(op_a.values()))[0]))
    med = statistics.median
    print(f"step (median of the traced steps after {a.skip}): "
          f"A {med(steps_a[a.skip:] or steps_a) / 1e3:.1f} ms, "
          f"B {med(steps_b[a.skip:] or steps_b) / 1e3:.1f} ms")
    print(f"{'lane':12s} {'A busy ms':>10s} {'B busy ms':>10s} {'A gaps ms':>10s} {'B gaps ms':>10s}"
          "   (per step: summed op medians, summed gap medians)")
    for tid, lane in sorted(lanes.items()):
        keys = [k for k in op_a if k[2] == tid]
        if not keys:
            continue
        total = lambda ops, i: sum(med(ops[k][i]) for k in keys) / 1e3
        print(f"{lane:12s} {total(op_a, 0):10.2f} {total(op_b, 0):10.2f} {total(op_a, 1):10.2f} "
              f"{total(op_b, 1):10.2f}")
    for what, i in (("duration", 0), ("gap before", 1)):
        rows = sorted(op_a, key=lambda k: -abs(med(op_a[k][i]) - med(op_b[k][i])))[:a.top]
        print(f"\nops whose {what} differs most (medians over {iterations} steps, ms; B - A):")
        for k in rows:
            x, y = med(op_a[k][i]) / 1e3, med(op_b[k][i]) / 1e3
            print(f"  #{k[0]:<5d} {lanes.get(k[2], k[2]):10s} {k[1][:48]:48s} "
                  f"A {x:9.3f}  B {y:9.3f}  {y - x:+9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
