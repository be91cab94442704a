#!/usr/bin/env bash
# The kvstore's effect on serving (issue 24 must-show 3), one device call: run_pressure.sh at a
# pool of 10% of free memory, LAZY, host tier off, without and with one same-host kvstore shard.
# With the store it runs two phases: the first worker computes the documents and writes them
# back, the second starts cold on that store. Pack .gpu-serve as run_serving.sh says, then
# (carry [".gpu-serve"], timeout_s 600):   OUT=$OUT bash bench/serving/run_kvstore_compare.sh
# Output in $OUT: summary-kv0.md, summary-kv1.md, serving-kv.tgz (both runs' folders).
# (The run of results/2026-12-02-h200-serving-kvstore/ also ran the saturation search of every
# mode: run_pressure.sh then took an empty SAT_MODES for its default.)
set -uo pipefail
FINAL=$OUT
# KVSTORE=1 runs two phases at 10%: the second worker starts cold on the store the first filled.
for kv in 0 1; do
  mkdir -p /tmp/o/kv$kv
  if [[ $kv == 0 ]]; then fracs="0.1"; budget=170; else fracs="0.1 0.1"; budget=320; fi
  OUT=/tmp/o/kv$kv KVSTORE=$kv FRACS="$fracs" MODES=lazy SAT_MODES="" FULL_N=0 CONC=16 N=120 \
    BUDGET_S=$budget WORKER_FLAGS="--prefill_chunk=2048 --max_batch_tokens=2048 --host_cache_bytes=0" \
    timeout -k 5 $((budget + 15)) bash bench/serving/run_pressure.sh > /tmp/o/kv$kv/stdout.txt 2>&1
  echo "KVSTORE=$kv rc=$?"
  cp /tmp/o/kv$kv/summary.md $FINAL/summary-kv$kv.md 2>/dev/null
  tail -40 /tmp/o/kv$kv/log.txt
done
tar czf $FINAL/serving-kv.tgz -C /tmp/o .
