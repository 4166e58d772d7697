#!/usr/bin/env python3
"""Training on the GPU against CPU workers on the same machine (issue: GPU workers for
real). For each device (cuda, cpu), worker count and configuration, one job of 1 PS and W
workers (ember_launch.py on localhost; the CUDA workers share the one GPU), DLRM at
--dim on the quickstart's data, the same global batch for every W, so that every job
trains the same model (herald is BSP). Per job: samples/s, the workers' phase shares,
rows moved, AUC, and the largest difference of its final model (embedding rows and
dense weights, ember-worker --dump-dir) from the first job's.

  scripts/bench_gpu.py --bin build-device/bin [--workers 1,2,4] [--iterations 200] [--json]

A markdown table on stdout, every job's figures in <work>/gpu.json.
"""
import argparse
import array
import functools
import json
import os
import sys
from pathlib import Path

import bench_util

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("wait", "sync", "commit", "pull", "embedding", "compute", "allreduce", "dense_step", "push", "update", "flush")
CONFIGS = {"vanilla": ("vanilla", []), "herald+lookahead": ("herald", ["--lookahead", "4", "--prefetch", "--overlap-allreduce"])}


sh = functools.partial(bench_util.sh, who="bench_gpu")


def floats(path):
    a = array.array("f")
    a.frombytes(Path(path).read_bytes())
    return a


def max_diff(a, b):
    if len(a) != len(b):
        return float("inf")
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default=str(ROOT / "build" / "bin"))
    p.add_argument("--dataset", help="ember-data dataset (default: the quickstart's 200,000 Criteo-like rows, generated)")
    p.add_argument("--work", default=str(ROOT / "out" / "bench-gpu"))
    p.add_argument("--devices", default="cuda,cpu")
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--configs", default="vanilla,herald+lookahead")
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--batch", type=int, default=2048, help="global batch (split over the workers)")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--json", action="store_true", help="also one JSON object per job")
    a = p.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    if not a.dataset:
        a.dataset = str(work / "criteo")
        tsv = work / "criteo.tsv"
        sh([f"{a.bin}/ember-data", "gen", "--like", "criteo", "--rows", "200000", "--scale", "0.01", "--seed", "1", "--force", "-o", tsv])
        sh([f"{a.bin}/ember-data", "prep", "--format", "criteo", "--val-fraction", "0.1", "--force", "-o", a.dataset, tsv])
    model = ["--model", "dlrm", "--bottom-mlp", "256-128", "--top-mlp", "256-128", "--dense-lr", "0.05", "--seed", "1"]
    rows, ref = [], None
    for dev in a.devices.split(","):
        for w in [int(x) for x in a.workers.split(",")]:
            if a.batch % w:
                sys.exit(f"bench_gpu: --batch {a.batch} does not split over {w} workers")
            for cfg in a.configs.split(","):
                policy, flags = CONFIGS[cfg]
                name = f"{dev}-w{w}-{cfg.replace('+', '-')}"
                out, dump = work / name, work / (name + "-model")
                # CPU workers share the machine's cores (one for the PS and the launcher).
                threads = max(1, ((os.cpu_count() or 2) - 2) // w) if dev == "cpu" else 1
                worker = model + ["--device", dev, "--torch-threads", str(threads), "--batch-per-worker", str(a.batch // w), "--iterations", str(a.iterations),
                                  "--cache-ratio", "0.1", "--progress-every", "0", "--eval-every", str(a.iterations)]
                sh([sys.executable, ROOT / "scripts" / "ember_launch.py", "--dataset", a.dataset, "--ps", "1", "--workers", w,
                    "--policy", policy, "--bin", a.bin, "--out", out, "-q", "--timeout", "900", "--dump-dir", dump,
                    "--ps-args", f"--dim {a.dim} --optimizer sgd --lr 0.05"] + flags + ["--"] + worker)
                s = json.loads((out / "summary.json").read_text())
                model_now = (floats(dump / "rows.bin"), floats(dump / "dense.bin"))
                if ref is None:
                    ref = (name, model_now)
                phase = s.get("phase_s", {})
                total = max(1e-12, sum(phase.get(k, 0.0) for k in PHASES))
                r = {"job": name, "device": dev, "workers": w, "config": cfg, "samples_s": s["samples_s"], "auc": s.get("auc"),
                     "rows_moved": s["transmissions"], "phase_share": {k: phase.get(k, 0.0) / total for k in PHASES},
                     "vs": ref[0], "rows_max_diff": max_diff(ref[1][0], model_now[0]),
                     "dense_max_diff": max_diff(ref[1][1], model_now[1])}
                rows.append(r)
                print(f"bench_gpu: {name}: {r['samples_s']:.0f} samples/s, AUC {r['auc']}, rows moved {r['rows_moved']}", file=sys.stderr,
                      flush=True)
    (work / "gpu.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(f"DLRM dim {a.dim}, global batch {a.batch}, {a.iterations} iterations, 1 PS; model differences against {rows[0]['job']}\n")
    print("| device | workers | config | samples/s | AUC | rows moved | compute | pull | push | allreduce | max row diff | max dense diff |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        sh_ = r["phase_share"]
        print(f"| {r['device']} | {r['workers']} | {r['config']} | {r['samples_s']:.0f} | {r['auc']:.4f} | {r['rows_moved']} | "
              f"{sh_['compute']:.0%} | {sh_['pull']:.0%} | {sh_['push']:.0%} | {sh_['allreduce']:.0%} | "
              f"{r['rows_max_diff']:.1e} | {r['dense_max_diff']:.1e} |")
    if a.json:
        for r in rows:
            print(json.dumps(r))


if __name__ == "__main__":
    main()
