#!/usr/bin/env python3
"""Multi-node launcher over ssh (the settings of ember_launch.py, one process per host
slot). Assumes the repository, the build and the dataset are at the same path on every
host (shared filesystem) and password-less ssh.

  scripts/launch_hosts.py --hostfile hosts.txt --ps 2 --workers 8 --dataset /shared/criteo \\
      --policy herald [--transport rdma] [--ssh-config FILE] --out /shared/runs/herald -- --model dlrm --iterations 1000

(scripts/launch_hosts.sh runs this.) hostfile: one host per line (# comments allowed), a
name or an address as the hosts themselves resolve it. PS shard s runs on host s mod H,
worker w on host (S + w) mod H. Rendezvous: ember-ps shard 0 binds the control plane at
tcp://<its host>:PORT (--port, default 29600; 0: any free port) and publishes it in
OUT/coordinator; every other process gets that endpoint and the job token (OUT/token,
mode 600). Data-plane ports are chosen by each PS and exchanged over the control plane;
the dense all-reduce (Gloo) store is hosted by worker 0 on a free port, also exchanged
there. Each shard listens, and each worker binds Gloo, on its hostfile entry (a name is
resolved on that host); each process states the entry as its host (ember-ps and
ember-worker --host), which decides what counts as traffic within a host.

Checkpoints and restarts, as ember_launch.py: --checkpoint-dir DIR (the shards' rows in
DIR/ps, the workers' dense state in DIR/dense; shared by every host), --checkpoint-every
N, --resume, and --max-restarts N: a failed job is started again, up to N times, from the
newest checkpoint that verifies (from the start without one), with one line per restart
naming the cause, the checkpoint and the iterations lost; the failed attempt's logs move
to OUT/attempt-K. A failure a restart cannot mend (a process refusing its settings or its
data: exit 2 or 3; a full disk) ends the job at once. summary.json lists the restarts.
--spares K: the hostfile's last K entries are spare hosts; before a restart, a host of the
job that does not answer ssh is replaced by the next spare (all its entries: its
processes keep their ranks, and the job its model). With no spare left, the launcher
waits up to --host-wait S seconds (default 60) for the host to answer again, then ends
the job saying so. Attempts, restarts and spares are the launcher core's
(ember_attempts.py).

--ssh-config FILE runs every ssh with -F FILE (for example a cluster_local.sh cluster's
STATE/ssh_config, to launch from outside the cluster). --rsh 'PROGRAM ARGS' runs
`PROGRAM ARGS HOST COMMAND` in place of ssh (as mpirun's rsh agent), for hosts that have
no sshd: `cluster_local.sh --state DIR rsh` on a --net-only cluster. --ps-args: extra
arguments for every ember-ps, split as a shell would, {shard} becoming the shard's index;
after `--`: arguments for every ember-worker (a --heartbeat-timeout-ms among either is
also how long the launcher waits for the control plane's word on a failure).

Output in OUT: each process's log (NAME.log, written on its host), the workers' metrics
(wN.jsonl), the shards' totals (psN.json), the hosts of each attempt (hosts-attempt-K)
and summary.json. When a process fails, the
launcher names the member that failed first by the control plane's word (OUT/failure.json,
written by shard 0), not by which process ended first, prints its last log lines and
exits 1, closing the ssh sessions still open 4 s after that word (their remote processes
get SIGHUP). Processes on a host that cannot be reached stop by themselves: the control
plane's heartbeats fail the job.
"""
import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

from ember_attempts import Attempt, HostPool, Restarts, run_job
from ember_job import settings_of_worker_args, split_worker_args, summarize, worker_settings, write_token

WHO = "launch_hosts"


class Parser(argparse.ArgumentParser):
    """Bad input is one line: `launch_hosts: what is wrong`, exit 2."""

    def error(self, message):
        self.exit(2, f"{WHO}: {message}\n")


def nonnegative(text):
    v = int(text)
    if v < 0:
        raise ValueError(text)
    return v


def positive(text):
    v = int(text)
    if v < 1:
        raise ValueError(text)
    return v


def build_parser(root):
    p = Parser(description="Run an Ember job on hosts over ssh (shards and workers by a hostfile).")
    p.add_argument("--hostfile", required=True, help="one host per line (# comments); the last --spares entries are spares")
    p.add_argument("--ps", type=positive, default=1, help="PS shards")
    p.add_argument("--workers", type=positive, default=1, help="workers")
    p.add_argument("--dataset", required=True, help="ember-data dataset directory, at the same path on every host")
    p.add_argument("--policy", default="herald", help="the workers' --policy")
    p.add_argument("--transport", default="tcp", help="tcp or rdma")
    p.add_argument("--out", required=True, help="output directory, shared by every host")
    p.add_argument("--port", type=nonnegative, default=29600, help="control-plane port on the first host (0: any free port)")
    p.add_argument("--ps-args", default="", help="extra arguments for every ember-ps; {shard} becomes the shard's index")
    p.add_argument("--bin", default=str(root / "build" / "bin"), help="where the binaries are, on every host")
    p.add_argument("--ssh-config", default="", help="run every ssh with -F FILE")
    p.add_argument("--rsh", default="", help="'PROGRAM ARGS' run as `PROGRAM ARGS HOST COMMAND` in place of ssh")
    p.add_argument("--checkpoint-dir", default="", help="checkpoints: the shards' rows in DIR/ps, the workers' dense state in DIR/dense")
    p.add_argument("--checkpoint-every", type=nonnegative, default=0, help="checkpoint every N iterations (with --checkpoint-dir)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint that verifies")
    p.add_argument("--max-restarts", type=nonnegative, default=0, help="restart a failed job up to N times")
    p.add_argument("--spares", type=nonnegative, default=0, help="the hostfile's last K entries are spare hosts")
    p.add_argument("--host-wait", type=nonnegative, default=60, help="seconds to wait for a lost host when no spare is left")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    return p


def check_args(p, a):
    if a.port > 65535:
        p.error(f"--port {a.port}: not a port (0: any free port)")
    if a.ssh_config and not os.access(a.ssh_config, os.R_OK):
        p.error(f"--ssh-config {a.ssh_config}: not a readable file")
    if (a.checkpoint_every or a.resume) and not a.checkpoint_dir:
        p.error("--checkpoint-every and --resume need --checkpoint-dir")
    try:
        a.entries = [line.split()[0] for line in Path(a.hostfile).read_text().splitlines()
                     if line.strip() and not line.strip().startswith("#")]
    except OSError as e:
        p.error(f"--hostfile {a.hostfile}: {e.strerror}")
    if len(a.entries) <= a.spares:
        p.error(f"{a.hostfile} lists {len(a.entries)} host(s), not more than --spares {a.spares}")


def last_heartbeat_ms(args, default=10000):
    """The heartbeat timeout the processes run with: the last --heartbeat-timeout-ms given."""
    ms = default
    for i, x in enumerate(args):
        if x == "--heartbeat-timeout-ms" and i + 1 < len(args) and args[i + 1].isdigit():
            ms = int(args[i + 1])
        elif x.startswith("--heartbeat-timeout-ms=") and x.split("=", 1)[1].isdigit():
            ms = int(x.split("=", 1)[1])
    return ms


class HostsJob:
    """The job's attempts on the hosts: the commands each host runs, through ssh."""

    def __init__(self, a, worker_args, root):
        self.a = a
        self.root = root
        self.out = Path(a.out).resolve()
        self.bin = Path(a.bin)
        self.ckpt = Path(a.checkpoint_dir).resolve() if a.checkpoint_dir else None
        self.worker_args = worker_args
        self.user_ps = shlex.split(a.ps_args)
        self.hb_ms = last_heartbeat_ms(self.user_ps + worker_args)
        ssh = ["ssh"] + (["-F", a.ssh_config] if a.ssh_config else [])
        self.remote_cmd = shlex.split(a.rsh) if a.rsh else ssh + ["-o", "BatchMode=yes", "-tt"]
        self.probe_cmd = shlex.split(a.rsh) if a.rsh else ssh + ["-o", "BatchMode=yes", "-o", "ConnectTimeout=5"]
        self.pool = HostPool(a.entries, a.spares, self.answers, a.host_wait, WHO)
        self.restarts = Restarts(self.out, a.max_restarts, self.ckpt, self.bin / "ember-ps", WHO)
        self.attempt = None

    def answers(self, host):
        """Whether `host` answers ssh (within 15 s)."""
        try:
            return subprocess.run(self.probe_cmd + [host, "true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, timeout=15).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def on_host(self, host):
        """The remote runner of a member on `host`: its command from the repository's
        directory, its output appended to its log (OUT is shared: a host cut off from this
        one still logs; ssh's own errors go to the same file, from here)."""
        def remote(cmd, log):
            line = " ".join(shlex.quote(c) for c in cmd)
            return self.remote_cmd + [host, f"cd {shlex.quote(str(self.root))} && exec {line} >> {shlex.quote(str(log))} 2>&1"]
        return remote

    def start_shards(self, att, hosts, token, ps_extra):
        """Shard 0 first: it binds the control plane and publishes its endpoint."""
        a = self.a
        coord = f"tcp://{hosts[0]}:{a.port}"
        for s in range(a.ps):
            h = hosts[s % len(hosts)]
            first = ["--coordinator-file", str(self.out / "coordinator"), "--failure-file", str(self.out / "failure.json")] if s == 0 else []
            cmd = [str(self.bin / "ember-ps"), "--dataset", a.dataset, "--shard", str(s), "--shards", str(a.ps), "--workers", str(a.workers),
                   "--listen", f"{h}:0", "--host", h, "--coordinator", coord, "--transport", a.transport, "--token-file", str(token),
                   "--stats-interval", "30", "--summary-file", str(self.out / f"ps{s}.json")] + first + \
                [x.replace("{shard}", str(s)) for x in ps_extra]
            att.start(f"ps{s}", cmd, self.on_host(h))
            if s == 0:
                coord = att.wait_coordinator(self.out / "coordinator")
        return coord

    def run_attempt(self):
        a = self.a
        hosts = self.pool.active
        self.attempt = att = Attempt(self.out, WHO, self.hb_ms / 1000 + 5, grace_s=4,
                                     progress=None if a.quiet else f"[{a.policy}] ")
        att.prepare_out()
        # The hosts this attempt runs on, one hostfile entry a line (spares replace lost ones).
        (self.out / f"hosts-attempt-{len(self.restarts.records) + 1}").write_text("".join(h + "\n" for h in hosts))
        token = write_token(self.out)
        if self.ckpt:
            self.ckpt.mkdir(parents=True, exist_ok=True)
        ps_ckpt, worker_ckpt = self.restarts.checkpoint_args(a.checkpoint_every, a.resume)
        coord = self.start_shards(att, hosts, token, ps_ckpt + self.user_ps)
        worker_args = worker_ckpt + self.worker_args + self.restarts.worker_args()
        for w in range(a.workers):
            h = hosts[(a.ps + w) % len(hosts)]
            att.start(f"worker{w}", [str(self.bin / "ember-worker"), "--dataset", a.dataset, "--coordinator", coord, "--workers",
                                     str(a.workers), "--rank", str(w), "--policy", a.policy, "--transport", a.transport, "--gloo-host", h,
                                     "--host", h, "--token-file", str(token), "--metrics", str(self.out / f"w{w}.jsonl")] + worker_args,
                      self.on_host(h))
        print(f"{WHO}: {a.ps} shard(s) on {hosts[0]}{' ..' if a.ps > 1 else ''} ({coord}), {a.workers} worker(s); output in {self.out}",
              flush=True)
        try:
            att.watch()
        finally:
            self.restarts.saw_training(att)
        settings = settings_of_worker_args(worker_settings(self.bin, WHO), ["--policy", a.policy, *self.worker_args])
        job = {"transport": a.transport, "workers": a.workers, "ps": a.ps, "checkpoint_dir": str(self.ckpt or ""),
               "restarts": self.restarts.records if a.max_restarts else None, "settings": settings}
        return summarize(self.out, job, who=WHO)

    def run(self):
        """The attempts (ember_attempts.run_job); an interrupt closes the ssh sessions (their
        remote processes get SIGHUP)."""
        self.out.mkdir(parents=True, exist_ok=True)
        return run_job(self, WHO, heal=self.pool.heal)


def main():
    root = Path(__file__).resolve().parent.parent
    argv, worker_args = split_worker_args(sys.argv[1:])
    p = build_parser(root)
    a = p.parse_args(argv)
    check_args(p, a)
    HostsJob(a, worker_args, root).run()


if __name__ == "__main__":
    main()
