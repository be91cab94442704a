#!/usr/bin/env python3
"""Where a forward step's GPU time goes, from an Nsight Systems trace (issue 29).

ncu_breakdown.py times each kernel alone (serialised, no PDL overlap), so it cannot see the
gaps between kernels that a real step has. This reads the kernels as they ran: `nsys profile
--capture-range=cudaProfilerApi --cuda-graph-trace=node` over `ttft_bench --profile` (one LAZY
request: prefill + one decode step, CUDA graphs and PDL as served), then

  nsys stats --report cuda_gpu_trace --format csv --output PREFIX REPORT.nsys-rep
  python3 bench/nsys_timeline.py PREFIX_cuda_gpu_trace.csv [--json out.json]

Steps are split after each ArgmaxRowsKernel (kernel kinds as in ncu_breakdown.py). Per step:
the span (first start to last end), the busy time (union of kernel intervals) and the idle
time (span - busy); per kind: count, summed duration, and the idle time just before that kind's
kernels (the gap a launch or a dependency wait leaves in front of it; overlap counts as 0).
"""
import argparse
import csv
import json
import sys

from ncu_breakdown import GEMM_NAMES, kind_of


def column(header, *keys):
    for i, h in enumerate(header):
        if all(k.lower() in h.lower() for k in keys):
            return i
    raise KeyError(f"no column with {keys} in {header}")


def read_kernels(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    start = next(i for i, r in enumerate(rows) if r and any("Start" in c for c in r))
    header = rows[start]
    c_start, c_dur, c_name = column(header, "Start"), column(header, "Duration"), column(header, "Name")
    c_grid = column(header, "GrdX")
    out = []
    for r in rows[start + 1:]:
        if len(r) <= max(c_start, c_dur, c_name, c_grid) or not r[c_grid].strip():
            continue  # memcpy / memset rows have no grid
        out.append({"name": r[c_name], "start": float(r[c_start]) / 1e3,
                    "dur": float(r[c_dur]) / 1e3})
    out.sort(key=lambda k: k["start"])
    return out


def split_steps(kernels):
    steps, cur = [], []
    for k in kernels:
        cur.append(k)
        if kind_of(k["name"]) == "argmax":
            steps.append(cur)
            cur = []
    if cur:
        steps.append(cur)
    return steps


def labels(step):
    gemms = [i for i, k in enumerate(step) if kind_of(k["name"]) == "GEMM"]
    label = {}
    for n, i in enumerate(gemms):
        label[i] = "GEMM LM head" if i == gemms[-1] else "GEMM " + GEMM_NAMES[n % 4]
    return [label.get(i, kind_of(k["name"])) for i, k in enumerate(step)]


def analyse(step):
    names = labels(step)
    groups = {}
    busy_end = step[0]["start"]
    busy = 0.0
    for i, k in enumerate(step):
        end = k["start"] + k["dur"]
        idle = max(0.0, k["start"] - busy_end) if i > 0 else 0.0
        busy += max(0.0, end - max(k["start"], busy_end))
        busy_end = max(busy_end, end)
        g = groups.setdefault(names[i], {"count": 0, "us": 0.0, "idle_before_us": 0.0})
        g["count"] += 1
        g["us"] += k["dur"]
        g["idle_before_us"] += idle
    span = busy_end - step[0]["start"]
    return {"kernels": len(step), "span_us": span, "busy_us": busy, "idle_us": span - busy,
            "groups": groups}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--json")
    a = ap.parse_args()
    steps = [analyse(s) for s in split_steps(read_kernels(a.csv))]
    for n, s in enumerate(steps):
        print(f"\nstep {n}: {s['kernels']} kernels, span {s['span_us'] / 1e3:.3f} ms, busy "
              f"{s['busy_us'] / 1e3:.3f} ms, idle {s['idle_us'] / 1e3:.3f} ms")
        print(f"{'kernel':28s} {'count':>6s} {'us':>10s} {'us each':>8s} {'idle before':>12s}")
        for name, g in sorted(s["groups"].items(), key=lambda x: -x[1]["us"]):
            print(f"{name:28s} {g['count']:6d} {g['us']:10.1f} {g['us'] / g['count']:8.2f} "
                  f"{g['idle_before_us']:12.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"steps": steps}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
