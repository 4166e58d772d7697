#!/usr/bin/env python3
"""Side-by-side comparison of Ember runs (summary.json written by ember_launch.py), and a
PNG of loss and rows moved per iteration.

  scripts/compare_runs.py out/run-vanilla out/run-herald --plot out/compare.png
"""
import argparse
import json
import sys
from pathlib import Path


def load(d):
    p = Path(d) / "summary.json"
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError) as e:
        sys.exit(f"compare_runs: {p}: {e}")


def table(runs):
    base = runs[0]
    rows = [
        ("samples/s", lambda r: f"{r['samples_s']:.0f}", lambda r: r["samples_s"] / base["samples_s"]),
        ("rows pulled", lambda r: str(r["pulls"]), lambda r: r["pulls"] / max(1, base["pulls"])),
        ("rows pushed", lambda r: str(r["pushes"]), lambda r: r["pushes"] / max(1, base["pushes"])),
        ("  gradients", lambda r: str(r["push_grad"]), None),
        ("  values", lambda r: str(r["push_value"]), None),
        ("  evictions", lambda r: str(r["push_evict"]), None),
        ("rows moved", lambda r: str(r["transmissions"]), lambda r: r["transmissions"] / max(1, base["transmissions"])),
        ("MB sent+received", lambda r: f"{(r['bytes_out'] + r['bytes_in']) / 1e6:.1f}", None),
        ("cache hit rate", lambda r: f"{100 * r['hit_rate']:.1f}%", None),
        ("final loss", lambda r: f"{r['loss']:.4f}", None),
        ("AUC", lambda r: f"{r['auc']:.4f}", None),
        ("logloss", lambda r: f"{r['logloss']:.4f}", None),
    ]
    names = [f"{r['policy']} ({r['transport']}, {r['workers']}w)" for r in runs]
    width = max(14, *(len(n) for n in names))
    out = [f"{'':18}" + "".join(f"{n:>{width + 2}}" for n in names)]
    for label, fmt, ratio in rows:
        cells = []
        for r in runs:
            c = fmt(r)
            if ratio and r is not base:
                c += f" ({ratio(r):.2f}x)"
            cells.append(f"{c:>{width + 2}}")
        out.append(f"{label:18}" + "".join(cells))
    return "\n".join(out)


def plot(runs, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("compare_runs: matplotlib is missing (apt-get install python3-matplotlib); no plot written", file=sys.stderr)
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in runs:
        its = [p["iteration"] for p in r["per_iteration"]]
        label = f"{r['policy']} ({r['transport']}, {r['workers']}w)"
        ax1.plot(its, [p["loss"] for p in r["per_iteration"]], label=label, linewidth=1)
        ax2.plot(its, [p["pulls"] + p["pushes"] for p in r["per_iteration"]], label=label, linewidth=1)
    ax1.set_xlabel("iteration")
    ax1.set_ylabel("training loss (global batch)")
    ax1.set_title("Loss")
    ax2.set_xlabel("iteration")
    ax2.set_ylabel("embedding rows pulled + pushed (all workers)")
    ax2.set_title("Traffic")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    tmp = Path(str(path) + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    tmp.replace(path)
    return True


def main():
    p = argparse.ArgumentParser(description="Compare Ember runs side by side (the first is the baseline).")
    p.add_argument("runs", nargs="+", help="run directories holding summary.json")
    p.add_argument("--plot", help="write a PNG of loss and traffic per iteration")
    a = p.parse_args()
    runs = [load(d) for d in a.runs]
    print(table(runs))
    if a.plot and plot(runs, a.plot):
        print(f"plot: {a.plot}")


if __name__ == "__main__":
    main()
