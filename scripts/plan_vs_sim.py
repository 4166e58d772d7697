#!/usr/bin/env python3
"""ember-plan's vanilla prediction against ember-sim's per-table counts (docs/planner.md).

Runs both on one dataset with the same topology and prints a Markdown table per kind:
per table, ember-sim's rows per iteration, ember-plan's, and the error.
"""
import argparse
import json
import subprocess
import sys


def last_json(out):
    obj = None
    for line in out.splitlines():
        if line.startswith("{"):
            obj = json.loads(line)
    return obj


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bin-dir", default="build/bin")
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--batch-per-worker", type=int, default=128)
    ap.add_argument("--cache-ratio", default="0.1")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--sim-args", default="", help="extra ember-sim flags (e.g. --shuffle)")
    ap.add_argument("--order", default="file", choices=["file", "shuffled"],
                    help="file: both in file order; shuffled: ember-sim --shuffle, ember-plan --order shuffled")
    ap.add_argument("--min-count", type=int, default=1000, help="judge tables with at least this many rows counted over the run")
    a = ap.parse_args()
    common = ["--dataset", a.dataset, "--workers", str(a.workers), "--batch-per-worker", str(a.batch_per_worker), "--cache-ratio", a.cache_ratio,
              "--warmup", str(a.warmup), "--iterations", str(a.warmup + a.iterations)]
    sim = last_json(subprocess.run([f"{a.bin_dir}/ember-sim", *common, "--policy", "vanilla", "--json", "--quiet",
                                    *(["--shuffle"] if a.order == "shuffled" else []), *a.sim_args.split()], check=True, capture_output=True, text=True).stdout)
    plan = last_json(subprocess.run([f"{a.bin_dir}/ember-plan", *common, "--order", a.order, "--json"], check=True, capture_output=True,
                                    text=True).stdout)
    it = sim["iterations"]
    print(f"{a.order} order, {a.workers} workers x {a.batch_per_worker}, iterations {a.warmup}..{a.warmup + it - 1}, "
          f"cache {plan['cache_rows']} rows (demand {plan['cache_demand']:.2f}); rows per iteration\n")
    print("| table | rows | sim pulls | plan pulls | error | sim pushes | plan pushes | error |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    worst = 0.0
    tot = {"sp": 0, "pp": 0, "sg": 0, "pg": 0}
    for s, p in zip(sim["tables"], plan["tables"]):
        cells = []
        for kind in ("pulls", "push_grad"):
            sv, pv = s[kind] / it, p[kind]
            err = (pv - sv) / sv if sv > 0 else 0.0
            judged = s[kind] >= a.min_count
            if judged:
                worst = max(worst, abs(err))
            cells += [f"{sv:.1f}", f"{pv:.1f}", f"{100 * err:+.1f}%" + ("" if judged else " (n/j)")]
        tot["sp"] += s["pulls"] / it; tot["pp"] += p["pulls"]; tot["sg"] += s["push_grad"] / it; tot["pg"] += p["push_grad"]
        print(f"| {s['name']} | {p['rows']} | " + " | ".join(cells) + " |")
    e1 = (tot["pp"] - tot["sp"]) / tot["sp"]
    e2 = (tot["pg"] - tot["sg"]) / tot["sg"]
    print(f"| all | | {tot['sp']:.1f} | {tot['pp']:.1f} | {100 * e1:+.1f}% | {tot['sg']:.1f} | {tot['pg']:.1f} | {100 * e2:+.1f}% |")
    print(f"\nworst judged error: {100 * worst:.1f}% (n/j: fewer than {a.min_count} rows counted, not judged)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
