#!/usr/bin/env python3
"""ember_launch.py --max-restarts N:

  - a worker killed (SIGKILL) mid-job: the launcher restarts the job from the newest
    checkpoint that verifies, says so in one line (the member, the checkpoint, the
    iterations lost), and the job ends with the model an uninterrupted job trains, bit
    for bit; summary.json counts the restart, the iterations recomputed and the time
    from the loss to training again;
  - a job that fails every time (a worker killed in every attempt) with --max-restarts 2
    ends after its third failure, saying so;
  - two faults in one job (a worker, then the shard hosting the coordinator): two
    restarts, the same model;
  - a shard on a disk tier killed with SIGKILL: restarted, the same model;
  - a job refused for a bad option ends after its first failure, not restarted, saying why.

  python3 tests/launcher/restart_test.py BIN_DIR SOURCE_DIR
"""
import json
import os
import signal
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


def job(tmp, data, name, extra, bin_dir=BIN, worker=(), ps=()):
    """Starts a job: 1 shard, 2 workers, herald + Adagrad, checkpoints every 4 iterations."""
    out = tmp / name
    cmd = LAUNCH + ["--dataset", str(data), "--ps", "1", "--workers", "2", "--policy", "herald", "--bin", str(bin_dir),
                    "--out", str(out), "-q", "--timeout", "200", "--heartbeat-timeout-ms", "3000",
                    "--checkpoint-dir", str(tmp / f"{name}-ckpt"), "--checkpoint-every", "4", "--dump-dir", str(tmp / f"{name}-model"),
                    "--ps-args", " ".join(["--dim 8 --optimizer adagrad --lr 0.05", *ps])] + list(extra) + [
                    "--", "--iterations", "30", "--batch-per-worker", "32", "--eval-every", "0", "--progress-every", "0",
                    "--dense-optimizer", "adagrad"] + list(worker)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), out


def lines(path):
    try:
        return sum(1 for _ in open(path))
    except OSError:
        return 0


def pid_of(pattern):
    r = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    pids = [int(x) for x in r.stdout.split()]
    return pids[0] if pids else None


def worker_pid(out, rank):
    """The pid of the running ember-worker of `rank` in job OUT (its --metrics file names it)."""
    return pid_of(f"ember-worker .*--metrics {out}/w{rank}.jsonl")


def kill_when(p, out, victim_pid, at_line=11):
    """SIGKILL to `victim_pid(out)` once worker 1 has logged `at_line` iterations; whether it was sent."""
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None:
        if lines(out / "w1.jsonl") >= at_line:
            pid = victim_pid(out)
            if pid:
                os.kill(pid, signal.SIGKILL)
                return True
        time.sleep(0.05)
    return False


def main():
    with tempfile.TemporaryDirectory(prefix="ember-restart-") as t:
        tmp = Path(t)
        data = tmp / "data"
        subprocess.run([str(BIN / "ember-data"), "gen", "--like", "criteo", "--rows", "12000", "--scale", "0.002", "--seed", "3",
                        "--force", "-o", str(tmp / "c.tsv")], check=True, capture_output=True, timeout=60)
        subprocess.run([str(BIN / "ember-data"), "prep", "--format", "criteo", "--val-fraction", "0.1", "--force", "-o", str(data),
                        str(tmp / "c.tsv")], check=True, capture_output=True, timeout=60)

        # The uninterrupted job (checkpointing as the other does: flushes change no model).
        p, _ = job(tmp, data, "whole", [])
        _, err = p.communicate(timeout=240)
        check("the uninterrupted job runs", p.returncode == 0, err[-2000:])

        # Worker 1 killed once past iteration 10: one restart, then the same model.
        p, out = job(tmp, data, "healed", ["--max-restarts", "2"])
        check("worker 1 was killed mid-job", kill_when(p, out, lambda o: worker_pid(o, 1)))
        _, err = p.communicate(timeout=240)
        check("the healed job finishes by itself", p.returncode == 0, err[-2000:])
        restart_lines = [l for l in err.splitlines() if l.startswith("ember-launch: restart ")]
        check("one line says what failed, the checkpoint and the iterations lost",
              len(restart_lines) == 1 and "restart 1/2: worker1" in restart_lines[0] and "from checkpoint" in restart_lines[0]
              and "iteration(s) lost" in restart_lines[0], restart_lines or err[-2000:])
        if p.returncode == 0:
            s = json.loads((out / "summary.json").read_text())
            r = s.get("restarts") or [{}]
            check("summary.json counts the restart", s.get("restart_count") == 1 and r[0].get("member") == "worker1", s.get("restarts"))
            check("iterations recomputed: from the checkpoint to the loss", 0 <= s.get("iterations_recomputed", -1) <= 8,
                  s.get("iterations_recomputed"))
            check("the time from the loss to training again is measured", (r[0].get("recovery_s") or 0) > 0, r[0])
            check("the failed attempt's logs are kept", (out / "attempt-1" / "worker1.log").exists())
            w0 = [json.loads(l) for l in (out / "w0.jsonl").read_text().splitlines() if '"summary"' in l]
            w0 = w0[-1] if w0 else {}
            check("worker 0 reports the restart from its --restart-record (summary; /metrics: ember_worker_job_*)",
                  w0.get("restarts") == 1 and w0.get("iterations_recomputed") == s.get("iterations_recomputed")
                  and (w0.get("recovery_s") or 0) > 0, {k: w0.get(k) for k in ("restarts", "iterations_recomputed", "recovery_s")})
            print(f"     {restart_lines[0] if restart_lines else ''}\n     recovery_s {r[0].get('recovery_s')}, "
                  f"iterations recomputed {s.get('iterations_recomputed')}")
            for f in ("rows.bin", "dense.bin"):
                a, b = (tmp / "whole-model" / f).read_bytes(), (tmp / "healed-model" / f).read_bytes()
                check(f"the healed job's {f} is the uninterrupted job's, byte for byte", a == b and len(a) > 0, f"{len(a)} vs {len(b)} bytes")

        # Two faults in one job: worker 1 killed, then, in the restarted attempt, the shard
        # that hosts the coordinator: two restarts, then the same model.
        p, out = job(tmp, data, "twice", ["--max-restarts", "2"])
        check("worker 1 was killed in the first attempt", kill_when(p, out, lambda o: worker_pid(o, 1)))
        deadline = time.time() + 120
        while time.time() < deadline and p.poll() is None and not (out / "attempt-1" / "w1.jsonl").exists():
            time.sleep(0.05)
        check("the shard hosting the coordinator was killed in the second attempt",
              kill_when(p, out, lambda o: pid_of(f"ember-ps .*--summary-file {o}/ps0.json"), at_line=6))
        _, err = p.communicate(timeout=240)
        restart_lines = [l for l in err.splitlines() if l.startswith("ember-launch: restart ")]
        check("the job killed twice finishes by itself after two restarts", p.returncode == 0 and len(restart_lines) == 2
              and "restart 1/2: worker1" in restart_lines[0] and "restart 2/2: ps0" in restart_lines[1], err[-3000:])
        if p.returncode == 0:
            s = json.loads((out / "summary.json").read_text())
            w0 = [json.loads(l) for l in (out / "w0.jsonl").read_text().splitlines() if '"summary"' in l]
            check("summary.json and worker 0 count both restarts", s.get("restart_count") == 2 and w0 and w0[-1].get("restarts") == 2,
                  s.get("restarts"))
            print(f"     recovery_s {[r.get('recovery_s') for r in s.get('restarts', [])]}, "
                  f"iterations recomputed {s.get('iterations_recomputed')}")
            for f in ("rows.bin", "dense.bin"):
                a, b = (tmp / "whole-model" / f).read_bytes(), (tmp / "twice-model" / f).read_bytes()
                check(f"after two faults, {f} is the uninterrupted job's, byte for byte", a == b and len(a) > 0, f"{len(a)} vs {len(b)} bytes")

        # A shard whose rows are on a disk tier (a 64 KiB budget) killed mid-job: the restarted
        # shard takes its store directory again and the job ends with the same model.
        tier = ["--store-dir", str(tmp / "tier"), "--ram-budget-mb", "0.0625"]
        p, out = job(tmp, data, "tier-healed", ["--max-restarts", "2"], ps=tier)
        check("a tiered shard was killed mid-job", kill_when(p, out, lambda o: pid_of(f"ember-ps .*--summary-file {o}/ps0.json")))
        _, err = p.communicate(timeout=240)
        check("the job of the killed tiered shard finishes by itself", p.returncode == 0 and "restart 1/2: ps0" in err, err[-2000:])
        for f in ("rows.bin", "dense.bin"):
            a, b = (tmp / "whole-model" / f).read_bytes(), (tmp / "tier-healed-model" / f).read_bytes() if p.returncode == 0 else b""
            check(f"after kill -9 of a tiered shard, {f} is the uninterrupted all-RAM job's, byte for byte", a == b and len(a) > 0,
                  f"{len(a)} vs {len(b)} bytes")

        # A worker that dies in every attempt: --max-restarts 2 gives up after the third failure.
        stub = tmp / "stub-bin"
        stub.mkdir()
        (stub / "ember-ps").symlink_to(BIN / "ember-ps")
        (stub / "ember-worker").write_text(f"""#!/usr/bin/env bash
[ "$1" = --options-json ] && exec "{BIN / 'ember-worker'}" "$@"
case " $* " in *" --rank 1 "*) "{BIN / 'ember-worker'}" "$@" & pid=$!; sleep 2; kill -9 $pid; wait $pid; exit 137 ;; esac
exec "{BIN / 'ember-worker'}" "$@"
""")
        (stub / "ember-worker").chmod(0o755)
        # (A job that would not end before the kill: every attempt fails.)
        p, out = job(tmp, data, "doomed", ["--max-restarts", "2"], bin_dir=stub, worker=["--iterations", "100000"])
        _, err = p.communicate(timeout=300)
        restart_lines = [l for l in err.splitlines() if l.startswith("ember-launch: restart ")]
        check("a job failing every time ends after the third failure", p.returncode != 0 and len(restart_lines) == 2
              and "giving up: the job failed 3 times, --max-restarts 2" in err, f"rc {p.returncode}: {err[-3000:]}")

        # Refused options are not retried.
        p, out = job(tmp, data, "refused", ["--max-restarts", "2"], worker=["--model", "nosuchmodel"])
        _, err = p.communicate(timeout=120)
        check("a job refused for a bad option ends after the first failure, saying why",
              p.returncode == 2 and "ember-launch: restart" not in err and "not restarted: a setting was refused" in err,
              f"rc {p.returncode}: {err[-2000:]}")
        word = json.loads((out / "failure.json").read_text()) if (out / "failure.json").exists() else {}
        check("the control plane's word carries the refusing worker's exit status (2)",
              word.get("member", "").startswith("worker ") and word.get("exit") == 2, str(word))

    if failures:
        print(f"{len(failures)} check(s) failed: {', '.join(failures)}")
        sys.exit(1)
    print("all restart checks passed")


if __name__ == "__main__":
    main()
