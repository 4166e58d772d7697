#!/usr/bin/env python3
"""Model files against their built-in twins, and DCNv2: samples/s of the same training,
alternated within each repeat on one machine, medians and ratios.

Two measurements per model:
  one process   ember-worker --reference: the whole global batch in one process, tables
                in memory (the dense model's share of an iteration is largest here);
  job           1 PS + 2 workers over TCP loopback (ember_launch.py, herald).

Models: the built-in dlrm and examples/models/dlrm.py (same layers), the built-in dcnv2
and examples/models/dcnv2.py, and examples/models/autoint.py (no twin). Target: a model
file within 10% of its built-in twin's samples/s.

  scripts/bench_models.py --dataset out/quickstart/criteo [--repeats 5] [--iterations 60] [--json]

Needs a python3 with PyTorch (python3-torch) to write the model files.
"""
import argparse
import functools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import bench_util

ROOT = Path(__file__).resolve().parent.parent


sh = functools.partial(bench_util.sh, who="bench_models")


def python_with_torch():
    for py in ("/usr/bin/python3", sys.executable, "python3"):
        if shutil.which(py) and subprocess.run([py, "-c", "import torch"], capture_output=True).returncode == 0:
            return py
    sys.exit("bench_models: no python3 with PyTorch (scripts/install_deps.sh --ops installs python3-torch)")


def models(a, work):
    """name -> ember-worker model arguments; pairs of (built-in, file) twins."""
    py = python_with_torch()
    dims = ["--tables", str(a.tables), "--dense", str(a.dense), "--dim", str(a.dim)]
    mlp = ["--bottom", a.bottom, "--top", a.top]
    files = {}
    for name, extra in (("dlrm", mlp), ("dcnv2", mlp + ["--layers", "3", "--rank", str(a.rank)]), ("autoint", [])):
        files[name] = work / f"{name}.pt"
        sh([py, ROOT / "examples" / "models" / f"{name}.py", "-o", files[name], *dims, *extra])
    layers = ["--bottom-mlp", a.bottom, "--top-mlp", a.top]
    return {
        "dlrm": ["--model", "dlrm", *layers],
        "dlrm.pt": ["--model-file", files["dlrm"]],
        "dcnv2": ["--model", "dcnv2", *layers, "--cross-layers", "3", "--cross-rank", str(a.rank)],
        "dcnv2.pt": ["--model-file", files["dcnv2"]],
        "autoint.pt": ["--model-file", files["autoint"]],
    }


def one_process(a, args):
    out = sh([Path(a.bin) / "ember-worker", "--reference", "--dataset", a.dataset, "--workers", "2", "--batch-per-worker",
              str(a.batch), "--iterations", str(a.iterations), "--dim", str(a.dim), "--log-level", "warn", *args])
    return json.loads(out.strip().splitlines()[-1])["samples_s"]


def job(a, work, name, args):
    out = work / f"job-{name}"
    shutil.rmtree(out, ignore_errors=True)
    sh([sys.executable, ROOT / "scripts" / "ember_launch.py", "--dataset", a.dataset, "--ps", "1", "--workers", "2", "--policy",
        "herald", "--bin", a.bin, "--out", out, "-q", "--ps-args", f"--dim {a.dim}", "--", "--batch-per-worker", str(a.batch),
        "--iterations", str(a.iterations), "--eval-every", "0", "--progress-every", "0", *args])
    return json.loads((out / "summary.json").read_text())["samples_s"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", required=True, help="an ember-data dataset (Criteo-like: --tables and --dense must match it)")
    p.add_argument("--bin", default=str(ROOT / "build" / "bin"))
    p.add_argument("--tables", type=int, default=26)
    p.add_argument("--dense", type=int, default=13)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--bottom", default="512-256-64")
    p.add_argument("--top", default="512-256")
    p.add_argument("--rank", type=int, default=64, help="dcnv2's cross rank")
    p.add_argument("--batch", type=int, default=128, help="samples per worker")
    p.add_argument("--iterations", type=int, default=60)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-job", action="store_true", help="one process only")
    p.add_argument("--models", default="", help="comma-separated subset (dlrm, dlrm.pt, dcnv2, dcnv2.pt, autoint.pt; a twin needs its pair)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-models-"))
    try:
        ms = models(a, work)
        if a.models:
            ms = {n: v for n, v in ms.items() if n in a.models.split(",")}
        runs = {(how, n): [] for how in ("one process", "job") for n in ms}
        for _ in range(a.repeats):
            for name, args in ms.items():  # alternated: each repeat runs every model once
                runs[("one process", name)].append(one_process(a, args))
                if not a.no_job:
                    runs[("job", name)].append(job(a, work, name, args))
        twins = {"dlrm.pt": "dlrm", "dcnv2.pt": "dcnv2", "dcnv2": "dlrm", "autoint.pt": "dlrm"}
        rows = []
        for how in ("one process", "job"):
            for name in ms:
                v = runs[(how, name)]
                if not v:
                    continue
                med = statistics.median(v)
                twin = twins.get(name) if runs.get((how, twins.get(name))) else None
                base = statistics.median(runs[(how, twin)]) if twin else med
                rows.append({"how": how, "model": name, "samples_s": round(med, 1), "vs": twin or "-",
                             "ratio": round(med / base, 3), "runs": [round(x, 1) for x in v]})
        if a.json:
            for r in rows:
                print(json.dumps(r))
            return
        print(f"{a.repeats} repeats of {a.iterations} iterations, 2 x {a.batch} samples, dim {a.dim}, "
              f"MLPs {a.bottom} / {a.top}, dcnv2 rank {a.rank}; medians")
        print("| measured | model | samples/s | against | ratio |\n|---|---|---:|---|---:|")
        for r in rows:
            print(f"| {r['how']} | {r['model']} | {r['samples_s']:,.0f} | {r['vs']} | {r['ratio']:.3f} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
