#!/usr/bin/env bash
# Builds the three images and tags each with the project version (CMakeLists.txt
# `project(lazyrag VERSION X.Y.Z ...)`, also the chart's default image.tag) and with
# VERSION-COMMIT (git short commit; "-dirty" appended when the tree has changes):
#
#   lazyrag/kvstore:0.1.0  lazyrag/kvstore:0.1.0-abc1234   (and worker, router)
#
# The repositories are the chart's defaults (values.yaml KVSTORE/WORKER/ROUTER image.repository).
#
#   deploy/docker/build.sh [--dry-run] [--push] [--registry PREFIX] [--engine docker|podman]
#                          [--only kvstore,worker,router] [-- EXTRA BUILD ARGS...]
#
#   --dry-run         print the commands, run nothing (needs no container engine)
#   --push            push both tags of every image after building it
#   --registry P      prefix of every repository, e.g. registry.example.com/ (the chart's
#                     image.registry; keep the trailing slash)
#   --engine E        docker or podman (default: docker if installed, else podman)
#   --only LIST       build only these images (comma-separated)
#   -- ARGS           passed to every `build`, e.g. -- --build-arg CUDA_ARCHITECTURES=90a
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dry_run=0 push=0 registry="" engine="" only="kvstore,worker,router"
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --push) push=1 ;;
    --registry) registry=${2:?--registry needs a value}; shift ;;
    --registry=*) registry=${1#*=} ;;
    --engine) engine=${2:?--engine needs a value}; shift ;;
    --engine=*) engine=${1#*=} ;;
    --only) only=${2:?--only needs a value}; shift ;;
    --only=*) only=${1#*=} ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//; s/^#$//'; exit 0 ;;
    *) echo "build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

version=$(sed -n 's/^project(lazyrag[[:space:]]\{1,\}VERSION[[:space:]]\{1,\}\([0-9][0-9.]*\).*/\1/p' \
  "$root/CMakeLists.txt" | head -1)
if [ -z "$version" ]; then
  echo "build.sh: no project(lazyrag VERSION ...) in $root/CMakeLists.txt" >&2
  exit 1
fi
if commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null); then
  if [ -n "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    commit="$commit-dirty"
  fi
else
  commit=nogit
fi

if [ -z "$engine" ]; then
  for candidate in docker podman; do
    if command -v "$candidate" >/dev/null 2>&1; then engine=$candidate; break; fi
  done
fi
if [ -z "$engine" ]; then
  if [ "$dry_run" = 1 ]; then
    engine=docker  # only printed
  else
    echo "build.sh: neither docker nor podman is installed; install one, or run with --dry-run" \
         "to print the build commands" >&2
    exit 1
  fi
fi

if [ "$dry_run" = 0 ] && ! "$engine" info >/dev/null 2>&1; then
  echo "build.sh: $engine is installed but does not answer ($engine info fails: is its daemon or" \
       "socket running?); or run with --dry-run to print the build commands" >&2
  exit 1
fi

run() {
  printf '%q ' "$@" | sed 's/ $//'
  echo
  if [ "$dry_run" = 0 ]; then "$@"; fi
}

IFS=, read -r -a components <<<"$only"
for c in "${components[@]}"; do
  case "$c" in kvstore|worker|router) ;; *) echo "build.sh: unknown image $c" >&2; exit 2 ;; esac
  repo="${registry}lazyrag/$c"
  run "$engine" build -f "$root/deploy/docker/$c.Dockerfile" \
    -t "$repo:$version" -t "$repo:$version-$commit" \
    --label "org.opencontainers.image.version=$version" \
    --label "org.opencontainers.image.revision=$commit" \
    ${extra[@]+"${extra[@]}"} "$root"
  if [ "$push" = 1 ]; then
    run "$engine" push "$repo:$version"
    run "$engine" push "$repo:$version-$commit"
  fi
done
