#!/usr/bin/env python3
"""Merges rag_qa_bench JSON files into one table per question set: exact match of every
configuration, its share of FULL's (FULL from whichever file ran it on that set), by fact depth,
and the LAZY / MATERIALIZE agreement of every pair that ran. Standard library only.

  python3 bench/rag_qa/summarize.py RESULT.json [RESULT.json ...] [--label FILE=LABEL ...]

A configuration is named "LABEL/CONFIG" when its file has a label (e.g. the shared-prefix run).
"""
import json
import sys


def main(argv):
    files, labels = [], {}
    for a in argv:
        if a.startswith("--label="):
            f, _, lab = a[len("--label="):].partition("=")
            labels[f] = lab
        else:
            files.append(a)
    sets = {}  # set -> {"n", "buckets", "rows": [(name, cfg)], "pairs": [...]}
    for f in files:
        with open(f) as fh:
            data = json.load(fh)
        lab = labels.get(f, "")
        for s in data["sets"]:
            entry = sets.setdefault(s["set"], {"rows": [], "pairs": [], "n": s["questions"],
                                               "buckets": s["depth_buckets"]})
            if s["questions"] != entry["n"]:
                entry.setdefault("note", []).append(f"{f}: {s['questions']} questions")
            for c in s["configs"]:
                entry["rows"].append(((lab + "/" if lab else "") + c["config"], c, s["questions"]))
            for p in s.get("lazy_materialize_identical", []):
                entry["pairs"].append(((lab + "/" if lab else "") + p["lazy"], p["identical"],
                                       p["questions"]))
    for name, e in sets.items():
        full = next((c for n, c, _ in e["rows"] if n == "full"), None)
        print(f"\n{name}: {e['n']} questions; fact depth buckets {e['buckets']}")
        for note in e.get("note", []):
            print(f"  note: {note}")
        print(f"  {'config':28s} {'EM':>6s} {'of FULL':>8s}  " +
              " ".join(f"{b:>9s}" for b in e["buckets"]))
        for n, c, q in e["rows"]:
            of = ""
            if full is not None and full["exact_match"] > 0 and q == e["n"]:
                of = f"{100 * c['exact_match'] / full['exact_match']:.0f}%"
            by = " ".join(f"{c['by_depth'][b]['correct']:>4d}/{c['by_depth'][b]['n']:<4d}"
                          for b in e["buckets"])
            print(f"  {n:28s} {100 * c['exact_match']:5.1f}% {of:>8s}  {by}")
        for n, same, q in e["pairs"]:
            print(f"  {n} == its MATERIALIZE twin: {same} / {q}")


if __name__ == "__main__":
    main(sys.argv[1:])
