#!/usr/bin/env python3
"""Checks one lazyrag-loadgen JSON: the fields plot.py reads are there and every request succeeded.

usage: check_result.py FILE.json EXPECTED_REQUESTS MODE
"""
import json
import math
import sys


def main():
    path, expected, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    with open(path) as f:
        r = json.load(f)
    errors = []

    def need(cond, what):
        if not cond:
            errors.append(what)

    cfg, s = r["config"], r["summary"]
    need(cfg["mode"] == mode, f"mode {cfg['mode']} != {mode}")
    for key in ("rate", "concurrency", "zipf", "distribution", "num_docs", "doc_tokens",
                "docs_per_request", "query_tokens", "max_tokens", "loop", "seed"):
        need(key in cfg, f"config.{key} missing")
    need(s["sent"] == expected, f"sent {s['sent']} != {expected}")
    need(s["ok"] == expected and s["failed"] == 0, f"ok {s['ok']} failed {s['failed']}")
    for key in ("ttft_ms", "server_ttft_ms", "queue_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        for q in ("mean", "p50", "p90", "p99", "max"):
            v = s[key][q]
            need(v is not None and math.isfinite(v) and v >= 0, f"summary.{key}.{q} = {v}")
    for key in ("request_throughput", "output_throughput", "doc_hit_ratio"):
        need(s[key] is not None and s[key] >= 0, f"summary.{key} = {s[key]}")
    need(s["request_throughput"] > 0, "zero throughput")
    reqs = r["requests"]
    need(len(reqs) == expected, f"{len(reqs)} request records")
    max_tokens = cfg["max_tokens"]
    for q in reqs:
        need(q["code"] == "OK", f"request {q['i']}: {q['code']} {q.get('error', '')}")
        need(q["tokens"] == max_tokens, f"request {q['i']}: {q['tokens']} tokens")
        need(len(q["itl_ms"]) == max_tokens - 1, f"request {q['i']}: {len(q['itl_ms'])} gaps")
        need(q["ttft_ms"] is not None and q["ttft_ms"] > 0, f"request {q['i']}: ttft")
        need(q["document_tokens"] > 0, f"request {q['i']}: no document tokens")
        need(q["computed_tokens"] > 0, f"request {q['i']}: no computed tokens")
        need(len(q["docs"]) == cfg["docs_per_request"], f"request {q['i']}: docs")
    if mode == "lazy":
        # Every document was prepared before the run: all of them come from the pool.
        need(s["doc_hit_ratio"] == 1.0, f"lazy doc hit ratio {s['doc_hit_ratio']}")
    if mode == "full":
        need(s["cached_document_tokens"] == 0, "full mode reused document tokens")
    if errors:
        print(f"{path}: FAILED")
        for e in errors[:20]:
            print("  " + e)
        sys.exit(1)
    print(f"{path}: {expected} requests ok, mean TTFT {s['ttft_ms']['mean']:.2f} ms, "
          f"hit ratio {s['doc_hit_ratio']:.3f}")


if __name__ == "__main__":
    main()
