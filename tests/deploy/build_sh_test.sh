#!/usr/bin/env bash
# deploy/docker/build.sh (issue 27): --dry-run prints one build per image, tagged
# lazyrag/NAME:VERSION and lazyrag/NAME:VERSION-COMMIT with VERSION = CMake's PROJECT_VERSION;
# without docker or podman (and no --dry-run) it exits 1 with a clear message.
#   build_sh_test.sh BUILD_SH PROJECT_VERSION
set -u
build_sh=$1 version=$2
root=$(cd "$(dirname "$build_sh")/../.." && pwd)
fail=0
err() { echo "FAIL: $*"; fail=1; }

commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo nogit)
out=$("$build_sh" --dry-run --engine podman) || err "build.sh --dry-run exited $?"
echo "$out"
[ "$(grep -c '^podman build ' <<<"$out")" = 3 ] || err "want 3 'podman build' lines"
for c in kvstore worker router; do
  line=$(grep -- "-f $root/deploy/docker/$c.Dockerfile " <<<"$out") || { err "no build of $c"; continue; }
  grep -q -- "-t lazyrag/$c:$version " <<<"$line" || err "$c not tagged lazyrag/$c:$version"
  grep -Eq -- "-t lazyrag/$c:$version-$commit(-dirty)? " <<<"$line" || err "$c not tagged lazyrag/$c:$version-$commit"
done
# The chart pulls the same tag by default.
chart_tag=$(sed -n 's/^  tag: "\(.*\)"$/\1/p' "$root/deploy/helm/lazyrag/values.yaml" | head -1)
[ "$chart_tag" = "$version" ] || err "values.yaml image.tag '$chart_tag' is not the project version $version"
out=$("$build_sh" --dry-run --registry reg.example/ --only router --push -- --build-arg A=1)
grep -q -- "-t reg.example/lazyrag/router:$version .*--build-arg A=1 $root\$" <<<"$out" || err "--registry/extra args: $out"
[ "$(grep -c '^docker push reg.example/lazyrag/router:' <<<"$out")" = 2 ] || err "--push: $out"

# No container engine on PATH: a clear message, exit 1.
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
for tool in bash sed git head dirname cat; do
  p=$(command -v "$tool") && ln -s "$p" "$bin/$tool"
done
msg=$(PATH=$bin "$bin/bash" "$build_sh" 2>&1)
rc=$?
[ "$rc" = 1 ] && grep -q "neither docker nor podman" <<<"$msg" || err "without an engine: rc $rc, $msg"
[ "$fail" = 0 ] && echo "ok: build.sh tags lazyrag/NAME:$version and :$version-$commit"
exit $fail
