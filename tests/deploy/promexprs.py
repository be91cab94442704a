#!/usr/bin/env python3
"""PromQL expressions of the Grafana dashboard and the alert rules, for the deploy tests.

    promexprs.py names --design DESIGN.md --dashboard lazyrag.json --rules alerts.yml
        Every metric and label name the expressions use must be one of DESIGN.md section 7
        (or one of the documented extras below: kvstore, worker, router, every server). Label
        values the expressions match on (tier, outcome, state, ...) must be ones the servers
        export (ALLOWED_VALUES). Exit 0 ok, 1 not, 77 when DESIGN.md is missing.
    promexprs.py eval --url http://127.0.0.1:PORT --dashboard ... --rules ... --ran kvstore,worker
        Evaluates every expression through Prometheus' HTTP API (/api/v1/query). Expressions
        whose metrics all come from processes that ran must return data; the others are
        reported as skipped by name. Dashboard queries get a fixed window in place of
        $__rate_interval and ".*" for $model and $instance; alert expressions get `bool` after
        each comparison with a number, so they return their quantities whether or not the
        alert fires (the unmodified expression must evaluate too). Every value must lie in its
        true range: no NaN (except a quantile of a histogram with no observations in the
        window), nothing negative, [0, 1] for percentunit panels, 0 or 1 for alert
        expressions.
    promexprs.py expect-finite --url URL --series N --query Q [--query Q ...]
        Each query must return N series or more, every value a number (not NaN).
    promexprs.py wait-alerts --url URL --alerts A,B [--firing] SECONDS
        Waits until Prometheus reports every named alert pending or firing (--firing: firing).
    promexprs.py wait-ready URL SECONDS     polls URL until it answers 200.
    promexprs.py wait-scraped URL N SECONDS waits until Prometheus scraped N targets.
    promexprs.py free-port                  prints a free TCP port on 127.0.0.1.
"""
import argparse
import json
import math
import re
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

# The kvstore exports these besides the DESIGN section 7 names (kvstore/kvstore_metrics.cc).
KVSTORE_EXTRAS = {"lazyrag_kvstore_capacity_bytes", "lazyrag_kvstore_corruptions_total",
                  "lazyrag_kvstore_transferred_bytes_total"}
# The worker's host-memory tier (worker/engine/engine_metrics.cc), which DESIGN section 7 names
# only through doc_cache_hits_total{tier="host"}; the *_seconds ones are histograms.
WORKER_EXTRAS = {"lazyrag_host_cache_bytes", "lazyrag_host_cache_capacity_bytes",
                 "lazyrag_host_cache_entries",
                 "lazyrag_host_cache_promotions_total", "lazyrag_host_cache_demotions_total",
                 "lazyrag_host_cache_checksum_failures_total",
                 "lazyrag_host_cache_promotion_seconds", "lazyrag_host_cache_demotion_seconds"}
# Also the worker's: queue time (arrival to first admission) and dropped write-backs.
WORKER_EXTRAS |= {"lazyrag_queue_time_seconds", "lazyrag_kvstore_writeback_dropped_total",
                  "lazyrag_requests_finished_total", "lazyrag_doc_computed_total",
                  "lazyrag_doc_computed_tokens_total", "lazyrag_kv_pool_evictions_total",
                  "lazyrag_preemptions_total"}
# The router's own (router/router_metrics.h).
ROUTER_EXTRAS = {"lazyrag_router_workers", "lazyrag_router_time_to_first_token_seconds"}
# Every server's /metrics (common/metrics.h: AppendBuildInfo, AppendProcessMetrics).
COMMON_EXTRAS = {"lazyrag_build_info", "process_resident_memory_bytes",
                 "process_virtual_memory_bytes", "process_cpu_seconds_total", "process_open_fds",
                 "process_max_fds", "process_start_time_seconds"}
# Every server's refused calls and token-file rereads (common/auth.h: AuthMetrics), at 0 also
# without --auth_tokens_file.
COMMON_EXTRAS |= {"lazyrag_auth_failures_total", "lazyrag_auth_token_reloads_total"}
EXTRA_LABELS = {"where", "direction", "state", "outcome", "version", "commit", "reason",
                "result"}
# Values the servers export for the labels expressions match on; a matcher on another value
# (a typo, a renamed tier) is an error. tier: the KV pool's tier is named by its device
# ("gpu" on cuda, "cpu" on cpu), then the host tier, another worker of the host, the kvstore.
ALLOWED_VALUES = {
    "tier": {"gpu", "cpu", "host", "peer", "store"},
    "state": {"free", "used", "pinned", "healthy", "ejected"},
    "outcome": {"length", "stop", "eos", "cancelled", "invalid_argument", "resource_exhausted",
                "deadline_exceeded", "unavailable", "internal",  # worker
                "ok", "retried", "failed", "error"},  # router
    "worker": {"none"},
    "reason": {"unauthenticated", "permission_denied"},  # lazyrag_auth_failures_total
    "job": {"lazyrag-kvstore", "lazyrag-worker", "lazyrag-router"},
}
# Labels Prometheus adds or that histograms have.
BUILTIN_LABELS = {"job", "instance", "le", "__name__"}
BUILTIN_METRICS = {"up"}  # Prometheus' own per-target series

# Which process exports a metric; anything else lazyrag_* is the worker's.
KVSTORE_METRICS = {"lazyrag_kvstore_entries", "lazyrag_kvstore_bytes",
                   "lazyrag_kvstore_evictions_total", "lazyrag_kvstore_requests_total"} | KVSTORE_EXTRAS

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
            "unless", "bool", "offset", "inf", "nan"}


def design_names(path):
    """Metric names (with lazyrag_) and label names of DESIGN.md section 7."""
    text = open(path, encoding="utf-8").read()
    m = re.search(r"^## 7\..*?$(.*?)^## ", text, re.S | re.M)
    if not m:
        raise SystemExit(f"{path}: no section 7")
    section = m.group(1)
    metrics, labels = set(), set()
    # "Labels `mode` and `model` where they apply."
    for pair in re.findall(r"Labels?\s+`(\w+)`\s+and\s+`(\w+)`", section):
        labels.update(pair)
    for token in re.findall(r"`([^`]+)`", section):
        name, _, rest = token.partition("{")
        for label in rest.rstrip("}").split(","):
            if label.strip():
                labels.add(label.split("=")[0].strip())
        if re.fullmatch(r"[a-z_]+", name) and name != "lazyrag_" and name not in labels:
            metrics.add(name if name.startswith("lazyrag_") else "lazyrag_" + name)
    return metrics, labels


def histogram_series(metrics):
    """Histograms (the *_seconds names, DESIGN says histograms are in seconds) expose
    _bucket, _sum and _count series."""
    out = set(metrics)
    for m in metrics:
        if m.endswith("_seconds"):
            out |= {m + "_bucket", m + "_sum", m + "_count"}
    return out


def load_expressions(dashboard_path, rules_path):
    """[(name, expr, kind, unit)] with kind "dashboard" or "alert", unit the panel's."""
    out = []
    dashboard = json.load(open(dashboard_path, encoding="utf-8"))

    def panels(items):
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    for p in panels(dashboard.get("panels", [])):
        for t in p.get("targets", []):
            if t.get("expr"):
                unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
                out.append((f'panel "{p["title"]}" {t.get("refId", "")}', t["expr"], "dashboard",
                            unit))
    import yaml  # PyYAML (Debian python3-yaml)
    rules = yaml.safe_load(open(rules_path, encoding="utf-8"))
    for group in rules["groups"]:
        for r in group["rules"]:
            name = r.get("alert") or r.get("record")
            out.append((f"rule {name}", r["expr"], "alert" if "alert" in r else "record", ""))
    return out


def strip_strings(expr):
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)


def metric_and_label_names(expr):
    """Metric names and label names an expression uses."""
    e = strip_strings(expr)
    labels = set()
    for block in re.findall(r"\{([^}]*)\}", e):
        labels |= set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", block))
    for kw in ("by", "without", "on", "ignoring", "group_left", "group_right"):
        for block in re.findall(rf"\b{kw}\s*\(([^)]*)\)", e):
            labels |= {x.strip() for x in block.split(",") if x.strip()}
    # Remove what is not a metric name: matchers, ranges, grouping clauses, numbers.
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    metrics = set()
    for m in re.finditer(r"(?<![\w.$])([A-Za-z_:][\w:]*)(\s*\()?", e):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in KEYWORDS:
            continue
        metrics.add(name)
    return metrics, labels


def cmd_names(args):
    try:
        design_metrics, design_labels = design_names(args.design)
    except FileNotFoundError:
        print(f"SKIP: {args.design} not found (shared/DESIGN.md beside the repository)")
        return 77
    allowed = (histogram_series(design_metrics) | KVSTORE_EXTRAS | histogram_series(WORKER_EXTRAS)
               | histogram_series(ROUTER_EXTRAS) | COMMON_EXTRAS | BUILTIN_METRICS)
    allowed_labels = design_labels | EXTRA_LABELS | BUILTIN_LABELS
    print(f"DESIGN section 7: {len(design_metrics)} metrics, labels {sorted(design_labels)}")
    bad = 0
    exprs = load_expressions(args.dashboard, args.rules)
    used = set()
    for name, expr, _, _ in exprs:
        metrics, labels = metric_and_label_names(expr)
        if not metrics:
            print(f"FAIL {name}: no metric name found in {expr!r}")
            bad += 1
        used |= metrics
        for m in sorted(metrics - allowed):
            print(f"FAIL {name}: metric {m} is not in DESIGN.md section 7")
            bad += 1
        for label in sorted(labels - allowed_labels):
            print(f"FAIL {name}: label {label} is not in DESIGN.md section 7")
            bad += 1
        for label, value in matched_values(expr):
            if label in ALLOWED_VALUES and not value <= ALLOWED_VALUES[label]:
                print(f"FAIL {name}: {label} value(s) {sorted(value - ALLOWED_VALUES[label])} "
                      f"are not exported (allowed: {sorted(ALLOWED_VALUES[label])})")
                bad += 1
    print(f"{len(exprs)} expressions, metrics used: {' '.join(sorted(used))}")
    unused = sorted(m for m in design_metrics if not any(u.startswith(m) for u in used))
    if unused:
        print(f"note: DESIGN metrics no expression uses: {' '.join(unused)}")
    print(f"names of {len(exprs)} expressions: {'FAILED' if bad else 'ok'}")
    return 1 if bad else 0


def matched_values(expr):
    """(label, {values}) of every matcher with a literal or a plain alternation (a|b)."""
    out = []
    for block in re.findall(r"\{([^}]*)\}", expr):
        for label, value in re.findall(r'([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)\s*"([^"]*)"', block):
            if value.startswith("$") or not re.fullmatch(r"[\w.-]+(\|[\w.-]+)*", value):
                continue
            out.append((label, set(value.split("|"))))
    return out


def components(expr):
    """Processes whose metrics an expression needs."""
    metrics, _ = metric_and_label_names(expr)
    out = set()
    for m in metrics:
        if m in COMMON_EXTRAS:
            out.add("kvstore")  # every server exports them; the kvstore always runs
        elif m == "up":
            out |= set(re.findall(r'job\s*=~?\s*"lazyrag-(\w+)"', expr)) or {"kvstore"}
        elif m.startswith("lazyrag_router_"):
            out.add("router")
        elif m in KVSTORE_METRICS:
            out.add("kvstore")
        else:
            out.add("worker")
    return out


def with_bool(expr):
    """Puts `bool` after every comparison with a number literal: the comparison then keeps
    every series (0 or 1) instead of filtering."""
    return re.sub(r"(==|!=|>=|<=|>|<)(?!\s*bool\b)(\s*)(?=[-+]?[0-9.])", r"\1 bool\2", expr)


def query(url, expr):
    q = urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=10) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        return json.load(e)


def out_of_range(expr, kind, unit, result, observed=lambda bucket: True):
    """Why the values of `result` are not in the true range of the expression ([] if they are).
    A quantile of a histogram is NaN for a label set with no observations in the window (a
    mode no request used); at least one of its series must be a number. Nothing else may be
    NaN: the servers create their series at zero, so every ratio's denominator counts.
    `observed(bucket_metric)`: whether that histogram had observations in the window (a
    quantile of a histogram without any may be NaN throughout)."""
    problems = []
    values = [(s["metric"], float(s["value"][1])) for s in result]
    quantile = "histogram_quantile" in expr
    nan = [m for m, v in values if math.isnan(v)]
    if nan and not quantile:
        problems.append(f"NaN for {nan}")
    if quantile and len(nan) == len(values):
        buckets = re.findall(r"\b(\w+_bucket)\b", expr)
        if any(observed(b) for b in buckets):
            problems.append("every series NaN although the histogram has observations")
    for m, v in values:
        if math.isnan(v):
            continue
        if v < 0:
            problems.append(f"{v} < 0 for {m}")
        if kind == "dashboard" and unit == "percentunit" and v > 1:
            problems.append(f"ratio {v} > 1 for {m}")
        if kind == "alert" and v not in (0.0, 1.0):
            problems.append(f"comparison {v} is not 0 or 1 for {m}")
    return problems


def cmd_eval(args):
    ran = set(x for x in args.ran.split(",") if x)
    passed = failed = 0
    skipped = []
    for name, expr, kind, unit in load_expressions(args.dashboard, args.rules):
        need = components(expr)
        live = (expr.replace("$__rate_interval", args.window).replace("$model", ".*")
                .replace("$instance", ".*"))
        if kind == "alert":
            original = query(args.url, live)
            if original.get("status") != "success":
                print(f"FAIL {name}: {original.get('error')}\n     {live}")
                failed += 1
                continue
            live = with_bool(live)
        if not need <= ran:
            skipped.append(f"{name} (needs {','.join(sorted(need - ran))})")
            continue
        answer = query(args.url, live)
        if answer.get("status") != "success":
            print(f"FAIL {name}: {answer.get('error')}\n     {live}")
            failed += 1
            continue
        result = answer["data"]["result"]
        if not result:
            print(f"FAIL {name}: no data\n     {live}")
            failed += 1
            continue
        def observed(bucket):
            count = bucket[:-len("_bucket")] + "_count"
            r = query(args.url, f"sum(increase({count}[{args.window}])) > 0")
            return bool(r.get("data", {}).get("result"))

        problems = out_of_range(expr, kind, unit, result, observed)
        if problems:
            print(f"FAIL {name}: {'; '.join(problems)}\n     {live}")
            failed += 1
            continue
        print(f"ok   {name}: {len(result)} series, e.g. {result[0]['metric']} = "
              f"{result[0]['value'][1]}")
        passed += 1
    # The live server loaded the rule file and evaluates every rule without error.
    with urllib.request.urlopen(f"{args.url}/api/v1/rules", timeout=10) as r:
        groups = json.load(r)["data"]["groups"]
    loaded = [rule for g in groups for rule in g["rules"]]
    broken = [f"{rule['name']}: {rule.get('lastError')}" for rule in loaded
              if rule.get("health") == "err"]
    if not loaded or broken:
        print(f"FAIL Prometheus loaded {len(loaded)} rules; failing: {broken}")
        failed += 1
    else:
        print(f"ok   Prometheus loaded {len(loaded)} rules, none failing")
    for s in skipped:
        print(f"skip {s}")
    print(f"{passed} passed, {failed} failed, {len(skipped)} skipped")
    return 1 if failed or not passed else 0


def cmd_expect_finite(args):
    """Each query returns at least args.series series, every value a number."""
    bad = 0
    for q in args.query:
        answer = query(args.url, q)
        result = answer.get("data", {}).get("result", [])
        values = {json.dumps(s["metric"], sort_keys=True): float(s["value"][1]) for s in result}
        nan = [m for m, v in values.items() if not math.isfinite(v)]
        if answer.get("status") != "success" or len(values) < args.series or nan:
            print(f"FAIL {q}: {len(values)} series (want {args.series}), not numbers: {nan} "
                  f"{answer.get('error', '')}")
            bad += 1
        else:
            print(f"ok   {q}: {len(values)} series, all numbers")
    return 1 if bad else 0


def cmd_wait_alerts(args):
    """Waits until every alert of args.alerts is pending or firing, or with args.firing firing
    (the live test loads the rules with their `for` shortened, so firing is reached)."""
    want = set(a for a in args.alerts.split(",") if a)
    states = ("firing",) if args.firing else ("pending", "firing")
    deadline = time.monotonic() + args.seconds
    seen = {}
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{args.url}/api/v1/alerts", timeout=10) as r:
            alerts = json.load(r)["data"]["alerts"]
        seen = {a["labels"]["alertname"]: a["state"] for a in alerts
                if a["state"] in states}
        if want <= set(seen):
            for a in sorted(want):
                print(f"ok   alert {a} {seen[a]}")
            return 0
        time.sleep(0.5)
    print(f"FAIL alerts not {' or '.join(states)} after {args.seconds} s: "
          f"{sorted(want - set(seen))} (active: {seen})")
    return 1


def cmd_wait_ready(args):
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(args.url, timeout=2) as r:
                if r.status == 200:
                    return 0
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.2)
    print(f"{args.url} not ready after {args.seconds} s", file=sys.stderr)
    return 1


def cmd_wait_scraped(args):
    """Waits until Prometheus has scraped `targets` targets successfully (its target discovery
    only hands targets to the scrapers some seconds after start)."""
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        answer = query(args.url, "count(up == 1)")
        result = answer.get("data", {}).get("result", [])
        if result and int(float(result[0]["value"][1])) >= args.targets:
            return 0
        time.sleep(0.3)
    print(f"Prometheus did not scrape {args.targets} targets within {args.seconds} s",
          file=sys.stderr)
    return 1


def cmd_free_port(_):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        print(s.getsockname()[1])
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    n = sub.add_parser("names")
    n.add_argument("--design", required=True)
    for s in (n, sub.add_parser("eval")):
        s.add_argument("--dashboard", required=True)
        s.add_argument("--rules", required=True)
    e = sub.choices["eval"]
    e.add_argument("--url", required=True)
    e.add_argument("--ran", required=True, help="comma list of kvstore,worker,router")
    e.add_argument("--window", default="1m", help="replaces $__rate_interval")
    w = sub.add_parser("wait-ready")
    w.add_argument("url")
    w.add_argument("seconds", type=float)
    ws = sub.add_parser("wait-scraped")
    ws.add_argument("url")
    ws.add_argument("targets", type=int)
    ws.add_argument("seconds", type=float)
    ef = sub.add_parser("expect-finite")
    ef.add_argument("--url", required=True)
    ef.add_argument("--query", action="append", required=True)
    ef.add_argument("--series", type=int, default=1)
    wa = sub.add_parser("wait-alerts")
    wa.add_argument("--url", required=True)
    wa.add_argument("--alerts", required=True)
    wa.add_argument("--firing", action="store_true")
    wa.add_argument("seconds", type=float)
    sub.add_parser("free-port")
    args = p.parse_args()
    return {"names": cmd_names, "eval": cmd_eval, "wait-ready": cmd_wait_ready,
            "wait-scraped": cmd_wait_scraped, "wait-alerts": cmd_wait_alerts,
            "expect-finite": cmd_expect_finite,
            "free-port": cmd_free_port}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
