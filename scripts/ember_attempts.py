#!/usr/bin/env python3
"""The launcher core: one attempt of an Ember job (its processes started, watched, and the
member that failed first named by the control plane's word), the restarts of a job that
heals itself (--max-restarts), spare hosts and host waits, and the one restart record
every launcher writes. ember_launch.py (this machine) and launch_hosts.py (hosts over
ssh) run their attempts here; ember.sbatch, whose attempts Slurm requeues, asks
`ember_job.py restart` (Restarts below) whether to requeue and what to record.

A restart record (OUT/restarts.jsonl, one JSON object a line; summary.json's "restarts"):
  attempt          the attempt that failed (1: the first)
  member           the member that failed first (ps0, worker2), by the control plane
  cause            why, in its words
  exit             the failed member's exit status (null: unknown)
  checkpoint       where the next attempt went on from ("": the start)
  resumed_at       that checkpoint's iteration
  iterations_lost  what worker 0 had finished less resumed_at: recomputed
  replaced, waited hosts replaced by spares, hosts waited for ("" each: none)
  recovery_s       from the loss to training again, by worker 0 (the last restart's)
"""
import ctypes
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from ember_job import iterations_finished, resume_point, write_restart_record

PR_SET_PDEATHSIG = 1

# Exit statuses of Ember's programs (common/error.cc) that a restart cannot mend: 2, a
# setting refused (ConfigError); 3, bad data or a refused model (DataError).
UNMENDABLE_EXITS = {2: "a setting was refused", 3: "the data or the model was refused"}


def die_with_parent(parent):
    """Runs in each child between fork and exec: SIGTERM when the launcher dies. The
    setting survives exec (also through `ip netns exec` and ssh's local end)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the launcher died before the prctl
        os.kill(os.getpid(), signal.SIGTERM)


def member_process(member):
    """'worker 2' (the control plane's name) -> 'worker2' (the launchers')."""
    role, _, rank = member.partition(" ")
    return role + rank


def tail(path, n=15):
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join("    " + line for line in lines[-n:])


class JobFailure(Exception):
    """An attempt that ended before its last iteration: the member that failed first, why,
    its log, and its exit status (None: not a process's exit, e.g. the --timeout)."""

    def __init__(self, name, why, log, rc):
        super().__init__(f"{name} {why}")
        self.name, self.why, self.log, self.rc = name, why, log, rc


def unmendable(f):
    """Why a restart cannot mend failure `f` ("" when it may)."""
    if f.rc in UNMENDABLE_EXITS:
        return UNMENDABLE_EXITS[f.rc]
    try:
        text = Path(f.log).read_text(errors="replace")[-20000:]
    except OSError:
        text = ""
    if "No space left on device" in text:
        return "the disk is full"
    if f.rc is None and "--timeout" in f.why:
        return "the job ran past --timeout"
    return ""


def failure_of_word(out):
    """The failure OUT/failure.json records (shard 0's control plane), as a JobFailure;
    None without one."""
    try:
        word = json.loads((Path(out) / "failure.json").read_text())
    except (OSError, ValueError):
        return None
    name = member_process(word.get("member", "?"))
    return JobFailure(name, f"failed first, by the control plane: {word.get('cause', '?')}", Path(out) / f"{name}.log", word.get("exit"))


class Attempt:
    """One attempt of a job: its members (shard 0 first, which publishes the control plane)
    started as processes of this launcher (commands on other hosts through ssh), watched
    until the workers finish or one member fails. A failure stops the others and raises
    JobFailure naming the member that failed first by the control plane's word, not the
    first process that happened to exit.

    `grace_s`: after that word, how long the other members get to stop by themselves (and
    log why) before they are stopped; `stop_wait_s`: the heartbeat timeout and the
    workers' grace, how long to wait for the word."""

    def __init__(self, out, who, stop_wait_s, timeout=None, grace_s=0.0, progress=None):
        self.out = Path(out)
        # How long a failed member gets to exit after the word (through ssh, a session to a
        # host cut off may never end: the member says its status on the control plane).
        self.exit_wait_s = 0.5 if grace_s else 10.0
        self.who = who
        self.stop_wait_s = stop_wait_s
        self.timeout = timeout
        self.grace_s = grace_s
        self.progress = progress  # prefix for worker 0's progress lines; None: quiet
        self.procs = []  # (name, Popen, log path)
        self.failure_file = self.out / "failure.json"
        self.training_at = None  # when worker 0 first reported an iteration (time.time())

    def start(self, name, cmd, remote=None):
        """Starts member `name`: `cmd` here, or through `remote(cmd, log)` (a command that
        runs it on its host, writing the log there)."""
        log = self.out / f"{name}.log"
        with open(log, "w") as f:
            f.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        parent = os.getpid()
        p = subprocess.Popen(remote(cmd, log) if remote else cmd, stdin=subprocess.DEVNULL, stdout=open(log, "a"),
                             stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=lambda: die_with_parent(parent))
        self.procs.append((name, p, log))
        return p

    def stop_all(self, sig=signal.SIGTERM):
        for _, p, _ in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass
        deadline = time.time() + 10
        for _, p, _ in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def fail(self, name, why, log, rc=None):
        print(f"{self.who}: the job failed: {name} {why}; its last log lines:\n{tail(log)}", file=sys.stderr, flush=True)
        self.stop_all()
        raise JobFailure(name, why, log, rc)

    def control_plane_word(self, wait):
        """The coordinator's record of the first failure ({"member", "cause", "exit"}),
        waiting up to `wait` seconds for it while shard 0 (its host) runs."""
        deadline = time.time() + wait
        while True:
            try:
                return json.loads(self.failure_file.read_text())
            except (OSError, ValueError):
                pass
            if time.time() >= deadline or self.procs[0][1].poll() is not None:
                return None
            time.sleep(0.05)

    def let_others_stop(self):
        """Gives the members still running `grace_s` to stop by themselves."""
        deadline = time.time() + self.grace_s
        while time.time() < deadline and any(p.poll() is None for _, p, _ in self.procs):
            time.sleep(0.1)

    def process_failed(self, name, rc, log):
        """A process exited with status rc != 0. A signal's victim here (rc < 0) and a
        process that refused its settings (rc 2) are the ones that failed; else the control
        plane says which member failed first (a survivor exits too, after its all-reduce or
        a PS request breaks), so wait for its word."""
        if rc < 0:
            self.fail(name, f"was killed by signal {-rc}", log, rc)
        if rc == 2:  # a ConfigError: it refused its own settings (the launchers pass them on unchecked)
            self.fail(name, "refused its settings (exit 2)", log, rc)
        word = self.control_plane_word(self.stop_wait_s)
        if word:
            failed = member_process(word.get("member", ""))
            procs = {n: (p, l) for n, p, l in self.procs}
            if failed in procs:
                p, flog = procs[failed]
                self.let_others_stop()
                # It may still be on its way out (logging, closing sockets): its exit status
                # says whether a restart can mend this, so wait for it a little. Through ssh
                # the status is the session's: the member says its own on the control plane.
                try:
                    rc_failed = p.wait(timeout=self.exit_wait_s)
                except subprocess.TimeoutExpired:
                    rc_failed = None
                if word.get("exit") is not None and (rc_failed is None or rc_failed == 255 or rc_failed > 128):
                    rc_failed = word["exit"]
                self.fail(failed, f"failed first, by the control plane: {word.get('cause', '?')}", flog, rc_failed)
        self.fail(name, f"exited with status {rc}", log, rc)

    def wait_coordinator(self, coord_file):
        """The control plane's endpoint, once shard 0 has published it (it bound its port)."""
        deadline = time.time() + 60
        while time.time() < deadline:
            if coord_file.exists() and coord_file.read_text().strip():
                return coord_file.read_text().strip()
            name, p, log = self.procs[0]
            if p.poll() is not None:
                self.fail(name, f"exited with status {p.returncode} before the job formed", log)
            time.sleep(0.05)
        self.fail("ps0", "did not publish its coordinator endpoint within 60 s", self.procs[0][2])

    def show_progress(self, w0_log, pos):
        """Prints worker 0's progress lines written since `pos`; returns the new position."""
        if not w0_log.exists():
            return pos
        with open(w0_log, errors="replace") as f:
            f.seek(pos)
            chunk = f.read()
            pos = f.tell()
        for line in chunk.splitlines():
            if line.startswith("$ "):  # the command line the launcher wrote
                continue
            if self.progress is not None and ("iteration" in line or "eval" in line or "error" in line):
                print(f"{self.progress}{line.split('] ', 2)[-1]}", flush=True)
        return pos

    def watch(self):
        """Streams worker 0's progress lines until the workers finish; fails fast when any
        member dies. Then waits for the shards, which stop by themselves."""
        start = time.time()
        w0_log = self.out / "worker0.log"
        pos = 0
        while True:
            pos = self.show_progress(w0_log, pos)
            if self.training_at is None and (self.out / "w0.jsonl").exists() and (self.out / "w0.jsonl").stat().st_size > 0:
                self.training_at = time.time()
            workers_done = True
            for name, p, log in self.procs:
                rc = p.poll()
                if name.startswith("worker") and rc is None:
                    workers_done = False
                elif rc is not None and rc != 0:
                    self.process_failed(name, rc, log)
            if workers_done:
                break
            if self.timeout is not None and time.time() - start > self.timeout:
                self.fail("the job", f"did not finish within --timeout {self.timeout} s", w0_log)
            time.sleep(0.2)
        self.show_progress(w0_log, pos)
        for name, p, log in self.procs:
            try:
                rc = p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.fail(name, "did not stop within 30 s after the workers finished", log)
            if rc != 0:
                self.process_failed(name, rc, log)

    def prepare_out(self):
        """Clears what an earlier attempt's run left in OUT that this one writes anew."""
        self.out.mkdir(parents=True, exist_ok=True)
        for old in [*self.out.glob("w*.jsonl"), *self.out.glob("ps*.json"), self.out / "coordinator", self.failure_file,
                    self.out / "summary.json"]:
            old.unlink(missing_ok=True)


class Restarts:
    """The restarts of a job that heals itself (--max-restarts N): whether a failure gets
    one, and for the next attempt the checkpoint it resumes from, what it records
    (OUT/restarts.jsonl) and what its workers report (OUT/restart-record.json, ember-worker
    --restart-record). The failed attempt's logs and metrics move to OUT/attempt-K."""

    def __init__(self, out, max_restarts, checkpoint_dir, ember_ps, who, records=None):
        self.out = Path(out)
        self.max = max_restarts
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.ember_ps = ember_ps
        self.who = who
        self.records = list(records or [])
        self.lost_at = None
        self.resume_from = None  # the checkpoint the next attempt resumes from

    @staticmethod
    def read(out):
        """The records of OUT/restarts.jsonl (an earlier attempt's; none: [])."""
        path = Path(out) / "restarts.jsonl"
        try:
            text = path.read_text()
        except OSError:
            return []
        try:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        except ValueError as e:
            sys.exit(f"{path}: not a restart record ({e})")

    def refuse(self, f):
        """The launcher's exit status when failure `f` gets no restart (saying why), else None."""
        why = unmendable(f)
        if why:
            if self.max:
                print(f"{self.who}: not restarted: {why} ({f.name}, exit {f.rc})", file=sys.stderr, flush=True)
            # The member's own status for a refused setting (2), data or model (3).
            return f.rc if f.rc in UNMENDABLE_EXITS else 1
        if len(self.records) >= self.max:
            if self.max:
                print(f"{self.who}: giving up: the job failed {len(self.records) + 1} times, --max-restarts {self.max}",
                      file=sys.stderr, flush=True)
            return 1
        return None

    def choose_checkpoint(self):
        """(the newest checkpoint that verifies, its iteration), or (None, 0): from the start."""
        if not self.checkpoint_dir or not (self.checkpoint_dir / "ps").is_dir():
            return None, 0
        try:
            point = resume_point(self.checkpoint_dir, who=self.who, ember_ps=self.ember_ps)
        except SystemExit as e:  # no checkpoint verifies: from the start
            print(e.code if isinstance(e.code, str) else f"{self.who}: no checkpoint to resume from", file=sys.stderr)
            return None, 0
        return point, int(point.name.split("-")[-1])

    def checkpoint_args(self, every, resume):
        """(every shard's, every worker's) arguments for checkpoints (every `every`
        iterations; 0: on SIGUSR1 alone) and for resuming: a restarted attempt from the
        checkpoint its restart chose (and said what it passed over), a first attempt with
        `resume` from the newest one that verifies. None without a checkpoint directory.
        --checkpoint-on-exit: SIGTERM stops the job at a checkpoint the workers flush for."""
        if not self.checkpoint_dir:
            return [], []
        ckpt = self.checkpoint_dir
        ps = ["--checkpoint-dir", str(ckpt / "ps"), "--checkpoint-every", str(every), "--checkpoint-on-exit"]
        point = self.resume_from if self.records else (
            resume_point(ckpt, who=self.who, ember_ps=self.ember_ps) if resume else None)
        if point:
            ps = ["--restore", str(point)] + ps
        return ps, ["--checkpoint-dir", str(ckpt / "dense")] + (["--resume"] if point else [])

    def record(self, f, replaced="", waited=""):
        """Records the restart after failure `f` (hosts `replaced` by spares and `waited`
        for, as lines say them) and prepares the next attempt; one line says what failed,
        where the job goes on from and how many iterations it recomputes."""
        n = len(self.records) + 1
        self.lost_at = time.time()
        reached = iterations_finished(self.out)  # before the metrics move
        keep = self.out / f"attempt-{n}"
        keep.mkdir(exist_ok=True)
        for x in [*self.out.glob("*.log"), *self.out.glob("*.jsonl"), *self.out.glob("ps*.json"), self.out / "failure.json"]:
            if x.exists() and x.name != "restarts.jsonl":
                x.replace(keep / x.name)
        point, start = self.choose_checkpoint()
        self.resume_from = point
        lost = max(0, reached - start)
        where = f"checkpoint {point} (iteration {start})" if point else "the start (no checkpoint verifies)"
        hosts = "".join(f" {x}" for x in (f"replaced {replaced};" if replaced else "", f"{waited};" if waited else "") if x)
        print(f"{self.who}: restart {n}/{self.max}: {f.name} {f.why}; from {where}; {lost} iteration(s) lost;{hosts} "
              f"the failed attempt's logs in {keep}", file=sys.stderr, flush=True)
        self.records.append({"attempt": n, "member": f.name, "cause": f.why, "exit": f.rc, "checkpoint": str(point or ""),
                             "resumed_at": start, "iterations_lost": lost, "replaced": replaced, "waited": waited,
                             "recovery_s": None})
        self.write()
        return self.records[-1]

    def write(self):
        """OUT/restarts.jsonl and OUT/restart-record.json, each written whole, then renamed."""
        tmp = self.out / f".restarts.jsonl.tmp-{os.getpid()}"
        tmp.write_text("".join(json.dumps(r) + "\n" for r in self.records))
        os.replace(tmp, self.out / "restarts.jsonl")
        write_restart_record(self.out / "restart-record.json", self.records, self.lost_at)

    def clear(self):
        """A new job (not a restart): no earlier job's records."""
        for x in ("restarts.jsonl", "restart-record.json"):
            (self.out / x).unlink(missing_ok=True)

    def worker_args(self):
        """What a restarted attempt's workers get: the record they report."""
        return ["--restart-record", str(self.out / "restart-record.json")] if self.records else []

    def saw_training(self, attempt):
        """Worker 0 trained again in `attempt`: the last restart's recovery time."""
        if self.records and self.lost_at is not None and attempt.training_at is not None:
            self.records[-1]["recovery_s"] = round(attempt.training_at - self.lost_at, 3)


class HostPool:
    """The hosts of a job over ssh and its spares: before a restart, a host that does not
    answer is replaced by the next spare in every entry it had (its processes keep their
    ranks, the job its model); with no spare left, the launcher waits up to `wait_s` for
    it to answer again (a link down for a while, a reboot)."""

    def __init__(self, entries, spares, answers, wait_s, who):
        if len(entries) <= spares:
            raise ValueError(f"lists {len(entries)} host(s), not more than --spares {spares}")
        self.active = entries[:len(entries) - spares]
        self.spares = entries[len(entries) - spares:]
        self.answers = answers  # host -> whether it answers (ssh)
        self.wait_s = wait_s
        self.who = who

    def heal(self):
        """(replaced, waited) as a restart records them; exits 1 when a host is lost."""
        replaced, waited = [], []
        for h in dict.fromkeys(self.active):
            if self.answers(h):
                continue
            if self.spares:
                spare = self.spares.pop(0)
                self.active = [spare if x == h else x for x in self.active]
                replaced.append(f"{h} by the spare {spare}")
                continue
            print(f"{self.who}: host {h} does not answer ssh and no spare host is left: waiting up to {self.wait_s} s for it "
                  f"(--host-wait)", file=sys.stderr, flush=True)
            start = time.time()
            while not self.answers(h):
                if time.time() - start >= self.wait_s:
                    sys.exit(f"{self.who}: host {h} is lost (no answer for {time.time() - start:.0f} s) and no spare host is "
                             f"left: the job needs {len(set(self.active))} hosts")
                time.sleep(2)
            waited.append(f"{h} answered again after {time.time() - start:.0f} s")
        return "; ".join(replaced), "; ".join(waited)


def run_attempts(run_attempt, restarts, heal=None):
    """Runs attempts (`run_attempt()`, raising JobFailure on a failure) until one succeeds;
    returns what it returned. A failure a restart may mend, within --max-restarts, gets a
    restart (on healed hosts: `heal()` gives (replaced, waited)); any other ends the
    launcher with the member's status for a refused setting or data, else 1."""
    while True:
        try:
            return run_attempt()
        except JobFailure as f:
            code = restarts.refuse(f)
            if code is not None:
                sys.exit(code)
            replaced, waited = heal() if heal else ("", "")
            restarts.record(f, replaced, waited)


def run_job(job, who, heal=None):
    """Runs `job`'s attempts (its run_attempt, restarts and current attempt) as run_attempts
    does, a new job (no earlier job's restart records). SIGINT and SIGTERM stop it: at a
    checkpoint when `job.stop_at_checkpoint(signum)` can, else at once (exit 128 + signal)."""
    def on_signal(signum, frame):
        stop = getattr(job, "stop_at_checkpoint", None)
        if stop and stop(signum):
            return
        print(f"{who}: interrupted; stopping the job", file=sys.stderr)
        if job.attempt:
            job.attempt.stop_all()
        sys.exit(128 + signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    job.restarts.clear()
    return run_attempts(job.run_attempt, job.restarts, heal)


def requeue(argv):
    """ember.sbatch after its job failed (Slurm requeues the job, a new run of the script):
    whether to restart it, and if so the restart recorded as every launcher records it.
    Exit 0: requeue it; 1: not (the line says why)."""
    import argparse
    p = argparse.ArgumentParser(prog="ember_attempts.py requeue", description=requeue.__doc__)
    p.add_argument("out", help="the job's output directory (failure.json, restarts.jsonl)")
    p.add_argument("--max-restarts", type=int, required=True, help="EMBER_MAX_RESTARTS")
    p.add_argument("--checkpoint-dir", default="", help="EMBER_CHECKPOINT_DIR")
    p.add_argument("--bin", default="", help="where ember-ps is (it verifies checkpoints)")
    p.add_argument("--who", default="ember.sbatch")
    a = p.parse_args(argv)
    f = failure_of_word(a.out)
    if f is None:  # no word from the control plane: the job never formed
        print(f"{a.who}: not restarted: it failed before it formed (settings, data or model; logs above)", file=sys.stderr)
        return 1
    ember_ps = Path(a.bin) / "ember-ps"
    restarts = Restarts(a.out, a.max_restarts, a.checkpoint_dir, ember_ps if os.access(ember_ps, os.X_OK) else None, a.who,
                        Restarts.read(a.out))
    if restarts.refuse(f) is not None:
        return 1
    restarts.record(f)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["requeue"]:
        sys.exit("usage: ember_attempts.py requeue OUT --max-restarts N [--checkpoint-dir DIR] [--bin BIN] (ember.sbatch's)")
    sys.exit(requeue(sys.argv[2:]))
