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

Attempts, restarts and their records are the launcher core's (ember_attempts.py, as for
launch_hosts.py and ember.sbatch); summary.json is built by ember_job.py.
"""
import argparse
import difflib
import os
import re
import shlex
import signal
import sys
import tomllib
from pathlib import Path

from ember_attempts import Attempt, Restarts, run_job
from ember_job import settings_of_worker_args, split_worker_args, summarize, worker_settings, write_token


class LocalJob:
    """The job's attempts on this machine: the commands of its shards and workers (network
    namespaces, virtual hosts and metrics ports as the flags say), each attempt run by the
    launcher core (ember_attempts.Attempt)."""

    def __init__(self, args, worker_args, settings):
        a = self.a = args
        self.worker_args = worker_args
        self.out = Path(a.out)
        self.bin = Path(a.bin)
        self.attempt = None
        self.stopping = 0  # the signal that asked the job to stop at a checkpoint (0: none)
        self.restarts = Restarts(self.out, a.max_restarts, a.checkpoint_dir, self.bin / "ember-ps", "ember-launch")
        # The worker settings given (flags or --config keys), as ember-worker arguments
        # before the [ember-worker] table's and those after `--`; what the workers then
        # run with (the last of a flag wins), for the summary and the progress lines.
        self.setting_args = []
        for flag, kind, _ in settings:
            v = getattr(a, flag.replace("-", "_"))
            if kind is bool:
                self.setting_args += [f"--{flag}"] if v else []
            elif v is not None:
                self.setting_args += [f"--{flag}", str(v)]
        self.settings = settings_of_worker_args(settings, self.setting_args + worker_args)
        host = a.ps_address
        self.metrics_endpoints = ([f"{host}:{a.metrics_port + s}" for s in range(a.ps)] +
                                  [f"127.0.0.1:{a.metrics_port + a.ps + w}" for w in range(a.workers)]) if a.metrics_port else []

    def metrics_port(self, i):
        """Prometheus endpoints (--metrics-port BASE): shard s on BASE+s, worker r on BASE+S+r."""
        return ["--metrics-port", str(self.a.metrics_port + i)] if self.a.metrics_port else []

    def shard_command(self, s, coord, common, ps_extra):
        a = self.a
        # "{shard}" in --ps-args becomes the shard's index (a directory per shard, as on
        # hosts that share no filesystem).
        shard_extra = (["--host", "vhost0"] if a.hosts else []) + [x.replace("{shard}", str(s)) for x in ps_extra]
        # Optional network namespaces (bench_e2e.py's bandwidth-limited link): the PS
        # shards in one, the workers in another, joined by a veth pair.
        ns = ["ip", "netns", "exec", a.ps_netns] if a.ps_netns else []
        host = a.ps_address
        return ns + [str(self.bin / "ember-ps"), *self.shard_tables(), "--shard", str(s), "--shards", str(a.ps),
                     "--workers", str(a.workers), "--stats-interval", "0", "--transport", a.transport, "--listen", f"{host}:0",
                     "--coordinator", f"tcp://{host}:0" if s == 0 else coord, "--coordinator-file", str(self.out / "coordinator"),
                     "--failure-file", str(self.out / "failure.json"), "--summary-file", str(self.out / f"ps{s}.json")] + \
            common + self.metrics_port(s) + shard_extra

    def shard_tables(self):
        """The shards' tables: the dataset's (its dynamic tables' slots with --slots-per-shard),
        or for a stream dynamic tables of --slots-per-shard slots."""
        a = self.a
        slots = ["--slots-per-shard", str(a.slots_per_shard)] if a.slots_per_shard else []
        return (["--dataset", a.dataset] if a.dataset else []) + slots

    def worker_data(self):
        """The workers' data: the dataset, or the stream's directory and format."""
        a = self.a
        return ["--dataset", a.dataset] if a.dataset else ["--stream", a.stream, "--stream-format", a.stream_format]

    def worker_command(self, w, coord, common, worker_extra):
        a = self.a
        host = ["--host", f"vhost{1 + w * a.hosts // a.workers}"] if a.hosts else []  # ranks in order, as evenly as they go
        ns = ["ip", "netns", "exec", a.worker_netns] if a.worker_netns else []
        return ns + [str(self.bin / "ember-worker"), *host, *self.worker_data(), "--coordinator", coord, "--workers", str(a.workers),
                     "--rank", str(w), "--transport", a.transport, *self.setting_args, "--metrics", str(self.out / f"w{w}.jsonl")] + \
            common + self.metrics_port(a.ps + w) + worker_extra + self.worker_args + \
            (["--dump-dir", a.dump_dir] if w == 0 and a.dump_dir else [])

    def run_attempt(self):
        """One attempt: the shards (shard 0 first: it publishes the control plane), then the
        workers, watched to the end; raises JobFailure when a member fails."""
        a = self.a
        self.attempt = att = Attempt(self.out, "ember-launch", a.heartbeat_timeout_ms / 1000 + 5, timeout=a.timeout,
                                     progress=None if a.quiet else f"[{self.settings['policy']}] ")
        att.prepare_out()
        token_file = write_token(self.out)
        ps_ckpt, worker_ckpt = self.restarts.checkpoint_args(a.checkpoint_every, a.resume)
        ps_extra = ps_ckpt + list(a.ps_extra)
        worker_extra = worker_ckpt + self.restarts.worker_args()
        common = ["--token-file", str(token_file), "--heartbeat-timeout-ms", str(a.heartbeat_timeout_ms)]
        coord = ""
        for s in range(a.ps):
            if s == 1:
                coord = att.wait_coordinator(self.out / "coordinator")
            att.start(f"ps{s}", self.shard_command(s, coord, common, ps_extra))
        coord = att.wait_coordinator(self.out / "coordinator")
        for w in range(a.workers):
            att.start(f"worker{w}", self.worker_command(w, coord, common, worker_extra))
        try:
            att.watch()
        finally:
            self.restarts.saw_training(att)
        job = {"transport": a.transport, "workers": a.workers, "ps": a.ps, "metrics_endpoints": self.metrics_endpoints,
               "checkpoint_dir": a.checkpoint_dir, "restarts": self.restarts.records if a.max_restarts else None, "settings": self.settings}
        return summarize(self.out, job, who="ember-launch")

    def stop_at_checkpoint(self, signum):
        """With a checkpoint directory, an interrupted job stops at a checkpoint that holds the
        model: ps0, told by SIGTERM, asks the workers to flush and finish a few iterations
        on (ember-ps --checkpoint-on-exit). Returns False when that cannot be done."""
        att = self.attempt
        if self.stopping or not self.a.checkpoint_dir or att is None or not any(n.startswith("worker") for n, _, _ in att.procs):
            return False
        self.stopping = signum
        os.kill(att.procs[0][1].pid, signal.SIGTERM)
        print("ember-launch: interrupted; the job stops at a checkpoint a few iterations on (interrupt again to stop now)",
              file=sys.stderr, flush=True)
        return True

    def run(self):
        """The job's attempts, restarted as --max-restarts allows (ember_attempts.run_job)."""
        return run_job(self, "ember-launch")

# Launcher settings that are paths: in a --config file, relative to the file's directory.
PATH_KEYS = ("dataset", "stream", "out", "bin", "checkpoint_dir", "dump_dir", "placement", "model_file")
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
        if act.dest in PATH_KEYS and v and not os.path.isabs(v) and "://" not in v:  # kafka:// is no path
            v = os.path.normpath(os.path.join(base, v))
        defaults[act.dest] = v
    return defaults, ps_table, worker_table


class Parser(argparse.ArgumentParser):
    """Bad input is one line: `ember-launch: what is wrong`, exit 2."""

    def error(self, message):
        self.exit(2, f"ember-launch: {message}\n")


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
    p.add_argument("--dataset", default="", help="ember-data dataset directory (this or --stream is required)")
    p.add_argument("--stream", default="",
                   help="train on the raw files of this directory, read in name order as they come in, or on kafka://HOST:PORT/TOPIC "
                        "(docs/online.md), not a --dataset")
    p.add_argument("--stream-format", default="criteo", help="--stream: criteo, criteo-csv or avazu")
    p.add_argument("--slots-per-shard", type=int, default=0,
                   help="dynamic tables (a --stream, or a dataset of hashed ids): rows each shard holds at most (ember-ps --slots-per-shard)")
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
    if not (a.dataset or a.stream) or not a.out:
        p.error("--dataset (or --stream) and --out are required (as flags or in the --config file)")
    if a.dataset and a.stream:
        p.error("--dataset and --stream exclude each other: a job trains on one")
    if a.stream and not a.stream.startswith("kafka://") and not Path(a.stream).is_dir():
        p.error(f"--stream {a.stream}: not a directory")
    if a.stream and a.slots_per_shard <= 0:
        p.error("--stream needs --slots-per-shard N: the shards' dynamic tables hold at most N rows each")
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
    if a.dataset and not (Path(a.dataset) / "manifest.json").exists():
        p.error(f"--dataset {a.dataset}: no manifest.json (run ember-data prep first)")
    for b in ("ember-ps", "ember-worker"):
        if not os.access(Path(a.bin) / b, os.X_OK):
            p.error(f"{Path(a.bin) / b} is missing (bash scripts/build.sh)")
    if a.max_restarts < 0:
        p.error(f"--max-restarts {a.max_restarts}: must be 0 or more")


def main():
    argv, worker_args = split_worker_args(sys.argv[1:])
    root = Path(__file__).resolve().parent.parent
    default_bin = os.environ.get("EMBER_BIN", str(root / "build" / "bin"))
    settings = launcher_settings(argv, default_bin)
    p = build_parser(settings, default_bin)
    a, worker_args = parse_args(p, argv, worker_args)
    check_args(p, a)
    job = LocalJob(a, worker_args, settings)
    job.run()
    if job.stopping:  # stopped at a checkpoint: the summary is written, the exit says why
        sys.exit(128 + job.stopping)


if __name__ == "__main__":
    main()
