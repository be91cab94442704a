#!/usr/bin/env bash
# Packs builds of several commits for one bench/gpu_gemv_run.sh call (issue 29's A/B calls):
#
#   bench/dev/gpu_pack.sh DIR NAME=REF:TARGET[,TARGET...] [NAME=REF:TARGETS ...]
#
# e.g.  bench/dev/gpu_pack.sh .gpu-y bin=wip/o-wgmma:cuda_backend_test,ttft_bench \
#           base=main:ttft_bench,kernel_bench
# Each REF is built in its own detached worktree under $WORKTREES (default
# /tmp/lazyrag-worktrees/NAME, Release, Ninja; kept, so a second pack rebuilds incrementally),
# never in this checkout; its TARGETs' executables go stripped into NAME/ with NAME/COMMIT.
# The kernel trace tool (bench/dev/kernel_trace, built from the first REF) and libcupti go into
# tools/, the non-CUDA libraries all of them need into lib/ (../shared/device/collect-libs.sh),
# and everything into DIR/pack.tar.xz, which gpu_gemv_run.sh unpacks (bin is the build it
# names "new"; every other folder holding a ttft_bench is a build beside it). Needs the
# packages ./deploy/local/bootstrap.sh installs; COLLECT_LIBS names collect-libs.sh where this
# checkout has no ../shared. Prints the pack's size (a call carries 64 MiB at most).
set -euo pipefail
dir=${1:?usage: gpu_pack.sh DIR NAME=REF:TARGET[,TARGET...] ...}
shift
[[ $# -gt 0 ]] || { echo "gpu_pack.sh: no builds named" >&2; exit 2; }
repo=$(git rev-parse --show-toplevel)
worktrees=${WORKTREES:-/tmp/lazyrag-worktrees}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/tools" "$worktrees"
first=1
for spec in "$@"; do
  if [[ ! $spec =~ ^([A-Za-z0-9_-]+)=([^:]+):([A-Za-z0-9_,-]+)$ ]]; then
    echo "gpu_pack.sh: '$spec' is not NAME=REF:TARGET[,TARGET...]" >&2
    exit 2
  fi
  name=${BASH_REMATCH[1]} ref=${BASH_REMATCH[2]} targets=${BASH_REMATCH[3]//,/ }
  [[ $name != lib && $name != tools ]] || { echo "gpu_pack.sh: '$name' is reserved" >&2; exit 2; }
  commit=$(git -C "$repo" rev-parse --verify "$ref^{commit}")
  wt=$worktrees/$name
  if [[ -d $wt ]]; then
    git -C "$wt" checkout -q --detach "$commit"
  else
    git -C "$repo" worktree add -q --detach "$wt" "$commit"
  fi
  [[ -f $wt/build/build.ninja ]] ||
    cmake -S "$wt" -B "$wt/build" -G Ninja -DCMAKE_BUILD_TYPE=Release > "$wt/configure.log"
  extra=$([[ $first == 1 ]] && echo kernel_trace || true)
  # shellcheck disable=SC2086
  cmake --build "$wt/build" -j"$(nproc)" --target $targets $extra | tail -n 1
  mkdir -p "$stage/$name"
  for t in $targets; do
    exe=$(find "$wt/build" -type f -name "$t" -perm -u+x -print -quit)
    [[ -n $exe ]] || { echo "gpu_pack.sh: no executable $t in $wt/build" >&2; exit 1; }
    cp "$exe" "$stage/$name/" && strip "$stage/$name/$t"
  done
  git -C "$repo" rev-parse --short "$commit" > "$stage/$name/COMMIT"
  if [[ $first == 1 ]]; then
    cp "$(find "$wt/build" -name libkernel_trace.so -print -quit)" "$stage/tools/"
    cp -L /usr/local/cuda/lib64/libcupti.so.13 "$stage/tools/"
    first=0
  fi
  echo "$name = $ref ($(cat "$stage/$name/COMMIT")): $targets"
done
collect=${COLLECT_LIBS:-$repo/../shared/device/collect-libs.sh}
# shellcheck disable=SC2046
"$collect" "$stage/lib" $(find "$stage" -mindepth 2 -type f -perm -u+x -not -path "$stage/tools/*")
mkdir -p "$dir"
tar cJf "$dir/pack.tar.xz" -C "$stage" .
echo "gpu_pack.sh: $(du -h "$dir/pack.tar.xz" | cut -f1) in $dir/pack.tar.xz"
