#!/usr/bin/env python3
"""Experiment runner: a job matrix (policies x transports x worker counts x cache ratios)
from a small JSON config, run one job after another with ember_launch.py. Each result is
kept as JSON; a report (Markdown table + PNG plots) compares samples/s, rows moved and
AUC, each policy against vanilla with the same transport, workers and cache ratio.
Combinations this machine cannot run (RDMA without a device) are listed as skipped with
the reason.

  scripts/experiments.py scripts/experiments.example.json --out out/experiments
"""
import argparse
import itertools
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def rdma_reason(bin_dir, dataset):
    """Why RDMA runs cannot happen here ('' when a device is present)."""
    r = subprocess.run([str(Path(bin_dir) / "ember-worker"), "--dataset", dataset, "--coordinator", "tcp://127.0.0.1:1",
                        "--token", "probe", "--transport", "rdma", "--join-timeout-ms", "1"],
                       capture_output=True, text=True)
    msg = (r.stderr + r.stdout).strip().splitlines()
    text = msg[-1] if msg else ""
    return text.replace("ember-worker: error: ", "") if "RDMA" in text else ""


def main():
    p = argparse.ArgumentParser(description="Run a matrix of Ember jobs and report on them.")
    p.add_argument("config", help="JSON: dataset, policies, transports, workers, cache_ratios, ps, worker_args, ps_args")
    p.add_argument("--out", required=True, help="results directory (one sub-directory per job, report.md, PNGs)")
    p.add_argument("--bin", default=str(ROOT / "build" / "bin"))
    p.add_argument("--timeout", type=float, default=1800, help="seconds per job")
    a = p.parse_args()
    try:
        cfg = json.loads(Path(a.config).read_text())
        dataset = cfg["dataset"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"experiments: {a.config}: {e}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    matrix = list(itertools.product(cfg.get("policies", ["vanilla", "herald"]), cfg.get("transports", ["tcp"]),
                                    cfg.get("workers", [4]), cfg.get("cache_ratios", [0.1])))
    rdma_why = rdma_reason(a.bin, dataset) if any(t == "rdma" for _, t, _, _ in matrix) else ""
    results, skipped = [], []
    for i, (policy, transport, workers, ratio) in enumerate(matrix):
        name = f"{policy.replace(':', '')}-{transport}-w{workers}-c{ratio}"
        print(f"== [{i + 1}/{len(matrix)}] {name}", flush=True)
        if transport == "rdma" and rdma_why:
            skipped.append({"job": name, "reason": rdma_why})
            print(f"   skipped: {rdma_why}", flush=True)
            continue
        run_dir = out / name
        cmd = [sys.executable, str(ROOT / "scripts" / "ember_launch.py"), "--dataset", dataset, "--ps", str(cfg.get("ps", 1)),
               "--workers", str(workers), "--policy", policy, "--transport", transport, "--bin", a.bin, "--out", str(run_dir),
               "--timeout", str(a.timeout), "--ps-args", cfg.get("ps_args", ""), "-q", "--",
               "--cache-ratio", str(ratio)] + [str(x) for x in cfg.get("worker_args", [])]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            why = (r.stderr.strip().splitlines() or ["(no output)"])[0]
            skipped.append({"job": name, "reason": f"failed: {why}"})
            print(f"   failed: {why}", flush=True)
            continue
        s = json.loads((run_dir / "summary.json").read_text())
        s.update({"job": name, "cache_ratio": ratio})
        results.append(s)
        print(f"   {s['samples_s']:.0f} samples/s, {s['transmissions']} rows moved, AUC {s['auc']:.4f}", flush=True)
    (out / "results.json").write_text(json.dumps({"results": results, "skipped": skipped}, indent=1) + "\n")
    report(results, skipped, out)


def report(results, skipped, out):
    def base_of(r):
        for b in results:
            if b["policy"] == "vanilla" and all(b[k] == r[k] for k in ("transport", "workers", "cache_ratio")):
                return b
        return None

    lines = ["# Ember experiments", "",
             "| job | policy | transport | workers | cache | samples/s | vs vanilla | rows moved | vs vanilla | hit rate | AUC | logloss |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        b = base_of(r)
        sp = f"{r['samples_s'] / b['samples_s']:.2f}x" if b else "-"
        mv = f"{r['transmissions'] / max(1, b['transmissions']):.2f}x" if b else "-"
        lines.append(f"| {r['job']} | {r['policy']} | {r['transport']} | {r['workers']} | {r['cache_ratio']} | {r['samples_s']:.0f} | {sp} | "
                     f"{r['transmissions']} | {mv} | {100 * r['hit_rate']:.1f}% | {r['auc']:.4f} | {r['logloss']:.4f} |")
    if skipped:
        lines += ["", "## Skipped", ""] + [f"- {s['job']}: {s['reason']}" for s in skipped]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
        names = [r["job"] for r in results]
        for ax, key, title in zip(axes, ("samples_s", "transmissions", "auc"), ("samples/s", "embedding rows moved", "AUC")):
            ax.bar(range(len(results)), [r[key] for r in results], color=["#999" if r["policy"] == "vanilla" else "#c44" for r in results])
            ax.set_xticks(range(len(results)))
            ax.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
            ax.set_title(title)
            ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "report.png", dpi=110)
        lines += ["", "![samples/s, rows moved and AUC per job](report.png)"]
    except ImportError:
        lines += ["", "(no plot: python3-matplotlib is not installed)"]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nreport: {out / 'report.md'}")


if __name__ == "__main__":
    main()
