#!/usr/bin/env python3
"""Stream training against the same job on prepared files (issue: at least 0.9x).

Writes Criteo-like text as a stream's directory of files (ember-data gen --files), prepares
the same lines with `prep --ids hash`, and runs the same job on each through
ember_launch.py (--stream DIR, then --dataset DIR), alternately, --repeats times; prints
each run's samples/s, the medians and the ratio stream / prepared. The two jobs train the
same model (tests/worker/training_dynamic_test.cc); this measures only what reading and
parsing text as it comes costs the loader.

  python3 scripts/bench_stream.py [--bin build/bin] [--work /tmp/ember-bench-stream]
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

from bench_util import sh

ROOT = Path(__file__).resolve().parent.parent


def run_job(a, data_args, name):
    out = Path(a.work) / name
    sh([sys.executable, ROOT / "scripts" / "ember_launch.py", *data_args, "--slots-per-shard", str(a.slots), "--ps", "1",
        "--workers", str(a.workers), "--policy", a.policy, "--bin", a.bin, "--out", out, "-q", "--timeout", "900",
        "--ps-args", "--dim 16 --optimizer adagrad --lr 0.05", "--", "--iterations", str(a.iterations),
        "--batch-per-worker", str(a.batch), "--progress-every", "0", "--eval-every", "0", "--model", a.model], who="bench_stream")
    return json.loads((out / "summary.json").read_text())["samples_s"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default=str(ROOT / "build" / "bin"))
    p.add_argument("--work", default="/tmp/ember-bench-stream")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=1024, help="samples per worker per iteration")
    p.add_argument("--iterations", type=int, default=60)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--model", default="dlrm")
    p.add_argument("--policy", default="herald")
    p.add_argument("--slots", type=int, default=1 << 20, help="--slots-per-shard")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = a.workers * a.batch * a.iterations
    stream = work / "stream"
    sh([f"{a.bin}/ember-data", "gen", "--like", "criteo", "--rows", str(rows), "--files", str(a.files), "--scale", "0.01",
        "--new-ids", "0.1", "--seed", "9", "--force", "-q", "-o", stream], who="bench_stream")
    parts = sorted(str(f) for f in stream.iterdir())
    sh([f"{a.bin}/ember-data", "prep", "--ids", "hash", "--format", "criteo", "--force", "-o", work / "prepared", *parts],
       who="bench_stream")
    runs = {"stream": [], "prepared": []}
    for r in range(a.repeats):
        runs["stream"].append(run_job(a, ["--stream", str(stream)], f"stream-{r}"))
        runs["prepared"].append(run_job(a, ["--dataset", str(work / "prepared")], f"prepared-{r}"))
        print(f"repeat {r}: stream {runs['stream'][-1]:.0f} samples/s, prepared {runs['prepared'][-1]:.0f}", flush=True)
    s, d = statistics.median(runs["stream"]), statistics.median(runs["prepared"])
    print(f"{a.workers} workers x {a.batch}, {a.model}, {a.policy}, {a.iterations} iterations ({rows} samples in {a.files} files): "
          f"stream {s:.0f} samples/s, prepared files {d:.0f} (medians of {a.repeats}); stream / prepared {s / d:.2f}x")


if __name__ == "__main__":
    main()
