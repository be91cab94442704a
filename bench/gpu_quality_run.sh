#!/usr/bin/env bash
# rag_qa_bench on the GPU machine (issue 25's quality sets), with the real model. The SmolLM2
# GGUF (98 MB) is larger than what one device call carries beside the tree (64 MiB in all, the
# tracked tree ~19 MB), so it travels in three parts over three calls to one warm machine (the
# machine keeps /tmp between calls for ~30 s): `part` stashes a part in /tmp/lazyrag-model,
# `run` joins them, checks the SHA-256 and runs every set side by side (no host tier, so they
# fit), writing $OUT/log.txt and $OUT/quality.tgz (each set's .json, .out and .progress.log).
#
# Packing here (no GPU needed):
#   bash bench/gpu_quality_run.sh pack [MODEL] [BUILD]   # MODEL: the cached SmolLM2 GGUF
#     -> .gpu-q1/part (43 MB), .gpu-q2/part (43 MB), .gpu-q/ (rag_qa_bench, its libraries, the
#        model's last part and SHA-256, the 300-question splits of make_quality_sets.py --large)
# Then three device calls, each started as soon as the last returns (within ~30 s):
#   carry [".gpu-q1"]: bash bench/gpu_quality_run.sh part .gpu-q1
#   carry [".gpu-q2"]: bash bench/gpu_quality_run.sh part .gpu-q2
#   carry [".gpu-q"]:  OUT=$OUT bash bench/gpu_quality_run.sh run
# Knobs of `run`: SETS (names under .gpu-q/sets without .jsonl; default the four large splits),
# CONFIGS (rag_qa_bench --configs; default full,lazy,lazy:d=1,lazy:k=8,lazy:k=16,lazy:k=32),
# FLAGS (more rag_qa_bench flags, e.g. "--shared_prefix template"), TIMEOUT (s per set, 500),
# DEVICE (cuda; cpu checks the script here).
set -uo pipefail
here=.gpu-q
stash=/tmp/lazyrag-model
case "${1:-}" in
  pack)
    model=${2:-$HOME/.cache/lazyrag/SmolLM2-135M-Instruct.Q4_1.gguf}
    build=${3:-build}
    set -e
    rm -rf "$here" .gpu-q1 .gpu-q2
    mkdir -p "$here/bin" .gpu-q1 .gpu-q2
    cp "$build/bench/rag_qa_bench" "$here/bin/" && strip "$here/bin/rag_qa_bench"
    ../shared/device/collect-libs.sh "$here/lib" "$here/bin/rag_qa_bench"
    tar cJf "$here/lib.tar.xz" -C "$here" lib && rm -rf "${here:?}/lib"
    dd if="$model" of=.gpu-q1/part bs=1000000 count=43 status=none
    dd if="$model" of=.gpu-q2/part bs=1000000 skip=43 count=43 status=none
    dd if="$model" of="$here/part" bs=1000000 skip=86 status=none
    sha256sum "$model" | cut -c1-64 > "$here/model.sha256"
    python3 bench/rag_qa/make_quality_sets.py --large "$here/sets" --questions 300
    git rev-parse --short HEAD > "$here/COMMIT"
    git status --porcelain --untracked-files=no | head -n 20 > "$here/DIRTY"
    du -sh "$here" .gpu-q1 .gpu-q2
    ;;
  part)
    d=$(basename "${2:?part DIR}") && mkdir -p "$stash" && cp "$2/part" "$stash/${d#.}" && ls -l "$stash"
    ;;
  run)
    OUT=${OUT:?set OUT to the output folder}
    mkdir -p "$OUT" /tmp/lazyrag-quality /tmp/lazyrag-quality-lib
    tar xJf "$here/lib.tar.xz" -C /tmp/lazyrag-quality-lib
    export LD_LIBRARY_PATH=/tmp/lazyrag-quality-lib/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    model=$stash/model.gguf
    cat "$stash/gpu-q1" "$stash/gpu-q2" "$here/part" > "$model"
    got=$(sha256sum "$model" | cut -c1-64)
    if [[ "$got" != "$(cat "$here/model.sha256")" ]]; then
      echo "model SHA-256 $got differs from the packed one: were both parts stashed?" | tee "$OUT/log.txt"
      exit 1
    fi
    sets=${SETS:-single_hop_dev_large single_hop_test_large multi_hop_dev_large multi_hop_test_large}
    configs=${CONFIGS:-full,lazy,lazy:d=1,lazy:k=8,lazy:k=16,lazy:k=32}
    q=/tmp/lazyrag-quality
    {
      echo "== $(date -u +%FT%TZ) binaries of $(cat "$here/COMMIT") dirty: $(tr '\n' ' ' < "$here/DIRTY")"
      echo "configs $configs flags ${FLAGS:-}"
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv || true
      for s in $sets; do
        # shellcheck disable=SC2086
        (timeout "${TIMEOUT:-500}" "$here/bin/rag_qa_bench" --model "$model" --device "${DEVICE:-cuda}" \
           --max_tokens 24 --commit "$(cat "$here/COMMIT")" --sets "$here/sets/$s.jsonl" \
           --configs "$configs" --out "$q/$s.json" ${FLAGS:-} > "$q/$s.out" 2> "$q/$s.progress.log"
         echo "$s: exit $? at $(date -u +%T)") &
      done
      wait
      for s in $sets; do echo "== $s"; tail -n 14 "$q/$s.out"; done
    } 2>&1 | tee "$OUT/log.txt"
    (cd "$q" && shopt -s nullglob && tar czf "$OUT/quality.tgz" ./*.json ./*.out ./*.progress.log)
    ;;
  *)
    echo "usage: $0 pack [MODEL] [BUILD] | part DIR | run" >&2
    exit 2
    ;;
esac
