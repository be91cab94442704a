#!/usr/bin/env bash
# Serving benchmark on the GPU machine (issue 7): the paper's workload (100 documents x 2048
# tokens, 5 per request, Zipf 2.1 and uniform, 32-token query, 16 output tokens with ignore_eos,
# Poisson arrivals at 0.5 1 2 3 4 req/s) on synthetic:llama3-8b (bf16) for each mode, plus a
# closed-loop saturation point (concurrency 16, Zipf) per mode. One lazyrag-worker on the GPU,
# restarted for every mode (fresh pool), behind lazyrag-router when that binary is packed;
# lazyrag-kvstore optional (KVSTORE=1). Run ON THE GPU MACHINE from the repository root.
#
# Packing here (no GPU needed; cuBLAS/cudart are on the GPU machine and are not carried):
#   cmake -S . -B build-serve -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a
#   cmake --build build-serve -j2 --target lazyrag-worker lazyrag-kvstore lazyrag-router \
#     lazyrag-loadgen
#   rm -rf .gpu-serve && mkdir -p .gpu-serve/bin .gpu-serve/lib
#   cp build-serve/worker/lazyrag-worker build-serve/kvstore/lazyrag-kvstore \
#      build-serve/bench/lazyrag-loadgen .gpu-serve/bin/
#   cp build-serve/router/lazyrag-router .gpu-serve/bin/   # optional: without it, no router
#   strip .gpu-serve/bin/*
#   ../shared/device/collect-libs.sh .gpu-serve/lib .gpu-serve/bin/*
#   # 71 MiB of libraries (36 MiB OpenBLAS): carried as a 15 MiB xz archive, unpacked there
#   tar cJf .gpu-serve/lib.tar.xz -C .gpu-serve lib && rm -rf .gpu-serve/lib
#   grep -qx '/.gpu-serve/' .git/info/exclude || echo /.gpu-serve/ >> .git/info/exclude
#   git rev-parse HEAD > .gpu-serve/COMMIT; git status --short > .gpu-serve/DIRTY
#   du -sh .gpu-serve   # everything carried must stay under 64 MiB (about 20 MiB)
# Then one device call (carry [".gpu-serve"], timeout_s 600):
#   OUT=$OUT bash bench/serving/run_serving.sh
# It stops itself after BUDGET_S seconds (default 540) whatever is left, splitting the time
# fairly between modes; every finished point is already in $OUT. Expected wall time with the
# defaults: about 7-8 minutes (LAZY and MATERIALIZE about 2 min each, FULL about 2.5 min).
#
# What comes back in $OUT (at most 8 files):
#   log.txt               progress, every loadgen summary table, SKIPPED lines, errors
#   serving-results.tgz   results/<mode>-<dist>-r<rate>.json, results/<mode>-sat-c<C>.json,
#                         logs/ (worker/router/kvstore stderr, /metrics snapshots), env.txt;
#                         rewritten after every point, so partial results survive a kill
#   summary.md, summary.json, ttft_vs_rate.png, throughput.png, hit_ratio.png   (plot.py)
#
# Knobs (environment):
#   MODES="lazy materialize full"  (add prefix for PREFIX)   DISTS="zipf uniform"
#   RATES="0.5 1 2 3 4"  POINT_S=8: requests per point = clamp(rate x POINT_S, MIN_N, N)
#   MIN_N=8 N=120        QUICK=0: paper sizes (N=120 per point, no time cap: about 8 minutes
#                        per mode and distribution, so run one MODES/DISTS pair per call)
#   SAT_CONC=16 SAT_S=8 SAT_DISTS=zipf   closed-loop saturation points (SAT_S=0: none)
#   POOL_GIB=64  (KV pool; 100 documents take 25 GiB, a MATERIALIZE or FULL request 1.3 GiB)
#   KVSTORE=0|1  (1: one lazyrag-kvstore shard under /tmp; the first worker writes the 100
#                documents back, later workers fetch them: 25 GiB through the store)
#   ROUTER=1|0   WORKER_FLAGS="--prefill_chunk=2048 --max_batch_tokens=2048"   BUDGET_S=540
#   SERVE_DIR=.gpu-serve   WARMUP=2   REQ_TIMEOUT_S=60   SEED=1
set -uo pipefail
OUT=${OUT:?set OUT to the output folder}
QUICK=${QUICK:-1}
MODES=${MODES:-lazy materialize full}
DISTS=${DISTS:-zipf uniform}
RATES=${RATES:-0.5 1 2 3 4}
N=${N:-120}
if [[ "$QUICK" == 1 ]]; then
  POINT_S=${POINT_S:-8}
  MIN_N=${MIN_N:-8}
else
  POINT_S=${POINT_S:-0}
  MIN_N=${MIN_N:-$N}
fi
SAT_CONC=${SAT_CONC:-16}
SAT_S=${SAT_S:-8}
SAT_DISTS=${SAT_DISTS:-zipf}
POOL_GIB=${POOL_GIB:-64}
KVSTORE=${KVSTORE:-0}
BUDGET_S=${BUDGET_S:-540}
# Shared workload defaults, START, BIN, WORK, LOG, libraries and functions:
source "$(dirname "${BASH_SOURCE[0]}")/serve_lib.sh"

write_env <<KNOBS
MODES=$MODES DISTS=$DISTS RATES=$RATES N=$N MIN_N=$MIN_N POINT_S=$POINT_S
SAT_CONC=$SAT_CONC SAT_S=$SAT_S POOL_GIB=$POOL_GIB KVSTORE=$KVSTORE ROUTER=$ROUTER
KNOBS

check_binaries  # sets USE_ROUTER

start_kvstore_if_asked

COMMON=(--num_docs="$NUM_DOCS" --doc_tokens="$DOC_TOKENS" --docs_per_request="$DOCS_PER_REQUEST"
        --query_tokens="$QUERY_TOKENS" --max_tokens="$MAX_TOKENS" --seed="$SEED"
        --timeout_s="$REQ_TIMEOUT_S" --wait_ready_s=60)

alpha_of() { [[ "$1" == zipf ]] && echo "$ZIPF_ALPHA" || echo 0; }

# point MODE DIST RATE|sat DEADLINE: one loadgen run, JSON under results/, table in the log.
point() {
  local mode=$1 dist=$2 rate=$3 deadline=$4 name n args est
  if [[ "$rate" == sat ]]; then
    name="$mode-$dist-sat-c$SAT_CONC"
    args=(--rate=0 --concurrency="$SAT_CONC" --num_requests=100000 --duration_s="$SAT_S")
    est=$(( SAT_S + 10 ))
  else
    name="$mode-$dist-r$rate"
    n=$(python3 -c "import math,sys; r,p,lo,hi=map(float,sys.argv[1:]); \
print(int(hi) if p<=0 else int(min(hi,max(lo,math.ceil(r*p)))))" "$rate" "$POINT_S" "$MIN_N" "$N")
    args=(--rate="$rate" --num_requests="$n")
    est=$(python3 -c "import sys; print(int(float(sys.argv[1])/float(sys.argv[2]))+8)" "$n" "$rate")
  fi
  local now left
  now=$(date +%s)
  left=$(( deadline - now ))
  if (( est > left )); then
    log "SKIPPED $name (needs ~${est}s, ${left}s left for this mode)"
    return
  fi
  # Requests may not outlive the mode's deadline; the kill is a last resort.
  local req_t=$(( left - est + 10 ))
  (( req_t > REQ_TIMEOUT_S )) && req_t=$REQ_TIMEOUT_S
  (( req_t < 10 )) && req_t=10
  run_loadgen "$name" "$mode" "$(alpha_of "$dist")" "$dist" $(( est + req_t + 30 )) "$req_t" \
    "${args[@]}"
}

read -r -a modes_arr <<<"$MODES"
for idx in "${!modes_arr[@]}"; do
  mode=${modes_arr[$idx]}
  left=$(remaining)
  modes_left=$(( ${#modes_arr[@]} - idx ))
  share=$(( left / modes_left ))
  mode_deadline=$(( $(date +%s) + share ))
  log "== mode $mode: ${share}s of ${left}s"
  if (( share < 30 )); then
    log "SKIPPED mode $mode (not enough time left)"
    continue
  fi
  start_phase "$mode" "$mode" $(( POOL_GIB << 30 )) || continue
  for dist in $DISTS; do
    for rate in $RATES; do point "$mode" "$dist" "$rate" "$mode_deadline"; done
    if (( SAT_S > 0 )) && [[ " $SAT_DISTS " == *" $dist "* ]]; then
      point "$mode" "$dist" sat "$mode_deadline"
    fi
  done
  stop_phase "$mode"
  archive
done
stop_kvstore

log "plots"
timeout 60 python3 bench/serving/plot.py "$WORK/results" --out "$OUT" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
(( rc != 0 )) && log "plot.py exit $rc (the JSON is in serving-results.tgz)"
archive
log "done in $(elapsed)s"
