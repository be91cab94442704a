#!/usr/bin/env python3
"""In-step kernel timeline from kernel_trace.cc's CSV (issue 29).

Kernels inside each profiler range (ttft_bench --profile: one LAZY request; with --quality_k a
second range) are split into steps after each run of argmax kernels and grouped as
bench/ncu_breakdown.py groups them (GEMMs by their place in the layer). Unlike ncu, the kernels
ran as served (CUDA graphs, programmatic dependent launches, clocks and caches untouched), so
durations overlap: each kernel is charged the time by which it moved the step's end forward
("critical", the sum of which plus the idle gaps is the step's wall time), and the idle gaps
(no kernel of the step running) before it are charged to "gaps".

  python3 bench/dev/kernel_trace/trace_timeline.py trace.csv [--json out.json]
      [--layer L]   (also each step's kernels of layer L, from its QKV GEMM to the next one:
                     start, end and how far each moved the step's end, in us)
"""
import argparse
import csv
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import ncu_breakdown  # noqa: E402  (bench/, for its kernel kinds and step split)


def read(path):
    kernels, marks = [], []
    with open(path) as f:
        for r in csv.DictReader(f):
            start, end = int(r["start_ns"]), int(r["end_ns"])
            if r["name"].startswith("#"):
                marks.append((r["name"], start))
            else:
                kernels.append({"name": r["name"], "start": start, "end": end})
    kernels.sort(key=lambda k: k["start"])
    return kernels, marks


def ranges(kernels, marks):
    starts = [t for n, t in marks if n == "#start"]
    stops = [t for n, t in marks if n == "#stop"]
    if not starts:
        return [kernels]
    return [[k for k in kernels if a <= k["start"] and k["end"] <= b] for a, b in zip(starts, stops)]


def analyse(step):
    frontier = step[0]["start"]
    groups = {}
    gaps = 0.0
    for k, g in zip(step, ncu_breakdown.step_labels(step)):
        gap = max(0, k["start"] - frontier)
        critical = max(0, k["end"] - max(frontier, k["start"]))
        frontier = max(frontier, k["end"])
        e = groups.setdefault(g, {"count": 0, "duration_us": 0.0, "critical_us": 0.0,
                                  "gaps_before_us": 0.0})
        e["count"] += 1
        e["duration_us"] += (k["end"] - k["start"]) / 1e3
        e["critical_us"] += critical / 1e3
        e["gaps_before_us"] += gap / 1e3
        gaps += gap / 1e3
    wall = (frontier - step[0]["start"]) / 1e3
    return {"kernels": len(step), "wall_us": wall, "gaps_us": gaps, "groups": groups}


def print_layer(step, layer):
    labels = ncu_breakdown.step_labels(step)
    qkv = [i for i, g in enumerate(labels) if g == "GEMM QKV"]
    if layer >= len(qkv):
        return
    first = max(0, qkv[layer] - 1)  # with the kernel before it (a norm, or a folded GEMV)
    last = qkv[layer + 1] if layer + 1 < len(qkv) else len(step)
    t0 = step[0]["start"]
    frontier = step[first - 1]["end"] if first > 0 else t0
    print(f"layer {layer}: {'kernel':24s} {'start':>9s} {'end':>9s} {'moved end by':>12s}")
    for i in range(first, last):
        k = step[i]
        moved = max(0, k["end"] - max(frontier, k["start"]))
        frontier = max(frontier, k["end"])
        print(f"         {labels[i][:24]:24s} {(k['start'] - t0) / 1e3:9.2f} "
              f"{(k['end'] - t0) / 1e3:9.2f} {moved / 1e3:12.2f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--json")
    ap.add_argument("--layer", type=int)
    a = ap.parse_args()
    kernels, marks = read(a.csv)
    out = []
    for r, window in enumerate(ranges(kernels, marks)):
        steps = ncu_breakdown.split_steps(window) if window else []
        for s, step in enumerate(steps):
            res = analyse(step)
            res.update({"range": r, "step": s})
            out.append(res)
            print(f"\nrange {r} step {s}: {res['kernels']} kernels, wall {res['wall_us']:.1f} us, "
                  f"idle gaps {res['gaps_us']:.1f} us")
            print(f"{'kernel':28s} {'count':>6s} {'duration us':>12s} {'critical us':>12s} "
                  f"{'% of wall':>9s} {'gaps before':>12s}")
            for name, g in sorted(res["groups"].items(), key=lambda x: -x[1]["critical_us"]):
                print(f"{name:28s} {g['count']:6d} {g['duration_us']:12.1f} "
                      f"{g['critical_us']:12.1f} {100 * g['critical_us'] / res['wall_us']:8.1f}% "
                      f"{g['gaps_before_us']:12.1f}")
            if a.layer is not None:
                print_layer(step, a.layer)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"steps": out}, f, indent=1)
    return 0 if out else 1


if __name__ == "__main__":
    sys.exit(main())
