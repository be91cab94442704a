# What the GPU serving scripts (run_serving.sh, run_pressure.sh) share: the workload defaults
# (the paper's: 100 documents x 2048 tokens, 5 per request, Zipf 2.1, 32-token query, 16 output
# tokens, synthetic:llama3-8b on cuda), the work folder and log, library unpacking, logging,
# starting and stopping servers on loopback, /metrics snapshots, waiting for kvstore
# write-backs, archiving results, and one loadgen point. Sourced, not run, after OUT and
# BUDGET_S are set; the caller sets COMMON (the loadgen workload flags) before run_loadgen.
# shellcheck shell=bash

START=$(date +%s)
SERVE_DIR=${SERVE_DIR:-.gpu-serve}
BIN="$PWD/$SERVE_DIR/bin"
ZIPF_ALPHA=${ZIPF_ALPHA:-2.1}
ROUTER=${ROUTER:-1}
WORKER_FLAGS=${WORKER_FLAGS:---prefill_chunk=2048 --max_batch_tokens=2048}
WARMUP=${WARMUP:-2}
REQ_TIMEOUT_S=${REQ_TIMEOUT_S:-60}
SEED=${SEED:-1}
NUM_DOCS=${NUM_DOCS:-100}
DOC_TOKENS=${DOC_TOKENS:-2048}
DOCS_PER_REQUEST=${DOCS_PER_REQUEST:-5}
QUERY_TOKENS=${QUERY_TOKENS:-32}
MAX_TOKENS=${MAX_TOKENS:-16}
MODEL=${MODEL:-synthetic:llama3-8b}
DEVICE=${DEVICE:-cuda}
RESERVE_S=25  # kept for plots and the final archive

# WORK (default /tmp/lazyrag-serve) may be set per instance, e.g. two instances on two GPUs
# of one machine (CUDA_VISIBLE_DEVICES=0 / 1), each with its own OUT and WORK.
WORK=${WORK:-/tmp/lazyrag-serve}
rm -rf "$WORK"
mkdir -p "$OUT" "$WORK/results" "$WORK/logs"
LOG="$OUT/log.txt"
: >"$LOG"

LIBDIR="$PWD/$SERVE_DIR/lib"
if [[ ! -d "$LIBDIR" && -f "$SERVE_DIR/lib.tar.xz" ]]; then
  LIBDIR="$WORK-lib/lib"
  rm -rf "$WORK-lib" && mkdir -p "$WORK-lib" &&
    tar xJf "$SERVE_DIR/lib.tar.xz" -C "$WORK-lib" ||
    echo "ERROR: cannot unpack $SERVE_DIR/lib.tar.xz" | tee -a "$LOG"
fi
export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

log() { echo "[$(date -u +%T) +$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
elapsed() { echo $(( $(date +%s) - START )); }
remaining() { echo $(( BUDGET_S - RESERVE_S - $(elapsed) )); }

# Stops the script when the worker or loadgen binary is missing; USE_ROUTER=1 when ROUTER=1
# and lazyrag-router is packed (else requests go to the worker directly).
check_binaries() {
  local b
  for b in lazyrag-worker lazyrag-loadgen; do
    [[ -x "$BIN/$b" ]] || { log "ERROR: $BIN/$b missing"; exit 1; }
  done
  USE_ROUTER=0
  if [[ "$ROUTER" == 1 && -x "$BIN/lazyrag-router" ]]; then USE_ROUTER=1; fi
  log "router: $([[ $USE_ROUTER == 1 ]] && echo yes || echo no)"
}

PIDS=()
stop_pid() {  # stop_pid PID: SIGTERM, then SIGKILL after 15 s
  local pid=$1
  [[ -z "$pid" ]] && return
  kill -0 "$pid" 2>/dev/null || return
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 150); do
    kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null; return; }
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
}
archive() {
  tar czf "$OUT/serving-results.tgz.part" -C "$WORK" results logs env.txt 2>/dev/null &&
    mv -f "$OUT/serving-results.tgz.part" "$OUT/serving-results.tgz"
}
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do stop_pid "$pid"; done
  PIDS=()
  archive
}
trap 'log "interrupted"; cleanup; exit 130' INT TERM
trap cleanup EXIT

# start_server NAME LOGBASE BINARY ARGS...: starts it, waits for its "ready grpc=A metrics=P"
# line (READY_S seconds), sets SERVER_ADDR, SERVER_METRICS and SERVER_PID.
start_server() {
  local name=$1 base=$2
  shift 2
  "$@" >"$WORK/logs/$base.out" 2>"$WORK/logs/$base.err" &
  SERVER_PID=$!
  PIDS+=("$SERVER_PID")
  local line=""
  for _ in $(seq 1 $(( ${READY_S:-180} * 10 ))); do
    line=$(grep -m1 'ready grpc=' "$WORK/logs/$base.out" 2>/dev/null)
    [[ -n "$line" ]] && break
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  if [[ -z "$line" ]]; then
    log "ERROR: $name did not become ready; last lines of its stderr:"
    tail -n 20 "$WORK/logs/$base.err" | tee -a "$LOG"
    stop_pid "$SERVER_PID"
    return 1
  fi
  SERVER_ADDR=$(sed -n 's/.*ready grpc=\([^ ]*\).*/\1/p' <<<"$line")
  SERVER_METRICS=$(sed -n 's/.*metrics=\([0-9-]*\).*/\1/p' <<<"$line")
  log "$name ready at $SERVER_ADDR (metrics $SERVER_METRICS, pid $SERVER_PID)"
}

metrics_snapshot() {  # metrics_snapshot PORT FILE
  [[ -z "$1" || "$1" == -1 ]] && return
  timeout 5 python3 -c 'import sys, urllib.request
sys.stdout.write(urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=4).read().decode())' \
    "$1" >"$2" 2>/dev/null || true
}

# Waits until the worker's write-backs to the kvstore are done (or dropped), at most $1 s.
wait_writebacks() {
  local port=$1 limit=$2 t0
  t0=$(date +%s)
  while (( $(date +%s) - t0 < limit )); do
    local left
    left=$(timeout 5 python3 - "$port" <<'EOF' 2>/dev/null
import sys, urllib.request
text = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=4).read().decode()
computed = done = 0.0
for line in text.splitlines():
    if not line or line.startswith("#"):
        continue
    series, value = line.rsplit(" ", 1)
    name = series.split("{", 1)[0]
    if name == "lazyrag_doc_computed_total":
        computed += float(value)
    elif name == "lazyrag_kvstore_writeback_dropped_total" or (
            name == "lazyrag_kvstore_requests_total" and 'op="put"' in series):
        done += float(value)
print(int(computed - done))
EOF
)
    [[ "$left" =~ ^-?[0-9]+$ ]] && (( left <= 0 )) && { log "write-backs done"; return; }
    sleep 1
  done
  log "write-backs still pending after ${limit}s (continuing)"
}

# run_loadgen NAME MODE ZIPF_ALPHA LABEL KILL_S REQ_TIMEOUT_S ARGS...: one loadgen point
# against $TARGET with the workload flags in COMMON; JSON to results/NAME.json, table in the log.
# Returns 1 without running when the worker or router of this phase ($WORKER_PID, $ROUTER_PID)
# has exited.
run_loadgen() {
  local name=$1 mode=$2 alpha=$3 label=$4 kill_s=$5 req_t=$6
  shift 6
  local pid
  for pid in "${WORKER_PID:-}" "${ROUTER_PID:-}"; do
    if [[ -n "$pid" ]] && ! kill -0 "$pid" 2>/dev/null; then
      log "SKIPPED $name: a server of this phase exited; worker stderr tail:"
      tail -n 20 "$WORK/logs/worker-${PHASE_TAG:-$mode}.err" 2>/dev/null | tee -a "$LOG"
      return 1
    fi
  done
  log "point $name ($*)"
  timeout -k 5 "$kill_s" "$BIN/lazyrag-loadgen" --target="$TARGET" --mode="$mode" \
    --zipf="$alpha" --label="$label" --warmup="$WARMUP" "${COMMON[@]}" \
    --timeout_s="$req_t" "$@" --out="$WORK/results/$name.json" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  (( rc != 0 )) && log "loadgen $name exit $rc"
  archive
  return 0
}

# write_env: machine, commit, knobs (lines from stdin) into $WORK/env.txt and the log.
write_env() {
  {
    echo "date $(date -u +%FT%TZ)"
    echo "commit $(cat "$SERVE_DIR/COMMIT" 2>/dev/null || git rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "dirty:"; cat "$SERVE_DIR/DIRTY" 2>/dev/null
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm \
      --format=csv 2>&1
    nproc; free -g | head -2; df -h /tmp | tail -1
    cat
    echo "WORKER_FLAGS=$WORKER_FLAGS BUDGET_S=$BUDGET_S MODEL=$MODEL DEVICE=$DEVICE SEED=$SEED"
    echo "NUM_DOCS=$NUM_DOCS DOC_TOKENS=$DOC_TOKENS DOCS_PER_REQUEST=$DOCS_PER_REQUEST" \
      "QUERY_TOKENS=$QUERY_TOKENS MAX_TOKENS=$MAX_TOKENS ZIPF_ALPHA=$ZIPF_ALPHA"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    for b in "$BIN"/*; do ldd "$b" 2>&1 | grep -i "not found" | sed "s|^|$(basename "$b"): |"; done
  } >"$WORK/env.txt" 2>&1
  cat "$WORK/env.txt" >>"$LOG"
}

# start_phase MODE TAG POOL_BYTES: a fresh worker (KV pool of POOL_BYTES; KV_FLAG and
# WORKER_FLAGS passed on) and, when USE_ROUTER=1, a router in front of it; prepares the document
# pool and waits for kvstore write-backs. Sets WORKER_PID, WORKER_METRICS, ROUTER_PID,
# ROUTER_METRICS and TARGET. Logs go to logs/worker-TAG.*; returns 1 when the worker fails.
start_phase() {
  local mode=$1 tag=$2 pool=$3 rc
  PHASE_TAG=$tag
  if ! start_server "worker($tag)" "worker-$tag" "$BIN/lazyrag-worker" --listen=127.0.0.1:0 \
      --metrics_port=0 --metrics_host=127.0.0.1 --model="$MODEL" --device="$DEVICE" \
      --kv_pool_bytes="$pool" "${KV_FLAG[@]}" $WORKER_FLAGS; then
    return 1
  fi
  WORKER_PID=$SERVER_PID
  WORKER_METRICS=$SERVER_METRICS
  TARGET=$SERVER_ADDR
  ROUTER_PID=""
  ROUTER_METRICS=""
  if [[ "$USE_ROUTER" == 1 ]]; then
    if start_server "router($tag)" "router-$tag" "$BIN/lazyrag-router" --listen=127.0.0.1:0 \
        --workers="$SERVER_ADDR" --metrics_port=0 --metrics_host=127.0.0.1; then
      ROUTER_PID=$SERVER_PID
      ROUTER_METRICS=$SERVER_METRICS
      TARGET=$SERVER_ADDR
    else
      log "router failed: sending to the worker directly"
    fi
  fi
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader 2>&1 |
    sed 's/^/gpu memory: /' | tee -a "$LOG"
  log "preparing $NUM_DOCS documents"
  timeout -k 5 240 "$BIN/lazyrag-loadgen" --target="$TARGET" "${COMMON[@]}" --prepare_only \
    2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  (( rc != 0 )) && log "prepare exit $rc"
  if [[ "${KVSTORE:-0}" == 1 && ${#KV_FLAG[@]} -gt 0 ]]; then
    wait_writebacks "$WORKER_METRICS" 90
  fi
  return 0
}

# stop_phase TAG: /metrics snapshots of the phase's worker and router, then stops both.
stop_phase() {
  local tag=$1
  metrics_snapshot "$WORKER_METRICS" "$WORK/logs/metrics-worker-$tag.txt"
  metrics_snapshot "$ROUTER_METRICS" "$WORK/logs/metrics-router-$tag.txt"
  stop_pid "$ROUTER_PID"
  stop_pid "$WORKER_PID"
  log "worker($tag) stopped"
  WORKER_PID=""
  ROUTER_PID=""
}

# start_kvstore_if_asked: with KVSTORE=1, one lazyrag-kvstore shard under $WORK (40 GiB
# capacity, no fsync per commit); sets KV_FLAG (the worker's --kvstore flag, empty without),
# KV_PID and KV_METRICS.
start_kvstore_if_asked() {
  KV_FLAG=()
  KV_PID=""
  KV_METRICS=""
  [[ "${KVSTORE:-0}" == 1 ]] || return 0
  if start_server kvstore kvstore "$BIN/lazyrag-kvstore" --listen=127.0.0.1:0 \
      --data_dir="$WORK/kvdata" --capacity_bytes=$((40 << 30)) --sync_commits=false \
      --metrics_port=0 --metrics_host=127.0.0.1; then
    KV_FLAG=(--kvstore="$SERVER_ADDR")
    KV_PID=$SERVER_PID
    KV_METRICS=$SERVER_METRICS
  else
    log "continuing without the kvstore"
  fi
}

# stop_kvstore: /metrics snapshot of the kvstore shard, then stops it (no-op without one).
stop_kvstore() {
  [[ -n "${KV_PID:-}" ]] || return 0
  metrics_snapshot "$KV_METRICS" "$WORK/logs/metrics-kvstore.txt"
  stop_pid "$KV_PID"
  KV_PID=""
}
