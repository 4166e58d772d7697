#!/usr/bin/env python3
"""Tables beyond RAM (docs/benchmarks.md "Disk tier"): one job three ways on the same
data, one PS shard whose table is many times its RAM budget:

  1. all RAM (the baseline);
  2. the rows on a disk tier (--store-dir, --ram-budget-mb), no hints (--no-hints: an
     LRU that reads a row when a worker first asks for it);
  3. the tier with the workers' hints (--lookahead iterations ahead).

  scripts/bench_tier.py [--rows 1000000] [--dim 64] [--budget-mb 64] [--iterations 100] [--repeats 3]

The page cache is kept out of the picture twice over: the tier reads and writes its file
with direct I/O (O_DIRECT), and each tiered shard runs in a memory cgroup (v1) limited to
the budget plus --overhead-mb, which charges its page cache too; the caches are dropped
before each run. The three configurations alternate within each repeat; per
configuration the table shows the median run by samples/s: samples/s and the median of
the per-repeat ratios to all RAM, the workers' pull and push rows/s (rows over the
seconds spent in those phases), the shard's peak RSS, the cgroup's peak charge (page
cache included), the rows file's peak page-cache residency (fincore), and the tier's
counters: rows a request waited for the disk for (misses on the critical path) per row
pulled, rows read by hints, bytes read and written. Without root (no cgroup, no cache
drop) it says so and runs anyway. Everything lands in --work; the table prints as
markdown.

Then one more run of the tier with hints checkpoints every --checkpoint-every iterations
(one whole checkpoint in 8, incremental ones between: docs/checkpoints.md), and a
second table gives what a whole and an incremental checkpoint cost (MB, seconds).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench_util import sh

ROOT = Path(__file__).resolve().parent.parent
CGROUP = Path("/sys/fs/cgroup/memory")


def wrapped_bin(real, work, cgroup):
    """A --bin directory whose ember-ps joins `cgroup` and then execs the real one."""
    d = work / "bin-cgroup"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    for f in Path(real).iterdir():
        if f.name != "ember-ps":
            (d / f.name).symlink_to(f.resolve())
    ps = d / "ember-ps"
    ps.write_text(f'#!/bin/sh\necho $$ > {cgroup}/cgroup.procs || exit 1\nexec {Path(real).resolve()}/ember-ps "$@"\n')
    ps.chmod(0o755)
    return d


def make_cgroup(name, limit_bytes):
    cg = CGROUP / name
    if cg.exists():
        cg.rmdir()
    cg.mkdir()
    (cg / "memory.limit_in_bytes").write_text(str(limit_bytes))
    return cg


def page_cache_watch(files, stop, peak):
    """Samples the page cache held by `files` (fincore) until `stop`; the peak in peak[0]."""
    while not stop.is_set():
        have = [str(f) for f in files if f.exists()]
        if have:
            r = subprocess.run(["fincore", "-b", "-n", "-o", "RES", *have], capture_output=True, text=True)
            if r.returncode == 0:
                peak[0] = max(peak[0], sum(int(x) for x in r.stdout.split() if x.isdigit()))
        stop.wait(0.5)


def run_case(a, name, ps_extra, data, work, bin_dir, cgroup, launch_extra=()):
    out = work / name.replace(" ", "-").replace(",", "")
    shutil.rmtree(out, ignore_errors=True)
    if os.geteuid() == 0:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    stop, peak = threading.Event(), [0]
    rows_files = [work / "store" / "shard-0-of-1.rows"]
    watch = threading.Thread(target=page_cache_watch, args=(rows_files, stop, peak), daemon=True)
    watch.start()
    cmd = [sys.executable, ROOT / "scripts" / "ember_launch.py", "--dataset", data, "--ps", 1, "--workers", a.workers, "--policy", "herald",
           "--lookahead", a.lookahead, "--prefetch", "--out", out, "--bin", bin_dir, *launch_extra,
           "--ps-args", " ".join([f"--dim {a.dim} --optimizer adagrad"] + ps_extra), "--",
           "--iterations", a.iterations, "--batch-per-worker", a.batch_per_worker, "--eval-every", 0, "--progress-every", 0,
           "--model", "wide-deep", "--cache-ratio", a.cache_ratio]
    sh(cmd, "bench_tier")
    stop.set()
    watch.join()
    s = json.loads((out / "summary.json").read_text())
    ps = json.loads((out / "ps0.json").read_text())
    phases = {"pull": 0.0, "push": 0.0}
    for w in range(a.workers):
        for line in (out / f"w{w}.jsonl").read_text().splitlines():
            j = json.loads(line)
            if j.get("summary"):
                phases["pull"] += j["phase_s"]["pull"]
                phases["push"] += j["phase_s"]["sync"] + j["phase_s"]["push"]
    served = ps["served"]
    pulled = served["pull"]["rows"] + served["pull_state"]["rows"] + served["prefetch"]["rows"]
    pushed = served["push_grad"]["rows"] + served["push_value"]["rows"]
    r = {"case": name, "samples_s": s["samples_s"], "rows_pulled": pulled, "pull_rows_s": pulled / max(phases["pull"], 1e-9),
         "push_rows_s": pushed / max(phases["push"], 1e-9), "peak_rss_mb": ps.get("peak_rss_bytes", 0) / 2**20,
         "page_cache_peak_mb": peak[0] / 2**20, "tier": ps.get("tier"), "checkpoint_cost": ps.get("checkpoint_cost")}
    if cgroup is not None:
        r["cgroup_peak_mb"] = int((cgroup / "memory.max_usage_in_bytes").read_text()) / 2**20
        r["cgroup_limit_mb"] = int((cgroup / "memory.limit_in_bytes").read_text()) / 2**20
        r["oom_kills"] = int(next((l.split()[1] for l in (cgroup / "memory.oom_control").read_text().splitlines() if l.startswith("oom_kill ")), 0))
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default=str(ROOT / "build" / "bin"))
    p.add_argument("--work", default=str(ROOT / "out" / "bench-tier"))
    p.add_argument("--rows", type=int, default=1000000, help="samples of synthetic Criteo-like data (ember-data gen)")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--budget-mb", type=float, default=64)
    p.add_argument("--overhead-mb", type=int, default=192, help="the tiered shard's cgroup limit: the budget plus this")
    p.add_argument("--iterations", type=int, default=100)
    p.add_argument("--batch-per-worker", type=int, default=512)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--lookahead", type=int, default=2)
    p.add_argument("--cache-ratio", type=float, default=0.02)
    p.add_argument("--repeats", type=int, default=3, help="rounds of the three configurations (medians are reported)")
    p.add_argument("--checkpoint-every", type=int, default=10, help="the checkpointing run's interval (0: no such run)")
    a = p.parse_args()
    work = Path(a.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    data = work / "data"
    if not (data / "manifest.json").exists():
        sh([f"{a.bin}/ember-data", "gen", "--like", "criteo", "--rows", a.rows, "--seed", 1, "--force", "-q", "-o", work / "gen.tsv"], "bench_tier")
        sh([f"{a.bin}/ember-data", "prep", "--format", "criteo", "-o", data, "--force", "-q", work / "gen.tsv"], "bench_tier")
    manifest = json.loads((data / "manifest.json").read_text())
    keys = sum(t["rows"] for t in manifest["tables"])
    table_mb = keys * a.dim * 2 * 4 / 2**20  # Adagrad: value and state
    print(f"bench_tier: {keys} rows of dim {a.dim} with Adagrad state: {table_mb:.0f} MB; budget {a.budget_mb:g} MB "
          f"({table_mb / a.budget_mb:.1f}x)", file=sys.stderr)
    use_cgroup = os.geteuid() == 0 and CGROUP.is_dir()
    if not use_cgroup:
        print("bench_tier: no memory cgroup (needs root and cgroup v1's memory controller): the page cache is kept out by the tier alone",
              file=sys.stderr)
    store = work / "store"
    tier = ["--store-dir", str(store), "--ram-budget-mb", f"{a.budget_mb:g}"]
    cases = [("all RAM", []), ("tier, no hints", tier + ["--no-hints"]), ("tier + hints", tier)]
    runs = {name: [] for name, _ in cases}
    for rep in range(a.repeats):
        for name, extra in cases:
            print(f"bench_tier: repeat {rep + 1}/{a.repeats}: {name} ...", file=sys.stderr)
            runs[name].append(run_fresh(a, name, extra, data, work, bool(extra) and use_cgroup))
    if a.repeats > 0:
        (work / "results.json").write_text(json.dumps(runs, indent=1) + "\n")
        table(a, keys, table_mb, cases, runs)
    if a.checkpoint_every > 0:
        checkpoint_cost(a, data, work, tier, use_cgroup, runs["all RAM"])


def run_fresh(a, name, ps_extra, data, work, in_cgroup, launch_extra=()):
    """run_case on an empty store directory, in a memory cgroup of the budget and the
    overhead (the tiered runs, as root) made for the run and removed after it."""
    cgroup, bin_dir = None, a.bin
    if in_cgroup:
        cgroup = make_cgroup("ember-bench-tier", int((a.budget_mb + a.overhead_mb) * 2**20))
        bin_dir = wrapped_bin(a.bin, work, cgroup)
    shutil.rmtree(work / "store", ignore_errors=True)
    r = run_case(a, name, ps_extra, data, work, bin_dir, cgroup, launch_extra)
    if cgroup is not None:
        time.sleep(0.5)
        cgroup.rmdir()
    return r


def table(a, keys, table_mb, cases, runs):
    base_runs = runs["all RAM"]
    results = []
    for name, _ in cases:
        ratios = [r["samples_s"] / b["samples_s"] for r, b in zip(runs[name], base_runs)]
        median = sorted(runs[name], key=lambda r: r["samples_s"])[len(runs[name]) // 2]
        results.append(dict(median, ratio=sorted(ratios)[len(ratios) // 2], ratios=[f"{x:.2f}" for x in ratios]))
    print(f"{keys} rows x dim {a.dim} + Adagrad = {table_mb:.0f} MB on one shard, RAM budget {a.budget_mb:g} MB "
          f"({table_mb / a.budget_mb:.1f}x); {a.workers} workers, herald, --lookahead {a.lookahead}, {a.iterations} iterations of "
          f"{a.batch_per_worker} a worker; {a.repeats} repeat(s), the median run of each\n")
    print("| run | samples/s | vs all RAM (per repeat) | pull rows/s | push rows/s | shard peak RSS MB | cgroup peak MB (limit) | "
          "rows file in page cache, peak MB | critical-path misses / row pulled | rows read by hints | read MB | written MB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        t = r["tier"] or {}
        cg = f"{r['cgroup_peak_mb']:.0f} ({r['cgroup_limit_mb']:.0f})" if "cgroup_peak_mb" in r else "-"
        miss = f"{t['misses'] / max(r['rows_pulled'], 1):.3%}" if t else "-"
        print(f"| {r['case']} | {r['samples_s']:.0f} | {r['ratio']:.2f}x ({', '.join(r['ratios'])}) | {r['pull_rows_s']:.0f} | {r['push_rows_s']:.0f} | "
              f"{r['peak_rss_mb']:.0f} | {cg} | {r['page_cache_peak_mb']:.1f} | {miss} | {t.get('hint_loads', '-')} | "
              f"{t['bytes_read'] / 2**20 if t else 0:.0f} | {t['bytes_written'] / 2**20 if t else 0:.0f} |")


def checkpoint_cost(a, data, work, tier, use_cgroup, base_runs):
    """The tier with hints, checkpointing: what a whole and an incremental checkpoint cost."""
    ckpt = work / "ckpt"
    shutil.rmtree(ckpt, ignore_errors=True)
    print("bench_tier: tier + hints, checkpointing ...", file=sys.stderr)
    r = run_fresh(a, "tier + hints, checkpointing", tier, data, work, use_cgroup,
                  ["--checkpoint-dir", str(ckpt), "--checkpoint-every", str(a.checkpoint_every)])
    c = r["checkpoint_cost"] or {}
    base = sorted(b["samples_s"] for b in base_runs)[len(base_runs) // 2] if base_runs else None
    vs = f" ({r['samples_s'] / base:.2f}x the median all-RAM run above)" if base else ""
    print(f"\nThe tier with hints, a checkpoint every {a.checkpoint_every} iterations: {r['samples_s']:.0f} samples/s{vs}\n")
    print("| checkpoint | count | MB each (mean) | seconds each (mean) |")
    print("|---|---|---|---|")
    for kind in ("whole", "incremental"):
        k = c.get(kind) or {"count": 0}
        n = max(k["count"], 1)
        print(f"| {kind} | {k['count']} | {k.get('bytes', 0) / n / 2**20:.1f} | {k.get('seconds', 0) / n:.2f} |")


if __name__ == "__main__":
    main()
