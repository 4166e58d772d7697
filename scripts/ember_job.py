#!/usr/bin/env python3
"""What Ember's launchers share (ember_launch.py, launch_hosts.py and the launcher core,
ember_attempts.py, import it; ember.sbatch runs it): the job's summary.json merged from
its output directory, the checkpoint a resumed job starts from, the job token, and the
worker settings the launchers take and record.

  python3 scripts/ember_job.py summarize OUT --ps S --workers W --policy P [--transport T]
      [--checkpoint-dir DIR] [--metrics-endpoints HOST:PORT,...] [-q] [-- WORKER_ARGS]
  python3 scripts/ember_job.py resume-point CKPT [--bin BIN]
  python3 scripts/ember_job.py token OUT

`summarize` reads the workers' metrics (OUT/wN.jsonl, ember-worker --metrics) and the
shards' totals (OUT/psN.json, ember-ps --summary-file), writes OUT/summary.json (fields:
docs/training.md#metrics) and prints the job's totals and the workers' time per phase.
The worker arguments after `--` give the settings the summary records (every job
setting `ember-worker --options-json` declares; --policy is summarize's own). `token` writes a new job token to OUT/token (mode 600), as every
launcher does. `resume-point` prints
the newest whole checkpoint under CKPT/ps that verifies (its shard files' checksums, by
BIN/ember-ps --verify-checkpoint) and has an intact copy of the workers' dense state.
"""
import argparse
import json
import os
import secrets
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path


def dense_corrupt(f):
    """Why the dense checkpoint file f (a zip archive, as LibTorch writes it) is corrupt:
    a record whose bytes fail its CRC-32, or an archive that cannot be read; None when it
    is intact (what ember-worker --resume checks before loading it)."""
    try:
        with zipfile.ZipFile(f) as z:
            bad = z.testzip()
    except (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error) as e:
        return f"{f}: not a readable dense checkpoint ({e})"
    return f"{f}: checksum mismatch (corrupt dense checkpoint: record {bad})" if bad else None


def shards_corrupt(d, ember_ps):
    """Why checkpoint directory d's shard files do not verify (`ember-ps --verify-checkpoint`
    reads each in full and checks its checksum); None when they do."""
    try:
        r = subprocess.run([str(ember_ps), "--verify-checkpoint", str(d), "--log-level", "error"],
                           capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{ember_ps} --verify-checkpoint {d}: {e}"
    if r.returncode == 0:
        return None
    why = r.stderr.strip().splitlines()
    return why[-1].removeprefix("ember-ps: error: ") if why else f"ember-ps --verify-checkpoint exited {r.returncode}"


def resume_point(ckpt, who="ember-job", ember_ps=None):
    """The newest checkpoint under CKPT/ps that is whole (its manifest), whose shard files
    verify (their checksums, with `ember_ps`: the ember-ps binary; None: not checked) and
    that has the workers' dense state (CKPT/dense/worker-*-iter-N.pt), one file of it at
    least intact: a worker whose own file is corrupt or missing loads another's, the
    replicas being identical. An exit checkpoint of a job stopped mid-run has none. Newer
    checkpoints passed over are named with why, on one line; none left: exit 1 naming
    each."""
    ckpt = Path(ckpt)
    passed = []
    for d in sorted((ckpt / "ps").glob("iter-*"), reverse=True):
        if not (d / "manifest.json").exists():
            passed.append(f"{d.name} (not whole)")
            continue
        dense = sorted((ckpt / "dense").glob(f"worker-*-{d.name}.pt"))
        if not dense:
            passed.append(f"{d.name} (no dense state in {ckpt / 'dense'})")
            continue
        why = shards_corrupt(d, ember_ps) if ember_ps else None
        if why:
            passed.append(f"{d.name} ({why})")
            continue
        corrupt = [w for w in map(dense_corrupt, dense) if w]
        if len(corrupt) == len(dense):
            passed.append(f"{d.name} ({'; '.join(corrupt)})")
            continue
        for w in corrupt:
            print(f"{who}: --resume from {d}: {w}; that worker loads another's intact file", file=sys.stderr)
        if passed:
            print(f"{who}: --resume from {d}, passing over " + ", ".join(passed), file=sys.stderr)
        return d
    sys.exit(f"{who}: --resume: no checkpoint in {ckpt / 'ps'} to resume from" + (": " + ", ".join(passed) if passed else ""))


# The ember-worker flags the launchers take as settings of their own (ember_launch.py's
# flags and --config keys, ember.sbatch's POLICY) and summary.json records: those
# ember-worker declares as job settings (`ember-worker --options-json`, from its option
# registry), as (flag, type, the worker's default). They are passed to every worker as
# they are; ember-worker checks them (`ember-worker --help` says what each does).
_TYPES = {"flag": bool, "integer": int, "number": float, "text": str}


# The settings of the ember-worker at the head of the repository, for `--help` before a
# build (tests/launcher/config_test.py checks it against the built one; to refresh it:
# build/bin/ember-worker --options-json | scripts/ember_job.py settings-snapshot).
SETTINGS_SNAPSHOT = Path(__file__).resolve().parent / "worker_settings.json"


def worker_options(bin_dir, who="ember-job"):
    """BIN_DIR/ember-worker --options-json, parsed: every option the worker declares."""
    worker = Path(bin_dir) / "ember-worker"
    try:
        r = subprocess.run([str(worker), "--options-json"], capture_output=True, text=True, timeout=60)
    except OSError as e:
        sys.exit(f"{who}: {worker} --options-json: {e.strerror} (build first: scripts/build.sh, or give --bin)")
    if r.returncode != 0:
        sys.exit(f"{who}: {worker} --options-json failed ({r.returncode}): {r.stderr.strip()[-400:]}")
    return json.loads(r.stdout)


def settings_snapshot(options):
    """The job settings among `options` (worker_options'), as SETTINGS_SNAPSHOT holds them."""
    return [{k: o[k] for k in ("flag", "kind", "default")} for o in options if o["setting"]]


def worker_settings(bin_dir, who="ember-job", snapshot_ok=False):
    """The job settings of BIN_DIR/ember-worker: [(flag without dashes, type, default)].
    `snapshot_ok`: without that binary, the repository's SETTINGS_SNAPSHOT (for --help)."""
    if snapshot_ok and not os.access(Path(bin_dir) / "ember-worker", os.X_OK):
        entries = json.loads(SETTINGS_SNAPSHOT.read_text())
    else:
        entries = settings_snapshot(worker_options(bin_dir, who))
    out = []
    for o in entries:
        kind = _TYPES[o["kind"]]
        default = o["default"] == "on" if kind is bool else kind(o["default"])
        out.append((o["flag"][2:], kind, default))
    return out


def settings_of_worker_args(settings, worker_args):
    """The summary's worker settings (`settings`: worker_settings') from ember-worker
    arguments (the last of a flag wins, as in ember-worker; defaults as the worker's), by
    summary key (refine_allocation)."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag, kind, default in settings:
        if kind is bool:
            p.add_argument(f"--{flag}", action="store_true")
        else:
            p.add_argument(f"--{flag}", type=kind, default=default)
    a, _ = p.parse_known_args(worker_args)
    return {flag.replace("-", "_"): getattr(a, flag.replace("-", "_")) for flag, _, _ in settings}


def iterations_finished(out):
    """How many iterations worker 0 finished, by OUT/w0.jsonl (0: none): what a restart
    loses is this less the iteration it resumes at."""
    last = -1
    try:
        with open(Path(out) / "w0.jsonl") as f:
            for line in f:
                try:
                    j = json.loads(line)
                except ValueError:
                    continue
                if "iteration" in j and not j.get("eval") and not j.get("summary"):
                    last = max(last, int(j["iteration"]))
    except OSError:
        pass
    return last + 1


def write_token(out):
    """A new job token in OUT/token: created 0600 (never readable by others, not even
    briefly), then renamed in place. Every launcher writes it so (ember.sbatch and
    through `ember_job.py token OUT`)."""
    out = Path(out)
    token_file = out / "token"
    tmp = out / f".token.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an older tmp of this name keeps its mode through O_CREAT
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(16) + "\n")
    os.replace(tmp, token_file)
    return token_file


def write_restart_record(path, restarts, lost_at):
    """What a restarted attempt's workers report (ember-worker --restart-record): the
    restarts so far, the iterations they lost (recomputed), and when the last loss was
    noticed (Unix seconds). Written to a temp file, then renamed."""
    path = Path(path)
    record = {"restarts": len(restarts), "iterations_recomputed": sum(int(r.get("iterations_lost", 0)) for r in restarts),
              "lost_at": float(lost_at or 0)}
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(record) + "\n")
    os.replace(tmp, path)
    return path


def sum_links(per_worker):
    """The workers' summary "links" summed field by field (nested dicts of counts)."""
    def add(a, b):
        return {k: add(a[k], v) if isinstance(v, dict) else a.get(k, 0) + v for k, v in b.items()} if a else b
    total = {}
    for links in per_worker:
        total = add(total, links)
    return total


def read_metrics(out, workers, who="ember-job"):
    """The workers' metrics in OUT/wN.jsonl: (per-iteration totals, the summaries, worker 0's
    evaluations). Exits 1 when a worker wrote no metrics, a line is not JSON, or a worker
    wrote no summary."""
    per_iter = {}
    summaries = []
    evals = []
    for w in range(workers):
        try:
            lines = open(out / f"w{w}.jsonl")
        except OSError as e:
            sys.exit(f"{who}: worker {w} wrote no metrics: {e.strerror}: {out / f'w{w}.jsonl'}")
        for n, line in enumerate(lines, 1):
            try:
                j = json.loads(line)
            except ValueError as e:
                sys.exit(f"{who}: {out / f'w{w}.jsonl'}:{n}: not JSON ({e})")
            if j.get("summary"):
                summaries.append(j)
            elif j.get("eval"):
                if w == 0:
                    evals.append(j)
            elif j.get("progressive") is True:
                pass  # worker 0's window as of a progress line: its summary holds the last
            else:
                it = per_iter.setdefault(j["iteration"], {"iteration": j["iteration"], "pulls": 0, "pushes": 0, "hits": 0})
                it["pulls"] += j["pulls"]
                it["pushes"] += j["push_grad"] + j["push_value"] + j["push_evict"]
                it["hits"] += j["hits"]
                if w == 0:
                    it["loss"] = j["loss"]
                    it["iter_ms"] = j["iter_ms"]
    if len(summaries) != workers:
        sys.exit(f"{who}: {len(summaries)} of {workers} workers wrote a summary")
    return per_iter, summaries, evals


def merge_summaries(job, summaries, w0, evals, per_iter):
    """The job's totals from the workers' summaries (w0: worker 0's), with the settings `job`
    records (the fields of summary.json before the shards' and the restarts')."""
    tot = {k: sum(s[k] for s in summaries) for k in ("pulls", "push_grad", "push_value", "push_evict", "hits", "bytes_out", "bytes_in")}
    # Payload bytes per kind (the model ember-sim predicts), and what the transport framed.
    # Every kind any worker wrote (a summary from before a kind existed lacks it: 0).
    kinds = sorted({k for s in summaries for k in s["bytes"]})
    bytes_kind = {k: sum(s["bytes"].get(k, 0) for s in summaries) for k in kinds}
    framed = {k: sum(s["framed_bytes"].get(k, 0) for s in summaries) for k in w0["framed_bytes"]}
    return {
        "policy": job["settings"]["policy"], "transport": job["transport"], "workers": job["workers"], "ps": job["ps"],
        "samples_s": min(s["samples_s"] for s in summaries),
        "seconds": max(s["seconds"] for s in summaries),
        "iterations": w0["iterations"],
        "stopped_at": w0.get("stopped_at", 0),
        **tot,
        "pushes": tot["push_grad"] + tot["push_value"] + tot["push_evict"],
        "transmissions": tot["pulls"] + tot["push_grad"] + tot["push_value"] + tot["push_evict"],
        "hit_rate": tot["hits"] / max(1, tot["hits"] + tot["pulls"]),
        "pull_state": sum(s["pull_state"] for s in summaries),
        # Replicated rows (a placement's tables, fae's hot rows): all-reduced, written back.
        "hot_sync": sum(s.get("hot_sync", 0) for s in summaries),
        "hot_flush": sum(s.get("hot_flush", 0) for s in summaries),
        # Flushes' rows: pushed to the PS, or handed to worker 0 for an evaluation.
        "flush_grad": sum(s.get("flush_grad", 0) for s in summaries),
        "flush_value": sum(s.get("flush_value", 0) for s in summaries),
        "eval_handed": sum(s.get("eval_handed", 0) for s in summaries),
        "allreduce_bytes": sum(s.get("allreduce_bytes", 0) for s in summaries),
        "prefetched": sum(s.get("prefetched", 0) for s in summaries),
        "bytes": bytes_kind, "framed_bytes": framed,
        # Bytes and rows by link class, summed over the workers (docs/cluster.md).
        "hosts": w0.get("hosts", 1),
        "links": sum_links([s["links"] for s in summaries if "links" in s]),
        # Every job setting the workers declare (ember-worker --options-json), as they ran.
        **job["settings"],
        "loss": w0["loss"], "auc": w0["auc"], "logloss": w0["logloss"],
        # Progressive validation over the last window (--progressive-window; None: off).
        "progressive": w0.get("progressive"),
        # Where the workers' iterations went (seconds, mean over workers; see trainer.h).
        "phase_s": {k: sum(s["phase_s"][k] for s in summaries) / len(summaries) for k in w0["phase_s"]},
        # Prometheus endpoints of the shards, then the workers (--metrics-port; empty: off).
        "metrics_endpoints": list(job.get("metrics_endpoints") or []),
        "evals": evals,
        # Worker 0's evaluations: the flushes before them and the evaluations themselves.
        "eval_s": sum(e.get("seconds", 0.0) for e in evals),
        "per_iteration": [per_iter[k] for k in sorted(per_iter)],
    }


def add_shards(result, out, shard_count, who="ember-job"):
    """Adds the shards' totals (OUT/psN.json, ember-ps --summary-file) to `result`: a
    checkpoint that failed to write is a warning that leaves the job running, reported here."""
    shards = []
    for s in range(shard_count):
        try:
            shards.append(json.loads((out / f"ps{s}.json").read_text()))
        except (OSError, ValueError):
            pass
    if shards:
        result["checkpoints"] = {"written": sum(x["checkpoints_written"] for x in shards),
                                 "failed": sum(x["checkpoint_failures"] for x in shards)}
        result["shards"] = shards
        if result["checkpoints"]["failed"]:
            print(f"{who}: warning: {result['checkpoints']['failed']} shard checkpoint(s) failed to write "
                  f"(see ps*.log); the newest whole checkpoint is the one --resume uses", file=sys.stderr, flush=True)


def add_restarts(result, job, w0):
    """Adds the job's restarts to `result` (a launcher that restarts failed jobs,
    --max-restarts), the last one's recovery time from worker 0 when it was not known."""
    if job.get("restarts") is not None:
        result["restarts"] = job["restarts"]
        if job["restarts"] and job["restarts"][-1].get("recovery_s") is None and w0.get("recovery_s") is not None:
            job["restarts"][-1]["recovery_s"] = w0["recovery_s"]  # from the loss to training again, by worker 0
        result["restart_count"] = len(job["restarts"])
        result["iterations_recomputed"] = sum(r["iterations_lost"] for r in job["restarts"])


def print_summary(out, result, policy, job, w0):
    """Prints the job's totals, its traffic across hosts (when it had any) and the workers'
    time per phase."""
    if w0.get("stopped_at"):
        print(f"[{policy}] stopped at iteration {w0['stopped_at']}, checkpointed in {job.get('checkpoint_dir', '')}: "
              f"--resume goes on from it", flush=True)
    print(f"[{policy}] done: {result['samples_s']:.0f} samples/s, rows pulled {result['pulls']}, pushed {result['pushes']}, "
          f"hit rate {100 * result['hit_rate']:.1f}%, "
          + (f"AUC {result['auc']:.4f}, logloss {result['logloss']:.4f}" if result["auc"] >= 0 else "not evaluated")
          + f" -> {out}/summary.json",
          flush=True)
    cross = result["links"].get("cross_host")
    if cross and cross["bytes_out"] + cross["bytes_in"] > 0:
        # Each byte once: the PS traffic both ways, the all-reduce's as its senders count it.
        once = lambda l: (l["ps_bytes_out"] + l["ps_bytes_in"], l["peer_bytes_out"])  # noqa: E731
        (cps, cpeer), (ips, ipeer) = once(cross), once(result["links"]["intra_host"])
        mb = lambda n: f"{n / 1e6:.1f} MB"  # noqa: E731
        print(f"[{policy}] across hosts: {mb(cps + cpeer)} (PS {mb(cps)}, all-reduce {mb(cpeer)}); "
              f"within hosts: {mb(ips + ipeer)}; {result['hosts']} worker host(s)", flush=True)
    ph = result["phase_s"]
    total = max(1e-9, sum(ph.values()))
    ps = ph["sync"] + ph["commit"] + ph["pull"] + ph["push"]
    share = lambda k: f"{100 * ph.get(k, 0.0) / total:.0f}%"  # noqa: E731
    print(f"[{policy}] worker time: PS exchanges {100 * ps / total:.0f}% (barrier + commit {share('commit')}, pulls {share('pull')}), "
          f"waiting for the loader {share('wait')}, embedding {share('embedding')}, model {share('compute')}, "
          f"all-reduce {share('allreduce')}, dense step {share('dense_step')}, updates {share('update')}, flushes {share('flush')}",
          flush=True)


def summarize(out, job, who="ember-job", quiet=False):
    """Merges OUT's metrics into OUT/summary.json and returns it. `job` holds what it
    records: transport, workers, ps, metrics_endpoints, restarts, `settings` (every job
    setting by summary key: settings_of_worker_args'), and checkpoint_dir (for the message
    of a job stopped at a checkpoint). Exits 1 when a worker wrote no summary."""
    out = Path(out)
    workers, policy = job["workers"], job["settings"]["policy"]
    per_iter, summaries, evals = read_metrics(out, workers, who)
    w0 = next(s for s in summaries if s["rank"] == 0)
    result = merge_summaries(job, summaries, w0, evals, per_iter)
    add_shards(result, out, job["ps"], who)
    add_restarts(result, job, w0)
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(out / "summary.json")
    if quiet:
        return result
    print_summary(out, result, policy, job, w0)
    return result


def split_worker_args(argv):
    """(own arguments, worker arguments): those after the first bare `--` go to every worker."""
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1:]


def main():
    argv, worker_args = split_worker_args(sys.argv[1:])
    p = argparse.ArgumentParser(description="summary.json of an Ember job; the checkpoint to resume from")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summarize", help="merge OUT's metrics into OUT/summary.json (worker arguments after --)")
    s.add_argument("out", help="the job's output directory (wN.jsonl, psN.json)")
    s.add_argument("--ps", type=int, required=True, help="PS shards")
    s.add_argument("--workers", type=int, required=True, help="workers")
    s.add_argument("--policy", required=True, help="the workers' --policy")
    s.add_argument("--transport", default="tcp", help="tcp or rdma")
    s.add_argument("--checkpoint-dir", default="", help="where the job's checkpoints went (named when it stopped at one)")
    s.add_argument("--metrics-endpoints", default="", help="comma-separated HOST:PORT of the Prometheus endpoints")
    s.add_argument("--restarts", default="", help="the job's restarts, one JSON object a line (ember.sbatch's OUT/restarts.jsonl)")
    s.add_argument("-q", "--quiet", action="store_true", help="write summary.json, print nothing")
    s.add_argument("--bin", default=os.environ.get("EMBER_BIN", str(Path(__file__).resolve().parent.parent / "build" / "bin")),
                   help="where ember-worker is (it names the job settings summary.json records)")
    t = sub.add_parser("token", help="write a new job token to OUT/token (mode 600)")
    t.add_argument("out", help="the job's output directory")
    r = sub.add_parser("resume-point", help="print the newest whole checkpoint under CKPT/ps with the workers' dense state")
    r.add_argument("ckpt", help="a launcher's checkpoint directory (CKPT/ps, CKPT/dense)")
    r.add_argument("--bin", default=os.environ.get("EMBER_BIN", str(Path(__file__).resolve().parent.parent / "build" / "bin")),
                   help="where ember-ps is (it verifies the shard files' checksums; without it they are not checked)")
    sub.add_parser("settings-snapshot", help=f"write {SETTINGS_SNAPSHOT.name} from `ember-worker --options-json` on stdin")
    a = p.parse_args(argv)
    if a.cmd == "settings-snapshot":
        text = json.dumps(settings_snapshot(json.load(sys.stdin)), indent=1) + "\n"
        tmp = SETTINGS_SNAPSHOT.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(SETTINGS_SNAPSHOT)
        return
    if a.cmd == "token":
        write_token(a.out)
        return
    if a.cmd == "resume-point":
        ember_ps = Path(a.bin) / "ember-ps"
        print(resume_point(a.ckpt, ember_ps=ember_ps if os.access(ember_ps, os.X_OK) else None))
        return
    if a.ps < 1 or a.workers < 1:
        p.error("--ps and --workers must be at least 1")
    if not Path(a.out).is_dir():
        p.error(f"{a.out}: no such directory")
    # The workers got --policy P before the worker arguments (which may override it).
    job = {"transport": a.transport, "workers": a.workers, "ps": a.ps, "checkpoint_dir": a.checkpoint_dir,
           "metrics_endpoints": [e for e in a.metrics_endpoints.split(",") if e],
           "settings": settings_of_worker_args(worker_settings(a.bin), ["--policy", a.policy, *worker_args])}
    if a.restarts:
        try:
            path = Path(a.restarts)
            job["restarts"] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
        except ValueError as e:
            p.error(f"--restarts {a.restarts}: {e}")
    summarize(a.out, job, quiet=a.quiet)


if __name__ == "__main__":
    main()
