#!/usr/bin/env python3
"""ember-serve follows a stream job while it trains:

  - started before the job, it serves each checkpoint the job writes (every 2 iterations,
    with ember-ps --serving-deltas), loading the first whole and applying the deltas of
    the others, never going back in version, each within 2 s of its checkpoint's
    manifest; killed with SIGKILL mid-stream, a new one loads the newest whole and
    follows from there;
  - at every version it served, its scores of raw lines equal ember-predict's on an
    ember-export of that checkpoint;
  - a bad request gets a 400 naming the line and the server goes on; SIGTERM stops it.

  python3 tests/launcher/serve_test.py BIN_DIR SOURCE_DIR
"""
import json
import struct
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

BIN, SRC = (Path(a).resolve() for a in sys.argv[1:3])
failures = []


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + ("" if cond else f": {detail}"), flush=True)
    if not cond:
        failures.append(name)


def request(url, body=None):
    req = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def main():
    with tempfile.TemporaryDirectory(prefix="ember-serve-") as t:
        tmp = Path(t)
        stream = tmp / "in"
        # The lines to score: another file of the same generator.
        subprocess.run([str(BIN / "ember-data"), "gen", "--like", "criteo", "--rows", "300", "--scale", "0.002", "--new-ids", "0.2",
                        "--seed", "7", "--force", "-q", "-o", str(tmp / "requests.tsv")], check=True, timeout=60)
        lines = (tmp / "requests.tsv").read_text()
        unlabelled = "\n".join(l.split("\t", 1)[1] for l in lines.splitlines()) + "\n"  # as requests come
        ckpt = tmp / "ckpt"

        def start_serve(n):
            port_file = tmp / f"port-{n}"
            proc = subprocess.Popen([str(BIN / "ember-serve"), "--checkpoints", str(ckpt), "--stream-format", "criteo", "--listen",
                                     "127.0.0.1:0", "--port-file", str(port_file), "--poll-ms", "100", "--log-level", "warn"],
                                    stderr=subprocess.PIPE, text=True)
            for _ in range(100):
                if port_file.exists():
                    break
                time.sleep(0.1)
            return proc, f"http://127.0.0.1:{port_file.read_text().strip()}"

        serve, url = start_serve(0)
        status, _, _ = request(url + "/version")
        check("no version before the job's first checkpoint (503)", status == 503, status)

        # The stream arrives while the job trains: a file of 400 lines a second.
        gen = subprocess.Popen([str(BIN / "ember-data"), "gen", "--like", "criteo", "--rows", "3200", "--files", "8", "--every", "1",
                                "--scale", "0.002", "--new-ids", "0.2", "--seed", "6", "--force", "-q", "-o", str(stream)])
        def launch(out, every, lr, iterations):
            return [sys.executable, str(SRC / "scripts" / "ember_launch.py"), "--stream", str(stream), "--slots-per-shard", "16384", "--ps",
                    "1", "--workers", "2", "--policy", "herald", "--bin", str(BIN), "--out", str(tmp / out), "-q", "--timeout", "200",
                    "--checkpoint-dir", str(ckpt), "--checkpoint-every", every, "--ps-args",
                    f"--dim 8 --optimizer sgd --lr {lr} --checkpoint-full-every 3 --keep-checkpoints 0 --serving-deltas", "--",
                    "--iterations", iterations, "--batch-per-worker", "64", "--progress-every", "0", "--keep-checkpoints", "0",
                    "--create-after", "2"]

        job = subprocess.Popen(launch("out", "2", "0.05", "20"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen, scored = [], {}  # versions in the order served; version -> probabilities
        seen_at, lives = {}, [[]]  # each ember-serve's /version answers
        deadline = time.time() + 180
        while time.time() < deadline:
            status, _, body = request(url + "/version")
            if status == 200:
                v = json.loads(body)["iteration"]
                if not lives[-1] or v != lives[-1][-1]["iteration"]:
                    lives[-1].append(json.loads(body))
                if not seen or v != seen[-1]:
                    seen.append(v)
                    seen_at[v] = time.time()
                    status, headers, text = request(url + "/score", unlabelled.encode())
                    if status == 200:
                        scored[int(headers["X-Ember-Iteration"])] = [float(x) for x in text.split()]
                if len(lives) == 1 and v >= 8:
                    # Killed mid-stream: a new one loads the newest checkpoint whole and follows.
                    serve.kill()
                    serve.wait()
                    serve, url = start_serve(1)
                    lives.append([])
            if job.poll() is not None and seen and seen[-1] >= 20:
                break
            time.sleep(0.05)
        _, err = job.communicate(timeout=60)
        gen.wait(timeout=60)
        check("the stream job runs", job.returncode == 0, err[-2000:])
        if not seen:
            serve.kill()
            print(serve.stderr.read()[-3000:])
        check("versions served in order, never back (an ember-serve killed and restarted too), up to the job's end",
              seen == sorted(set(seen)) and seen and seen[-1] == 20, seen)
        for n, life in enumerate(lives):
            applied = life[-1]["deltas_applied"] if life else 0
            check(f"ember-serve {n}: one whole load, then every newer version by deltas ({applied} applied)",
                  life and life[-1]["whole_loads"] == 1 and applied >= 1, life[-1:] if life else life)
        # The deltas hold the changed rows: their bytes against those rows' (dim 8 float32).
        records = row_bytes = delta_bytes = 0
        for f in (ckpt / "ps").glob("iter-*/*.delta"):
            b = f.read_bytes()
            dim = struct.unpack_from("<I", b, 12)[0]
            updated, created, freed = struct.unpack_from("<QQQ", b, 56)
            records += updated + created + freed
            row_bytes += (updated + created) * dim * 4
            delta_bytes += len(b)
        print(f"     deltas: {records} records, {delta_bytes} bytes, {delta_bytes / max(row_bytes, 1):.3f}x their rows' bytes")
        check("the deltas' bytes follow their rows' (at most 1.5x at dim 8 with new ids)", 0 < delta_bytes <= 1.5 * row_bytes,
              (delta_bytes, row_bytes))
        lag = max((seen_at[v] - (ckpt / "ps" / f"iter-{v:09d}" / "manifest.json").stat().st_mtime for v in seen), default=99)
        check(f"each version served within 2 s of its checkpoint (slowest {lag:.2f} s)", lag <= 2.0, lag)
        whole = sorted((ckpt / "ps").glob("iter-*/shard-0-of-1.ckpt"))
        sizes = [f.stat().st_size for f in whole]
        print(f"     versions {seen}; shard file bytes by checkpoint {sizes}")

        # Every version scored equals ember-predict on an export of that checkpoint.
        (tmp / "lines.tsv").write_text(unlabelled)

        def predicted(v):
            exp = tmp / f"export-{v}"
            r = subprocess.run([str(BIN / "ember-export"), "--checkpoint", str(ckpt / "ps" / f"iter-{v:09d}"), "--dense",
                                str(ckpt / "dense"), "--stream-format", "criteo", "-o", str(exp), "--force"], capture_output=True,
                               text=True, timeout=120)
            if r.returncode != 0:
                return [], r.stderr[-1000:]
            r = subprocess.run([str(BIN / "ember-predict"), "--export", str(exp), str(tmp / "lines.tsv"), "-o", str(tmp / f"p-{v}")],
                               capture_output=True, text=True, timeout=120)
            return ([float(x) for x in (tmp / f"p-{v}").read_text().split()] if r.returncode == 0 else []), r.stderr[-500:]

        for v, probs in sorted(scored.items()):
            want, err = predicted(v)
            d = max((abs(a - b) for a, b in zip(probs, want)), default=1.0) if len(probs) == len(want) == 300 else 1.0
            check(f"version {v}: the served scores are ember-predict's on its export (max diff {d:.1e})", d <= 1e-6, err)
        check("more than one version was scored", len(scored) >= 2, scored.keys())

        # Another run in the same directory (another learning rate, a checkpoint every 3):
        # its checkpoint 20 replaces the one served, and its delta 23 follows that one, not
        # the one served: ember-serve loads it whole instead of applying it.
        r = subprocess.run(launch("out2", "3", "0.3", "24"), capture_output=True, text=True, timeout=240)
        check("a second run in the same checkpoint directory runs", r.returncode == 0, r.stderr[-2000:])
        deadline, last = time.time() + 30, {}
        while time.time() < deadline and last.get("iteration") != 24:
            status, _, body = request(url + "/version")
            last = json.loads(body) if status == 200 else {}
            time.sleep(0.1)
        status, headers, text = request(url + "/score", unlabelled.encode())
        want, err = predicted(24)
        got = [float(x) for x in text.split()] if status == 200 else []
        d = max((abs(a - b) for a, b in zip(got, want)), default=1.0) if len(got) == len(want) == 300 else 1.0
        check(f"the other run's iteration 24, loaded whole ({last.get('whole_loads')} whole loads), scores as its export "
              f"(max diff {d:.1e})", last.get("whole_loads") == 2 and headers.get("X-Ember-Iteration") == "24" and d <= 1e-6,
              (last, err))

        status, _, body = request(url + "/score", b"not\ta\tcriteo\tline\n")
        check("a bad line gets a 400 naming it", status == 400 and body.startswith("request:1: "), (status, body))
        status, _, _ = request(url + "/healthz")
        check("the server goes on after it", status == 200, status)
        serve.send_signal(signal.SIGTERM)
        try:
            rc = serve.wait(timeout=20)
        except subprocess.TimeoutExpired:
            serve.kill()
            rc = -9
        check("SIGTERM stops ember-serve (exit 0)", rc == 0, serve.stderr.read()[-1000:])
    print("serve_test: " + ("FAILED: " + ", ".join(failures) if failures else "all passed"))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
