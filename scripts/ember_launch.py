#!/usr/bin/env python3
"""Run one Ember job on this machine: S ember-ps shards and W ember-worker processes on
localhost, a merged progress view, the metrics collected into one summary.json.

If any process dies, everything is stopped and the launcher exits non-zero naming the
member that failed first and why, by the control plane's word (OUT/failure.json, written
by shard 0's coordinator), not by which process happened to exit first, with its last
log lines; it never hangs (the control plane's heartbeats fail the job, and --timeout
bounds the whole run). If the launcher itself dies (even by SIGKILL), every process of
its job gets SIGTERM (Linux's parent-death signal).

  scripts/ember_launch.py --dataset out/criteo --workers 4 --policy herald --out out/run-herald \\
      -- --model dlrm --iterations 200

Arguments after `--` go to every ember-worker. --ps-args adds arguments for every ember-ps.
The ember-worker flags the launcher also takes (--policy, --lookahead, --eviction,
--prefetch, --refine-allocation, --overlap-allreduce, --placement, --model-file: those
ember-worker declares as job settings, `ember-worker --options-json`) go to every worker unchecked:
ember-worker refuses bad values (exit 2), and the launcher then stops the job showing
the worker's own error.

Checkpoints and resuming a job (the shards' rows under DIR/ps, the workers' dense models
under DIR/dense):

  scripts/ember_launch.py ... --checkpoint-dir out/ckpt --checkpoint-every 10 -- --iterations 200
  scripts/ember_launch.py ... --checkpoint-dir out/ckpt --checkpoint-every 10 --resume -- --iterations 200

With --checkpoint-dir, Ctrl-C stops the job at a checkpoint a few iterations on (the
workers flush for it), from which --resume goes on; a second Ctrl-C stops it at once.

A job kept as a file (examples/*.toml): every setting by its flag's name without `--`,
flags for every shard / worker in the tables [ember-ps] / [ember-worker], paths relative
to the file; flags on the command line override it, arguments after `--` come last:

  scripts/ember_launch.py --config examples/herald.toml --out out/run-h -- --iterations 50

The summary (summary.json) is built by ember_job.py, which ember.sbatch runs too.
"""
import argparse
import ctypes
import difflib
import json
import re
import os
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from ember_job import (iterations_finished, resume_point, settings_of_worker_args, worker_settings, split_worker_args, summarize,
                       write_restart_record, write_token)


PR_SET_PDEATHSIG = 1


def die_with_parent(parent):
    """Runs in each child between fork and exec: SIGTERM when the launcher dies. The
    setting survives exec (also through `ip netns exec`)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the launcher died before the prctl
        os.kill(os.getpid(), signal.SIGTERM)


def member_process(member):
    """'worker 2' (the control plane's name) -> 'worker2' (the launcher's)."""
    role, _, rank = member.partition(" ")
    return {"ps": "ps", "worker": "worker"}.get(role, role) + rank


def tail(path, n=15):
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join("    " + l for l in lines[-n:])


class JobFailure(Exception):
    """A job that ended before its last iteration: the member that failed first, why, its
    log, and its exit status (None: not a process's exit, e.g. the --timeout)."""

    def __init__(self, name, why, log, rc):
        super().__init__(f"{name} {why}")
        self.name, self.why, self.log, self.rc = name, why, log, rc


# Exit statuses of Ember's programs (common/error.cc) that a restart cannot mend: 2, a
# setting refused (ConfigError); 3, bad data or a refused model (DataError).
UNMENDABLE_EXITS = {2: "a setting was refused", 3: "the data or the model was refused"}


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


class Job:
    def __init__(self, args, worker_args, settings):
        self.a = args
        self.worker_args = worker_args
        self.out = Path(args.out)
        self.bin = Path(args.bin)
        self.procs = []  # (name, Popen, log path)
        self.stopping = 0  # the signal that asked the job to stop at a checkpoint (0: none)
        self.training_at = None  # when worker 0 first reported an iteration (time.time())
        self.restarts = None  # --max-restarts: what the earlier attempts lost (summary.json)
        self.lost_at = None  # when the previous attempt failed (time.time())
        # The worker settings given (flags or --config keys), as ember-worker arguments
        # before the [ember-worker] table's and those after `--`; what the workers then
        # run with (the last of a flag wins), for the summary and the progress lines.
        self.setting_args = []
        for flag, kind, _ in settings:
            v = getattr(args, flag.replace("-", "_"))
            if kind is bool:
                self.setting_args += [f"--{flag}"] if v else []
            elif v is not None:
                self.setting_args += [f"--{flag}", str(v)]
        self.settings = settings_of_worker_args(settings, self.setting_args + worker_args)

    def start(self, name, cmd):
        log = self.out / f"{name}.log"
        with open(log, "w") as f:
            f.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        parent = os.getpid()
        p = subprocess.Popen(cmd, stdout=open(log, "a"), stderr=subprocess.STDOUT, start_new_session=True,
                             preexec_fn=lambda: die_with_parent(parent))
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

    def stop_at_checkpoint(self, signum):
        """With a checkpoint directory, an interrupted job stops at a checkpoint that holds the
        model: ps0, told by SIGTERM, asks the workers to flush and finish a few iterations
        on (ember-ps --checkpoint-on-exit). Returns False when that cannot be done."""
        if self.stopping or not self.a.checkpoint_dir or not any(n.startswith("worker") for n, _, _ in self.procs):
            return False
        self.stopping = signum
        os.kill(self.procs[0][1].pid, signal.SIGTERM)
        print("ember-launch: interrupted; the job stops at a checkpoint a few iterations on (interrupt again to stop now)",
              file=sys.stderr, flush=True)
        return True

    def fail(self, name, why, log, rc=None):
        print(f"ember-launch: {name} {why}; its last log lines:\n{tail(log)}", file=sys.stderr, flush=True)
        self.stop_all()
        raise JobFailure(name, why, log, rc)

    def control_plane_word(self, wait):
        """The coordinator's record of the first failure ({"member", "cause"}), waiting up
        to `wait` seconds for it while shard 0 (its host) runs."""
        deadline = time.time() + wait
        while True:
            try:
                return json.loads(self.failure_file.read_text())
            except (OSError, ValueError):
                pass
            if time.time() >= deadline or self.procs[0][1].poll() is not None:
                return None
            time.sleep(0.05)

    def process_failed(self, name, rc, log):
        """A process exited with status rc != 0. A signal's victim (rc < 0) and a process
        that refused its settings (rc 2, ConfigError) are the ones that failed; for an exit, the control plane says which member failed first (a survivor
        exits too, after its all-reduce or a PS request breaks), so wait for its word, up to
        the heartbeat timeout and the workers' grace."""
        if rc < 0:
            self.fail(name, f"was killed by signal {-rc}", log, rc)
        if rc == 2:  # a ConfigError: it refused its own settings (the launcher passes them on unchecked)
            self.fail(name, "refused its settings (exit 2)", log, rc)
        word = self.control_plane_word(self.a.heartbeat_timeout_ms / 1000 + 5)
        if word:
            failed = member_process(word.get("member", ""))
            procs = {n: (p, l) for n, p, l in self.procs}
            if failed in procs:
                p, flog = procs[failed]
                # It may still be on its way out (logging, closing sockets): its exit
                # status says whether a restart can mend this, so wait for it a little.
                try:
                    rc_failed = p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    rc_failed = word.get("exit")  # the status it said it exits with
                self.fail(failed, f"failed first, by the control plane: {word.get('cause', '?')}", flog, rc_failed)
        self.fail(name, f"exited with status {rc}", log, rc)

    def run(self):
        a = self.a
        self.out.mkdir(parents=True, exist_ok=True)
        for old in [*self.out.glob("*.jsonl"), *self.out.glob("ps*.json")]:
            old.unlink()
        token_file = write_token(self.out)
        coord_file = self.out / "coordinator"
        if coord_file.exists():
            coord_file.unlink()
        self.failure_file = self.out / "failure.json"
        if self.failure_file.exists():
            self.failure_file.unlink()
        ps_extra = list(a.ps_extra)
        worker_extra = []
        if a.checkpoint_dir:
            ckpt = Path(a.checkpoint_dir)
            # Also without --checkpoint-every: SIGUSR1 to a shard asks for one.
            # --checkpoint-on-exit: SIGTERM stops the job at a checkpoint the workers flush for.
            ps_extra = ["--checkpoint-dir", str(ckpt / "ps"), "--checkpoint-every", str(a.checkpoint_every), "--checkpoint-on-exit"] + ps_extra
            if a.resume:
                # A restart chose its checkpoint already (and said what it passed over).
                point = getattr(a, "resume_from", None) or resume_point(ckpt, who="ember-launch", ember_ps=self.bin / "ember-ps")
                ps_extra = ["--restore", str(point)] + ps_extra
            worker_extra = ["--checkpoint-dir", str(ckpt / "dense")] + (["--resume"] if a.resume else [])
        if self.restarts:  # the workers report the restarts on /metrics and in their summaries
            record = self.out / "restart-record.json"
            write_restart_record(record, self.restarts, self.lost_at)
            worker_extra += ["--restart-record", str(record)]
        common = ["--token-file", str(token_file), "--heartbeat-timeout-ms", str(a.heartbeat_timeout_ms)]
        # Optional network namespaces (bench_e2e.py's bandwidth-limited link): the PS
        # shards in one, the workers in another, joined by a veth pair.
        ps_ns = ["ip", "netns", "exec", a.ps_netns] if a.ps_netns else []
        wk_ns = ["ip", "netns", "exec", a.worker_netns] if a.worker_netns else []
        host = a.ps_address
        # Prometheus endpoints (--metrics-port BASE): shard s on BASE+s, worker r on BASE+S+r.
        def metrics_port(i):
            return ["--metrics-port", str(a.metrics_port + i)] if a.metrics_port else []
        self.metrics_endpoints = ([f"{host}:{a.metrics_port + s}" for s in range(a.ps)] +
                                  [f"127.0.0.1:{a.metrics_port + a.ps + w}" for w in range(a.workers)]) if a.metrics_port else []
        for s in range(a.ps):
            if s == 1:
                coord = self.wait_coordinator(coord_file)
            # "{shard}" in --ps-args becomes the shard's index (a directory per shard, as
            # on hosts that share no filesystem).
            shard_extra = [x.replace("{shard}", str(s)) for x in ps_extra]
            if a.hosts:
                shard_extra = ["--host", "vhost0"] + shard_extra
            cmd = ps_ns + [str(self.bin / "ember-ps"), "--dataset", a.dataset, "--shard", str(s), "--shards", str(a.ps),
                           "--workers", str(a.workers), "--stats-interval", "0", "--transport", a.transport, "--listen", f"{host}:0",
                           "--coordinator", f"tcp://{host}:0" if s == 0 else coord, "--coordinator-file", str(coord_file),
                           "--failure-file", str(self.failure_file), "--summary-file", str(self.out / f"ps{s}.json")] + common + metrics_port(s) + shard_extra
            self.start(f"ps{s}", cmd)
        coord = self.wait_coordinator(coord_file)
        for w in range(a.workers):
            cmd = wk_ns + [str(self.bin / "ember-worker"), "--dataset", a.dataset, "--coordinator", coord, "--workers", str(a.workers),
                           "--rank", str(w), "--transport", a.transport, *self.setting_args,
                           "--metrics", str(self.out / f"w{w}.jsonl")] + common + metrics_port(a.ps + w) + worker_extra + self.worker_args
            if a.hosts:  # ranks in order, as evenly as they go: host h holds ranks h*W/N .. (h+1)*W/N - 1
                cmd[len(wk_ns) + 1:len(wk_ns) + 1] = ["--host", f"vhost{1 + w * a.hosts // a.workers}"]
            if w == 0 and a.dump_dir:
                cmd += ["--dump-dir", a.dump_dir]
            self.start(f"worker{w}", cmd)
        self.watch()
        return self.summarize()

    def wait_coordinator(self, coord_file):
        deadline = time.time() + 60
        while time.time() < deadline:
            if coord_file.exists() and coord_file.read_text().strip():
                return coord_file.read_text().strip()
            name, p, log = self.procs[0]
            if p.poll() is not None:
                self.fail(name, f"exited with status {p.returncode} before the job formed", log)
            time.sleep(0.05)
        self.fail("ps0", "did not publish its coordinator endpoint within 60 s", self.procs[0][2])

    def watch(self):
        """Streams worker 0's progress lines; fails fast when any process dies."""
        start = time.time()
        w0_log = self.out / "worker0.log"
        pos = 0
        while True:
            if w0_log.exists():
                with open(w0_log, errors="replace") as f:
                    f.seek(pos)
                    chunk = f.read()
                    pos = f.tell()
                for line in chunk.splitlines():
                    if line.startswith("$ "):  # the command line the launcher wrote
                        continue
                    if not self.a.quiet and ("iteration" in line or "eval" in line or "error" in line):
                        print(f"[{self.settings['policy']}] {line.split('] ', 2)[-1]}", flush=True)
            if self.training_at is None and (self.out / "w0.jsonl").exists() and (self.out / "w0.jsonl").stat().st_size > 0:
                self.training_at = time.time()
                if self.restarts and self.lost_at is not None:  # from the loss to training again
                    self.restarts[-1]["recovery_s"] = round(self.training_at - self.lost_at, 3)
            workers_done = True
            for name, p, log in self.procs:
                rc = p.poll()
                if name.startswith("worker"):
                    if rc is None:
                        workers_done = False
                    elif rc != 0:
                        self.process_failed(name, rc, log)
                elif rc is not None and rc != 0:
                    self.process_failed(name, rc, log)
            if workers_done:
                break
            if time.time() - start > self.a.timeout:
                self.fail("the job", f"did not finish within --timeout {self.a.timeout} s", w0_log)
            time.sleep(0.2)
        # Workers left: the parameter servers stop by themselves.
        for name, p, log in self.procs:
            try:
                rc = p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.fail(name, "did not stop within 30 s after the workers finished", log)
            if rc != 0:
                self.process_failed(name, rc, log)

    def summarize(self):
        a = self.a
        job = {"transport": a.transport, "workers": a.workers, "ps": a.ps, "metrics_endpoints": self.metrics_endpoints,
               "checkpoint_dir": a.checkpoint_dir, "restarts": self.restarts, **self.settings}
        return summarize(self.out, job, who="ember-launch")


# Launcher settings that are paths: in a --config file, relative to the file's directory.
PATH_KEYS = ("dataset", "out", "bin", "checkpoint_dir", "dump_dir", "placement", "model_file")
# Tables of a --config file: flags for every ember-ps, every ember-worker.
ARG_TABLES = ("ember-ps", "ember-worker")


def config_error(path, text, key, msg):
    """Exits 2 with `FILE[:LINE]: msg`, LINE where `key =` first appears in the file."""
    line = ""
    if key is not None:
        for n, l in enumerate(text.splitlines(), 1):
            if re.match(r"\s*[\"']?" + re.escape(key) + r"[\"']?\s*=", l) or l.strip() == f"[{key}]":
                line = f":{n}"
                break
    print(f"ember-launch: {path}{line}: {msg}", file=sys.stderr)
    sys.exit(2)


def table_args(path, text, table, values):
    """[ember-worker] / [ember-ps]: `flag = value` -> ["--flag", "value"]; true -> ["--flag"]."""
    if not isinstance(values, dict):
        config_error(path, text, table, f"'{table}' must be a table of {table} flags ([{table}])")
    out = []
    for k, v in values.items():
        if isinstance(v, bool):
            out += [f"--{k}"] if v else []
        elif isinstance(v, (str, int, float)):
            out += [f"--{k}", str(v)]
        else:
            config_error(path, text, k, f"[{table}] {k}: a string, number or boolean, not {type(v).__name__}")
    return out


def load_config(p, path):
    """Reads a TOML job file: every launcher setting by its flag's name without the leading
    `--` (`ps-args`, `checkpoint-every`), plus the tables [ember-ps] and [ember-worker] of
    flags for every shard / worker. Returns (defaults for the parser, ps args, worker args).
    Unknown keys and wrong types end the launcher in one line naming the file and key."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        print(f"ember-launch: --config {path}: {e.strerror}", file=sys.stderr)
        sys.exit(2)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        print(f"ember-launch: {path}: not TOML: {e}", file=sys.stderr)
        sys.exit(2)
    # Each setting by its long flag (--prefetch, not --no-prefetch).
    actions = {next(o for o in a.option_strings if o.startswith("--"))[2:]: a for a in p._actions
               if any(o.startswith("--") for o in a.option_strings) and a.dest not in ("help", "config")}
    base = os.path.dirname(os.path.abspath(path))
    defaults, ps_table, worker_table = {}, [], []
    for key, v in data.items():
        if key in ARG_TABLES:
            (ps_table if key == "ember-ps" else worker_table).extend(table_args(path, text, key, v))
            continue
        act = actions.get(key)
        if act is None:
            near = difflib.get_close_matches(key.replace("_", "-"), [*actions, *ARG_TABLES], n=1)
            config_error(path, text, key, f"unknown key '{key}'" + (f" (did you mean '{near[0]}'?)" if near else
                                                                     " (keys are the launcher's flags without --, and [ember-ps], [ember-worker])"))
        if isinstance(act, (argparse._StoreTrueAction, argparse.BooleanOptionalAction)):
            ok, want = isinstance(v, bool), "true or false"
        elif act.type is int:
            ok, want = isinstance(v, int) and not isinstance(v, bool), "an integer"
        elif act.type is float:
            ok, want = isinstance(v, (int, float)) and not isinstance(v, bool), "a number"
        else:
            ok, want = isinstance(v, str), "a string"
        if not ok:
            config_error(path, text, key, f"'{key}' must be {want}, not {type(v).__name__} {v!r}")
        if act.dest in PATH_KEYS and v and not os.path.isabs(v):
            v = os.path.normpath(os.path.join(base, v))
        defaults[act.dest] = v
    return defaults, ps_table, worker_table


class Parser(argparse.ArgumentParser):
    """Bad input is one line: `ember-launch: what is wrong`, exit 2."""

    def error(self, message):
        self.exit(2, f"ember-launch: {message}\n")


def restart(a, job, f, n):
    """Prepares attempt n + 1 after failure `f`: the failed attempt's logs and metrics move
    to OUT/attempt-n/, --resume is set when a checkpoint verifies, and one line says what
    failed, where the job goes on from and how many iterations it recomputes."""
    out = Path(a.out)
    reached = iterations_finished(out)  # before the loss
    keep = out / f"attempt-{n}"
    keep.mkdir(exist_ok=True)
    for x in [*out.glob("*.log"), *out.glob("*.jsonl"), *out.glob("ps*.json"), *out.glob("failure.json")]:
        x.replace(keep / x.name)
    point, start = None, 0
    if a.checkpoint_dir and (Path(a.checkpoint_dir) / "ps").is_dir():
        try:
            point = resume_point(Path(a.checkpoint_dir), who="ember-launch", ember_ps=job.bin / "ember-ps")
            start = int(point.name.split("-")[-1])
        except SystemExit as e:  # no checkpoint verifies: from the start
            print(e.code if isinstance(e.code, str) else "ember-launch: no checkpoint to resume from", file=sys.stderr)
    a.resume = point is not None
    a.resume_from = point
    lost = max(0, reached - start)
    where = f"checkpoint {point} (iteration {start})" if point else "the start (no checkpoint verifies)"
    print(f"ember-launch: restart {n}/{a.max_restarts}: {f.name} {f.why}; from {where}; {lost} iteration(s) lost; "
          f"the failed attempt's logs in {keep}", file=sys.stderr, flush=True)
    return {"attempt": n, "member": f.name, "cause": f.why, "exit": f.rc, "checkpoint": str(point) if point else "",
            "resumed_at": start, "iterations_lost": lost, "recovery_s": None}


def launcher_settings(argv, default_bin):
    """The worker settings this launcher takes: those its ember-worker (by --bin) declares."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--bin", default=default_bin)
    pre.add_argument("-h", "--help", action="store_true")
    known, _ = pre.parse_known_args(argv)
    return worker_settings(known.bin, "ember-launch", snapshot_ok=known.help)


def build_parser(settings, default_bin):
    """The launcher's argument parser, with a flag for each of ember-worker's job settings."""
    p = Parser(description="Run an Ember job (ember-ps shards + ember-worker processes) on localhost.",
                                epilog="Settings may also come from a TOML file (--config); flags given here override it (docs/launching.md).")
    p.add_argument("--config", default="", help="a TOML job file: the settings by these flags' names, [ember-ps] and [ember-worker] tables of flags; "
                   "flags given here override it, relative paths in it are relative to the file")
    p.add_argument("--dataset", default="", help="ember-data dataset directory (required)")
    p.add_argument("--ps", type=int, default=1, help="PS shards")
    p.add_argument("--workers", type=int, default=4, help="workers")
    p.add_argument("--transport", default="tcp", help="tcp or rdma")
    # ember-worker's own flags, passed to every worker as given (left out: the worker's
    # default); the workers check them.
    for flag, kind, _ in settings:
        if kind is bool:
            p.add_argument(f"--{flag}", action=argparse.BooleanOptionalAction, default=False,
                           help=f"ember-worker --{flag} for every worker (ember-worker --help)")
        else:
            p.add_argument(f"--{flag}", type=kind, default=None,
                           help=f"ember-worker --{flag} for every worker (ember-worker --help; default: the worker's)")
    p.add_argument("--out", default="", help="directory for logs, metrics and summary.json (required)")
    p.add_argument("--bin", default=default_bin, help="where the binaries are")
    p.add_argument("--ps-args", default="", help="extra arguments for every ember-ps (e.g. '--dim 16 --optimizer adagrad'); {shard} becomes the shard's index")
    p.add_argument("--dump-dir", default="", help="worker 0 writes the final model here")
    p.add_argument("--metrics-port", type=int, default=0,
                   help="Prometheus metrics: shard s serves on BASE+s, worker r on BASE+PS+r (ember-ps/ember-worker --metrics-port; 0 = off)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds before the whole job is stopped")
    p.add_argument("--heartbeat-timeout-ms", type=int, default=10000)
    p.add_argument("--hosts", type=int, default=0,
                   help="group the processes as virtual hosts on this machine: the shards on vhost0, the workers in rank order "
                        "on vhost1..vhostN (ember-ps/ember-worker --host), so that the job reports traffic within and across hosts "
                        "and --allreduce hierarchical has hosts (0: every process states this machine's name)")
    p.add_argument("--ps-address", default="127.0.0.1", help="address the PS shards listen on (and the coordinator binds)")
    p.add_argument("--ps-netns", default="", help="run the PS shards in this network namespace (ip netns exec; root)")
    p.add_argument("--worker-netns", default="", help="run the workers in this network namespace (ip netns exec; root)")
    p.add_argument("--checkpoint-dir", default="",
                   help="checkpoints: the shards' rows in DIR/ps, the workers' dense models in DIR/dense (kill -USR1 a shard for one now)")
    p.add_argument("--checkpoint-every", type=int, default=0, help="checkpoint every N iterations (with --checkpoint-dir)")
    p.add_argument("--resume", action=argparse.BooleanOptionalAction, default=False,
                   help="continue from the newest whole checkpoint in --checkpoint-dir")
    p.add_argument("--max-restarts", type=int, default=0,
                   help="restart a failed job up to N times, from the newest checkpoint that verifies (with --checkpoint-dir; "
                        "else from the start); a failure a restart cannot mend (a refused setting, bad data, a full disk) "
                        "ends the job at once")
    p.add_argument("-q", "--quiet", action=argparse.BooleanOptionalAction, default=False, help="no progress lines")
    return p


def parse_args(p, argv, worker_args):
    """The launcher's settings: the --config file's, overridden by the command line's.
    Returns (the parsed arguments, with ps_extra: every shard's extra arguments, and the
    worker arguments, the [ember-worker] table's before those after `--`)."""
    pre = Parser(add_help=False)
    pre.add_argument("--config", default="")
    cfg_path = pre.parse_known_args(argv)[0].config
    ps_table = []
    if cfg_path:
        defaults, ps_table, worker_table = load_config(p, cfg_path)
        p.set_defaults(**defaults)
        worker_args = worker_table + worker_args  # the command line's come last: they win
    a = p.parse_args(argv)
    a.ps_extra = ps_table + shlex.split(a.ps_args)
    return a, worker_args


def check_args(p, a):
    """Ends the launcher (exit 2, by p.error) on settings that cannot make a job."""
    if not a.dataset or not a.out:
        p.error("--dataset and --out are required (as flags or in the --config file)")
    if not 0 <= a.metrics_port <= 65536 - a.ps - a.workers:
        p.error(f"--metrics-port {a.metrics_port}: ports BASE..BASE+{a.ps + a.workers - 1} must lie in 1..65535 (0: off)")
    if a.ps < 1 or a.workers < 1:
        p.error("--ps and --workers must be at least 1")
    if not 0 <= a.hosts <= a.workers:
        p.error(f"--hosts {a.hosts}: between 0 and --workers ({a.workers}) virtual worker hosts")
    if (a.checkpoint_every > 0 or a.resume) and not a.checkpoint_dir:
        p.error("--checkpoint-every and --resume need --checkpoint-dir")
    if a.resume and not (Path(a.checkpoint_dir) / "ps").is_dir():
        p.error(f"--resume: {Path(a.checkpoint_dir) / 'ps'} does not exist (no checkpoint was written there)")
    if not (Path(a.dataset) / "manifest.json").exists():
        p.error(f"--dataset {a.dataset}: no manifest.json (run ember-data prep first)")
    for b in ("ember-ps", "ember-worker"):
        if not os.access(Path(a.bin) / b, os.X_OK):
            p.error(f"{Path(a.bin) / b} is missing (bash scripts/build.sh)")
    if a.max_restarts < 0:
        p.error(f"--max-restarts {a.max_restarts}: must be 0 or more")


def run_with_restarts(a, worker_args, settings):
    """Runs the job, restarting it after a failure a restart may mend, up to --max-restarts
    times; returns the last attempt's Job. Exits on a failure it does not restart (the
    member's status for a refused setting or data, else 1) and on an interrupt that stops
    the job at once (128 + the signal)."""
    restarts = [] if a.max_restarts else None
    lost_at = None
    while True:
        job = Job(a, worker_args, settings)
        job.restarts, job.lost_at = restarts, lost_at

        def on_signal(signum, frame, job=job):
            if job.stop_at_checkpoint(signum):
                return
            print("ember-launch: interrupted; stopping the job", file=sys.stderr)
            job.stop_all()
            sys.exit(128 + signum)

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        try:
            job.run()
            break
        except JobFailure as f:
            why = unmendable(f)
            if why:
                if a.max_restarts:
                    print(f"ember-launch: not restarted: {why} ({f.name}, exit {f.rc})", file=sys.stderr)
                # The member's own status for a refused setting (2), data or model (3).
                sys.exit(f.rc if f.rc in UNMENDABLE_EXITS else 1)
            if restarts is None or len(restarts) >= a.max_restarts:
                if a.max_restarts:
                    print(f"ember-launch: giving up: the job failed {len(restarts) + 1} times, --max-restarts {a.max_restarts}",
                          file=sys.stderr)
                sys.exit(1)
            lost_at = time.time()
            restarts.append(restart(a, job, f, len(restarts) + 1))
    return job


def main():
    argv, worker_args = split_worker_args(sys.argv[1:])
    root = Path(__file__).resolve().parent.parent
    default_bin = os.environ.get("EMBER_BIN", str(root / "build" / "bin"))
    settings = launcher_settings(argv, default_bin)
    p = build_parser(settings, default_bin)
    a, worker_args = parse_args(p, argv, worker_args)
    check_args(p, a)
    job = run_with_restarts(a, worker_args, settings)
    if job.stopping:  # stopped at a checkpoint: the summary is written, the exit says why
        sys.exit(128 + job.stopping)


if __name__ == "__main__":
    main()
