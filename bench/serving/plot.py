#!/usr/bin/env python3
"""Plots and tables of lazyrag-loadgen results (bench/serving/run_serving.sh).

usage: plot.py RESULTS_DIR [--out DIR] [--ttft_bound_ms 1000]

Reads every *.json that lazyrag-loadgen wrote under RESULTS_DIR (the mode, the distribution,
the rate or the concurrency come from each file's config, not from its name) and writes:
  ttft_vs_rate.png   mean (solid) and p99 (dashed) client TTFT against the offered rate, one
                     panel per distribution, one line per mode, log scale
  throughput.png     achieved request throughput against the offered rate (open loop), and the
                     closed-loop points: requests/s and output tokens/s per mode
  hit_ratio.png      document hit ratio against the offered rate (open-loop points)
  pressure.png       hit ratio, mean TTFT and throughput against the KV pool size, when the
                     closed-loop points hold several pool sizes (run_pressure.sh; the pool
                     fraction comes from "-p<fraction>-" in the file name)
  summary.md         one row per point, the LAZY/MATERIALIZE and LAZY/FULL TTFT ratios, the
                     cache-pressure table (LAZY beside MATERIALIZE per pool size), and
                     the highest offered rate each mode sustains with p99 TTFT under the bound
  summary.json       the same rows, machine-readable
"""
import argparse
import glob
import json
import math
import os
import re
import sys

MODE_ORDER = ["lazy", "materialize", "prefix", "full"]
COLORS = {"lazy": "tab:green", "materialize": "tab:blue", "prefix": "tab:orange",
          "full": "tab:red"}


def load(results_dir):
    rows = []
    for path in sorted(glob.glob(os.path.join(results_dir, "**", "*.json"), recursive=True)):
        try:
            with open(path) as f:
                r = json.load(f)
            cfg, s = r["config"], r["summary"]
        except (OSError, ValueError, KeyError) as e:
            print(f"plot.py: skipping {path}: {e}", file=sys.stderr)
            continue
        srv = r.get("server", {})
        frac = re.search(r"-p([0-9.]+)-", os.path.basename(path))
        rows.append({
            "file": os.path.basename(path),
            "mode": cfg["mode"],
            "dist": cfg.get("distribution", "zipf" if cfg.get("zipf", 0) > 0 else "uniform"),
            "zipf": cfg.get("zipf", 0),
            "loop": cfg["loop"],
            "rate": cfg["rate"],
            "concurrency": cfg["concurrency"],
            "pool_pages": srv.get("pages_total", 0),
            "pool_frac": float(frac.group(1)) if frac else None,
            "page_size": srv.get("page_size", 0),
            "sent": s["sent"], "ok": s["ok"], "failed": s["failed"],
            "errors": s.get("errors", {}),
            "req_s": s["request_throughput"], "tok_s": s["output_throughput"],
            "ttft": s["ttft_ms"], "server_ttft": s["server_ttft_ms"], "queue": s["queue_ms"],
            "itl": s["itl_ms"], "tpot": s["tpot_ms"], "e2e": s["e2e_ms"],
            "hit": s["doc_hit_ratio"], "pool_hit": s["pool_hit_ratio"],
            "host_hit": s.get("host_hit_ratio"),
            "store_hit": s.get("store_hit_ratio"),
            "computed_tokens": s["computed_tokens"], "ok_n": s["ok"],
        })
    return rows


def modes_of(rows):
    present = {r["mode"] for r in rows}
    return [m for m in MODE_ORDER if m in present] + sorted(present - set(MODE_ORDER))


def fmt(v, digits=2):
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:.{digits}f}"


def open_points(rows, mode, dist):
    pts = [r for r in rows if r["loop"] == "open" and r["mode"] == mode and r["dist"] == dist]
    return sorted(pts, key=lambda r: r["rate"])


# An open-loop point keeps up when its achieved throughput is at least this share of the offered
# rate. Throughput is measured from the first send to the last completion, which for 120
# requests reads ~15% under the offered rate even when the server keeps up (ramp-down).
KEEPS_UP = 0.8


def sustained_rate(rows, mode, dist, bound_ms):
    """Highest offered rate whose points up to it all succeeded, kept up (achieved >= KEEPS_UP x
    offered) and had p99 TTFT under the bound."""
    best = None
    for r in open_points(rows, mode, dist):
        p99 = r["ttft"]["p99"]
        if (r["failed"] == 0 and p99 is not None and p99 <= bound_ms and
                r["req_s"] >= KEEPS_UP * r["rate"]):
            best = r["rate"]
        else:
            break
    return best


def pressure_rows(rows):
    """Closed-loop points by pool size (largest first), when there are several pool sizes."""
    closed = [r for r in rows if r["loop"] == "closed"]
    pools = sorted({r["pool_pages"] for r in closed}, reverse=True)
    if len(pools) < 2:
        return []
    out = []
    for pages in pools:
        p = {"pages": pages, "frac": None}
        for r in closed:
            if r["pool_pages"] == pages:
                p[r["mode"]] = r
                p["frac"] = r["pool_frac"]
        out.append(p)
    return out


def write_tables(rows, out, bound_ms):
    modes = modes_of(rows)
    dists = sorted({r["dist"] for r in rows}, key=lambda d: (d != "zipf", d))
    lines = ["# Serving benchmark", "",
             "Client TTFT in ms (send to first token), server TTFT and queue from the worker's "
             "Timings, ITL in ms, throughput over the window from the first send to the last "
             "completion. hit = cached document tokens / document tokens.", "",
             "| mode | dist | load | ok/sent | TTFT mean | p50 | p90 | p99 | server TTFT | "
             "queue | ITL mean | ITL p99 | req/s | tok/s | hit |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    table = []
    for m in modes:
        for d in dists:
            pts = open_points(rows, m, d) + sorted(
                [r for r in rows if r["loop"] == "closed" and r["mode"] == m and r["dist"] == d],
                key=lambda r: r["concurrency"])
            for r in pts:
                load_s = f"{r['rate']:g}/s" if r["loop"] == "open" else f"c={r['concurrency']}"
                lines.append(
                    f"| {m} | {d} | {load_s} | {r['ok']}/{r['sent']} | {fmt(r['ttft']['mean'])} | "
                    f"{fmt(r['ttft']['p50'])} | {fmt(r['ttft']['p90'])} | {fmt(r['ttft']['p99'])} | "
                    f"{fmt(r['server_ttft']['mean'])} | {fmt(r['queue']['mean'])} | "
                    f"{fmt(r['itl']['mean'])} | {fmt(r['itl']['p99'])} | {fmt(r['req_s'], 3)} | "
                    f"{fmt(r['tok_s'], 1)} | {fmt(r['hit'], 3)} |")
                table.append({k: r[k] for k in ("pool_frac", "mode", "dist", "loop", "rate", "concurrency",
                                                "ok", "sent", "failed", "errors", "req_s",
                                                "tok_s", "ttft", "server_ttft", "queue", "itl",
                                                "tpot", "e2e", "hit", "pool_hit", "host_hit", "store_hit",
                                                "pool_pages", "file")})
    ratios = []
    if "lazy" in modes:
        lines += ["", "## Mean TTFT ratios (other mode / LAZY; > 1: LAZY is faster)", "",
                  "| dist | load | MATERIALIZE/LAZY | FULL/LAZY | PREFIX/LAZY |", "|---|---|---|---|---|"]
        for d in dists:
            for lz in open_points(rows, "lazy", d):
                def ratio(other):
                    for r in open_points(rows, other, d):
                        if r["rate"] == lz["rate"] and lz["ttft"]["mean"]:
                            return r["ttft"]["mean"] / lz["ttft"]["mean"]
                    return None
                rm, rf, rp = ratio("materialize"), ratio("full"), ratio("prefix")
                lines.append(f"| {d} | {lz['rate']:g}/s | {fmt(rm)} | {fmt(rf)} | {fmt(rp)} |")
                ratios.append({"dist": d, "rate": lz["rate"], "materialize_over_lazy": rm,
                               "full_over_lazy": rf, "prefix_over_lazy": rp})
    pressure = pressure_rows(rows)
    if pressure:
        lines += ["", "## Cache pressure (closed loop; pool = fraction of free device memory "
                  "after the weights)", "",
                  "| pool | pages | LAZY TTFT mean | p99 | req/s | hit | MATERIALIZE TTFT mean | p99 | "
                  "req/s | hit | TTFT M/L | req/s L/M |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for p in pressure:
            lz, mt = p.get("lazy"), p.get("materialize")
            def cells(r):
                if r is None:
                    return ["-"] * 4
                return [fmt(r["ttft"]["mean"]), fmt(r["ttft"]["p99"]), fmt(r["req_s"], 2),
                        fmt(r["hit"], 3)]
            t_ratio = (mt["ttft"]["mean"] / lz["ttft"]["mean"]
                       if lz and mt and lz["ttft"]["mean"] else None)
            q_ratio = lz["req_s"] / mt["req_s"] if lz and mt and mt["req_s"] else None
            lines.append("| " + " | ".join(
                [f"{p['frac']:g}" if p["frac"] is not None else "-", str(p["pages"])] +
                cells(lz) + cells(mt) + [fmt(t_ratio), fmt(q_ratio)]) + " |")
            p["materialize_over_lazy_ttft"] = t_ratio
            p["lazy_over_materialize_req_s"] = q_ratio
    lines += ["", f"## Saturation (highest offered rate with every request ok, achieved >= "
              f"{KEEPS_UP:g} x offered and p99 TTFT <= {bound_ms:g} ms; closed-loop throughput)", "",
              "| mode | dist | sustained rate (req/s) | closed loop | req/s | output tok/s | "
              "TTFT mean |", "|---|---|---|---|---|---|---|"]
    sat = []
    for m in modes:
        for d in dists:
            sr = sustained_rate(rows, m, d, bound_ms)
            closed = [r for r in rows if r["loop"] == "closed" and r["mode"] == m and
                      r["dist"] == d]
            if not closed and not open_points(rows, m, d):
                continue
            # The largest pool's point at the highest concurrency.
            c = max(closed, key=lambda r: (r["pool_pages"], r["concurrency"])) if closed else None
            lines.append(
                f"| {m} | {d} | {fmt(sr, 2) if sr is not None else 'none'} | "
                f"{'c=' + str(c['concurrency']) if c else '-'} | {fmt(c['req_s'], 3) if c else '-'} | "
                f"{fmt(c['tok_s'], 1) if c else '-'} | {fmt(c['ttft']['mean']) if c else '-'} |")
            sat.append({"mode": m, "dist": d, "sustained_rate": sr,
                        "closed_concurrency": c["concurrency"] if c else None,
                        "closed_req_s": c["req_s"] if c else None,
                        "closed_tok_s": c["tok_s"] if c else None})
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({"ttft_bound_ms": bound_ms, "points": table, "ttft_ratios": ratios,
                   "saturation": sat,
                   "pressure": [{"frac": p["frac"], "pages": p["pages"],
                                 "materialize_over_lazy_ttft": p["materialize_over_lazy_ttft"],
                                 "lazy_over_materialize_req_s": p["lazy_over_materialize_req_s"]}
                                for p in pressure]}, f, indent=1)
    print("\n".join(lines))


def plot(rows, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = modes_of(rows)
    dists = sorted({r["dist"] for r in rows if r["loop"] == "open"}, key=lambda d: (d != "zipf", d))
    if dists:
        fig, axes = plt.subplots(1, len(dists), figsize=(6 * len(dists), 4.5), squeeze=False)
        for ax, d in zip(axes[0], dists):
            for m in modes:
                pts = open_points(rows, m, d)
                if not pts:
                    continue
                x = [r["rate"] for r in pts]
                ax.plot(x, [r["ttft"]["mean"] for r in pts], "o-", color=COLORS.get(m),
                        label=f"{m.upper()} mean")
                ax.plot(x, [r["ttft"]["p99"] for r in pts], "x--", color=COLORS.get(m),
                        alpha=0.6, label=f"{m.upper()} p99")
            alpha = next((r["zipf"] for r in rows if r["dist"] == d and r["zipf"] > 0), None)
            ax.set_title(f"TTFT vs rate, {d}" + (f" (alpha {alpha:g})" if alpha else ""))
            ax.set_xlabel("offered rate (req/s, Poisson)")
            ax.set_ylabel("TTFT (ms, client)")
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "ttft_vs_rate.png"), dpi=120)
        plt.close(fig)

    closed = [r for r in rows if r["loop"] == "closed"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    ax = axes[0]
    for d, style in zip(dists, ["o-", "s--", "^:"]):
        for m in modes:
            pts = open_points(rows, m, d)
            if pts:
                ax.plot([r["rate"] for r in pts], [r["req_s"] for r in pts], style,
                        color=COLORS.get(m), label=f"{m.upper()} {d}")
    if dists:
        top = max(r["rate"] for r in rows if r["loop"] == "open")
        ax.plot([0, top], [0, top], color="gray", lw=0.8, label="offered")
    ax.set_xlabel("offered rate (req/s)")
    ax.set_ylabel("achieved (req/s)")
    ax.set_title("Open loop: achieved throughput")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax = axes[1]
    if closed:
        labels = [f"{r['mode'].upper()}\n{r['dist']} c={r['concurrency']}" for r in
                  sorted(closed, key=lambda r: (modes.index(r["mode"]), r["dist"]))]
        ordered = sorted(closed, key=lambda r: (modes.index(r["mode"]), r["dist"]))
        xs = range(len(ordered))
        ax.bar(xs, [r["tok_s"] for r in ordered], color=[COLORS.get(r["mode"]) for r in ordered])
        for x, r in zip(xs, ordered):
            ax.text(x, r["tok_s"], f"{r['req_s']:.1f} req/s", ha="center", va="bottom",
                    fontsize=8)
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_ylabel("output tokens/s")
        ax.set_title("Closed loop (saturation)")
    else:
        ax.set_axis_off()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "throughput.png"), dpi=120)
    plt.close(fig)

    pressure = pressure_rows(rows)
    if pressure:
        fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
        for m in modes:
            pts = [p[m] for p in pressure if m in p]
            if not pts:
                continue
            x = [r["pool_frac"] if r["pool_frac"] is not None else r["pool_pages"] for r in pts]
            for ax, y in zip(axes, [[r["hit"] for r in pts], [r["ttft"]["mean"] for r in pts],
                                    [r["req_s"] for r in pts]]):
                ax.plot(x, y, "o-", color=COLORS.get(m), label=m.upper())
        frac_axis = all(p["frac"] is not None for p in pressure)
        for ax, title, ylabel in zip(axes, ["Document hit ratio", "Mean TTFT", "Throughput"],
                                     ["hit ratio", "TTFT (ms, client)", "requests/s"]):
            ax.set_xlabel("KV pool (fraction of free device memory)" if frac_axis
                          else "KV pool (pages)")
            ax.set_ylabel(ylabel)
            ax.set_title(title + " under cache pressure (closed loop)")
            ax.invert_xaxis()
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        axes[0].set_ylim(-0.05, 1.05)
        axes[1].set_yscale("log")
        fig.tight_layout()
        fig.savefig(os.path.join(out, "pressure.png"), dpi=120)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for m in modes:
        for d, style in zip(dists, ["o-", "s--", "^:"]):
            pts = [r for r in rows if r["mode"] == m and r["dist"] == d and r["loop"] == "open"]
            if not pts:
                continue
            pts.sort(key=lambda r: r["rate"])
            ax.plot([r["rate"] for r in pts], [r["hit"] for r in pts], style,
                    color=COLORS.get(m), label=f"{m.upper()} {d}")
    ax.set_xlabel("offered rate (req/s)")
    ax.set_ylabel("document hit ratio")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Document KV hit ratio")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "hit_ratio.png"), dpi=120)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--out", default=".")
    ap.add_argument("--ttft_bound_ms", type=float, default=1000.0)
    ap.add_argument("--no_plots", action="store_true")
    a = ap.parse_args()
    rows = load(a.results)
    if not rows:
        print(f"plot.py: no results under {a.results}", file=sys.stderr)
        return 1
    os.makedirs(a.out, exist_ok=True)
    write_tables(rows, a.out, a.ttft_bound_ms)
    if not a.no_plots:
        plot(rows, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
