#!/usr/bin/env python3
"""Per-kernel breakdown of forward steps from an Nsight Compute CSV (issue 29).

Input: `ncu --csv --log-file F --metrics gpu__time_duration.sum,dram__bytes_read.sum,
dram__bytes_write.sum` over `ttft_bench --profile` (one LAZY request, prefill + one decode step,
then one with --quality_k). Kernels are serialised and timed alone by ncu (no overlap, no PDL),
so the sum is an upper bound of the step's GPU time.

Steps are split after each run of argmax kernels (a step's last: its partial maxima and merge). Kernels are grouped by kind;
the GEMMs of a step by their place in the layer (QKV, O, gate_up, down) and the LM head (the
step's last GEMM). Bytes are DRAM bytes read + written; "floor" is those bytes at the read
ceiling (--ceiling_tbs, 4.52 TB/s measured on the H200, bench/README.md).

  python3 bench/ncu_breakdown.py ncu.csv [--ceiling_tbs 4.52] [--json out.json]
"""
import argparse
import csv
import json
import sys

TIME_UNITS = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
              "second": 1e6, "s": 1e6}
BYTE_UNITS = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12,
              "KB": 1e3, "MB": 1e6, "GB": 1e9}
GEMM_NAMES = ["QKV", "O", "gate_up", "down"]


def kind_of(name):
    n = name.lower()
    if "splitkreduce" in n or "splitk_reduce" in n or "reduce_kernel" in n:
        return "split-K reduce"
    if any(k in n for k in ("gemm", "gemv", "xmma", "cutlass", "nvjet", "cublas")):
        return "GEMM"
    for key, label in (("lazydecode", "attention (decode)"), ("lazyprefill", "attention (prefill)"),
                       ("mergesplits", "attention split merge"),
                       ("fallbackattention", "attention (fallback)"), ("rmsnorm", "RMSNorm"),
                       ("qkvscatter", "QKV RoPE + scatter"), ("swiglu", "SwiGLU"),
                       ("argmax", "argmax"), ("ropetable", "RoPE table"),
                       ("materialize", "materialize")):
        if key in n:
            return label
    return "other: " + name.split("(")[0][:40]


def read_kernels(path):
    rows = {}
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        kid = int(r["ID"])
        k = rows.setdefault(kid, {"name": r["Kernel Name"], "us": 0.0, "bytes": 0.0})
        unit, value = r["Metric Unit"], float(r["Metric Value"].replace(",", ""))
        if r["Metric Name"] == "gpu__time_duration.sum":
            k["us"] = value * TIME_UNITS[unit]
        elif r["Metric Name"].startswith("dram__bytes"):
            k["bytes"] += value * BYTE_UNITS[unit]
    return [rows[i] for i in sorted(rows)]


def split_steps(kernels):
    steps, cur = [], []
    for i, k in enumerate(kernels):
        cur.append(k)
        last = i + 1 == len(kernels)
        if kind_of(k["name"]) == "argmax" and (last or kind_of(kernels[i + 1]["name"]) != "argmax"):
            steps.append(cur)
            cur = []
    if cur:
        steps.append(cur)
    return steps


def step_labels(step):
    """The group of each kernel of a step: its kind, GEMMs by their place in the layer."""
    gemms = [i for i, k in enumerate(step) if kind_of(k["name"]) == "GEMM"]
    label = {}
    for n, i in enumerate(gemms):
        label[i] = "GEMM LM head" if i == gemms[-1] else "GEMM " + GEMM_NAMES[n % 4]
    return [label.get(i, kind_of(k["name"])) for i, k in enumerate(step)]


def breakdown(step):
    groups = {}
    for k, g in zip(step, step_labels(step)):
        e = groups.setdefault(g, {"count": 0, "us": 0.0, "bytes": 0.0})
        e["count"] += 1
        e["us"] += k["us"]
        e["bytes"] += k["bytes"]
    return groups


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--ceiling_tbs", type=float, default=4.52)
    ap.add_argument("--json")
    a = ap.parse_args()
    steps = split_steps(read_kernels(a.csv))
    out = []
    for s, step in enumerate(steps):
        groups = breakdown(step)
        total_us = sum(g["us"] for g in groups.values())
        total_b = sum(g["bytes"] for g in groups.values())
        print(f"\nstep {s}: {len(step)} kernels, {total_us / 1e3:.3f} ms serialised, "
              f"{total_b / 1e9:.2f} GB moved, floor {total_b / a.ceiling_tbs / 1e9:.3f} ms "
              f"at {a.ceiling_tbs} TB/s")
        print(f"{'kernel':28s} {'count':>6s} {'us':>10s} {'%':>6s} {'GB':>8s} {'TB/s':>7s} "
              f"{'of ceiling':>10s}")
        for name, g in sorted(groups.items(), key=lambda x: -x[1]["us"]):
            tbs = g["bytes"] / (g["us"] * 1e6) if g["us"] > 0 else 0.0
            print(f"{name:28s} {g['count']:6d} {g['us']:10.1f} {100 * g['us'] / total_us:6.1f} "
                  f"{g['bytes'] / 1e9:8.3f} {tbs:7.2f} {100 * tbs / a.ceiling_tbs:9.0f}%")
        out.append({"step": s, "kernels": len(step), "us": total_us, "bytes": total_b,
                    "groups": groups})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"ceiling_tbs": a.ceiling_tbs, "steps": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
