#!/usr/bin/env python3
"""Rows and bytes per policy and lookahead, from ember-sim (docs/scheduler.md#lookahead).

For each dataset: vanilla, herald, and herald with lookahead eviction for each window L,
plus Belady's bound; rows moved and payload bytes with SGD and with Adagrad, each as a
change against vanilla. With --refine, also herald with --refine-allocation, alone and
with each window. Prints a Markdown table per dataset.

  scripts/lookahead_table.py [--bin build/bin] [--windows 1,2,4,8] [--cases NAME,...] [--refine] [--no-belady]
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_util  # noqa: E402  (running a command)

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT.parent / "shared" / "data" / "real" / "criteo_kaggle_train_head10000.tsv"

# name -> ember-sim arguments (its --iterations include the --warmup ones)
CASES = {
    "criteo-1": ["--synthetic", "criteo", "--scale", "1", "--batch-per-worker", "128", "--cache-ratio", "0.1",
                 "--iterations", "600", "--warmup", "100"],
    "criteo-0.01": ["--synthetic", "criteo", "--scale", "0.01", "--batch-per-worker", "128", "--cache-ratio", "0.1",
                    "--iterations", "600", "--warmup", "100"],
    "criteo-0.01-r0.01": ["--synthetic", "criteo", "--scale", "0.01", "--batch-per-worker", "128", "--cache-ratio", "0.01",
                          "--iterations", "600", "--warmup", "100"],
    "avazu-1": ["--synthetic", "avazu", "--scale", "1", "--batch-per-worker", "128", "--cache-ratio", "0.1",
                "--iterations", "600", "--warmup", "100"],
    "real-criteo": ["--batch-per-worker", "16", "--cache-ratio", "0.1", "--iterations", "70", "--warmup", "10"],
}


def sim(a, case, extra, optimizer, data_dir):
    args = list(CASES[case])
    if case == "real-criteo":
        args = ["--dataset", str(data_dir)] + args
    cmd = [str(Path(a.bin) / "ember-sim"), "--workers", "8", "--json", "-q", "--optimizer", optimizer] + args + extra
    out = bench_util.sh(cmd, who="lookahead_table")
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def real_dataset(a):
    """The real Criteo head, prepared once (90% train) into the work directory."""
    out = Path(a.work) / "real-criteo"
    if not (out / "manifest.json").exists():
        if not REAL.exists():
            return None
        subprocess.run([str(Path(a.bin) / "ember-data"), "prep", "--format", "criteo", "--val-fraction", "0.1", "--force",
                        "-o", str(out), str(REAL)], check=True, capture_output=True)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default=str(ROOT / "build" / "bin"))
    p.add_argument("--work", default=str(ROOT / "out" / "lookahead-table"))
    p.add_argument("--windows", default="1,2,4,8")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--refine", action="store_true", help="also herald with --refine-allocation")
    p.add_argument("--no-belady", action="store_true", help="leave out Belady's bound")
    a = p.parse_args()
    Path(a.work).mkdir(parents=True, exist_ok=True)
    windows = [int(x) for x in a.windows.split(",") if x]
    for case in [c for c in a.cases.split(",") if c]:
        if case not in CASES:
            sys.exit(f"lookahead_table: unknown case {case} ({', '.join(CASES)})")
        data_dir = real_dataset(a) if case == "real-criteo" else None
        if case == "real-criteo" and data_dir is None:
            print(f"## {case}: skipped ({REAL} absent)\n")
            continue
        runs = [("vanilla", "-", ["--policy", "vanilla,herald", "--lookahead", "0"])]
        runs += [(f"herald L={L}", "lookahead", ["--policy", "herald", "--lookahead", str(L), "--eviction", "lookahead"]) for L in windows]
        if not a.no_belady:
            runs += [("herald belady", "belady", ["--policy", "herald", "--eviction", "belady"])]
        if a.refine:
            refine = ["--policy", "herald", "--refine-allocation"]
            runs += [("herald refined", "-", refine + ["--lookahead", "0"])]
            runs += [(f"herald refined L={L}", "lookahead", refine + ["--lookahead", str(L), "--eviction", "lookahead"]) for L in windows]
        rows = []
        base = {}
        for label, eviction, extra in runs:
            sgd = sim(a, case, extra, "sgd", data_dir)
            ada = sim(a, case, extra, "adagrad", data_dir)
            for s, g in zip(sgd, ada):
                name = s["policy"] if label == "vanilla" else label
                if s["policy"] == "vanilla":
                    base = {"rows": s["transmissions"], "sgd": s["bytes"]["total"] - s["bytes"]["flush"],
                            "ada": g["bytes"]["total"] - g["bytes"]["flush"]}
                rows.append((name, s, g))
        print(f"## {case}: `ember-sim --workers 8 {' '.join(CASES[case])}`\n")
        print("| policy | pulls | pushes | rows moved | rows vs vanilla | MB SGD | vs vanilla | MB Adagrad | vs vanilla | hit rate | ms/batch |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for name, s, g in rows:
            sb, gb = s["bytes"]["total"] - s["bytes"]["flush"], g["bytes"]["total"] - g["bytes"]["flush"]
            pct = lambda x, b: f"{100 * (x / b - 1):+.1f}%" if b else "-"
            print(f"| {name} | {s['pulls']} | {s['pushes']} | {s['transmissions']} | {pct(s['transmissions'], base['rows'])} | "
                  f"{sb / 1e6:.1f} | {pct(sb, base['sgd'])} | {gb / 1e6:.1f} | {pct(gb, base['ada'])} | {s['hit_rate']:.3f} | "
                  f"{s['sched_ms_per_batch']:.2f} |")
        print(flush=True)


if __name__ == "__main__":
    main()
