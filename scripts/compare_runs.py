#!/usr/bin/env python3
"""Side-by-side comparison of Ember runs (summary.json written by ember_launch.py), and a
PNG of loss and rows moved per iteration.

  scripts/compare_runs.py out/run-vanilla out/run-herald --plot out/compare.png

A run directory may also hold link.json (scripts/quickstart_jobs.py writes it for jobs run
across a shaped link): the bytes the PS end of the link sent and received during the job,
shown as rows next to samples/s when any run has one.
"""
import argparse
import json
import sys
from pathlib import Path


def load(d):
    p = Path(d) / "summary.json"
    try:
        r = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        sys.exit(f"compare_runs: {p}: {e}")
    lp = Path(d) / "link.json"
    if lp.exists():
        try:
            r["link_bytes"] = json.loads(lp.read_text())
        except ValueError as e:
            sys.exit(f"compare_runs: {lp}: {e}")
    return r


def name(r):
    """The policy, with the launcher's mechanisms that are on: herald+L4+prefetch+overlap."""
    extra = [f"+L{r['lookahead']}"] if r.get("lookahead") else []
    extra += [f"+{k}" for k, key in (("prefetch", "prefetch"), ("overlap", "overlap_allreduce"),
                                     ("refine", "refine_allocation")) if r.get(key)]
    return r["policy"] + "".join(extra)


def setting(r):
    return f"({r['transport']}, {r['workers']}w)"


def link_rows(runs):
    """Rows of bytes across the shaped link (link.json), when any run has them."""
    if not any("link_bytes" in r for r in runs):
        return []

    def mb(r, *keys):
        return sum(r["link_bytes"][k] for k in keys) if "link_bytes" in r else None

    both = ("ps_tx_bytes", "ps_rx_bytes")
    fmt = lambda *keys: lambda r: "-" if mb(r, *keys) is None else f"{mb(r, *keys) / 1e6:.1f}"
    base = mb(runs[0], *both)
    ratio = lambda r: mb(r, *both) / base if base and mb(r, *both) is not None else None
    return [
        ("link", lambda r: r["link_bytes"]["link"] if "link_bytes" in r else "loopback", None),
        ("link MB, PS end", fmt(*both), ratio),
        ("  PS to workers", fmt("ps_tx_bytes"), None),
        ("  workers to PS", fmt("ps_rx_bytes"), None),
    ]


def table(runs):
    base = runs[0]
    rows = [
        ("samples/s", lambda r: f"{r['samples_s']:.0f}", lambda r: r["samples_s"] / base["samples_s"]),
        *link_rows(runs),
        ("rows pulled", lambda r: str(r["pulls"]), lambda r: r["pulls"] / max(1, base["pulls"])),
        ("rows pushed", lambda r: str(r["pushes"]), lambda r: r["pushes"] / max(1, base["pushes"])),
        ("  gradients", lambda r: str(r["push_grad"]), None),
        ("  values", lambda r: str(r["push_value"]), None),
        ("  evictions", lambda r: str(r["push_evict"]), None),
        ("rows moved", lambda r: str(r["transmissions"]), lambda r: r["transmissions"] / max(1, base["transmissions"])),
        ("payload MB", lambda r: f"{(r['bytes_out'] + r['bytes_in']) / 1e6:.1f}",
         lambda r: (r["bytes_out"] + r["bytes_in"]) / max(1, base["bytes_out"] + base["bytes_in"])),
        ("cache hit rate", lambda r: f"{100 * r['hit_rate']:.1f}%", None),
        ("final loss", lambda r: f"{r['loss']:.4f}", None),
        ("AUC", lambda r: f"{r['auc']:.4f}", None),
        ("logloss", lambda r: f"{r['logloss']:.4f}", None),
    ]
    names, settings = [name(r) for r in runs], [setting(r) for r in runs]
    cells = []
    for label, fmt, ratio in rows:
        line = []
        for r in runs:
            c = fmt(r)
            x = ratio(r) if ratio and r is not base else None
            line.append(c + (f" ({x:.2f}x)" if x is not None else ""))
        cells.append((label, line))
    width = max(14, *(len(n) for n in names + settings), *(len(c) for _, line in cells for c in line))
    out = [f"{'':18}" + "".join(f"{n:>{width + 2}}" for n in names),
           f"{'':18}" + "".join(f"{n:>{width + 2}}" for n in settings)]
    out += [f"{label:18}" + "".join(f"{c:>{width + 2}}" for c in line) for label, line in cells]
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
        # An iteration whose loss is not known yet (the overlapped all-reduce's first) is
        # left out, not drawn as 0.
        known = [p for p in r["per_iteration"] if p.get("loss") is not None]
        its = [p["iteration"] for p in r["per_iteration"]]
        label = f"{name(r)} {setting(r)}"
        ax1.plot([p["iteration"] for p in known], [p["loss"] for p in known], label=label, linewidth=1)
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
