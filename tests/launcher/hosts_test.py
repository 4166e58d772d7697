#!/usr/bin/env python3
"""launch_hosts.py (the ssh launcher) on this machine, without root or sshd: its hosts are
loopback addresses (127.0.0.2..4, every one of them this machine) and --rsh is a stand-in
for ssh that runs the command here, or answers as ssh does for a host that cannot be
reached (exit 255) while that host is listed in a file of lost hosts:

  - a job on two hosts ends with summary.json and each process placed by the hostfile;
  - a host lost mid-job (its worker killed, the host then not answering) with
    --max-restarts 1 --spares 1: the spare takes its entries, the line says so, the
    restart record names it, and the model is the uninterrupted job's, bit for bit;
  - a host lost for a few seconds with no spare: the launcher waits for it (--host-wait),
    says how long, and the job ends with the same model;
  - a bad option (--spares as many as the hosts) is one line and exit 2.

The real thing, over ssh to network namespaces and under Slurm, is the cluster_jobs test.

  python3 tests/launcher/hosts_test.py BIN_DIR SOURCE_DIR
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BIN, SRC = (Path(a).resolve() for a in sys.argv[1:3])
LAUNCH = [sys.executable, str(SRC / "scripts" / "launch_hosts.py")]
HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
failures = []

# The stand-in for ssh: `rsh HOST COMMAND`; a host listed in LOST answers as ssh does when
# it cannot connect.
RSH = """#!/usr/bin/env bash
host="$1"; shift
if grep -qxF "$host" "{lost}" 2> /dev/null; then
  echo "$host" >> "{lost}.refused"
  echo "ssh: connect to host $host port 22: No route to host" >&2
  exit 255
fi
exec bash -c "$1"
"""


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + ("" if cond else f": {detail}"), flush=True)
    if not cond:
        failures.append(name)


def job(tmp, data, name, hosts, extra=()):
    """Starts a job: 1 shard, 2 workers on `hosts` (shard 0 on the first, worker w on
    host (1 + w) mod H), herald + Adagrad, checkpoints every 4 iterations."""
    out = tmp / name
    (tmp / f"{name}.hosts").write_text("\n".join(hosts) + "\n")
    cmd = LAUNCH + ["--hostfile", str(tmp / f"{name}.hosts"), "--rsh", str(tmp / "rsh"), "--port", "0", "--ps", "1", "--workers", "2",
                    "--dataset", str(data), "--bin", str(BIN), "--out", str(out), "-q", "--checkpoint-dir", str(tmp / f"{name}-ckpt"),
                    "--checkpoint-every", "4", "--ps-args", "--dim 8 --optimizer adagrad --lr 0.05 --heartbeat-timeout-ms 3000",
                    *extra, "--", "--iterations", "30", "--batch-per-worker", "32", "--eval-every", "0", "--progress-every", "0",
                    "--dense-optimizer", "adagrad", "--heartbeat-timeout-ms", "3000", "--dump-dir", str(tmp / f"{name}-model")]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), out


def iterations(out):
    try:
        return sum(1 for _ in open(out / "w0.jsonl"))
    except OSError:
        return 0


def lose_host_at(p, out, host, lost_file, at=11, back_after=None):
    """Once worker 0 logged `at` iterations: `host` stops answering and its worker is killed;
    with `back_after`, it answers again that many seconds after it first refused the
    launcher. Whether it happened."""
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None and iterations(out) < at:
        time.sleep(0.05)
    pids = subprocess.run(["pgrep", "-f", f"ember-worker .*--host {host} .*--metrics {out}/"], capture_output=True, text=True).stdout.split()
    if not pids:
        return False
    Path(f"{lost_file}.refused").unlink(missing_ok=True)
    lost_file.write_text(host + "\n")
    for pid in pids:
        os.kill(int(pid), signal.SIGKILL)
    if back_after is not None:
        def come_back():
            refused = Path(f"{lost_file}.refused")
            while not refused.exists() and time.time() < deadline:
                time.sleep(0.1)
            time.sleep(back_after)
            lost_file.write_text("")
        threading.Thread(target=come_back, daemon=True).start()
    return True


def same_model(tmp, a, b):
    return all((tmp / f"{a}-model" / f).read_bytes() == (tmp / f"{b}-model" / f).read_bytes() for f in ("rows.bin", "dense.bin"))


def main():
    with tempfile.TemporaryDirectory(prefix="ember-hosts-") as t:
        tmp = Path(t)
        lost = tmp / "lost"
        lost.write_text("")
        (tmp / "rsh").write_text(RSH.format(lost=lost))
        (tmp / "rsh").chmod(0o755)
        data = tmp / "data"
        subprocess.run([str(BIN / "ember-data"), "gen", "--like", "criteo", "--rows", "12000", "--scale", "0.002", "--seed", "3",
                        "--force", "-o", str(tmp / "c.tsv")], check=True, capture_output=True, timeout=60)
        subprocess.run([str(BIN / "ember-data"), "prep", "--format", "criteo", "--val-fraction", "0.1", "--force", "-o", str(data),
                        str(tmp / "c.tsv")], check=True, capture_output=True, timeout=60)

        p, out = job(tmp, data, "whole", HOSTS[:2])
        _, err = p.communicate(timeout=240)
        check("a job on two hosts runs", p.returncode == 0 and (out / "summary.json").exists(), err[-2000:])
        w0 = (out / "worker0.log").read_text(errors="replace") if p.returncode == 0 else ""
        check("worker 0 runs on the second host, shard 0 on the first",
              f"--host {HOSTS[1]}" in w0 and f"--listen {HOSTS[0]}:0" in (out / "ps0.log").read_text(errors="replace"), w0[:400])

        p, out = job(tmp, data, "spare", HOSTS, ["--max-restarts", "1", "--spares", "1"])
        check("the host of worker 0 was lost mid-job", lose_host_at(p, out, HOSTS[1], lost))
        _, err = p.communicate(timeout=240)
        lost.write_text("")
        line = next((l for l in err.splitlines() if l.startswith("launch_hosts: restart 1/1: ")), "")
        check("the job heals on the spare host", p.returncode == 0 and f"replaced {HOSTS[1]} by the spare {HOSTS[2]};" in line,
              err[-2000:])
        if p.returncode == 0:
            r = json.loads((out / "summary.json").read_text()).get("restarts") or [{}]
            check("the restart record names the replaced host", r[0].get("replaced") == f"{HOSTS[1]} by the spare {HOSTS[2]}" and
                  r[0].get("member") == "worker0", r)
            check("worker 0 runs on the spare, its rank kept", f"--host {HOSTS[2]}" in (out / "worker0.log").read_text(errors="replace"))
            check("each attempt's hosts are recorded", (out / "hosts-attempt-1").read_text().split() == HOSTS[:2] and
                  (out / "hosts-attempt-2").read_text().split() == [HOSTS[0], HOSTS[2]])
            check("the healed job's model is the uninterrupted job's, bit for bit", same_model(tmp, "whole", "spare"))

        p, out = job(tmp, data, "wait", HOSTS[:2], ["--max-restarts", "1", "--host-wait", "30"])
        check("the host of worker 0 was lost for 3 s", lose_host_at(p, out, HOSTS[1], lost, back_after=3))
        _, err = p.communicate(timeout=240)
        check("the launcher waits for the lost host and the job heals", p.returncode == 0 and
              f"host {HOSTS[1]} does not answer ssh and no spare host is left" in err and
              f"{HOSTS[1]} answered again after" in err, err[-2000:])
        if p.returncode == 0:
            check("the job that waited ends with the uninterrupted job's model", same_model(tmp, "whole", "wait"))

        p, _ = job(tmp, data, "bad", HOSTS[:2], ["--spares", "2"])
        _, err = p.communicate(timeout=60)
        check("--spares as many as the hosts is refused in one line", p.returncode == 2 and
              err.strip() == f"launch_hosts: {tmp / 'bad.hosts'} lists 2 host(s), not more than --spares 2", err)

    if failures:
        print(f"{len(failures)} check(s) failed: {', '.join(failures)}")
        sys.exit(1)
    print("all launch_hosts checks passed")


if __name__ == "__main__":
    main()
