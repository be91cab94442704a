#!/usr/bin/env python3
"""Writes deploy/grafana/lazyrag.json, the Grafana dashboard of lazyrag.

The dashboard is generated so that its panels stay uniform; edit this file, run it, and commit
both. Every query uses only DESIGN.md section 7 metric names plus the documented extras of
tests/deploy/promexprs.py (the kvstore's own lazyrag_kvstore_capacity_bytes, the worker's
host-tier lazyrag_host_cache_* metrics, lazyrag_queue_time_seconds, the router's
lazyrag_router_workers and time to first token, lazyrag_build_info, the process_* metrics
and the lazyrag_auth_* counters every server exports); tests/deploy checks that and evaluates every query against a live
Prometheus, asserting each value lies in its true range (percentunit panels in [0, 1]).
Queries may use Grafana's $__rate_interval and the template variables $model and $instance
(the live test puts a fixed window and ".*" in their places).

Every ratio divides counts of the same events: hits and lookups of documents, hit tokens and
hit + computed tokens, affinity hits and the router's calls to a worker (worker!="none"; both
counted when the call ends), errors and all requests. The servers create their labelled series
at zero (every mode, outcome, tier, worker), so a ratio over a window never reads NaN or above
100% because a series appeared in it.

    python3 deploy/grafana/make_dashboard.py
"""
import json
import os

RI = "$__rate_interval"
DS = {"type": "prometheus", "uid": "${datasource}"}
INST = 'instance=~"$instance"'
# Worker metrics labelled `model`: filtered by $model too.
MODEL_METRICS = (
    "lazyrag_time_to_first_token_seconds", "lazyrag_inter_token_latency_seconds",
    "lazyrag_request_duration_seconds", "lazyrag_queue_time_seconds",
    "lazyrag_requests_running", "lazyrag_requests_waiting", "lazyrag_requests_finished_total",
    "lazyrag_prompt_tokens_total", "lazyrag_generation_tokens_total",
    "lazyrag_doc_cache_lookups_total", "lazyrag_doc_cache_hits_total",
    "lazyrag_doc_cache_hit_tokens_total", "lazyrag_doc_computed_total",
    "lazyrag_doc_computed_tokens_total", "lazyrag_kv_pool_pages", "lazyrag_kv_pool_evictions_total",
    "lazyrag_preemptions_total", "lazyrag_host_cache_")


def sel(metric, matchers=""):
    """metric{instance=~"$instance"[, model=~"$model"][, matchers]}."""
    parts = [INST]
    if metric.startswith(MODEL_METRICS):
        parts.append('model=~"$model"')
    if matchers:
        parts.append(matchers.strip("{}"))
    return f"{metric}{{{', '.join(parts)}}}"


def rate(metric, by=None, matchers=""):
    inner = f"rate({sel(metric, matchers)}[{RI}])"
    return f"sum by ({by}) ({inner})" if by else f"sum({inner})"


def quantiles(bucket, by="", qs=(0.5, 0.9, 0.99), suffix=""):
    group = f"le, {by}" if by else "le"
    targets = []
    for q in qs:
        legend = f"p{int(q * 100)}" + (f" {{{{{by}}}}}" if by else "")
        targets.append((f"histogram_quantile({q}, sum by ({group}) (rate({sel(bucket)}[{RI}])))",
                        legend + suffix))
    return targets


class Dashboard:
    def __init__(self):
        self.panels = []
        self.y = 0
        self.x = 0
        self.row_height = 0

    def row(self, title):
        self._newline()
        self.panels.append({"type": "row", "title": title, "collapsed": False,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
                            "id": len(self.panels) + 1, "panels": []})
        self.y += 1

    def _newline(self):
        if self.x:
            self.y += self.row_height
            self.x = 0
            self.row_height = 0

    def panel(self, title, description, targets, unit, kind="timeseries", w=8, h=8,
              stack=False, minmax=None):
        if self.x + w > 24:
            self._newline()
        fieldcfg = {"unit": unit}
        if minmax:
            fieldcfg["min"], fieldcfg["max"] = minmax
        if kind == "timeseries":
            fieldcfg["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10,
                                  "showPoints": "never", "spanNulls": True,
                                  "stacking": {"mode": "normal" if stack else "none",
                                               "group": "A"}}
        panel = {
            "type": kind,
            "title": title,
            "description": description,
            "id": len(self.panels) + 1,
            "datasource": DS,
            "gridPos": {"h": h, "w": w, "x": self.x, "y": self.y},
            "fieldConfig": {"defaults": fieldcfg, "overrides": []},
            "targets": [{"datasource": DS, "refId": chr(ord("A") + i), "expr": expr,
                         "legendFormat": legend, "range": True}
                        for i, (expr, legend) in enumerate(targets)],
        }
        if kind == "timeseries":
            panel["options"] = {"legend": {"displayMode": "list", "placement": "bottom",
                                           "showLegend": True},
                                "tooltip": {"mode": "multi", "sort": "desc"}}
        else:
            panel["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "",
                                                  "values": False},
                                "colorMode": "value", "graphMode": "area",
                                "textMode": "auto"}
        self.panels.append(panel)
        self.x += w
        self.row_height = max(self.row_height, h)


def gauge(metric, by="instance", matchers=""):
    return f"sum by ({by}) ({sel(metric, matchers)})"


def build():
    d = Dashboard()

    d.row("Overview")
    d.panel("Healthy workers", "Workers each router considers healthy (health check SERVING) "
            "and ejected. No healthy worker: every request fails (alert "
            "LazyragNoHealthyWorker).",
            [(gauge("lazyrag_router_workers", "state"), "{{state}}")], "short", kind="stat",
            w=4)
    finished = "lazyrag_requests_finished_total"
    errors = 'outcome!~"length|stop|eos|cancelled"'
    d.panel("Worker error rate by outcome",
            "Share of the workers' finished requests that ended with each error status (not "
            "length, stop, eos or a client's cancellation), all modes.",
            [(f"{rate(finished, 'outcome', errors)} / ignoring(outcome) group_left "
              f"{rate(finished)}", "{{outcome}}")],
            "percentunit", w=10, stack=True, minmax=(0, 1))
    router_calls = "lazyrag_router_requests_total"
    FAILED = 'outcome=~"failed|error"'
    client_requests = 'outcome!="retried"'  # each client request ends in one such count
    d.panel("Router error rate by outcome",
            "Share of client requests the routers ended with a failure: failed (a worker failed "
            "after the stream started, or no worker was left to try: worker=\"none\") or "
            "error (the worker's error, passed on). Retried calls are not client requests.",
            [(f"{rate(router_calls, 'outcome', FAILED)}"
              f" / ignoring(outcome) group_left {rate(router_calls, None, client_requests)}",
              "{{outcome}}")], "percentunit", w=10, stack=True, minmax=(0, 1))

    d.row("Document cache")
    hit_ratio = (f"{rate('lazyrag_doc_cache_hits_total')}"
                 f" / {rate('lazyrag_doc_cache_lookups_total')}")
    d.panel("Document cache hit rate", "Share of document lookups served without computing "
            "(any tier), all workers.", [(hit_ratio, "hit rate")], "percentunit", kind="stat",
            w=4, minmax=(0, 1))
    hit_tokens = rate("lazyrag_doc_cache_hit_tokens_total")
    token_ratio = (f"{hit_tokens} / ({hit_tokens} + "
                   f"{rate('lazyrag_doc_computed_tokens_total')})")
    d.panel("Token-weighted hit rate", "Share of document tokens served without computing: "
            "hit tokens / (hit tokens + computed tokens). A long document weighs more than a "
            "short one.", [(token_ratio, "token hit rate")], "percentunit", kind="stat", w=4,
            minmax=(0, 1))
    d.panel("Document cache hit rate by tier",
            "Share of document lookups served from each tier: gpu or cpu (the worker's KV pool, "
            "named by its device), host (the worker's host-memory tier), peer (another worker "
            "of the same host), store (the kvstore). The rest were computed.",
            [(f"{rate('lazyrag_doc_cache_hits_total', 'model, tier')}"
              f" / ignoring(tier) group_left {rate('lazyrag_doc_cache_lookups_total', 'model')}",
              "{{tier}} {{model}}")], "percentunit", w=8, stack=True, minmax=(0, 1))
    d.panel("Document lookups and hit tokens",
            "Document lookups per second, and document tokens per second served from each tier.",
            [(rate("lazyrag_doc_cache_lookups_total", "model"), "lookups/s {{model}}"),
             (rate("lazyrag_doc_cache_hit_tokens_total", "tier"), "hit tokens/s {{tier}}")],
            "short", w=8)

    d.row("Host-memory tier")
    d.panel("Host tier bytes", "Bytes of document KV each worker holds in its host-memory "
            "tier (--host_cache_bytes caps it).",
            [(gauge("lazyrag_host_cache_bytes"), "used {{instance}}"),
             (gauge("lazyrag_host_cache_capacity_bytes"), "capacity {{instance}}")],
            "bytes", w=6)
    d.panel("Host tier documents", "Documents each worker holds in its host-memory tier.",
            [(gauge("lazyrag_host_cache_entries"), "{{instance}}")], "short", w=6)
    d.panel("Host tier promotions and demotions",
            "Documents per second copied from the host tier into the KV pool (promotions: a "
            "pool miss served from host memory) and from the KV pool to the host tier "
            "(demotions), and copies dropped for a checksum mismatch (then recomputed).",
            [(rate("lazyrag_host_cache_promotions_total", "instance"), "promoted {{instance}}"),
             (rate("lazyrag_host_cache_demotions_total", "instance"), "demoted {{instance}}"),
             (rate("lazyrag_host_cache_checksum_failures_total", "instance"),
              "checksum failures {{instance}}")], "short", w=12)
    d.panel("Host tier copy latency", "p50 and p99 of one document's copy from the host tier "
            "into the KV pool (promotion) and from the pool to the host tier (demotion).",
            quantiles("lazyrag_host_cache_promotion_seconds_bucket", qs=(0.5, 0.99),
                      suffix=" promotion")
            + quantiles("lazyrag_host_cache_demotion_seconds_bucket", qs=(0.5, 0.99),
                        suffix=" demotion"), "s", w=24)

    d.row("Latency")
    d.panel("Time to first token", "p50, p90 and p99 of request arrival at the worker to "
            "first token, by attention mode (no line: no request of that mode in the window).",
            quantiles("lazyrag_time_to_first_token_seconds_bucket", "mode"), "s", w=6)
    d.panel("Router time to first token", "p50, p90 and p99 of a request's arrival at the "
            "router to its first streamed message: routing, retries and the worker's TTFT, as "
            "the client sees it.",
            quantiles("lazyrag_router_time_to_first_token_seconds_bucket"), "s", w=6)
    d.panel("Queue time", "p50 and p99 of request arrival to its first admission by the "
            "worker's scheduler, by attention mode.",
            quantiles("lazyrag_queue_time_seconds_bucket", "mode", qs=(0.5, 0.99)), "s", w=6)
    d.panel("Inter-token latency", "p50, p90 and p99 of the time between consecutive tokens.",
            quantiles("lazyrag_inter_token_latency_seconds_bucket", "mode"), "s", w=6)
    d.panel("Request duration", "p50 and p99 of request arrival to its end.",
            quantiles("lazyrag_request_duration_seconds_bucket", "mode", qs=(0.5, 0.99)), "s",
            w=12)
    d.panel("Requests by outcome", "Requests the workers finished per second, by outcome "
            "(length, stop, eos; cancelled; an error status).",
            [(rate(finished, "outcome"), "{{outcome}}")], "reqps", w=12, stack=True)

    d.row("Throughput and load")
    d.panel("Tokens per second", "Generated tokens and prompt tokens per second.",
            [(rate("lazyrag_generation_tokens_total", "model"), "generated {{model}}"),
             (rate("lazyrag_prompt_tokens_total", "model"), "prompt {{model}}")],
            "short")
    d.panel("Running and waiting requests", "Requests admitted by the schedulers and "
            "requests queued for admission, all workers.",
            [(gauge("lazyrag_requests_running", "model"), "running {{model}}"),
             (gauge("lazyrag_requests_waiting", "model"), "waiting {{model}}")], "short")
    pages = "lazyrag_kv_pool_pages"
    total = gauge(pages, matchers='state=~"free|used"')
    used, pinned = (gauge(pages, matchers=f'state="{s}"') for s in ("used", "pinned"))
    d.panel("KV pool use", "Share of each worker's KV pool pages in use (requests and cached "
            "documents; cached documents are evicted on demand) and pinned (document pages "
            "referenced by running requests, not evictable).",
            [(f"{used} / {total}", "used {{instance}}"),
             (f"{pinned} / {total}", "pinned {{instance}}")],
            "percentunit", minmax=(0, 1))
    d.panel("Preemptions, evictions, dropped write-backs",
            "Per second: requests preempted (their pages freed, requeued: the pool is too "
            "small for the load), documents evicted from the KV pool, and computed documents "
            "not written back to the kvstore because the write-back queue was full "
            "(--max_writeback_bytes).",
            [(rate("lazyrag_preemptions_total", "instance"), "preempted {{instance}}"),
             (rate("lazyrag_kv_pool_evictions_total", "instance"), "evicted {{instance}}"),
             (rate("lazyrag_kvstore_writeback_dropped_total", "instance"),
              "write-backs dropped {{instance}}")], "short", w=16)

    d.row("kvstore")
    d.panel("kvstore bytes", "Value bytes stored per shard, and the shard's capacity.",
            [(gauge("lazyrag_kvstore_bytes"), "{{instance}}"),
             (gauge("lazyrag_kvstore_capacity_bytes"), "capacity {{instance}}")],
            "bytes", w=6)
    d.panel("kvstore entries", "Documents stored per shard.",
            [(gauge("lazyrag_kvstore_entries"), "{{instance}}")], "short", w=6)
    d.panel("kvstore evictions", "Values evicted per second to stay within capacity.",
            [(rate("lazyrag_kvstore_evictions_total", "instance"), "{{instance}}")], "short",
            w=6)
    d.panel("kvstore requests", "RPCs the shards served per second, by op and result.",
            [(rate("lazyrag_kvstore_requests_total", "op, result", 'job="lazyrag-kvstore"'),
              "{{op}} {{result}}")], "reqps", w=6)
    d.panel("kvstore fetch latency", "p50, p90 and p99 of a worker's document fetch from "
            "the kvstore (successful gets).",
            quantiles("lazyrag_kvstore_fetch_seconds_bucket"), "s", w=12)
    d.panel("kvstore fetch throughput", "Document bytes per second the workers fetched.",
            [(rate("lazyrag_kvstore_fetch_bytes_total", "instance"), "{{instance}}")],
            "Bps", w=12)

    d.row("Router")
    WITH_WORKER = 'worker!="none"'
    d.panel("Router traffic per worker", "Calls per second the routers made to each "
            "worker, by outcome (worker=\"none\": no healthy worker to call).",
            [(rate(router_calls, "worker, outcome"), "{{worker}} {{outcome}}")], "reqps", w=12,
            stack=True)
    d.panel("Router affinity rate", "Share of the routers' calls to a worker that went to a "
            "worker already holding some of the request's documents. Both counters count a "
            "call when it ends, so the ratio is exact.",
            [(f"{rate('lazyrag_router_affinity_hits_total')}"
              f" / {rate(router_calls, None, WITH_WORKER)}", "affinity")],
            "percentunit", w=12, minmax=(0, 1))

    d.row("Processes")
    d.panel("Resident memory", "Resident memory of every lazyrag process.",
            [(gauge("process_resident_memory_bytes", "job, instance"), "{{job}} {{instance}}")],
            "bytes")
    d.panel("CPU", "CPU seconds per second (cores busy) of every lazyrag process.",
            [(rate("process_cpu_seconds_total", "job, instance"), "{{job}} {{instance}}")],
            "short")
    d.panel("Builds", "Processes per version and commit (lazyrag_build_info).",
            [(f"count by (job, version, commit) ({sel('lazyrag_build_info')})",
              "{{job}} {{version}} {{commit}}")], "short")

    d.row("Authentication")
    d.panel("Refused calls and token reloads",
            "Calls per second each kind of server refused (gRPC and HTTP, --auth_tokens_file): "
            "unauthenticated (no or an unknown bearer token), permission_denied (a client's "
            "token on a worker-only service: kvstore, peer calls). And rereads of the token "
            "file after it changed, ok or error (malformed: the previous tokens stay).",
            [(rate("lazyrag_auth_failures_total", "job, reason"), "{{job}} {{reason}}"),
             (rate("lazyrag_auth_token_reloads_total", "job, result"),
              "{{job}} reload {{result}}")], "short", w=12)

    return {
        "title": "lazyrag",
        "uid": "lazyrag-overview",
        "description": "lazyrag RAG serving: document cache, host-memory tier, latency, "
                       "throughput, KV pool, kvstore and router (DESIGN.md section 7 metrics).",
        "tags": ["lazyrag"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0, "refresh": 1},
            template("model", "Model", "label_values(lazyrag_requests_running, model)"),
            template("instance", "Instance",
                     'label_values(up{job=~"lazyrag-.*"}, instance)'),
        ]},
        "panels": d.panels,
    }


def template(name, label, query):
    """A multi-value query variable whose "All" matches everything (".*")."""
    return {"name": name, "label": label, "type": "query", "datasource": DS,
            "query": {"query": query, "refId": name}, "definition": query,
            "refresh": 2, "includeAll": True, "multi": True, "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "sort": 1, "hide": 0}


def main():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lazyrag.json")
    with open(path, "w") as f:
        json.dump(build(), f, indent=2)
        f.write("\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
