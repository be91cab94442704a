#!/usr/bin/env python3
"""Side-by-side tables of builds measured in rounds within one device call.

Reads DIR/ttft-<build>-<round>.json (ttft_bench --out) and DIR/kernel-<build>[-<round>].json
(kernel_bench --out), as bench/gpu_gemv_run.sh and the results/ run scripts name them, and
prints markdown tables: one row per build and round, then the build's mean, and with --base
the mean's change against that build's. Kernel rows are the default `lazy` variant of each
kernel_bench case (--variants: every variant, as "case variant"). --traces adds, from
DIR/trace-<build>.json (bench/dev/kernel_trace/trace_timeline.py --json), each traced step's
critical-path microseconds per kernel group side by side. --json writes the same numbers.

Usage: bench/ab_table.py DIR [--base BUILD] [--variants] [--traces] [--json PATH]
"""
import argparse
import glob
import json
import os
import re
import statistics
import sys

# (column, path into the ttft_bench JSON); a missing field prints as "-".
TTFT_COLUMNS = [
    ("LAZY", ("ttft_ms", "lazy", "median")),
    ("LAZY requests only", ("ttft_ms", "lazy_requests_only", "median")),
    ("LAZY step (GPU)", ("lazy_step_gpu_ms", "median")),
    ("MATERIALIZE", ("ttft_ms", "materialize", "median")),
    ("FULL", ("ttft_ms", "full", "median")),
    ("decode b1", ("decode_step_ms", "median")),
    ("b16 (GPU)", ("decode_step_gpu_ms_batch16", "median")),
    ("b64 (GPU)", ("decode_step_gpu_ms_batch64", "median")),
    ("read TB/s", ("read_ceiling_tbs",)),
]

NAME = re.compile(r"^(ttft|kernel)-(.+?)(?:-(\d+))?\.json$")
TRACE = re.compile(r"^trace-(.+)\.json$")


def field(doc, path):
    for key in path:
        if not isinstance(doc, dict) or key not in doc:
            return None
        doc = doc[key]
    return doc if isinstance(doc, (int, float)) else None


def load(directory, variants=False):
    """{kind: {build: {round: {column: value}}}} for the files DIR holds (no round: 1)."""
    runs = {"ttft": {}, "kernel": {}}
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        m = NAME.match(os.path.basename(path))
        if not m:
            continue
        kind, build, rnd = m.group(1), m.group(2), int(m.group(3) or 1)
        with open(path) as f:
            doc = json.load(f)
        if kind == "ttft":
            values = {col: field(doc, p) for col, p in TTFT_COLUMNS}
        else:
            values = {(f"{r['name']} {r.get('variant')}" if variants else r["name"]): r["ms"] * 1e3
                      for r in doc.get("results", [])
                      if (variants or r.get("variant") == "lazy") and "ms" in r}
        runs[kind].setdefault(build, {})[rnd] = values
    return runs


def means(per_round, columns):
    out = {}
    for col in columns:
        vals = [v[col] for v in per_round.values() if v.get(col) is not None]
        out[col] = statistics.mean(vals) if vals else None
    return out


def fmt(v, digits):
    return "-" if v is None else f"{v:.{digits}f}"


def table(title, builds, columns, digits, base):
    lines = [f"\n{title}\n", "| build | round | " + " | ".join(columns) + " |",
             "|---|---|" + "---|" * len(columns)]
    summary = {}
    for build in builds:
        per_round = builds[build]
        for rnd in sorted(per_round):
            lines.append(f"| {build} | {rnd} | " +
                         " | ".join(fmt(per_round[rnd].get(c), digits) for c in columns) + " |")
        summary[build] = means(per_round, columns)
        lines.append(f"| **{build}** | mean | " +
                     " | ".join(fmt(summary[build][c], digits) for c in columns) + " |")
    if base is not None and base in summary:
        ref = summary[base]
        for build in builds:
            if build == base:
                continue
            cells = []
            for c in columns:
                a, b = summary[build][c], ref[c]
                cells.append("-" if a is None or not b else f"{100 * (a / b - 1):+.1f}%")
            lines.append(f"| {build} vs {base} | | " + " | ".join(cells) + " |")
    return "\n".join(lines), summary


def load_traces(directory):
    """{build: [step: {group: critical us, "wall": us}]} from DIR/trace-<build>.json."""
    traces = {}
    for path in sorted(glob.glob(os.path.join(directory, "trace-*.json"))):
        m = TRACE.match(os.path.basename(path))
        if not m:
            continue
        with open(path) as f:
            steps = json.load(f).get("steps", [])
        traces[m.group(1)] = [
            dict({g: v.get("critical_us") for g, v in s.get("groups", {}).items()},
                 wall=s.get("wall_us"), label=f"range {s.get('range')} step {s.get('step')}, "
                 f"{s.get('kernels')} kernels") for s in steps]
    return traces


def trace_tables(traces, base):
    """One table per traced step: kernel groups as rows, builds as columns (+ % vs base)."""
    lines, out = [], {}
    builds = list(traces)
    for i in range(max(len(t) for t in traces.values())):
        groups = []
        for b in builds:
            if i < len(traces[b]):
                groups += [g for g in traces[b][i] if g not in groups + ["wall", "label"]]
        groups.append("wall")
        cols = builds + ([f"vs {base}"] if base in traces else [])
        label = next(traces[b][i]["label"] for b in builds if i < len(traces[b]))
        lines += [f"\nkernel trace, {label}: critical us\n",
                  "| group | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
        for g in groups:
            vals = [traces[b][i].get(g) if i < len(traces[b]) else None for b in builds]
            cells = [fmt(v, 1) for v in vals]
            if base in traces:
                ref = traces[base][i].get(g) if i < len(traces[base]) else None
                cells.append(", ".join(
                    f"{b} {100 * (v / ref - 1):+.1f}%" for b, v in zip(builds, vals)
                    if b != base and v is not None and ref))
            lines.append(f"| {g} | " + " | ".join(cells) + " |")
        out[str(i)] = {b: traces[b][i] for b in builds if i < len(traces[b])}
    return "\n".join(lines), out


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--base", help="build the others are compared with")
    ap.add_argument("--variants", action="store_true", help="every kernel_bench variant")
    ap.add_argument("--traces", action="store_true", help="the kernel traces' groups too")
    ap.add_argument("--json", help="write the means here")
    args = ap.parse_args(argv)
    runs = load(args.dir, args.variants)
    if not runs["ttft"] and not runs["kernel"]:
        print(f"ab_table: no ttft-<build>-<round>.json or kernel-<build>-<round>.json in "
              f"{args.dir}", file=sys.stderr)
        return 2
    if args.base and args.base not in runs["ttft"] and args.base not in runs["kernel"]:
        print(f"ab_table: no build named {args.base!r} in {args.dir}", file=sys.stderr)
        return 2
    out = {}
    if runs["ttft"]:
        text, out["ttft_ms"] = table("ttft_bench, ms (read ceiling TB/s)", runs["ttft"],
                                     [c for c, _ in TTFT_COLUMNS], 3, args.base)
        print(text)
    if runs["kernel"]:
        cases = []
        for per_round in runs["kernel"].values():
            for values in per_round.values():
                cases += [c for c in values if c not in cases]
        text, out["kernel_us"] = table("kernel_bench, us (variant lazy)", runs["kernel"], cases,
                                       2, args.base)
        print(text)
    if args.traces:
        traces = load_traces(args.dir)
        if traces:
            text, out["trace_critical_us"] = trace_tables(traces, args.base)
            print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
