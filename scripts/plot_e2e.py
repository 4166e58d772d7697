#!/usr/bin/env python3
"""Plot bench_e2e.py's link sweep: samples/s against link rate, one line per configuration.

  scripts/plot_e2e.py out/bench-e2e/sweep.json [-o out/bench-e2e/e2e_sweep.png]

x is the link rate in Mbit/s (log scale); the unshaped loopback run (link 0) is drawn as a
separate point at the right, labelled 'loopback'. Needs matplotlib (Debian:
apt-get install -y python3-matplotlib); it is imported only when plotting.
"""
import argparse
import json
import sys
from pathlib import Path

CONFIG_STYLE = {  # colour, marker
    "vanilla": ("#7f7f7f", "o"),
    "herald": ("#1f77b4", "s"),
    "herald+lookahead": ("#d62728", "^"),
}


def plot(rows, path, title=None):
    """Writes the PNG to `path`. Returns None, or the reason it could not (no matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"matplotlib is not installed ({e}); apt-get install -y python3-matplotlib"
    shaped = sorted({r["link_mbit"] for r in rows if r["link_mbit"] > 0})
    has_loop = any(r["link_mbit"] == 0 for r in rows)
    # The loopback point sits one and a half "octaves" right of the fastest shaped link.
    loop_x = (shaped[-1] * 3 if shaped else 1)
    configs = []
    for r in rows:
        if r["config"] not in configs:
            configs.append(r["config"])
    fig, ax = plt.subplots(figsize=(7.5, 4.6), dpi=130)
    for cfg in configs:
        colour, marker = CONFIG_STYLE.get(cfg, (None, "x"))
        pts = {r["link_mbit"]: r for r in rows if r["config"] == cfg}
        xs = [m for m in shaped if m in pts]
        ys = [pts[m]["samples_s"] for m in xs]
        line, = ax.plot(xs, ys, marker=marker, color=colour, label=cfg, linewidth=1.8, markersize=6)
        colour = line.get_color()
        if has_loop and 0 in pts:
            ly = pts[0]["samples_s"]
            ax.plot([loop_x], [ly], marker=marker, color=colour, markersize=7, linestyle="none")
            if xs:  # a dotted hint that loopback is not on the rate axis
                ax.plot([xs[-1], loop_x], [ys[-1], ly], linestyle=":", color=colour, linewidth=1)
        if cfg != "vanilla":  # ratio vs vanilla next to each point
            for m, r in pts.items():
                x = loop_x if m == 0 else m
                if r.get("ratio_vs_vanilla"):
                    ax.annotate(f"{r['ratio_vs_vanilla']:.2f}x", (x, r["samples_s"]), textcoords="offset points",
                                xytext=(6, 4 if cfg == "herald+lookahead" else -11), fontsize=7, color=colour)
    ax.set_xscale("log")
    ticks = list(shaped) + ([loop_x] if has_loop else [])
    labels = [str(m) for m in shaped] + (["loopback"] if has_loop else [])
    ax.set_xticks(ticks)
    ax.set_xticklabels(labels)
    ax.minorticks_off()
    if has_loop and shaped:
        ax.axvline((shaped[-1] * loop_x) ** 0.5, color="#bbbbbb", linestyle="--", linewidth=0.8)
    lo = (shaped[0] if shaped else loop_x) / 1.25
    ax.set_xlim(lo, loop_x * 1.5)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("link rate, Mbit/s (tc tbf, PS <-> workers); right: unshaped loopback")
    ax.set_ylabel("samples/s (median)")
    # A long title goes on two lines, split at its first ": ".
    title = (title or "Ember, 4 workers + 1 PS: samples/s against link rate").replace(": ", ":\n", 1)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep", help="sweep.json written by bench_e2e.py --sweep")
    p.add_argument("-o", "--out", help="PNG (default: e2e_sweep.png next to sweep.json)")
    a = p.parse_args()
    data = json.loads(Path(a.sweep).read_text())
    rows = data["rows"] if isinstance(data, dict) else data
    out = a.out or str(Path(a.sweep).with_name("e2e_sweep.png"))
    why = plot(rows, out, data.get("title") if isinstance(data, dict) else None)
    if why:
        sys.exit(f"plot_e2e: no plot: {why}")
    print(f"plot_e2e: wrote {out}")


if __name__ == "__main__":
    main()
