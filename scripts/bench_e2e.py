#!/usr/bin/env python3
"""End-to-end benchmark (the e2e part of ember-bench, as a script because it launches
processes). All figures come from one run on one machine, reported as ratios:

  1. samples/s of 1 PS + 1 worker against a plain single-process LibTorch loop with the
     table in memory (ember-worker --reference): same model, batch and data. Target >= 0.8.
  2. herald vs vanilla samples/s (and rows moved) with 4 workers over TCP loopback.
  3. the same over a bandwidth-limited link (veth + tc tbf in network namespaces): needs
     root and iproute2; reported as skipped with the reason otherwise.

  scripts/bench_e2e.py [--dataset DIR] [--iterations N] [--json]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def sh(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"bench_e2e: {' '.join(map(str, cmd))} failed:\n{r.stderr[-2000:]}")
    return r.stdout


def launch(a, policy, workers, name, extra):
    out = Path(a.work) / name
    sh([sys.executable, str(ROOT / "scripts" / "ember_launch.py"), "--dataset", a.dataset, "--ps", "1", "--workers", str(workers),
        "--policy", policy, "--bin", a.bin, "--out", str(out), "-q", "--timeout", "1800",
        "--ps-args", f"--dim {a.dim} --optimizer sgd --lr 0.05", "--"] + extra)
    return json.loads((out / "summary.json").read_text())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", help="ember-data dataset (default: generate a Criteo-like one)")
    p.add_argument("--work", default=str(ROOT / "out" / "bench-e2e"))
    p.add_argument("--bin", default=str(ROOT / "build" / "bin"))
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--batch", type=int, default=512, help="global batch")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3, help="runs per case (the median is reported)")
    p.add_argument("--json", action="store_true", help="also one JSON object per case")
    a = p.parse_args()
    Path(a.work).mkdir(parents=True, exist_ok=True)
    if not a.dataset:
        a.dataset = str(Path(a.work) / "criteo")
        tsv = Path(a.work) / "criteo.tsv"
        sh([f"{a.bin}/ember-data", "gen", "--like", "criteo", "--rows", "300000", "--scale", "0.01", "--seed", "1", "--force", "-o", str(tsv)])
        sh([f"{a.bin}/ember-data", "prep", "--format", "criteo", "--val-fraction", "0.02", "--force", "-o", a.dataset, str(tsv)])
    model = ["--model", "dlrm", "--bottom-mlp", "64-32", "--top-mlp", "64-32", "--dense-lr", "0.05", "--seed", "1"]
    med = lambda xs: sorted(xs)[len(xs) // 2]
    cases = []

    # 1. One PS + one worker vs one process with the table in memory.
    ref, one = [], []
    for _ in range(a.repeats):
        out = sh([f"{a.bin}/ember-worker", "--reference", "--dataset", a.dataset, "--workers", "1", "--batch-per-worker", str(a.batch),
                  "--iterations", str(a.iterations), "--dim", str(a.dim), "--optimizer", "sgd", "--lr", "0.05", "--log-level", "warn"] + model)
        ref.append(json.loads(out.strip().splitlines()[-1])["samples_s"])
        s = launch(a, "herald", 1, "one-worker", model + ["--batch-per-worker", str(a.batch), "--iterations", str(a.iterations),
                                                         "--cache-ratio", "0.1", "--progress-every", "0"])
        one.append(s["samples_s"])
    cases.append({"case": "1ps_1worker_vs_single_process", "samples_s": med(one), "baseline_samples_s": med(ref),
                  "ratio": med(one) / med(ref), "target": 0.8})

    # 2. herald vs vanilla, 4 workers over loopback.
    runs = {"vanilla": [], "herald": []}
    for _ in range(a.repeats):
        for policy in runs:
            runs[policy].append(launch(a, policy, 4, f"w4-{policy}", model + ["--batch-per-worker", str(a.batch // 4), "--iterations",
                                                                           str(a.iterations), "--cache-ratio", "0.1", "--progress-every", "0"]))
    v = med([r["samples_s"] for r in runs["vanilla"]])
    h = med([r["samples_s"] for r in runs["herald"]])
    cases.append({"case": "herald_vs_vanilla_4w_loopback", "samples_s": h, "baseline_samples_s": v, "ratio": h / v,
                  "rows_moved": runs["herald"][0]["transmissions"], "baseline_rows_moved": runs["vanilla"][0]["transmissions"],
                  "rows_ratio": runs["herald"][0]["transmissions"] / runs["vanilla"][0]["transmissions"]})

    # 3. Bandwidth-limited link.
    why = ""
    if os.geteuid() != 0:
        why = "needs root (network namespaces + tc)"
    elif not shutil.which("tc") or not shutil.which("ip"):
        why = "iproute2 (ip, tc) is not installed"
    else:
        why = "not implemented yet: the launcher does not place processes in network namespaces"
    cases.append({"case": "herald_vs_vanilla_4w_tbf_link", "skipped": why})

    print(f"{'case':34} {'samples/s':>10} {'baseline':>10} {'ratio':>7}  notes")
    for c in cases:
        if "skipped" in c:
            print(f"{c['case']:34} {'-':>10} {'-':>10} {'-':>7}  skipped: {c['skipped']}")
            continue
        note = f"target >= {c['target']}" if "target" in c else f"rows moved {c['rows_ratio']:.2f}x of vanilla"
        print(f"{c['case']:34} {c['samples_s']:10.0f} {c['baseline_samples_s']:10.0f} {c['ratio']:7.2f}  {note}")
    if a.json:
        for c in cases:
            print(json.dumps(c))


if __name__ == "__main__":
    main()
