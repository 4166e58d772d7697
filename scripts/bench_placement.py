#!/usr/bin/env python3
"""Does the plan pay? (issue 29, docs/planner.md). On one dataset, W workers and one PS:
ember-plan plans the tables under a memory budget per worker (herald's PS + cache from a
simulator sample), then three herald jobs run, alternated within each repeat, each under
the same budget:

  all-PS     every table on the PS + cache (the budget all cache)
  greedy     ember-plan's best greedy plan (--greedy-out)
  searched   ember-plan's searched plan (--plan-out)

over TCP loopback (--link-mbit 0) or over the shaped link of scripts/bench_e2e.py (the PS
in one network namespace, the workers in another, a veth pair shaped by tc tbf; the
workers' all-reduce stays inside their namespace, so ember-plan is told their links are
unshaped: --worker-link-mbit 100000). Reported per plan: the predicted and measured payload
bytes on the PS link per iteration (every worker's pulls and pushes; flushes apart), the
framed bytes the transport carried per iteration (headers, the replicas' load and
write-back included), the all-reduce payload per worker per iteration, samples/s (median
of --repeats) and each against all-PS.

With --calibrate, two short jobs over loopback first (every table on the PS + cache, then
every table replicated) give the machine's costs (scripts/bench_placement.py fits them;
ember-plan --calibration reads the file): the CPU's part of an iteration, fixed and per
byte on the PS link, and the all-reduce's, fixed and per byte each worker puts in. Then
ember-plan predicts each plan's iteration time, compared with the measured one.

  scripts/bench_placement.py --dataset DIR [--workers 8] [--memory 4M] [--link-mbit 50]
                             [--iterations 100] [--repeats 3] [--calibrate | --calibration FILE] [--json]
"""
import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_e2e import ROOT, TbfLink, launch, sh  # noqa: E402

CONFIGS = ("all-PS", "greedy", "searched")


def plan(a, calibration=""):
    """Writes the plan files into a.work (and all-replicated.json, for --calibrate); returns
    ember-plan's JSON prediction."""
    work = Path(a.work)
    out = sh([f"{a.bin}/ember-plan", "--dataset", a.dataset, "--workers", str(a.workers), "--batch-per-worker", str(a.batch_per_worker),
              "--ps", "1", "--memory", a.memory, "--link-mbit", str(a.link_mbit or 10000), "--worker-link-mbit", "100000",
              "--policy", "herald", "--sample", str(a.sample), "--warmup", str(a.plan_warmup), "--dim", str(a.dim),
              "--plan-out", str(work / "searched.json"), "--greedy-out", str(work / "greedy.json"), "--json"]
             + (["--calibration", calibration] if calibration else []))
    pred = json.loads(out.strip().splitlines()[-1])
    # all-PS: every table cached, the whole budget (as ember-plan costed it) the cache.
    p = json.loads((work / "searched.json").read_text())
    for t in p["tables"]:
        t["treatment"] = "cache"
    p["cache_rows"] = pred["all_cache"]["cache_rows"]
    (work / "all-PS.json").write_text(json.dumps(p, indent=1) + "\n")
    for t in p["tables"]:
        t["treatment"] = "replicated"
    (work / "all-replicated.json").write_text(json.dumps(p, indent=1) + "\n")
    return pred


def calibrate(a):
    """Two short loopback jobs (all-PS, all-replicated); the fitted costs, written to
    <work>/calibration.json. Per iteration: all-reduce = a0 + a1 x bytes put in; the rest
    (CPU) = c0 + c1 x bytes on the PS link."""
    it = a.iterations
    a.iterations = a.calibration_iterations
    try:
        x, y = (run(a, c, "calibration", []) for c in ("all-PS", "all-replicated"))
    finally:
        a.iterations = it
    a1 = max(0.0, (y["allreduce_s"] - x["allreduce_s"]) / max(1.0, y["allreduce"] - x["allreduce"]))
    a0 = x["allreduce_s"] - a1 * x["allreduce"]
    cx, cy = x["iteration_s"] - x["allreduce_s"], y["iteration_s"] - y["allreduce_s"]
    c1 = max(0.0, (cx - cy) / max(1.0, x["ps_payload"] - y["ps_payload"]))
    c0 = cy - c1 * y["ps_payload"]
    cal = {"cpu_s": c0, "cpu_s_per_ps_byte": c1, "allreduce_s": a0, "allreduce_s_per_byte": a1,
           "dense_allreduce_bytes": x["allreduce"], "workers": a.workers, "batch_per_worker": a.batch_per_worker,
           "from": {"all-PS": x, "all-replicated": y}}
    path = Path(a.work) / "calibration.json"
    path.write_text(json.dumps(cal, indent=1) + "\n")
    return str(path)


def run(a, config, repeat, launcher):
    s = launch(a, "herald", a.workers, f"{config}-{repeat}",
               ["--batch-per-worker", str(a.batch_per_worker), "--iterations", str(a.iterations), "--progress-every", "0",
                "--model", "dlrm", "--bottom-mlp", "64-32", "--top-mlp", "64-32", "--dense-lr", "0.05", "--seed", "1"],
               list(launcher) + ["--placement", str(Path(a.work) / f"{config}.json")])
    it = s["iterations"]
    b = s["bytes"]
    return {"samples_s": s["samples_s"],
            "iteration_s": s["seconds"] / it,
            "allreduce_s": s["phase_s"]["allreduce"] / it,
            "ps_payload": (b["total"] - b["flush"]) / it,
            "framed": s["framed_bytes"]["total"] / it,
            "allreduce": s["allreduce_bytes"] / a.workers / it,
            "hot_sync": s["hot_sync"] / it,
            "transmissions": s["transmissions"] / it}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True, help="ember-data dataset")
    p.add_argument("--work", default=str(ROOT / "out" / "bench-placement"))
    p.add_argument("--bin", default=str(ROOT / "build" / "bin"))
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--batch-per-worker", type=int, default=128)
    p.add_argument("--memory", default="4M", help="memory per worker the plans share (ember-plan --memory)")
    p.add_argument("--link-mbit", type=int, default=50, help="the PS link's rate (tc tbf), Mbit/s; 0: unshaped TCP loopback")
    p.add_argument("--iterations", type=int, default=100)
    p.add_argument("--sample", type=int, default=20, help="herald's simulator sample for ember-plan (iterations)")
    p.add_argument("--plan-warmup", type=int, default=40, help="ember-plan --warmup: the sample starts once the caches fill")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3, help="runs per plan (medians reported)")
    p.add_argument("--json", action="store_true", help="also the rows as JSON")
    p.add_argument("--calibrate", action="store_true", help="first fit the machine's costs (two loopback jobs) and predict iteration times")
    p.add_argument("--calibration", default="", help="a calibration file (from --calibrate) to predict iteration times with")
    p.add_argument("--calibration-iterations", type=int, default=40, help="iterations of each --calibrate job")
    a = p.parse_args()
    Path(a.work).mkdir(parents=True, exist_ok=True)
    pred = plan(a)
    if a.calibrate:
        a.calibration = calibrate(a)
    if a.calibration:
        pred = plan(a, a.calibration)
    predicted = {"all-PS": pred["all_cache"], "greedy": pred["greedy"][pred["best_greedy"]], "searched": pred["searched"]}
    runs = {c: [] for c in CONFIGS}

    def sweep(launcher):
        for r in range(a.repeats):
            for c in CONFIGS:
                runs[c].append(run(a, c, r, launcher))
                print(f"  {c} run {r + 1}: {runs[c][-1]['samples_s']:.0f} samples/s", file=sys.stderr, flush=True)

    if a.link_mbit > 0:
        if os.geteuid() != 0:
            sys.exit("bench_placement: the shaped link needs root (network namespaces + tc); --link-mbit 0 runs over loopback")
        if not shutil.which("tc") or not shutil.which("ip"):
            sys.exit("bench_placement: iproute2 (ip, tc) is not installed")
        with TbfLink(a.link_mbit) as link:
            sweep(link.launcher_args())
    else:
        sweep([])
    med = statistics.median
    rows = []
    for c in CONFIGS:
        m = {k: med([r[k] for r in runs[c]]) for k in runs[c][0]}
        rows.append({"config": c, "predicted_ps_link": predicted[c]["ps_link_bytes"], "predicted_iteration_s": predicted[c]["iteration_s"], **m,
                     "runs_samples_s": [r["samples_s"] for r in runs[c]]})
    base = rows[0]
    link = f"{a.link_mbit} Mbit/s tbf" if a.link_mbit else "loopback"
    print(f"herald, {a.workers} workers x {a.batch_per_worker}, 1 PS, {link}, memory {a.memory} per worker, "
          f"{a.iterations} iterations, medians of {a.repeats}")
    print("| plan | PS link KB/it predicted | PS link KB/it measured | vs all-PS | framed KB/it | all-reduce KB/it per worker "
          "| samples/s | vs all-PS | ms/it predicted | ms/it measured | error |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        p = r["predicted_iteration_s"]
        err = "-" if p is None else f"{100 * (p - r['iteration_s']) / r['iteration_s']:+.0f}%"
        print(f"| {r['config']} | {r['predicted_ps_link'] / 1e3:.1f} | {r['ps_payload'] / 1e3:.1f} | "
              f"{r['ps_payload'] / base['ps_payload']:.2f}x | {r['framed'] / 1e3:.1f} | {r['allreduce'] / 1e3:.1f} | "
              f"{r['samples_s']:.0f} | {r['samples_s'] / base['samples_s']:.2f}x | {'-' if p is None else f'{1e3 * p:.0f}'} | "
              f"{1e3 * r['iteration_s']:.0f} | {err} |")
    if a.json:
        for r in rows:
            print(json.dumps(r))


if __name__ == "__main__":
    main()
