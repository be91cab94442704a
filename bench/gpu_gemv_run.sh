#!/usr/bin/env bash
# One GPU call comparing builds (issue 29; first written for the one-row projections of
# worker/kernels/gemv.h, hence its name): every carried *_test first (the kernels and the CUDA
# model against the CPU), then gemv_bench (cuBLAS beside the GEMV and its block shapes) and
# ttft_bench for the binaries under test and, when carried, base builds beside them (alternating
# rounds, so all see the same machine), then optionally kernel_bench, kernel traces and Nsight
# Compute. Run ON THE GPU MACHINE from the repository root.
#
# Packing here (no GPU needed), from commits:
#   bench/dev/gpu_pack.sh .gpu-g bin=my-branch:ttft_bench,kernels_test base=main:ttft_bench
# which writes .gpu-g/pack.tar.xz: a folder per build (bin, the builds under test; any other
# name but lib and tools, a build to compare with), tools/ and lib/ (GPU_DIR may also name those
# folders unpacked).
# Then one device call carrying [".gpu-g"]:  GPU_DIR=.gpu-g OUT=$OUT bash bench/gpu_gemv_run.sh
# Knobs: ROUNDS=2 (new/base pairs), TTFT_ARGS (extra ttft_bench flags), TESTS=1 (TEST_TIMEOUT=240 s
# each), GEMV=1 (gemv_bench), NCU=0 (1: an Nsight Compute profile of one LAZY request, prefill and
# one decode step, for each build, and its per-kernel breakdown by bench/ncu_breakdown.py; kernels
# are serialised and timed alone), TRACE=0 (1: the same request's kernels as they ran, CUDA graphs
# and PDL overlap included, from bench/dev/kernel_trace, carried in $GPU_DIR/tools with libcupti;
# TRACE_ARGS adds ttft_bench flags, e.g. "--quality_k 8"), KERNEL_BENCH=0 (1: kernel_bench of every
# build folder holding one, after the ttft rounds; KERNEL_BENCH_ARGS), FLAG_SETS (one build with
# several option sets, "name=flags;name=flags", e.g. "o0=--o_prefetch 0;o1=--o_prefetch 1": bin's
# ttft_bench runs every set in each round, ttft-<name>-<i>.json, and TRACE=1 traces each set).
# Results in $OUT: log.txt, gemv.json, ttft-new-<i>.json, ttft-base-<i>.json, <test>.xml,
# kernel-<build>.json, trace-<new|base>.csv.xz and .json, ncu-<new|base>.csv.xz and
# ncu-<new|base>.json (clocks and caches as the run left them, not locked or flushed by ncu: closer
# to the served step; NCU_BUILDS picks builds, default all).
set -uo pipefail
OUT=${OUT:?set OUT to the output folder}
GPU_DIR=${GPU_DIR:-.gpu-g}
if [[ -f "$GPU_DIR/pack.tar.xz" ]]; then
  rm -rf /tmp/lazyrag-pack && mkdir -p /tmp/lazyrag-pack &&
    tar xJf "$GPU_DIR/pack.tar.xz" -C /tmp/lazyrag-pack
  GPU_DIR=/tmp/lazyrag-pack
fi
[[ -d "$GPU_DIR" ]] || { echo "gpu_gemv_run.sh: no folder $GPU_DIR" >&2; exit 2; }
GPU_DIR=$(cd "$GPU_DIR" && pwd)
ROUNDS=${ROUNDS:-2}
# bin first, then every other folder holding a ttft_bench; "new" names bin in the results.
BUILDS=$(cd "$GPU_DIR" && echo bin && for d in */; do d=${d%/}; [[ $d != bin && $d != lib && $d != tools && -x $d/ttft_bench ]] && echo "$d"; done)
TTFT_ARGS=${TTFT_ARGS:-}
TRACE_ARGS=${TRACE_ARGS:-}
KERNEL_BENCH_ARGS=${KERNEL_BENCH_ARGS:-}
mkdir -p "$OUT"
# The build folders holding an executable $1, and a folder's name in the results (bin: new).
builds_with() { for d in $BUILDS; do [[ -x "$GPU_DIR/$d/$1" ]] && echo "$d"; done; }
build_name() { [[ $1 == bin ]] && echo new || echo "$1"; }
# Runs tool $1 of every build holding it with --out $OUT/$2-<name>$3.json and the other arguments.
run_each() {
  local tool=$1 prefix=$2 suffix=$3 which name
  shift 3
  for which in $(builds_with "$tool"); do
    name=$(build_name "$which")
    echo "== $tool $name$suffix $*"
    timeout 200 "$GPU_DIR/$which/$tool" --out "$OUT/$prefix-$name$suffix.json" "$@"
    echo "$tool $name rc=$?"
  done
}
LIB="$GPU_DIR/lib"
[[ -d "$LIB" ]] || { echo "gpu_gemv_run.sh: no $LIB (bench/dev/gpu_pack.sh writes it)" >&2; exit 2; }
export LD_LIBRARY_PATH="$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{
  echo "== $(date -u +%FT%TZ) builds:$(for d in $BUILDS; do echo -n " $d=$(cat "$GPU_DIR/$d/COMMIT" 2>/dev/null)"; done)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv || true
  if [[ "${TESTS:-1}" == 1 ]]; then
    for t in "$GPU_DIR"/*/*_test; do
      [[ -x "$t" ]] || continue
      name=$(basename "$(dirname "$t")")-$(basename "$t")
      start=$(date +%s)
      timeout "${TEST_TIMEOUT:-240}" "$t" --gtest_brief=1 --gtest_output="xml:$OUT/$name.xml"
      echo "$name rc=$? in $(( $(date +%s) - start )) s"
    done
  fi
  if [[ -x "$GPU_DIR/bin/gemv_bench" && "${GEMV:-1}" == 1 ]]; then
    echo "== gemv_bench"
    timeout 120 "$GPU_DIR/bin/gemv_bench" --out "$OUT/gemv.json"
    echo "gemv_bench rc=$?"
  fi
  sets=()
  [[ -z "${FLAG_SETS:-}" ]] || IFS=';' read -ra sets <<< "$FLAG_SETS"
  for i in $(seq 1 "$ROUNDS"); do
    if [[ ${#sets[@]} -gt 0 ]]; then
      for set in "${sets[@]}"; do
        echo "== ttft_bench ${set%%=*} round $i: ${set#*=} $TTFT_ARGS"
        # shellcheck disable=SC2086
        timeout 200 "$GPU_DIR/bin/ttft_bench" --out "$OUT/ttft-${set%%=*}-$i.json" ${set#*=} $TTFT_ARGS
        echo "ttft_bench ${set%%=*} rc=$?"
      done
    else
      # shellcheck disable=SC2086
      run_each ttft_bench ttft "-$i" $TTFT_ARGS
    fi
  done
  if [[ "${KERNEL_BENCH:-0}" == 1 ]]; then
    # shellcheck disable=SC2086
    run_each kernel_bench kernel "" $KERNEL_BENCH_ARGS
  fi
  if [[ "${TRACE:-0}" == 1 && -f "$GPU_DIR/tools/libkernel_trace.so" ]]; then
    # name:build:flags of each trace: bin with each flag set, or every build as it is.
    traces=()
    if [[ ${#sets[@]} -gt 0 ]]; then
      for set in "${sets[@]}"; do traces+=("${set%%=*}:bin:${set#*=}"); done
    else
      for which in $(builds_with ttft_bench); do traces+=("$(build_name "$which"):$which:"); done
    fi
    for t in "${traces[@]}"; do
      IFS=':' read -r name which flags <<< "$t"
      echo "== kernel trace $name (ttft_bench --profile $flags $TRACE_ARGS)"
      # shellcheck disable=SC2086
      LD_LIBRARY_PATH="$GPU_DIR/tools:$LD_LIBRARY_PATH" \
        CUDA_INJECTION64_PATH="$GPU_DIR/tools/libkernel_trace.so" \
        KERNEL_TRACE_OUT="$OUT/trace-$name.csv" \
        timeout 200 "$GPU_DIR/$which/ttft_bench" --profile $flags $TRACE_ARGS | tail -n 2
      python3 bench/dev/kernel_trace/trace_timeline.py "$OUT/trace-$name.csv" \
        --json "$OUT/trace-$name.json"
      xz -f "$OUT/trace-$name.csv"
    done
  fi
  if [[ "${NCU:-0}" == 1 ]]; then
    ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
    for which in $(builds_with ttft_bench); do
      [[ -n "$ncu" ]] || continue
      name=$(build_name "$which")
      echo "== ncu $name ($ncu)"
      [[ -z "${NCU_BUILDS:-}" || " $NCU_BUILDS " == *" $which "* ]] || continue
      timeout 240 "$ncu" --csv --log-file "$OUT/ncu-$name.csv" --profile-from-start off \
        --clock-control none --cache-control none \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        "$GPU_DIR/$which/ttft_bench" --profile | tail -n 2
      python3 bench/ncu_breakdown.py "$OUT/ncu-$name.csv" --json "$OUT/ncu-$name.json"
      xz -f "$OUT/ncu-$name.csv"
    done
  fi
} 2>&1 | tee "$OUT/log.txt"
