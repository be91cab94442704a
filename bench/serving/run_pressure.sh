#!/usr/bin/env bash
# Cache-pressure sweep and saturation search on the GPU machine (issue 7), in one device call.
# The paper's workload (100 documents x 2048 tokens, 5 per request, Zipf 2.1, 32-token query,
# 16 output tokens with ignore_eos) on synthetic:llama3-8b, one lazyrag-worker on the GPU behind
# lazyrag-router, a fresh worker per (pool size, mode):
#
#  1. Free device memory after the weights is measured once (a worker with a 1 GiB pool; free =
#     memory.total - memory.used + 1 GiB, from nvidia-smi).
#  2. Pressure: for each fraction in FRACS of that free memory and each mode in MODES, a KV pool
#     of that size and a closed loop of CONC clients for N requests. LAZY keeps one copy of a
#     document; MATERIALIZE copies five documents (1.3 GiB) per running request, so as the pool
#     shrinks its copies evict documents that later requests recompute.
#  3. Saturation: at the largest fraction, for each mode in SAT_MODES, open-loop Poisson rates
#     from SAT_RATES (ascending) with N requests each, stopping after the first rate whose p99
#     TTFT exceeds BOUND_MS or that loses a request. plot.py reports the highest rate each mode
#     sustains under the bound.
#
# KVSTORE=1 puts one lazyrag-kvstore shard behind every worker. Default 0: on this machine
# recomputing a 2048-token document (~75 ms) is faster than fetching its 268 MB of KV through
# the kvstore (~0.5 GB/s, bench/README.md), and the workers' fetch-or-compute model
# (worker/engine/fetch_cost.h) then recomputes anyway; KVSTORE=1 measures that decision.
# Pack .gpu-serve as described in run_serving.sh, then one device call (carry
# [".gpu-serve"], timeout_s 600):
#   OUT=$OUT bash bench/serving/run_pressure.sh
# Knobs: KVSTORE=0|1 FRACS="0.9 0.5 0.3 0.2 0.1" MODES="lazy materialize" CONC=16 N=120 BOUND_MS=500
#   SAT_MODES="lazy materialize prefix" SAT_RATES="8 16 24 32 48 64" FULL_N=40 (FULL: closed
#   loop at the largest fraction with FULL_N requests; 0: none) BUDGET_S=560 ROUTER=1
#   WORKER_FLAGS="--prefill_chunk=2048 --max_batch_tokens=2048" SERVE_DIR=.gpu-serve SEED=1
# Output in $OUT: log.txt, serving-results.tgz (results/*.json, logs/, env.txt), summary.md,
# summary.json and the plots of plot.py (pressure.png: hit ratio, TTFT, throughput against the
# pool size).
set -uo pipefail
OUT=${OUT:?set OUT to the output folder}
FRACS=${FRACS:-0.9 0.5 0.3 0.2 0.1}
MODES=${MODES:-lazy materialize}
CONC=${CONC:-16}
N=${N:-120}
BOUND_MS=${BOUND_MS:-500}
SAT_MODES=${SAT_MODES-lazy materialize prefix}  # empty: no saturation search
SAT_RATES=${SAT_RATES:-8 16 24 32 48 64}
FULL_N=${FULL_N:-40}
BUDGET_S=${BUDGET_S:-560}
# Shared workload defaults, START, BIN, WORK, LOG, libraries and functions:
source "$(dirname "${BASH_SOURCE[0]}")/serve_lib.sh"

write_env <<KNOBS
FRACS=$FRACS MODES=$MODES CONC=$CONC N=$N BOUND_MS=$BOUND_MS
SAT_MODES=$SAT_MODES SAT_RATES=$SAT_RATES FULL_N=$FULL_N ZIPF_ALPHA=$ZIPF_ALPHA ROUTER=$ROUTER
KNOBS

check_binaries  # sets USE_ROUTER

KVSTORE=${KVSTORE:-0}
start_kvstore_if_asked

COMMON=(--num_docs="$NUM_DOCS" --doc_tokens="$DOC_TOKENS" --docs_per_request="$DOCS_PER_REQUEST"
        --query_tokens="$QUERY_TOKENS" --max_tokens="$MAX_TOKENS" --seed="$SEED"
        --wait_ready_s=60)

gpu_mib() {  # gpu_mib FIELD: memory.used or memory.total of GPU 0 in MiB
  nvidia-smi --query-gpu="$1" --format=csv,noheader,nounits -i 0 2>/dev/null | head -1 | tr -d ' '
}

# 1. Free memory after the weights (FREE_MIB=... skips the probe, e.g. on a machine without
# nvidia-smi).
if [[ -z "${FREE_MIB:-}" ]]; then
  if ! start_server "worker(probe)" worker-probe "$BIN/lazyrag-worker" --listen=127.0.0.1:0 \
      --metrics_port=-1 --model="$MODEL" --device="$DEVICE" --kv_pool_bytes=$((1 << 30)) \
      $WORKER_FLAGS; then
    log "ERROR: the probe worker did not start"
    exit 1
  fi
  used=$(gpu_mib memory.used)
  total=$(gpu_mib memory.total)
  stop_pid "$SERVER_PID"
  if ! [[ "$used" =~ ^[0-9]+$ && "$total" =~ ^[0-9]+$ ]]; then
    log "ERROR: nvidia-smi gave no memory figures (used '$used', total '$total'); set FREE_MIB"
    exit 1
  fi
  FREE_MIB=$(( total - used + 1024 ))
  log "device memory: total ${total} MiB, used ${used} MiB with a 1 GiB pool -> free after weights ${FREE_MIB} MiB"
fi
echo "free_after_weights_mib $FREE_MIB" >>"$WORK/env.txt"

pool_bytes() {  # pool_bytes FRACTION
  python3 -c "import sys; print(int(float(sys.argv[1]) * int(sys.argv[2]) * (1 << 20)))" "$1" "$FREE_MIB"
}
p99_of() {  # p99_of JSON: p99 client TTFT in ms and the failure count, or "nan 1"
  python3 - "$1" <<'EOF' 2>/dev/null || echo "nan 1"
import json, sys
s = json.load(open(sys.argv[1]))["summary"]
p99 = s["ttft_ms"]["p99"]
print("nan" if p99 is None else p99, s["failed"])
EOF
}
closed_point() {  # closed_point NAME MODE REQUESTS
  local kill_s=$(( REQ_TIMEOUT_S * 3 + 60 ))
  run_loadgen "$1" "$2" "$ZIPF_ALPHA" zipf "$kill_s" "$REQ_TIMEOUT_S" --rate=0 \
    --concurrency="$CONC" --num_requests="$3"
}
ladder() {  # ladder MODE TAG: ascending open-loop rates until p99 TTFT > BOUND_MS
  local mode=$1 tag=$2 rate est
  for rate in $SAT_RATES; do
    est=$(python3 -c "import sys; print(int(float(sys.argv[1]) / float(sys.argv[2])) + 20)" "$N" "$rate")
    if (( est > $(remaining) )); then
      log "SKIPPED $tag-r$rate (needs ~${est}s, $(remaining)s left)"
      return
    fi
    run_loadgen "$tag-r$rate" "$mode" "$ZIPF_ALPHA" zipf $(( est + REQ_TIMEOUT_S + 30 )) \
      "$REQ_TIMEOUT_S" --rate="$rate" --num_requests="$N" || return
    read -r p99 failed < <(p99_of "$WORK/results/$tag-r$rate.json")
    if [[ "$failed" != 0 ]] || python3 -c "import sys; sys.exit(0 if sys.argv[1] == 'nan' or float(sys.argv[1]) > float(sys.argv[2]) else 1)" "$p99" "$BOUND_MS"; then
      log "$mode: p99 TTFT ${p99} ms (failed $failed) at $rate req/s: past the ${BOUND_MS} ms bound"
      return
    fi
  done
}

read -r -a fracs_arr <<<"$FRACS"
first_frac=${fracs_arr[0]}
# Phases: (fraction, mode). The saturation ladders run at the first (largest) fraction; prefix
# and full only there.
phases=()
for f in "${fracs_arr[@]}"; do
  for m in $MODES; do phases+=("$f $m"); done
  if [[ "$f" == "$first_frac" ]]; then
    for m in $SAT_MODES; do [[ " $MODES " == *" $m "* ]] || phases+=("$f $m"); done
    (( FULL_N > 0 )) && phases+=("$f full")
  fi
done
for idx in "${!phases[@]}"; do
  read -r frac mode <<<"${phases[$idx]}"
  tag="$mode-p$frac"
  if (( $(remaining) < 30 )); then
    log "SKIPPED phase $tag (not enough time left)"
    continue
  fi
  pool=$(pool_bytes "$frac")
  log "== phase $tag: pool $(( pool >> 20 )) MiB ($frac of free), $(remaining)s left"
  start_phase "$mode" "$tag" "$pool" || continue
  if [[ "$mode" == full ]]; then
    closed_point "$tag-c$CONC" "$mode" "$FULL_N"
  elif [[ " $MODES " == *" $mode "* ]]; then
    closed_point "$tag-c$CONC" "$mode" "$N"
  fi
  if [[ "$frac" == "$first_frac" && " $SAT_MODES " == *" $mode "* ]]; then
    ladder "$mode" "$tag"
  fi
  stop_phase "$tag"
  archive
done

stop_kvstore
log "plots"
timeout 60 python3 bench/serving/plot.py "$WORK/results" --out "$OUT" --ttft_bound_ms "$BOUND_MS" \
  2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
(( rc != 0 )) && log "plot.py exit $rc (the JSON is in serving-results.tgz)"
archive
log "done in $(elapsed)s"
