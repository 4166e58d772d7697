#!/usr/bin/env python3
"""The pipeline's ceiling per worker process (docs/benchmarks.md "The pipeline's ceiling"):
jobs of 1 PS and W workers over loopback training a model that computes nothing
(examples/models/null.py), so that samples/s is what the loader, the scheduler, the PS
exchange and the embedding path allow. One-hot Criteo-like data and MLPerf's bags (26
bags, 214 ids a sample), vanilla and herald + lookahead, per batch size and worker count:
samples/s, ns per id of the whole iteration and of each phase, next to the memory's rate
measured in the same run: `ember-bench bags`, a bare gather-pool and scatter-add of the
same ids, in order, over a table of the same rows, on the worker's thread count.

  scripts/bench_pipeline.py [--batches 1024,4096] [--workers 1,2] [--iterations 40] [--threads 1]

The tables print as markdown; every job's figures land in <work>/pipeline.json.
"""
import argparse
import functools
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import bench_util

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("wait", "sync", "commit", "pull", "embedding", "compute", "allreduce", "dense_step", "push", "update", "flush")
CONFIGS = {"vanilla": ("vanilla", []), "herald+lookahead": ("herald", ["--lookahead", "4", "--prefetch", "--overlap-allreduce"])}
DATA = {"one-hot": [], "mlperf": ["--multi-hot", "mlperf"]}

sh = functools.partial(bench_util.sh, who="bench_pipeline")


def torch_python(preferred):
    """A Python with torch, to write the null model (Debian's python3-torch: /usr/bin/python3)."""
    for py in [preferred, "/usr/bin/python3", shutil.which("python3")]:
        if py and subprocess.run([py, "-c", "import torch"], capture_output=True).returncode == 0:
            return py
    sys.exit("bench_pipeline: no python3 with torch to write examples/models/null.py (install python3-torch: scripts/install_deps.sh --ops)")


def build_parser():
    """The benchmark's argument parser (its description: this file's docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default=str(ROOT / "build" / "bin"))
    p.add_argument("--work", default=str(ROOT / "out" / "bench-pipeline"))
    p.add_argument("--rows", type=int, default=100000, help="generated rows per dataset (ember-data gen)")
    p.add_argument("--scale", type=float, default=0.01)
    p.add_argument("--data", default="one-hot,mlperf")
    p.add_argument("--batches", default="1024,4096", help="samples per worker per iteration")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--configs", default="vanilla,herald+lookahead")
    p.add_argument("--iterations", type=int, default=40)
    p.add_argument("--threads", type=int, default=1, help="each worker's --torch-threads (and the bare loop's threads)")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--cache-ratio", type=float, default=0.25, help="one-hot jobs' cache, of every table's rows")
    p.add_argument("--bags-cache-ratio", type=float, default=0.9,
                   help="MLPerf bags' jobs' cache: a micro-batch of bags holds most of a small table's rows")
    p.add_argument("--repeats", type=int, default=1, help="jobs per case (medians)")
    p.add_argument("--python", default=sys.executable, help="a python3 with torch, for the null model")
    p.add_argument("--device", default="cpu", help="the workers' --device (cuda: the GPU issue's runs)")
    p.add_argument("--model", default="null",
                   help="null (examples/models/null.py) or a built-in model (dlrm, dcnv2: the real model's cost beside the ceiling)")
    return p


def model_args(a, work):
    """The workers' model flags: the null model (written to WORK/null.pt) or --model's."""
    if a.model == "null":
        null = work / "null.pt"
        sh([torch_python(a.python), ROOT / "examples" / "models" / "null.py", "-o", null, "--tables", 26, "--dense", 13, "--dim", a.dim])
        return ["--model-file", null]
    return ["--model", a.model]


def prepare_data(a, work, data, bare):
    """Generates and preps dataset `data` under WORK and measures the bare loop on its ids
    (into bare, by (data, batch)); returns (its directory, ids a sample)."""
    b = a.bin
    text, ds = work / f"{data}.tsv", work / data
    sh([f"{b}/ember-data", "gen", "--like", "criteo", "--rows", a.rows, "--scale", a.scale, "--seed", 1, "--force", "-q", "-o", text]
       + DATA[data])
    sep = ["--multi-hot-sep", "|"] if DATA[data] else []
    sh([f"{b}/ember-data", "prep", "--format", "criteo", "--val-fraction", "0.01", "--force", "-o", ds, text] + sep)
    manifest = json.loads((ds / "manifest.json").read_text())
    ids = sum(t.get("mean_bag", 1.0) for t in manifest["tables"])
    out = sh([f"{b}/ember-bench", "--json", "bags", "--dataset", ds, "--batch", a.batches, "--dim", a.dim, "--threads", a.threads])
    for line in out.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            bare[(data, r["batch"])] = r
    return ds, ids


def run_jobs(a, work, model, data, ds, batch, w, cfg):
    """--repeats jobs of one case (data, batch per worker, workers, configuration); their summaries."""
    b = a.bin
    policy, flags = CONFIGS[cfg]
    runs = []
    for rep in range(a.repeats):
        name = f"{data}-b{batch}-w{w}-{cfg.replace('+', '-')}-{rep}"
        jo = work / name
        worker = model + ["--device", a.device, "--torch-threads", a.threads, "--batch-per-worker", batch, "--iterations", a.iterations,
                  "--cache-ratio", a.bags_cache_ratio if DATA[data] else a.cache_ratio, "--progress-every", 0, "--eval-samples", 1000]
        sh([sys.executable, ROOT / "scripts" / "ember_launch.py", "--dataset", ds, "--ps", 1, "--workers", w, "--policy", policy,
            "--bin", b, "--out", jo, "-q", "--timeout", 1800, "--ps-args", f"--dim {a.dim} --optimizer sgd --lr 0.05"]
           + flags + ["--"] + [str(x) for x in worker])
        runs.append(json.loads((jo / "summary.json").read_text()))
    return runs


def case_figures(a, runs, data, batch, w, cfg, ids, bare):
    """One case's figures from its jobs' summaries, against the bare loop's on the same ids; prints them in a line."""
    phase = {k: statistics.median(r["phase_s"].get(k, 0.0) for r in runs) for k in PHASES}
    iters = runs[0]["iterations"] if "iterations" in runs[0] else a.iterations
    worker_ids = iters * batch * ids  # ids one worker pooled
    busy = sum(phase[k] for k in PHASES if k != "flush")  # the final evaluation left out
    ref = bare[(data, batch)]
    j = {"data": data, "batch": batch, "workers": w, "config": cfg, "ids_per_sample": ids,
         "samples_s": statistics.median(r["samples_s"] for r in runs),
         "samples_s_training": w * iters * batch / busy,
         "ns_id": 1e9 * busy / worker_ids, "bare_ns_id": ref["bare_ns_id"], "fused_kernel_ns_id": ref["fused_ns_id"],
         "phase_ns_id": {k: 1e9 * phase[k] / worker_ids for k in PHASES}}
    j["vs_bare"] = j["ns_id"] / j["bare_ns_id"]
    j["embedding_vs_bare"] = j["phase_ns_id"]["embedding"] / j["bare_ns_id"]
    print(f"bench_pipeline: {data} batch {batch} x {w} {cfg}: {j['samples_s_training']:,.0f} samples/s, "
          f"{j['ns_id']:.0f} ns/id ({j['vs_bare']:.1f}x bare), embedding {j['embedding_vs_bare']:.1f}x bare",
          file=sys.stderr, flush=True)
    return j


def print_tables(a, jobs):
    """Prints the jobs' figures as a markdown table under a line naming the settings."""
    print(f"Model {a.model}, device {a.device}, dim {a.dim}, {a.iterations} iterations, cache {a.cache_ratio} of the rows, "
          f"{a.threads} torch thread(s) a worker; ns per id a worker pooled; bare: `ember-bench bags` on the same ids\n")
    print("| data | batch/worker | workers | config | samples/s | ns/id | bare ns/id | vs bare | embedding ns/id | embedding vs bare | "
          + " | ".join(k for k in PHASES if k not in ("embedding", "flush")) + " |")
    print("|---" * (10 + len(PHASES) - 2) + "|")
    for j in jobs:
        ph = j["phase_ns_id"]
        print(f"| {j['data']} | {j['batch']} | {j['workers']} | {j['config']} | {j['samples_s_training']:,.0f} | {j['ns_id']:.0f} | "
              f"{j['bare_ns_id']:.0f} | {j['vs_bare']:.1f}x | {ph['embedding']:.0f} | {j['embedding_vs_bare']:.1f}x | "
              + " | ".join(f"{ph[k]:.0f}" for k in PHASES if k not in ("embedding", "flush")) + " |")


def main():
    a = build_parser().parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    model = model_args(a, work)
    jobs, bare = [], {}
    for data in a.data.split(","):
        ds, ids = prepare_data(a, work, data, bare)
        for batch in [int(x) for x in a.batches.split(",")]:
            for w in [int(x) for x in a.workers.split(",")]:
                for cfg in a.configs.split(","):
                    runs = run_jobs(a, work, model, data, ds, batch, w, cfg)
                    jobs.append(case_figures(a, runs, data, batch, w, cfg, ids, bare))
    (work / "pipeline.json").write_text(json.dumps({"jobs": jobs, "bare": [v for v in bare.values()], "args": vars(a)}, indent=1) + "\n")
    print_tables(a, jobs)


if __name__ == "__main__":
    main()
