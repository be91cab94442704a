#!/usr/bin/env python3
"""Tables from selective_recompute's JSON lines (one per question).

  summarize.py RUN.jsonl [RUN2.jsonl ...] [--reference RAG_QA_BENCH.json] [--out SUMMARY.json]

Per configuration: correct answers (rag_qa_bench's scorer, recorded by the program), % of FULL,
document tokens recomputed per request (oracle: copied from FULL), correct by fact depth, mean
seconds of the configuration's prefill (selected tokens + query block, after the cached KV
exists) and decode per question; how often each selection agrees with the oracle's and lies in
the first B tokens; paired wins and losses of each selective configuration against first-k at
the same budget. --reference: the same questions' answers from rag_qa_bench's JSON; full, lazy,
lazy:d=1 and firstk:B must give its full, lazy, lazy:d=1 and lazy:k=B answers.
"""
import argparse
import json
import math

BUCKETS = [(0, "0-31"), (32, "32-127"), (128, "128-255"), (256, "256+")]


def bucket(depth):
    name = BUCKETS[0][1]
    for lo, n in BUCKETS:
        if depth >= lo:
            name = n
    return name


def sign_test(wins, losses):
    """Two-sided exact binomial p-value of wins vs losses (ties dropped)."""
    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    p = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * p)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--reference", action="append", default=[])
    ap.add_argument("--out")
    args = ap.parse_args()
    recs = []
    for path in args.runs:
        with open(path) as f:
            recs += [json.loads(line) for line in f if line.strip()]
    configs = list(recs[0]["configs"].keys())
    recs = [r for r in recs if all(c in r["configs"] for c in configs)]
    n = len(recs)
    summary = {"questions": n, "configs": {}}
    full = sum(r["configs"]["full"]["correct"] for r in recs) if "full" in configs else 0
    depth_n = {b: sum(1 for r in recs if bucket(r["depth"]) == b) for _, b in BUCKETS}
    print(f"{n} questions; FULL {full}; by fact depth " +
          " ".join(f"{b}:{depth_n[b]}" for _, b in BUCKETS))
    phases = {k: sum(r["phase_s"][k] for r in recs) / n for k in recs[0]["phase_s"]}
    prompt = sum(r["prompt_tokens"] for r in recs) / n
    docs = sum(sum(r["document_tokens"]) for r in recs) / n
    print(f"mean prompt {prompt:.0f} tokens ({docs:.0f} in documents); mean seconds per question: " +
          ", ".join(f"{k} {v:.2f}" for k, v in phases.items()))
    summary["phase_s_mean"] = phases
    summary["prompt_tokens_mean"] = prompt
    summary["document_tokens_mean"] = docs
    head = f"{'config':<14} {'correct':>7} {'%FULL':>6} {'recomp/req':>10}"
    head += "".join(f" {b:>9}" for _, b in BUCKETS)
    head += f" {'prefill_s':>9} {'decode_s':>8} {'sel=oracle':>10} {'sel<B':>6}"
    print(head)
    for c in configs:
        rows = [r["configs"][c] for r in recs]
        ok = sum(x["correct"] for x in rows)
        by = {b: sum(r["configs"][c]["correct"] for r in recs if bucket(r["depth"]) == b)
              for _, b in BUCKETS}
        rec = sum(x["recomputed_document_tokens"] for x in rows) / n
        pre = sum(x["prefill_s"] for x in rows) / n
        dec = sum(x["decode_s"] for x in rows) / n
        ov = [r["selection_overlap"][c] for r in recs if c in r.get("selection_overlap", {})]
        sel = sum(o["selected"] for o in ov)
        same = sum(o["with_oracle"] for o in ov) / sel if sel else None
        first = sum(o["within_first"] for o in ov) / sel if sel else None
        pct = 100 * ok / full if full else 0
        line = f"{c:<14} {ok:>7} {pct:>5.0f}% {rec:>10.1f}"
        line += "".join(f" {by[b]:>4}/{depth_n[b]:<4}" for _, b in BUCKETS)
        line += f" {pre:>9.2f} {dec:>8.2f}"
        line += f" {same:>10.2f} {first:>6.2f}" if sel else f" {'-':>10} {'-':>6}"
        print(line)
        summary["configs"][c] = {
            "correct": ok, "of_full": ok / full if full else None,
            "recomputed_document_tokens_per_request": rec,
            "by_depth": {b: {"correct": by[b], "n": depth_n[b]} for _, b in BUCKETS},
            "prefill_s_mean": pre, "decode_s_mean": dec,
            "selected_in_oracle_set": same, "selected_within_first_B": first}
    # Paired: each selective configuration against first-k at the same budget.
    print("\npaired against first-k at the same budget (questions only one of the two answers)")
    summary["paired"] = {}
    for c in configs:
        parts = c.split(":")
        if parts[0] in ("full", "lazy", "firstk") or len(parts) < 2:
            continue
        base = "firstk:" + parts[1]
        if base not in configs:
            continue
        win = sum(1 for r in recs if r["configs"][c]["correct"] and not r["configs"][base]["correct"])
        loss = sum(1 for r in recs if r["configs"][base]["correct"] and not r["configs"][c]["correct"])
        p = sign_test(win, loss)
        print(f"  {c:<14} vs {base:<10}: +{win} -{loss} (sign test p = {p:.2f})")
        summary["paired"][c] = {"against": base, "wins": win, "losses": loss, "sign_test_p": p}
    # Check questions (B = all and B = 0).
    checks = [r["checks"] for r in recs if "checks" in r]
    if checks:
        ok = all(v["pass"] for ch in checks for v in ch.values())
        same = sum(ch[k]["same_answer_as_full"] for ch in checks for k in ("oracle:all", "blend:all"))
        worst = max(ch[k]["max_rel_logit_diff_vs_full"] for ch in checks
                    for k in ("oracle:all", "blend:all"))
        print(f"\nchecks on {len(checks)} questions: {'pass' if ok else 'FAIL'}; B=all answers "
              f"equal FULL's {same}/{2 * len(checks)}, first-step logits within {worst:.1e} of "
              f"FULL's (relative to the largest); B=0 equal to plain LAZY bit for bit")
        summary["checks"] = {"questions": len(checks), "pass": ok, "all_same_answer_as_full": same,
                             "max_rel_logit_diff_vs_full": worst}
    # Against rag_qa_bench's answers for the same questions.
    mapping = {"full": "full", "lazy": "lazy", "lazy:d=1": "lazy:d=1"}
    for c in configs:
        if c.startswith("firstk:") and c[7:].isdigit():
            mapping[c] = "lazy:k=" + c[7:]
    for ref_path in args.reference:
        with open(ref_path) as f:
            ref = json.load(f)
        summary.setdefault("reference", {})[ref_path] = {}
        for s in ref["sets"]:
            ids = []
            with open(s["set"]) as f:
                ids = [json.loads(line)["id"] for line in f if line.strip()]
            by_id = {}
            for rc in s["configs"]:
                for i, text in enumerate(rc["answers"]):
                    by_id[(rc["config"], ids[i])] = text
            print(f"\nagainst {ref_path} ({s['set']}, max_tokens {ref.get('max_tokens')}):")
            for mine, theirs in mapping.items():
                if mine not in configs:
                    continue
                both = [r for r in recs if r["set"] == s["set"] and (theirs, r["id"]) in by_id]
                same = sum(r["configs"][mine]["text"] == by_id[(theirs, r["id"])] for r in both)
                if both:
                    print(f"  {mine:<10} = rag_qa_bench {theirs:<9}: identical answers {same}/{len(both)}")
                    summary["reference"][ref_path][mine] = {"rag_qa_bench": theirs,
                                                            "identical": same,
                                                            "questions": len(both)}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
