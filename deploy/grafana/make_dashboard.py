#!/usr/bin/env python3
"""Writes deploy/grafana/lazyrag.json, the Grafana dashboard of lazyrag.

The dashboard is generated so that its panels stay uniform; edit this file, run it, and commit
both. Every query uses only DESIGN.md section 7 metric names (plus the kvstore's own
lazyrag_kvstore_capacity_bytes and the worker's host-tier lazyrag_host_cache_* metrics of
worker/engine/engine_metrics.cc); tests/deploy checks that and evaluates every query against a
live Prometheus. Queries may use Grafana's $__rate_interval (the live test puts a fixed window
in its place) and no other dashboard variable except the data source.

    python3 deploy/grafana/make_dashboard.py
"""
import json
import os

RI = "$__rate_interval"
DS = {"type": "prometheus", "uid": "${datasource}"}


def rate(metric, by=None, matchers=""):
    inner = f"rate({metric}{matchers}[{RI}])"
    return f"sum by ({by}) ({inner})" if by else f"sum({inner})"


def quantiles(bucket, by="", qs=(0.5, 0.9, 0.99), suffix=""):
    group = f"le, {by}" if by else "le"
    targets = []
    for q in qs:
        legend = f"p{int(q * 100)}" + (f" {{{{{by}}}}}" if by else "")
        targets.append((f"histogram_quantile({q}, sum by ({group}) (rate({bucket}[{RI}])))",
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


def build():
    d = Dashboard()

    d.row("Document cache")
    hit_ratio = (f"{rate('lazyrag_doc_cache_hits_total')}"
                 f" / {rate('lazyrag_doc_cache_lookups_total')}")
    d.panel("Document cache hit rate", "Share of document lookups served without computing "
            "(any tier), all workers.", [(hit_ratio, "hit rate")], "percentunit", kind="stat",
            w=4, minmax=(0, 1))
    d.panel("Document cache hit rate by tier",
            "Share of document lookups served from each tier: gpu (the worker's KV pool), "
            "host (the worker's host-memory tier), peer (another worker of the same host), "
            "store (the kvstore). The rest were computed. Every tier label the workers export "
            "is shown (sum by tier); a tier appears once it served a lookup.",
            [(f"{rate('lazyrag_doc_cache_hits_total', 'model, tier')}"
              f" / ignoring(tier) group_left {rate('lazyrag_doc_cache_lookups_total', 'model')}",
              "{{tier}} {{model}}")], "percentunit", w=10, stack=True, minmax=(0, 1))
    d.panel("Document lookups and hit tokens",
            "Document lookups per second, and document tokens per second served from each tier.",
            [(rate("lazyrag_doc_cache_lookups_total", "model"), "lookups/s {{model}}"),
             (rate("lazyrag_doc_cache_hit_tokens_total", "tier"), "hit tokens/s {{tier}}")],
            "short", w=10)

    d.row("Host-memory tier")
    d.panel("Host tier bytes", "Bytes of document KV each worker holds in its host-memory "
            "tier (--host_cache_bytes caps it).",
            [("sum by (instance) (lazyrag_host_cache_bytes)", "used {{instance}}"),
             ("sum by (instance) (lazyrag_host_cache_capacity_bytes)", "capacity {{instance}}")],
            "bytes", w=6)
    d.panel("Host tier documents", "Documents each worker holds in its host-memory tier.",
            [("sum by (instance) (lazyrag_host_cache_entries)", "{{instance}}")], "short",
            w=6)
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
    d.panel("Time to first token", "p50, p90 and p99 of request arrival to first token, by "
            "attention mode.",
            quantiles("lazyrag_time_to_first_token_seconds_bucket", "mode"), "s")
    d.panel("Inter-token latency", "p50, p90 and p99 of the time between consecutive tokens.",
            quantiles("lazyrag_inter_token_latency_seconds_bucket", "mode"), "s")
    d.panel("Request duration", "p50 and p99 of request arrival to its end.",
            quantiles("lazyrag_request_duration_seconds_bucket", "mode", qs=(0.5, 0.99)), "s")

    d.row("Throughput and load")
    d.panel("Tokens per second", "Generated tokens and prompt tokens per second.",
            [(rate("lazyrag_generation_tokens_total", "model"), "generated {{model}}"),
             (rate("lazyrag_prompt_tokens_total", "model"), "prompt {{model}}")],
            "short")
    d.panel("Running and waiting requests", "Requests admitted by the schedulers and "
            "requests queued for admission, all workers.",
            [("sum by (model) (lazyrag_requests_running)", "running {{model}}"),
             ("sum by (model) (lazyrag_requests_waiting)", "waiting {{model}}")], "short")
    pool_used = ('sum by (instance) (lazyrag_kv_pool_pages{state="used"})'
                 ' / sum by (instance) (lazyrag_kv_pool_pages{state=~"free|used"})')
    pinned = ('sum by (instance) (lazyrag_kv_pool_pages{state="pinned"})'
              ' / sum by (instance) (lazyrag_kv_pool_pages{state=~"free|used"})')
    d.panel("KV pool use", "Share of each worker's KV pool pages in use (requests and cached "
            "documents; cached documents are evicted on demand) and pinned (document pages "
            "referenced by running requests, not evictable).",
            [(pool_used, "used {{instance}}"), (pinned, "pinned {{instance}}")],
            "percentunit", minmax=(0, 1))

    d.row("kvstore")
    d.panel("kvstore bytes", "Value bytes stored per shard, and the shard's capacity.",
            [("sum by (instance) (lazyrag_kvstore_bytes)", "{{instance}}"),
             ("sum by (instance) (lazyrag_kvstore_capacity_bytes)", "capacity {{instance}}")],
            "bytes", w=6)
    d.panel("kvstore entries", "Documents stored per shard.",
            [("sum by (instance) (lazyrag_kvstore_entries)", "{{instance}}")], "short", w=6)
    d.panel("kvstore evictions", "Values evicted per second to stay within capacity.",
            [(rate("lazyrag_kvstore_evictions_total", "instance"), "{{instance}}")], "short",
            w=6)
    d.panel("kvstore requests", "RPCs the shards served per second, by op and result.",
            [(rate("lazyrag_kvstore_requests_total", "op, result", '{job="lazyrag-kvstore"}'),
              "{{op}} {{result}}")], "reqps", w=6)
    d.panel("kvstore fetch latency", "p50, p90 and p99 of a worker's document fetch from "
            "the kvstore (successful gets).",
            quantiles("lazyrag_kvstore_fetch_seconds_bucket"), "s", w=12)
    d.panel("kvstore fetch throughput", "Document bytes per second the workers fetched.",
            [(rate("lazyrag_kvstore_fetch_bytes_total", "instance"), "{{instance}}")],
            "Bps", w=12)

    d.row("Router")
    d.panel("Router traffic per worker", "Requests per second the routers sent to each "
            "worker, by outcome.",
            [(rate("lazyrag_router_requests_total", "worker, outcome"),
              "{{worker}} {{outcome}}")], "reqps", w=12, stack=True)
    d.panel("Router affinity rate", "Share of routed requests sent to a worker that already "
            "held their documents.",
            [(f"{rate('lazyrag_router_affinity_hits_total')}"
              f" / {rate('lazyrag_router_requests_total')}", "affinity")], "percentunit",
            w=12, minmax=(0, 1))

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
        "templating": {"list": [{
            "name": "datasource", "label": "Data source", "type": "datasource",
            "query": "prometheus", "current": {}, "hide": 0, "refresh": 1,
        }]},
        "panels": d.panels,
    }


def main():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lazyrag.json")
    with open(path, "w") as f:
        json.dump(build(), f, indent=2)
        f.write("\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
