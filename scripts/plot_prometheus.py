#!/usr/bin/env python3
"""Plot what a Prometheus server scraped from an Ember job: rows per second on the PS
link (pulled and pushed, summed over the shards), the workers' iteration time and cache
hit ratio, over the job's time range, from Prometheus's HTTP API (query_range).

  scripts/plot_prometheus.py --prometheus http://127.0.0.1:9090 --minutes 5 -o rows.png

Needs Debian's python3-matplotlib (/usr/bin/python3). Exits 1 with one line when
Prometheus cannot be reached or holds no Ember series.
"""
import argparse
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

PANELS = [
    ("rows/s on the PS link", "rows/s", [
        ("pulled", "sum(rate(ember_ps_rows_pulled_total[{w}]))"),
        ("pushed", "sum(rate(ember_ps_rows_pushed_total[{w}]))"),
    ]),
    ("iteration time (mean over workers)", "ms", [
        ("iteration", "1000 * sum(rate(ember_worker_iteration_seconds_sum[{w}])) / sum(rate(ember_worker_iteration_seconds_count[{w}]))"),
    ]),
    ("cache hit ratio (all workers)", "ratio", [
        ("hits / lookups", "sum(rate(ember_worker_cache_hits_total[{w}])) / sum(rate(ember_worker_cache_lookups_total[{w}]))"),
    ]),
]


def query_range(base, query, start, end, step):
    url = base.rstrip("/") + "/api/v1/query_range?" + urllib.parse.urlencode(
        {"query": query, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{query}: {body.get('error', body)}")
    return body["data"]["result"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prometheus", default="http://127.0.0.1:9090", help="the server's base URL")
    p.add_argument("--minutes", type=float, default=5, help="plot the last N minutes (or --start/--end)")
    p.add_argument("--start", type=float, help="unix time of the first point")
    p.add_argument("--end", type=float, help="unix time of the last point")
    p.add_argument("--step", type=float, default=1.0, help="seconds between points")
    p.add_argument("--window", default="5s", help="rate() window")
    p.add_argument("--title", default="Ember job, scraped by Prometheus")
    p.add_argument("-o", "--output", required=True, help="PNG to write")
    a = p.parse_args()
    end = a.end if a.end is not None else time.time()
    start = a.start if a.start is not None else end - 60 * a.minutes
    try:
        series = []
        for title, unit, queries in PANELS:
            lines = []
            for label, q in queries:
                for res in query_range(a.prometheus, q.format(w=a.window), start, end, a.step):
                    pts = [(float(t) - start, float(v)) for t, v in res["values"] if v not in ("NaN", "+Inf", "-Inf")]
                    if pts:
                        lines.append((label, pts))
            series.append((title, unit, lines))
    except (urllib.error.URLError, OSError, RuntimeError) as e:
        sys.exit(f"plot_prometheus: {a.prometheus}: {e}")
    if not any(lines for _, _, lines in series):
        sys.exit(f"plot_prometheus: {a.prometheus} holds no ember_* series between {start:.0f} and {end:.0f}")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(series), 1, figsize=(8, 2.6 * len(series)), sharex=True)
    for ax, (title, unit, lines) in zip(axes, series):
        for label, pts in lines:
            ax.plot([x for x, _ in pts], [y for _, y in pts], label=label)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        if lines:
            ax.legend(fontsize=8, loc="upper right")
    axes[-1].set_xlabel("seconds")
    fig.suptitle(a.title, fontsize=11)
    fig.tight_layout()
    fig.savefig(a.output, dpi=110)
    print(f"plot_prometheus: wrote {a.output}")


if __name__ == "__main__":
    main()
