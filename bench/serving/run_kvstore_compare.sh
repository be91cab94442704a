#!/usr/bin/env bash
# Issue 24 must-show 3: paper workload at pool 10% of free memory, LAZY, host tier off, without
# and with one same-host kvstore shard (a fresh worker per run; with the store, the worker that
# prepares the documents writes them back and the measured worker starts cold on that store).
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
