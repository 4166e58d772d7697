#!/usr/bin/env python3
"""ember_launch.py --config (a TOML job file):

  - unknown keys, wrong types, bad TOML and bad [ember-worker] values are refused in one
    line naming the file, line and key, exit 2;
  - relative paths in the file are relative to the file;
  - flags on the command line override the file, worker arguments after `--` come last;
  - examples/herald.toml runs (a 5-iteration job, 2 workers) and its summary.json says so;
  - examples/mlperf-dcnv2.toml runs on multi-hot data (MLPerf's bag sizes, 6 iterations);
  - --metrics-port BASE gives shard s BASE+s and worker r BASE+S+r, listed in summary.json
    (the daemons run through wrappers that drop the flag), and out of range is refused.

  python3 tests/launcher/config_test.py BIN_DIR SOURCE_DIR
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BIN, SRC = (Path(a).resolve() for a in sys.argv[1:3])
LAUNCH = [sys.executable, str(SRC / "scripts" / "ember_launch.py")]
failures = []


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + ("" if cond else f": {detail}"))
    if not cond:
        failures.append(name)


def launch(args, cwd=None, timeout=60):
    # Cases without --bin still find this build's ember-worker (EMBER_BIN; default build/bin).
    return subprocess.run(LAUNCH + args, capture_output=True, text=True, timeout=timeout, cwd=cwd, env={**os.environ, "EMBER_BIN": str(BIN)})


def refused(name, toml, *want, extra=(), where=None):
    """The file (written in `where`, default the temporary directory) is refused: exit 2,
    one line on stderr holding every string of `want` ({f}: the file)."""
    f = (where or tmp) / f"{name.replace(' ', '-')}.toml"
    f.write_text(toml)
    r = launch(["--config", str(f), *extra])
    lines = r.stderr.strip().splitlines()
    check(f"refused: {name}", r.returncode == 2 and len(lines) == 1 and all(w.format(f=f) in lines[0] for w in want),
          f"rc {r.returncode}, stderr {r.stderr!r}")


with tempfile.TemporaryDirectory() as d:
    tmp = Path(d)
    # Before a build, --help lists the worker settings of the repository's snapshot, which
    # is the built ember-worker's.
    r = subprocess.run(LAUNCH + ["--help", "--bin", str(tmp / "no-build")], capture_output=True, text=True, timeout=60)
    check("--help without a build lists the worker settings", r.returncode == 0 and all(
        f in r.stdout for f in ("--policy", "--lookahead", "--model-file")), r.stdout[-2000:] + r.stderr[-1000:])
    built = subprocess.run([str(BIN / "ember-worker"), "--options-json"], capture_output=True, text=True, timeout=60)
    sys.path.insert(0, str(SRC / "scripts"))
    import ember_job  # noqa: E402
    snapshot = json.loads((SRC / "scripts" / "worker_settings.json").read_text())
    check("scripts/worker_settings.json is ember-worker's settings", snapshot == ember_job.settings_snapshot(json.loads(built.stdout)),
          "refresh it: build/bin/ember-worker --options-json | python3 scripts/ember_job.py settings-snapshot")
    refused("unknown key", 'workers = 2\nbogus = 1\n', "{f}:2:", "unknown key 'bogus'")
    refused("underscore spelling", 'ps_args = "--dim 8"\n', "{f}:1:", "unknown key 'ps_args'", "did you mean 'ps-args'")
    refused("string for an integer", 'dataset = "x"\nworkers = "4"\n', "{f}:2:", "'workers' must be an integer")
    refused("integer for a switch", 'prefetch = 1\n', "{f}:1:", "'prefetch' must be true or false")
    refused("float for a string", 'policy = 1.5\n', "{f}:1:", "'policy' must be a string")
    refused("bad TOML", 'workers = 2\nps = = 3\n', "{f}: not TOML", "line 2")
    refused("a list in [ember-worker]", '[ember-worker]\nmodel = ["dlrm"]\n', "{f}:2:", "[ember-worker] model")
    refused("[ember-ps] not a table", 'ember-ps = "--dim 8"\n', "{f}:1:", "'ember-ps' must be a table")
    r = launch(["--config", str(tmp / "missing.toml")])
    check("refused: no such file", r.returncode == 2 and "--config" in r.stderr and "No such file" in r.stderr, r.stderr)
    # Relative paths are the file's: the dataset named is looked for beside the file.
    sub = tmp / "sub"
    sub.mkdir()
    refused("relative dataset", 'dataset = "nodata"\nout = "o"\n', f"--dataset {sub / 'nodata'}: no manifest.json", where=sub)
    refused("metrics port range", 'dataset = "x"\nout = "o"\nmetrics-port = 65534\n', "--metrics-port 65534")

    # A short job from the quickstart's example, with flags overriding the file.
    data = tmp / "data"
    subprocess.run([str(BIN / "ember-data"), "gen", "--like", "criteo", "--rows", "20000", "--scale", "0.002", "--seed", "5",
                    "--force", "-o", str(tmp / "c.tsv")], check=True, capture_output=True, timeout=60)
    subprocess.run([str(BIN / "ember-data"), "prep", "--format", "criteo", "--val-fraction", "0.1", "--force", "-o", str(data),
                    str(tmp / "c.tsv")], check=True, capture_output=True, timeout=60)
    out = tmp / "run"
    r = launch(["--config", str(SRC / "examples" / "herald.toml"), "--bin", str(BIN), "--dataset", str(data), "--out", str(out),
                "--workers", "2", "-q", "--", "--iterations", "5", "--eval-every", "0"], cwd=str(tmp), timeout=90)
    check("examples/herald.toml runs", r.returncode == 0, f"rc {r.returncode}: {r.stderr[-2000:]}")
    if r.returncode == 0:
        s = json.loads((out / "summary.json").read_text())
        check("flags override the file (--workers 2, -- --iterations 5)", s["workers"] == 2 and s["iterations"] == 5 and s["policy"] == "herald",
              f"workers {s['workers']}, iterations {s['iterations']}, policy {s['policy']}")
        cmd = (out / "worker0.log").read_text().splitlines()[0]
        check("[ember-worker] reaches the workers, the command line's arguments last",
              "--model dlrm" in cmd and cmd.index("--iterations 300") < cmd.index("--iterations 5"), cmd)
        check("[ember-ps] reaches the shards", "--dim 16 --optimizer adagrad --lr 0.05" in (out / "ps0.log").read_text().splitlines()[0])
        check("no metrics endpoints without --metrics-port", s["metrics_endpoints"] == [], s["metrics_endpoints"])
        declared = ember_job.worker_settings(BIN)
        missing = [f for f, _, _ in declared if f.replace("-", "_") not in s]
        check("summary.json records every job setting ember-worker declares", declared and not missing, missing)
        check("summary.json records the settings' values", s["model_file"] == "" and s["policy"] == "herald" and
              s["cache_admission"] == next(d for f, _, d in declared if f == "cache-admission"),
              {k: s.get(k) for k in ("model_file", "policy", "cache_admission")})

    # The MLPerf-shaped example on multi-hot data (small tables, so smaller micro-batches).
    bags = tmp / "bags"
    subprocess.run([str(BIN / "ember-data"), "gen", "--like", "criteo", "--rows", "4000", "--scale", "0.002", "--seed", "5",
                    "--multi-hot", "mlperf", "--force", "-o", str(tmp / "b.tsv")], check=True, capture_output=True, timeout=60)
    subprocess.run([str(BIN / "ember-data"), "prep", "--format", "criteo", "--multi-hot-sep", "|", "--val-fraction", "0.1", "--force",
                    "-o", str(bags), str(tmp / "b.tsv")], check=True, capture_output=True, timeout=60)
    out = tmp / "run-mlperf"
    r = launch(["--config", str(SRC / "examples" / "mlperf-dcnv2.toml"), "--bin", str(BIN), "--dataset", str(bags), "--out", str(out),
                "--workers", "2", "-q", "--", "--iterations", "6", "--eval-every", "0", "--batch-per-worker", "8"], cwd=str(tmp),
               timeout=120)
    check("examples/mlperf-dcnv2.toml runs on multi-hot data", r.returncode == 0, f"rc {r.returncode}: {r.stderr[-2000:]}")
    if r.returncode == 0:
        cmd = (out / "worker0.log").read_text().splitlines()[0]
        check("the MLPerf example trains dcnv2 with sum pooling", "--model dcnv2" in cmd and "--pooling sum" in cmd, cmd)

    # --metrics-port BASE: shard s gets BASE+s, worker r BASE+S+r, and summary.json lists
    # them. Wrappers note the port each daemon got and run the real one without it.
    stub = tmp / "stub-bin"
    stub.mkdir()
    for b in ("ember-ps", "ember-worker"):
        (stub / b).write_text(f"""#!/usr/bin/env bash
[ "$1" = --options-json ] && exec "{BIN / b}" "$@"  # the launcher asks for the job settings
args=()
while [ $# -gt 0 ]; do
  if [ "$1" = --metrics-port ]; then echo "$2" > "{tmp}/port-$$"; shift 2; else args+=("$1"); shift; fi
done
echo "{b} $(cat "{tmp}/port-$$" 2> /dev/null)" >> "{tmp}/ports"
exec "{BIN / b}" "${{args[@]}}"
""")
        (stub / b).chmod(0o755)
    out = tmp / "run-metrics"
    r = launch(["--config", str(SRC / "examples" / "vanilla.toml"), "--bin", str(stub), "--dataset", str(data), "--out", str(out),
                "--ps", "2", "--workers", "2", "--metrics-port", "9400", "-q", "--", "--iterations", "3", "--eval-every", "0"],
               cwd=str(tmp), timeout=90)
    check("a job with --metrics-port runs", r.returncode == 0, f"rc {r.returncode}: {r.stderr[-2000:]}")
    if r.returncode == 0:
        ports = sorted((tmp / "ports").read_text().split("\n")[:-1])
        check("--metrics-port BASE+s for shards, BASE+S+r for workers",
              ports == ["ember-ps 9400", "ember-ps 9401", "ember-worker 9402", "ember-worker 9403"], ports)
        s = json.loads((out / "summary.json").read_text())
        check("summary.json: metrics_endpoints",
              s["metrics_endpoints"] == ["127.0.0.1:9400", "127.0.0.1:9401", "127.0.0.1:9402", "127.0.0.1:9403"], s["metrics_endpoints"])

if failures:
    print(f"{len(failures)} check(s) failed: " + ", ".join(failures))
    sys.exit(1)
print("all checks passed")
