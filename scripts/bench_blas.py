#!/usr/bin/env python3
"""The dense model's BLAS: the quickstart's herald job (examples/herald.toml, 4 workers over
TCP loopback) trained with Debian's reference BLAS for its matrix products, with OpenBLAS
on its SSE3 kernels (OPENBLAS_CORETYPE=Prescott, what OpenBLAS 0.3.21 falls back to on a
CPU it does not know) and with OpenBLAS as Ember runs it (kernels matched to the CPU,
docs/building.md#the-dense-models-blas). Alternated, samples/s from each summary.json,
medians and ratios against the reference BLAS measured in the same run.

  scripts/bench_blas.py --dataset out/quickstart/criteo --models dlrm,dcnv2 --repeats 2

The reference BLAS comes first on the library path (LD_LIBRARY_PATH=
/usr/lib/x86_64-linux-gnu/blas, Debian's libblas3), so `sgemm` is its own.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {
    "reference BLAS": {"LD_LIBRARY_PATH": "/usr/lib/x86_64-linux-gnu/blas"},
    "OpenBLAS, Prescott kernels": {"OPENBLAS_CORETYPE": "Prescott"},
    "OpenBLAS as Ember runs it": {},
}


def run(a, model, name, env, repeat):
    """One job; its samples/s and AUC."""
    out = Path(a.work) / f"{model}-{name.split()[0].lower()}-{name.split()[-2].lower()}-{repeat}"
    e = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    e.update(env)
    cmd = [sys.executable, str(ROOT / "scripts" / "ember_launch.py"), "--config", str(ROOT / "examples" / "herald.toml"),
           "--dataset", a.dataset, "--out", str(out), "-q", "--", "--model", model, "--iterations", str(a.iterations),
           "--eval-every", "0"]
    r = subprocess.run(cmd, env=e, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"bench_blas: the {model} job ({name}) failed: {r.stderr[-1000:]}")
    s = json.loads((out / "summary.json").read_text())
    return s["samples_s"], s.get("auc")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default=str(ROOT / "out" / "quickstart" / "criteo"))
    p.add_argument("--work", default=str(ROOT / "out" / "bench-blas"))
    p.add_argument("--models", default="dlrm,dcnv2")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--iterations", type=int, default=40)
    a = p.parse_args()
    results = {}
    for repeat in range(a.repeats):
        for model in a.models.split(","):
            for name, env in CONFIGS.items():
                sps, auc = run(a, model, name, env, repeat)
                results.setdefault((model, name), []).append(sps)
                print(f"{model} {name} repeat {repeat + 1}: {sps:.0f} samples/s, AUC {auc}", flush=True)
    print("| model | BLAS | samples/s per repeat | median | vs reference BLAS |")
    print("|---|---|---|---:|---:|")
    for (model, name), v in results.items():
        base = statistics.median(results[(model, "reference BLAS")])
        print(f"| {model} | {name} | {' / '.join(f'{x:,.0f}' for x in v)} | {statistics.median(v):,.0f} | "
              f"{statistics.median(v) / base:.2f}x |")


if __name__ == "__main__":
    main()
