#!/usr/bin/env bash
# Live check of the dashboard and alert rules: a real Prometheus server (Debian's
# `prometheus`) scrapes a local kvstore (and a worker and a router when their binaries are
# built) every second while a short workload runs; then every PromQL expression of
# deploy/grafana/lazyrag.json and deploy/prometheus/alerts.yml is evaluated through
# Prometheus' HTTP API and must return data within its true range (no NaN, ratios in [0, 1];
# tests/deploy/promexprs.py), except expressions over metrics of a process that did not run,
# which are reported as skipped by name. The workload sends one request in each attention mode
# besides the lazy ones: a mode with one request must read a number, not NaN. With a router,
# the worker is then stopped and the LazyragNoHealthyWorker and LazyragErrorRateHigh alerts
# must fire while requests fail: Prometheus loads a copy of the rules whose every `for` is 2 s
# (the expressions are the shipped ones; the durations only delay firing).
#
#   prometheus_live_test.sh --python PY --kvstore BIN --cli BIN [--worker BIN] [--router BIN]
#       --dashboard lazyrag.json --rules alerts.yml
#
# Everything listens on 127.0.0.1 on ports picked at run time; every process this script
# starts is stopped on exit. Bounded: about 20 s, each wait has its own limit.
#
# Contract with the servers: each takes --listen 127.0.0.1:0 --metrics_port 0 --metrics_host
# 127.0.0.1 and prints "lazyrag-NAME ready grpc=HOST:PORT metrics=PORT" once serving (as
# lazyrag-kvstore does). The worker also takes --model, --device cpu, --kvstore,
# --kv_pool_bytes, --host_cache_bytes, --page_size, --max_batch_tokens; the router --workers;
# `lazyrag-cli generate --server ADDR` sends a request to a worker or router. The worker's model
# is $LAZYRAG_MODEL when set, else synthetic:tiny.
set -euo pipefail

python=python3 kvstore="" cli="" worker="" router="" dashboard="" rules=""
while (($#)); do
  case "$1" in
    --python) python=$2 ;;
    --kvstore) kvstore=$2 ;;
    --cli) cli=$2 ;;
    --worker) worker=$2 ;;
    --router) router=$2 ;;
    --dashboard) dashboard=$2 ;;
    --rules) rules=$2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift 2
done
here=$(cd "$(dirname "$0")" && pwd)
exprs="$here/promexprs.py"

skip() { echo "SKIP: $*"; exit 77; }
command -v prometheus >/dev/null || skip "prometheus is not installed (Debian package prometheus)"
"$python" -c 'import yaml' 2>/dev/null || skip "$python has no PyYAML (Debian package python3-yaml)"
[ -x "$kvstore" ] || skip "no lazyrag-kvstore binary"
[ -x "$cli" ] || skip "no lazyrag-cli binary (the kvstore workload needs it)"
[ -n "$worker" ] && [ ! -x "$worker" ] && worker=""
[ -n "$router" ] && [ ! -x "$router" ] && router=""
[ -z "$worker" ] && router=""  # a router needs a worker to route to

tmp=$(mktemp -d "${TMPDIR:-/tmp}/lazyrag-prom-live.XXXXXX")
pids=()
cleanup() {
  local status=$?
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if ((status != 0 && status != 77)); then
    for log in "$tmp"/*.log; do
      [ -f "$log" ] && { echo "--- $(basename "$log") (last lines)"; tail -n 20 "$log"; }
    done
  fi
  rm -rf "$tmp"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# start NAME SECONDS CMD...: runs CMD in the background and waits for its ready line; sets
# grpc_addr and metrics_port from it.
start() {
  local name=$1 seconds=$2
  shift 2
  "$@" >"$tmp/$name.log" 2>&1 &
  pids+=($!)
  local pid=$! line=""
  for _ in $(seq $((seconds * 10))); do
    line=$(grep -m1 ' ready ' "$tmp/$name.log" || true)
    [ -n "$line" ] && break
    kill -0 "$pid" 2>/dev/null || { echo "FAIL: $name exited before it was ready"; exit 1; }
    sleep 0.1
  done
  [ -n "$line" ] || { echo "FAIL: $name printed no ready line within $seconds s"; exit 1; }
  grpc_addr=$(sed -n 's/.*grpc=\([^ ]*\).*/\1/p' <<<"$line")
  metrics_port=$(sed -n 's/.*metrics=\([0-9]*\).*/\1/p' <<<"$line")
  echo "$name: grpc $grpc_addr, metrics 127.0.0.1:$metrics_port"
}

ran=kvstore
# A small capacity so that the workload also evicts.
start kvstore 15 "$kvstore" --listen 127.0.0.1:0 --data_dir "$tmp/kvstore" \
  --capacity_bytes 1000000 --metrics_port 0 --metrics_host 127.0.0.1 --sync_commits=false
kvstore_grpc=$grpc_addr
targets="  - job_name: lazyrag-kvstore
    static_configs: [{targets: ['127.0.0.1:$metrics_port']}]"
server=""
if [ -n "$worker" ]; then
  start worker 60 "$worker" --listen 127.0.0.1:0 --model "${LAZYRAG_MODEL:-synthetic:tiny}" \
    --device cpu --kvstore "$kvstore_grpc" --kv_pool_bytes 67108864 --host_cache_bytes 16777216 \
    --page_size 16 --max_batch_tokens 2048 --metrics_port 0 --metrics_host 127.0.0.1
  server=$grpc_addr
  worker_pid=${pids[-1]}
  ran+=,worker
  targets+="
  - job_name: lazyrag-worker
    static_configs: [{targets: ['127.0.0.1:$metrics_port']}]"
fi
if [ -n "$router" ]; then
  start router 15 "$router" --listen 127.0.0.1:0 --workers "$server" --metrics_port 0 \
    --metrics_host 127.0.0.1
  server=$grpc_addr
  ran+=,router
  targets+="
  - job_name: lazyrag-router
    static_configs: [{targets: ['127.0.0.1:$metrics_port']}]"
fi

prom_port=$("$python" "$exprs" free-port)
sed -E 's/^([[:space:]]*for:[[:space:]]*).*/\12s/' "$rules" >"$tmp/alerts-fast.yml"
cat >"$tmp/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: ['$tmp/alerts-fast.yml']
scrape_configs:
$targets
EOF
prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" --log.level=warn >"$tmp/prometheus.log" 2>&1 &
pids+=($!)
url="http://127.0.0.1:$prom_port"
"$python" "$exprs" wait-ready "$url/-/ready" 20 || { echo "FAIL: Prometheus did not start"; exit 1; }
ntargets=$(tr ',' '\n' <<<"$ran" | wc -l)
"$python" "$exprs" wait-scraped "$url" "$ntargets" 20 || { echo "FAIL: no scrapes"; exit 1; }
echo "prometheus: $url, scraping $ran every 1 s"

# Workload, about 6 s: kvstore puts (evicting), gets and stats; requests through the router
# (or the worker) when they run. Every command must succeed (its messages go to cli.log).
head -c 300000 /dev/urandom >"$tmp/value"
printf 'Paris is the capital of France. It lies on the Seine.\n' >"$tmp/doc1.txt"
printf 'Lyon is a city in France, at the Rhone and the Saone.\n' >"$tmp/doc2.txt"
end=$((SECONDS + 6))
i=0
exec 3>&2 2>>"$tmp/cli.log"
while ((SECONDS < end)); do
  key="live-$((i % 6))"
  "$cli" kv put --kvstore "$kvstore_grpc" --key "$key" --file "$tmp/value" --timeout_s 10
  "$cli" kv get --kvstore "$kvstore_grpc" --key "$key" --file "$tmp/got" --timeout_s 10
  "$cli" kv stat --kvstore "$kvstore_grpc" --key "$key" --key missing-key --timeout_s 10 >/dev/null
  if [ -n "$server" ]; then
    "$cli" generate --server "$server" --doc "$tmp/doc1.txt" --doc "$tmp/doc2.txt" \
      --query "Which river runs through Paris? ($i)" --max_tokens 4 >/dev/null
  fi
  i=$((i + 1))
done
if [ -n "$server" ]; then  # one request in each other mode
  for mode in materialize prefix full; do
    "$cli" generate --server "$server" --doc "$tmp/doc1.txt" --doc "$tmp/doc2.txt" \
      --query "Which river runs through Lyon? ($mode)" --mode "$mode" --max_tokens 4 >/dev/null
  done
fi
exec 2>&3 3>&-
echo "workload: $i rounds"
sleep 3  # three more scrapes

"$python" "$exprs" eval --url "$url" --ran "$ran" --window 1m --dashboard "$dashboard" \
  --rules "$rules"
if [ -n "$worker" ]; then
  # Every mode served one request or more: its quantiles and request rate are numbers.
  q='histogram_quantile(0.5, sum by (le, mode) (rate(lazyrag_NAME_bucket[1m])))'
  "$python" "$exprs" expect-finite --url "$url" --series 4 \
    --query "${q/NAME/time_to_first_token_seconds}" --query "${q/NAME/queue_time_seconds}" \
    --query 'sum by (mode) (rate(lazyrag_requests_finished_total[1m])) > 0'
fi
if [ -n "$router" ]; then
  # The worker stops; requests through the router fail; the router ejects the worker.
  kill -TERM "$worker_pid"
  for _ in $(seq 50); do kill -0 "$worker_pid" 2>/dev/null || break; sleep 0.1; done
  end=$((SECONDS + 4))
  while ((SECONDS < end)); do
    "$cli" generate --server "$server" --doc "$tmp/doc1.txt" --query "Anyone there?" \
      --max_tokens 2 --timeout_s 5 >/dev/null 2>>"$tmp/cli.log" || true
    sleep 0.2
  done
  "$python" "$exprs" wait-alerts --url "$url" --firing \
    --alerts LazyragNoHealthyWorker,LazyragErrorRateHigh 30
fi
