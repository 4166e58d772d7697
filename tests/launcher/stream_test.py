#!/usr/bin/env python3
"""ember_launch.py --stream: a job trains on files that keep coming in.

  - `ember-data gen --files 6 --every 0.6` writes the stream while the job runs; worker 1
    is killed (SIGKILL) mid-stream, and in another run the shard; with --max-restarts
    the launcher restarts the job from its newest checkpoint, which goes on from the
    stream position it keeps, and the job ends with the model of an uninterrupted job on
    the whole directory, row by row;
  - the job's summary.json has its progressive validation (each batch scored before it
    trains);
  - its checkpoint exports without a dataset (ember-export --stream-format) and
    ember-predict scores raw lines with the export;
  - examples/online-stream.toml runs (shortened);
  - --stream without --slots-per-shard, or with --dataset, is refused in one line.

  python3 tests/launcher/stream_test.py BIN_DIR SOURCE_DIR
"""
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN, SRC = (Path(a).resolve() for a in sys.argv[1:3])
LAUNCH = [sys.executable, str(SRC / "scripts" / "ember_launch.py")]
failures = []


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + ("" if cond else f": {detail}"), flush=True)
    if not cond:
        failures.append(name)


def job(tmp, stream, name, extra=()):
    """A stream job: 1 shard of dynamic tables, 2 workers, herald + SGD, checkpoints every 4."""
    out = tmp / name
    cmd = LAUNCH + ["--stream", str(stream), "--slots-per-shard", "16384", "--ps", "1", "--workers", "2", "--policy", "herald",
                    "--bin", str(BIN), "--out", str(out), "-q", "--timeout", "200", "--heartbeat-timeout-ms", "3000",
                    "--checkpoint-dir", str(tmp / f"{name}-ckpt"), "--checkpoint-every", "4", "--dump-dir", str(tmp / f"{name}-model"),
                    "--ps-args", "--dim 8 --optimizer sgd --lr 0.05", *extra, "--",
                    "--iterations", "20", "--batch-per-worker", "64", "--progress-every", "0", "--progressive-window", "5",
                    "--create-after", "2", "--expire-after", "6"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), out


def gen(stream, every):
    return subprocess.Popen([str(BIN / "ember-data"), "gen", "--like", "criteo", "--rows", "3000", "--files", "6", "--every", str(every),
                             "--scale", "0.002", "--new-ids", "0.2", "--seed", "5", "--force", "-q", "-o", str(stream)])


def floats(path):
    b = path.read_bytes()
    return struct.unpack(f"<{len(b) // 4}f", b)


def max_diff(a, b):
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0) if len(a) == len(b) else float("inf")


def lines(path):
    try:
        return sum(1 for _ in open(path))
    except OSError:
        return 0


def healed_run(tmp, name, victim, pattern):
    """The stream written while the job trains (a file every 0.6 s), `victim` (the process
    `pattern` finds) killed with SIGKILL mid-stream, healed by --max-restarts."""
    live_dir = tmp / f"{name}-in"
    live_dir.mkdir()  # the job waits on it before the writer's first file
    p, out = job(tmp, live_dir, name, ["--max-restarts", "2"])
    time.sleep(0.5)
    writer = gen(live_dir, 0.6)
    killed = False
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None and not killed:
        if lines(out / "w0.jsonl") >= 10:
            r = subprocess.run(["pgrep", "-f", pattern.format(out=out)], capture_output=True, text=True)
            if r.stdout.split():
                os.kill(int(r.stdout.split()[0]), signal.SIGKILL)
                killed = True
        time.sleep(0.05)
    check(f"{victim} was killed mid-stream", killed)
    _, err = p.communicate(timeout=240)
    writer.wait(timeout=60)
    check(f"{victim} killed: the healed stream job finishes by itself", p.returncode == 0, err[-2000:])
    restarts = [l for l in err.splitlines() if l.startswith("ember-launch: restart ")]
    check(f"{victim} killed: one restart, from a checkpoint", len(restarts) == 1 and "from checkpoint" in restarts[0],
          restarts or err[-2000:])
    print(f"     {restarts[0] if restarts else ''}")


def main():
    with tempfile.TemporaryDirectory(prefix="ember-stream-") as t:
        tmp = Path(t)
        # The uninterrupted job, on the whole stream written first.
        whole_dir = tmp / "whole-in"
        gen(whole_dir, 0).wait(timeout=60)
        p, out = job(tmp, whole_dir, "whole")
        _, err = p.communicate(timeout=240)
        check("the uninterrupted stream job runs", p.returncode == 0, err[-2000:])

        # The same stream while it is written, a file every 0.6 s, worker 1 killed mid-way;
        # then again with the shard killed.
        for victim, pattern in (("worker 1", "ember-worker .*--metrics {out}/w1.jsonl"),
                                ("the shard", "ember-ps .*--summary-file {out}/ps0.json")):
            name = "healed" if victim == "worker 1" else "healed-ps"
            healed_run(tmp, name, victim, pattern)
            dumped = (tmp / f"{name}-model" / "rows.bin").exists()
            check(f"{victim} killed: the job dumped its model", dumped)
            if dumped:
                for f in ("rows.bin", "dense.bin"):
                    d = max_diff(floats(tmp / "whole-model" / f), floats(tmp / f"{name}-model" / f))
                    check(f"{victim} killed: {f} is the uninterrupted job's model (max diff {d:.2e})", d <= 1e-5, d)
        out = tmp / "healed"
        live_dir = tmp / "healed-in"
        if (tmp / "healed-model" / "rows.bin").exists():
            # The healed job's last checkpoint, exported without a dataset, scores raw lines.
            exp = tmp / "export"
            r = subprocess.run([str(BIN / "ember-export"), "--checkpoint", str(tmp / "healed-ckpt"), "--stream-format", "criteo",
                                "-o", str(exp)], capture_output=True, text=True, timeout=120)
            check("ember-export --stream-format exports the stream job's checkpoint", r.returncode == 0, r.stderr[-1000:])
            r = subprocess.run([str(BIN / "ember-predict"), "--export", str(exp), "--json", str(live_dir / "part-000005.tsv")],
                               capture_output=True, text=True, timeout=120)
            scored = json.loads(r.stdout) if r.returncode == 0 else {}
            check("ember-predict scores raw lines with it", scored.get("samples") == 500 and 0 < scored.get("auc", 0) < 1,
                  r.stdout + r.stderr[-1000:])
            s = json.loads((out / "summary.json").read_text())
            prog = s.get("progressive") or {}
            check("summary.json has progressive validation", 0 < prog.get("auc", 0) < 1 and prog.get("logloss", 0) > 0, prog)
            print(f"     progressive {prog}")

        # The example job file runs (shortened) on the same stream.
        r = subprocess.run(LAUNCH + ["--config", str(SRC / "examples" / "online-stream.toml"), "--bin", str(BIN), "--stream", str(whole_dir),
                                     "--out", str(tmp / "ex"), "--checkpoint-dir", str(tmp / "ex-ckpt"), "-q", "--",
                                     "--iterations", "4", "--batch-per-worker", "128"], capture_output=True, text=True, timeout=240)
        check("examples/online-stream.toml runs", r.returncode == 0, r.stderr[-2000:])

        # Refused in one line.
        for extra, want in ((["--slots-per-shard", "0"], "--stream needs --slots-per-shard"),
                            (["--dataset", str(tmp)], "--dataset and --stream exclude each other")):
            r = subprocess.run(LAUNCH + ["--stream", str(whole_dir), "--slots-per-shard", "16384", "--out", str(tmp / "bad"), "--bin", str(BIN),
                                         *extra], capture_output=True, text=True, timeout=60)
            check(f"refused: {want}", r.returncode == 2 and want in r.stderr, r.stderr[-500:])
    print("stream_test: " + ("FAILED: " + ", ".join(failures) if failures else "all passed"))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
