#!/usr/bin/env python3
"""Serving deltas: their bytes against the changed rows', and ember-serve's cost per version.

Runs a stream job (ember_launch.py --stream, dynamic tables) that checkpoints every
--every iterations with `ember-ps --serving-deltas --checkpoint-full-every 4`, with an
ember-serve following it, for each dim and optimizer asked; then reads every delta's header
(rows updated, created, freed) and prints, per configuration:

  - the deltas' bytes against the changed rows' bytes (float32 values of the rows updated
    and created; issue target: at most 1.2x), and against the checkpoint files the same
    checkpoints wrote (which carry keys, ids and optimizer state for a resume);
  - ember-serve's time to take a version by its deltas (median), against another
    ember-serve's whole load of the last checkpoint.

  python3 scripts/bench_deltas.py [--bin build/bin] [--dims 8,16,64] [--optimizers sgd,adagrad]
"""
import argparse
import re
import signal
import statistics
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from bench_util import sh

ROOT = Path(__file__).resolve().parent.parent


def delta_counts(root):
    """(records, changed rows' bytes, deltas' bytes) of every delta file under root."""
    records = row_bytes = total = 0
    for f in root.glob("iter-*/*.delta"):
        b = f.read_bytes()
        dim = struct.unpack_from("<I", b, 12)[0]
        updated, created, freed = struct.unpack_from("<QQQ", b, 56)
        records += updated + created + freed
        row_bytes += (updated + created) * dim * 4
        total += len(b)
    return records, row_bytes, total


def stop_at_last(serve, port_file, iterations):
    """Waits until `serve` serves `iterations`, stops it, returns its log."""
    deadline = time.time() + 120
    while time.time() < deadline and not port_file.exists():
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port_file.read_text().strip()}/version"
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                if f'"iteration":{iterations},' in r.read().decode().replace(" ", ""):
                    break
        except OSError:
            pass
        time.sleep(0.05)
    serve.send_signal(signal.SIGTERM)
    return serve.communicate(timeout=60)[1]


def run(a, dim, optimizer, stream):
    work = Path(a.work) / f"{optimizer}-{dim}"
    ckpt = work / "ckpt"
    sh(["rm", "-rf", work], who="bench_deltas")
    work.mkdir(parents=True)
    serve = subprocess.Popen([f"{a.bin}/ember-serve", "--checkpoints", str(ckpt), "--stream-format", "criteo", "--listen", "127.0.0.1:0",
                              "--port-file", str(work / "port"), "--poll-ms", "50", "--log-level", "info"],
                             stderr=subprocess.PIPE, text=True)
    sh([sys.executable, ROOT / "scripts" / "ember_launch.py", "--stream", str(stream), "--slots-per-shard", str(a.slots), "--ps", "1",
        "--workers", str(a.workers), "--policy", "herald", "--bin", a.bin, "--out", work / "out", "-q", "--timeout", "900",
        "--checkpoint-dir", ckpt, "--checkpoint-every", str(a.every), "--ps-args",
        f"--dim {dim} --optimizer {optimizer} --lr 0.05 --checkpoint-full-every 4 --keep-checkpoints 0 --serving-deltas", "--",
        "--iterations", str(a.iterations), "--batch-per-worker", str(a.batch), "--progress-every", "0", "--eval-every", "0",
        "--keep-checkpoints", "0", "--model", "dlrm"], who="bench_deltas")
    log = stop_at_last(serve, work / "port", a.iterations)
    applied = [float(x) for x in re.findall(r"delta\(s\), \d+ rows, \d+ bytes, applied in ([0-9.]+) s", log)]
    # The last version loaded whole by another ember-serve: the table at its largest.
    last = subprocess.Popen([f"{a.bin}/ember-serve", "--checkpoints", str(ckpt), "--stream-format", "criteo", "--listen", "127.0.0.1:0",
                             "--port-file", str(work / "port-last"), "--poll-ms", "50", "--log-level", "info"],
                            stderr=subprocess.PIPE, text=True)
    whole = [float(x) for x in re.findall(r"loaded whole in ([0-9.]+) s", stop_at_last(last, work / "port-last", a.iterations))]
    records, row_bytes, delta_bytes = delta_counts(ckpt / "ps")
    ckpt_bytes = sum(f.stat().st_size for f in (ckpt / "ps").glob("iter-*/*.ckpt"))
    dense_bytes = sum(f.stat().st_size for f in (ckpt / "dense").glob("worker-0-*.pt"))
    return {"dim": dim, "optimizer": optimizer, "records": records, "ratio": delta_bytes / max(row_bytes, 1),
            "delta_mb": delta_bytes / 1e6, "ckpt_mb": ckpt_bytes / 1e6, "dense_mb": dense_bytes / 1e6,
            "apply_s": statistics.median(applied) if applied else float("nan"), "applies": len(applied),
            "whole_s": statistics.median(whole) if whole else float("nan")}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default=str(ROOT / "build" / "bin"))
    p.add_argument("--work", default="/tmp/ember-bench-deltas")
    p.add_argument("--dims", default="8,16,64")
    p.add_argument("--optimizers", default="sgd,adagrad")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=512, help="samples per worker per iteration")
    p.add_argument("--iterations", type=int, default=40)
    p.add_argument("--every", type=int, default=4, help="--checkpoint-every")
    p.add_argument("--slots", type=int, default=1 << 18, help="--slots-per-shard")
    a = p.parse_args()
    stream = Path(a.work) / "stream"
    sh([f"{a.bin}/ember-data", "gen", "--like", "criteo", "--rows", str(a.workers * a.batch * a.iterations), "--files", "4", "--scale",
        "0.01", "--new-ids", "0.1", "--seed", "9", "--force", "-q", "-o", stream], who="bench_deltas")
    rows = [run(a, int(d), o, stream) for o in a.optimizers.split(",") for d in a.dims.split(",")]
    print(f"{a.workers} workers x {a.batch}, {a.iterations} iterations, a checkpoint every {a.every} (whole every 4th), "
          f"{a.slots} slots; ember-serve following")
    print("| optimizer | dim | delta records | deltas MB | deltas / changed rows' bytes | checkpoint files MB | "
          "dense state MB | serve: a version by deltas (median s) | serve: the last whole (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['optimizer']} | {r['dim']} | {r['records']:,} | {r['delta_mb']:.2f} | {r['ratio']:.3f}x | {r['ckpt_mb']:.2f} | "
              f"{r['dense_mb']:.2f} | {r['apply_s']:.3f} ({r['applies']} versions) | {r['whole_s']:.3f} |")


if __name__ == "__main__":
    main()
