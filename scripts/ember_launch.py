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

Checkpoints and resuming a job (the shards' rows under DIR/ps, the workers' dense models
under DIR/dense):

  scripts/ember_launch.py ... --checkpoint-dir out/ckpt --checkpoint-every 10 -- --iterations 200
  scripts/ember_launch.py ... --checkpoint-dir out/ckpt --checkpoint-every 10 --resume -- --iterations 200

With --checkpoint-dir, Ctrl-C stops the job at a checkpoint a few iterations on (the
workers flush for it), from which --resume goes on; a second Ctrl-C stops it at once.
"""
import argparse
import ctypes
import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path


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


def resume_point(ckpt):
    """The newest checkpoint under CKPT/ps that is whole (its manifest) and has the workers'
    dense state (CKPT/dense/worker-*-iter-N.pt); an exit checkpoint of a job stopped
    mid-run has none."""
    passed = []
    for d in sorted((ckpt / "ps").glob("iter-*"), reverse=True):
        if not (d / "manifest.json").exists():
            passed.append(f"{d.name} (not whole)")
            continue
        if not list((ckpt / "dense").glob(f"worker-*-{d.name}.pt")):
            passed.append(f"{d.name} (no dense state in {ckpt / 'dense'})")
            continue
        if passed:
            print(f"ember-launch: --resume from {d}, passing over " + ", ".join(passed), file=sys.stderr)
        return d
    sys.exit(f"ember-launch: --resume: no checkpoint in {ckpt / 'ps'} to resume from" + (": " + ", ".join(passed) if passed else ""))


class Job:
    def __init__(self, args, worker_args):
        self.a = args
        self.worker_args = worker_args
        self.out = Path(args.out)
        self.bin = Path(args.bin)
        self.procs = []  # (name, Popen, log path)
        self.stopping = 0  # the signal that asked the job to stop at a checkpoint (0: none)

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

    def fail(self, name, why, log):
        print(f"ember-launch: {name} {why}; its last log lines:\n{tail(log)}", file=sys.stderr)
        self.stop_all()
        sys.exit(1)

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
        """A process exited with status rc != 0. A signal's victim (rc < 0) is the one that
        failed; for an exit, the control plane says which member failed first (a survivor
        exits too, after its all-reduce or a PS request breaks), so wait for its word, up to
        the heartbeat timeout and the workers' grace."""
        if rc < 0:
            self.fail(name, f"was killed by signal {-rc}", log)
        word = self.control_plane_word(self.a.heartbeat_timeout_ms / 1000 + 5)
        if word:
            failed = member_process(word.get("member", ""))
            logs = {n: l for n, _, l in self.procs}
            if failed in logs:
                self.fail(failed, f"failed first, by the control plane: {word.get('cause', '?')}", logs[failed])
        self.fail(name, f"exited with status {rc}", log)

    def run(self):
        a = self.a
        self.out.mkdir(parents=True, exist_ok=True)
        for old in [*self.out.glob("*.jsonl"), *self.out.glob("ps*.json")]:
            old.unlink()
        token_file = self.out / "token"
        # Created 0600 (never readable by others, not even briefly), then renamed in place.
        tmp = self.out / f".token.tmp-{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # an older tmp of this name keeps its mode through O_CREAT
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(16) + "\n")
        os.replace(tmp, token_file)
        coord_file = self.out / "coordinator"
        if coord_file.exists():
            coord_file.unlink()
        self.failure_file = self.out / "failure.json"
        if self.failure_file.exists():
            self.failure_file.unlink()
        ps_extra = shlex.split(a.ps_args)
        worker_extra = []
        if a.checkpoint_dir:
            ckpt = Path(a.checkpoint_dir)
            # Also without --checkpoint-every: SIGUSR1 to a shard asks for one.
            # --checkpoint-on-exit: SIGTERM stops the job at a checkpoint the workers flush for.
            ps_extra = ["--checkpoint-dir", str(ckpt / "ps"), "--checkpoint-every", str(a.checkpoint_every), "--checkpoint-on-exit"] + ps_extra
            if a.resume:
                ps_extra = ["--restore", str(resume_point(ckpt))] + ps_extra
            worker_extra = ["--checkpoint-dir", str(ckpt / "dense")] + (["--resume"] if a.resume else [])
        common = ["--token-file", str(token_file), "--heartbeat-timeout-ms", str(a.heartbeat_timeout_ms)]
        # Optional network namespaces (bench_e2e.py's bandwidth-limited link): the PS
        # shards in one, the workers in another, joined by a veth pair.
        ps_ns = ["ip", "netns", "exec", a.ps_netns] if a.ps_netns else []
        wk_ns = ["ip", "netns", "exec", a.worker_netns] if a.worker_netns else []
        host = a.ps_address
        for s in range(a.ps):
            if s == 1:
                coord = self.wait_coordinator(coord_file)
            # "{shard}" in --ps-args becomes the shard's index (a directory per shard, as
            # on hosts that share no filesystem).
            shard_extra = [x.replace("{shard}", str(s)) for x in ps_extra]
            cmd = ps_ns + [str(self.bin / "ember-ps"), "--dataset", a.dataset, "--shard", str(s), "--shards", str(a.ps),
                           "--workers", str(a.workers), "--stats-interval", "0", "--transport", a.transport, "--listen", f"{host}:0",
                           "--coordinator", f"tcp://{host}:0" if s == 0 else coord, "--coordinator-file", str(coord_file),
                           "--failure-file", str(self.failure_file), "--summary-file", str(self.out / f"ps{s}.json")] + common + shard_extra
            self.start(f"ps{s}", cmd)
        coord = self.wait_coordinator(coord_file)
        for w in range(a.workers):
            cmd = wk_ns + [str(self.bin / "ember-worker"), "--dataset", a.dataset, "--coordinator", coord, "--workers", str(a.workers),
                           "--rank", str(w), "--policy", a.policy, "--transport", a.transport,
                           "--lookahead", str(a.lookahead), "--eviction", a.eviction,
                           *(["--prefetch"] if a.prefetch else []), *(["--refine-allocation"] if a.refine_allocation else []), *(["--overlap-allreduce"] if a.overlap_allreduce else []),
                           "--metrics", str(self.out / f"w{w}.jsonl")] + common + worker_extra + self.worker_args
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
                        print(f"[{self.a.policy}] {line.split('] ', 2)[-1]}", flush=True)
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
        per_iter = {}
        summaries = []
        evals = []
        for w in range(a.workers):
            for line in open(self.out / f"w{w}.jsonl"):
                j = json.loads(line)
                if j.get("summary"):
                    summaries.append(j)
                elif j.get("eval"):
                    if w == 0:
                        evals.append(j)
                else:
                    it = per_iter.setdefault(j["iteration"], {"iteration": j["iteration"], "pulls": 0, "pushes": 0, "hits": 0})
                    it["pulls"] += j["pulls"]
                    it["pushes"] += j["push_grad"] + j["push_value"] + j["push_evict"]
                    it["hits"] += j["hits"]
                    if w == 0:
                        it["loss"] = j["loss"]
                        it["iter_ms"] = j["iter_ms"]
        if len(summaries) != a.workers:
            print(f"ember-launch: {len(summaries)} of {a.workers} workers wrote a summary", file=sys.stderr)
            sys.exit(1)
        tot = {k: sum(s[k] for s in summaries) for k in ("pulls", "push_grad", "push_value", "push_evict", "hits", "bytes_out", "bytes_in")}
        w0 = next(s for s in summaries if s["rank"] == 0)
        # Payload bytes per kind (the model ember-sim predicts), and what the transport framed.
        bytes_kind = {k: sum(s["bytes"][k] for s in summaries) for k in w0["bytes"]}
        framed = {k: sum(s["framed_bytes"][k] for s in summaries) for k in w0["framed_bytes"]}
        result = {
            "policy": a.policy, "transport": a.transport, "workers": a.workers, "ps": a.ps,
            "samples_s": min(s["samples_s"] for s in summaries),
            "seconds": max(s["seconds"] for s in summaries),
            "iterations": w0["iterations"],
            "stopped_at": w0.get("stopped_at", 0),
            **tot,
            "pushes": tot["push_grad"] + tot["push_value"] + tot["push_evict"],
            "transmissions": tot["pulls"] + tot["push_grad"] + tot["push_value"] + tot["push_evict"],
            "hit_rate": tot["hits"] / max(1, tot["hits"] + tot["pulls"]),
            "pull_state": sum(s["pull_state"] for s in summaries),
            "prefetched": sum(s.get("prefetched", 0) for s in summaries),
            "bytes": bytes_kind, "framed_bytes": framed,
            "lookahead": a.lookahead, "eviction": a.eviction,
            "prefetch": a.prefetch, "overlap_allreduce": a.overlap_allreduce,
            "refine_allocation": a.refine_allocation,
            "loss": w0["loss"], "auc": w0["auc"], "logloss": w0["logloss"],
            # Where the workers' iterations went (seconds, mean over workers; see trainer.h).
            "phase_s": {k: sum(s["phase_s"][k] for s in summaries) / len(summaries) for k in w0["phase_s"]},
            "evals": evals,
            "per_iteration": [per_iter[k] for k in sorted(per_iter)],
        }
        # The shards' totals (ember-ps --summary-file): a checkpoint that failed to write is
        # a warning that leaves the job running, reported here.
        shards = []
        for s in range(a.ps):
            try:
                shards.append(json.loads((self.out / f"ps{s}.json").read_text()))
            except (OSError, ValueError):
                pass
        if shards:
            result["checkpoints"] = {"written": sum(x["checkpoints_written"] for x in shards),
                                     "failed": sum(x["checkpoint_failures"] for x in shards)}
            result["shards"] = shards
            if result["checkpoints"]["failed"]:
                print(f"ember-launch: warning: {result['checkpoints']['failed']} shard checkpoint(s) failed to write "
                      f"(see ps*.log); the newest whole checkpoint is the one --resume uses", file=sys.stderr, flush=True)
        tmp = self.out / "summary.json.tmp"
        tmp.write_text(json.dumps(result, indent=1) + "\n")
        tmp.replace(self.out / "summary.json")
        if w0.get("stopped_at"):
            print(f"[{a.policy}] stopped at iteration {w0['stopped_at']}, checkpointed in {a.checkpoint_dir}: --resume goes on from it",
                  flush=True)
        print(f"[{a.policy}] done: {result['samples_s']:.0f} samples/s, rows pulled {result['pulls']}, pushed {result['pushes']}, "
              f"hit rate {100 * result['hit_rate']:.1f}%, "
              + (f"AUC {result['auc']:.4f}, logloss {result['logloss']:.4f}" if result["auc"] >= 0 else "not evaluated")
              + f" -> {self.out}/summary.json",
              flush=True)
        ph = result["phase_s"]
        total = max(1e-9, sum(ph.values()))
        ps = ph["sync"] + ph["commit"] + ph["pull"] + ph["push"]
        print(f"[{a.policy}] worker time: PS exchanges {100 * ps / total:.0f}% (barrier + commit {100 * ph['commit'] / total:.0f}%, "
              f"pulls {100 * ph['pull'] / total:.0f}%), model {100 * ph['compute'] / total:.0f}%, all-reduce {100 * ph['allreduce'] / total:.0f}%, "
              f"updates {100 * ph['update'] / total:.0f}%", flush=True)
        return result


def main():
    argv = sys.argv[1:]
    worker_args = []
    if "--" in argv:
        i = argv.index("--")
        argv, worker_args = argv[:i], argv[i + 1:]
    root = Path(__file__).resolve().parent.parent
    p = argparse.ArgumentParser(description="Run an Ember job (ember-ps shards + ember-worker processes) on localhost.")
    p.add_argument("--dataset", required=True, help="ember-data dataset directory")
    p.add_argument("--ps", type=int, default=1, help="PS shards")
    p.add_argument("--workers", type=int, default=4, help="workers")
    p.add_argument("--policy", default="herald", help="vanilla, laia, plan, herald, het:S")
    p.add_argument("--transport", default="tcp", help="tcp or rdma")
    p.add_argument("--lookahead", type=int, default=0, help="batches the scheduler sees beyond the one it plans (0 = none)")
    p.add_argument("--eviction", default="auto", help="auto, lru or lookahead (auto: lookahead when --lookahead > 0)")
    p.add_argument("--prefetch", action="store_true", help="pull the next iteration's rows whose PS copy is final while this one computes")
    p.add_argument("--refine-allocation", action="store_true", help="laia, herald: refine LAIA's allocation by swaps that move fewer rows")
    p.add_argument("--overlap-allreduce", action="store_true", help="sum the dense gradients while the PS exchange runs")
    p.add_argument("--out", required=True, help="directory for logs, metrics and summary.json")
    p.add_argument("--bin", default=os.environ.get("EMBER_BIN", str(root / "build" / "bin")), help="where the binaries are")
    p.add_argument("--ps-args", default="", help="extra arguments for every ember-ps (e.g. '--dim 16 --optimizer adagrad'); {shard} becomes the shard's index")
    p.add_argument("--dump-dir", default="", help="worker 0 writes the final model here")
    p.add_argument("--timeout", type=float, default=3600, help="seconds before the whole job is stopped")
    p.add_argument("--heartbeat-timeout-ms", type=int, default=10000)
    p.add_argument("--ps-address", default="127.0.0.1", help="address the PS shards listen on (and the coordinator binds)")
    p.add_argument("--ps-netns", default="", help="run the PS shards in this network namespace (ip netns exec; root)")
    p.add_argument("--worker-netns", default="", help="run the workers in this network namespace (ip netns exec; root)")
    p.add_argument("--checkpoint-dir", default="",
                   help="checkpoints: the shards' rows in DIR/ps, the workers' dense models in DIR/dense (kill -USR1 a shard for one now)")
    p.add_argument("--checkpoint-every", type=int, default=0, help="checkpoint every N iterations (with --checkpoint-dir)")
    p.add_argument("--resume", action="store_true", help="continue from the newest whole checkpoint in --checkpoint-dir")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    a = p.parse_args(argv)
    if a.ps < 1 or a.workers < 1:
        p.error("--ps and --workers must be at least 1")
    if a.lookahead < 0:
        p.error("--lookahead must be at least 0")
    if a.eviction not in ("auto", "lru", "lookahead"):
        p.error(f"--eviction {a.eviction}: training runs auto, lru or lookahead" +
                (" (belady needs the whole future: ember-sim only)" if a.eviction == "belady" else ""))
    if a.eviction == "lookahead" and a.lookahead == 0:
        p.error("--eviction lookahead needs --lookahead L >= 1")
    if (a.lookahead > 0 or a.eviction == "lookahead") and a.policy.startswith("het"):
        p.error(f"--lookahead does not apply to {a.policy}: its stale copies are kept by version, not by next use")
    if a.refine_allocation and a.policy not in ("laia", "herald"):
        p.error(f"--refine-allocation refines LAIA's allocation (laia, herald), not {a.policy}'s")
    if a.prefetch and a.policy.startswith("het"):
        p.error(f"--prefetch does not apply to {a.policy}: its pulls refresh stale copies by version")
    if (a.checkpoint_every > 0 or a.resume) and not a.checkpoint_dir:
        p.error("--checkpoint-every and --resume need --checkpoint-dir")
    if a.resume and not (Path(a.checkpoint_dir) / "ps").is_dir():
        p.error(f"--resume: {Path(a.checkpoint_dir) / 'ps'} does not exist (no checkpoint was written there)")
    if not (Path(a.dataset) / "manifest.json").exists():
        p.error(f"--dataset {a.dataset}: no manifest.json (run ember-data prep first)")
    for b in ("ember-ps", "ember-worker"):
        if not os.access(Path(a.bin) / b, os.X_OK):
            p.error(f"{Path(a.bin) / b} is missing (bash scripts/build.sh)")
    job = Job(a, worker_args)

    def on_signal(signum, frame):
        if job.stop_at_checkpoint(signum):
            return
        print("ember-launch: interrupted; stopping the job", file=sys.stderr)
        job.stop_all()
        sys.exit(128 + signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    job.run()
    if job.stopping:  # stopped at a checkpoint: the summary is written, the exit says why
        sys.exit(128 + job.stopping)


if __name__ == "__main__":
    main()
