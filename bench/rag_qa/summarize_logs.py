#!/usr/bin/env python3
"""Rebuilds rag_qa_bench tables from its progress logs (stderr: one line per question with each
configuration's running count), for runs stopped before they wrote their JSON, and merges runs:
every configuration is compared with FULL on the questions both answered.

  python3 bench/rag_qa/summarize_logs.py --depths DEPTHS.txt [--out OUT.json] \
      LABEL=LOG [LABEL=LOG ...]

DEPTHS.txt: `rag_qa_bench --configs none` output ("depth SET qID TOKENS" lines). A
configuration is reported as LABEL/CONFIG (LABEL "" for none). Standard library only.
"""
import json
import re
import sys

BUCKETS = [(0, 32, "0-31"), (32, 128, "32-127"), (128, 256, "128-255"), (256, 1 << 30, "256+")]
LINE = re.compile(r"^(\S+) q(\d+):(.*)$")


def bucket(depth):
    for lo, hi, name in BUCKETS:
        if lo <= depth < hi:
            return name
    return BUCKETS[-1][2]


def parse_log(path):
    """{set: {config: {qid: correct}}} from the running counts."""
    out = {}
    last = {}
    with open(path) as fh:
        for line in fh:
            m = LINE.match(line.strip())
            if not m:
                continue
            s, qid, rest = m.group(1), int(m.group(2)), m.group(3)
            for item in rest.split():
                name, _, count = item.rpartition("=")
                c, n = (int(x) for x in count.split("/"))
                prev = last.get((s, name), 0)
                out.setdefault(s, {}).setdefault(name, {})[qid] = c - prev
                last[(s, name)] = c
    return out


def main(argv):
    depths_file, out_file, runs = None, None, []
    it = iter(argv)
    for a in it:
        if a == "--depths":
            depths_file = next(it)
        elif a == "--out":
            out_file = next(it)
        else:
            label, _, path = a.partition("=")
            runs.append((label, path))
    depth = {}
    with open(depths_file) as fh:
        for line in fh:
            p = line.split()
            if len(p) == 4 and p[0] == "depth":
                depth[(p[1], int(p[2][1:]))] = int(p[3])
    merged = {}  # set -> config -> {qid: correct}
    for label, path in runs:
        for s, cfgs in parse_log(path).items():
            for name, per_q in cfgs.items():
                key = f"{label}/{name}" if label else name
                merged.setdefault(s, {})[key] = per_q
    report = {}
    for s, cfgs in merged.items():
        full = cfgs.get("full")
        print(f"\n{s}")
        print(f"  {'config':26s} {'n':>3s} {'EM':>6s} {'FULL(same q)':>12s} {'of FULL':>8s}  " +
              " ".join(f"{b[2]:>9s}" for b in BUCKETS))
        rows = []
        for name, per_q in cfgs.items():
            qs = sorted(per_q)
            n = len(qs)
            em = sum(per_q[q] for q in qs) / n if n else 0
            common = [q for q in qs if full and q in full]
            full_em = sum(full[q] for q in common) / len(common) if common else None
            mine = sum(per_q[q] for q in common) / len(common) if common else None
            of = mine / full_em if full_em else None
            by = {}
            for lo, hi, b in BUCKETS:
                sel = [q for q in qs if bucket(depth.get((s, q), 0)) == b]
                by[b] = {"correct": sum(per_q[q] for q in sel), "n": len(sel)}
            rows.append({"config": name, "questions": n, "exact_match": em,
                         "full_exact_match_same_questions": full_em,
                         "of_full": of, "common_questions": len(common), "by_depth": by,
                         "question_ids": qs})
            print(f"  {name:26s} {n:3d} {100 * em:5.1f}% " +
                  (f"{100 * full_em:11.1f}% {100 * of:7.0f}%" if of is not None else
                   f"{'':>12s} {'':>8s}") + "  " +
                  " ".join(f"{by[b]['correct']:>4d}/{by[b]['n']:<4d}" for _, _, b in BUCKETS))
        report[s] = rows
    if out_file:
        with open(out_file, "w") as fh:
            json.dump(report, fh, indent=1)
        print(f"wrote {out_file}")


if __name__ == "__main__":
    main(sys.argv[1:])
