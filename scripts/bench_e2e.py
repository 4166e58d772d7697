#!/usr/bin/env python3
"""End-to-end benchmark (the e2e part of ember-bench, as a script because it launches
processes). All figures come from one run on one machine, reported as ratios:

  1. samples/s of 1 PS + 1 worker against a plain single-process LibTorch loop with the
     table in memory (ember-worker --reference): same model, batch and data. Target >= 0.8.
  2. herald vs vanilla samples/s (and rows moved) with 4 workers over TCP loopback.
  3. the same over a bandwidth-limited link: the PS in one network namespace, the workers
     in another, joined by a veth pair shaped by tc tbf on both ends (this kernel has no
     netem). Needs root and iproute2; reported as skipped with the reason otherwise. The
     default rate (--link-mbit 100) is scaled down from the 1-10 Gbit/s of a GPU cluster
     by about how much slower this 2-core CPU computes an iteration than a GPU does, so
     that communication weighs in an iteration about as much as it does there. The dense all-reduce
     stays inside the workers' namespace.

  scripts/bench_e2e.py [--dataset DIR] [--iterations N] [--json]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def sh(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"bench_e2e: {' '.join(map(str, cmd))} failed:\n{r.stderr[-2000:]}")
    return r.stdout


def launch(a, policy, workers, name, extra, launcher=()):
    out = Path(a.work) / name
    sh([sys.executable, str(ROOT / "scripts" / "ember_launch.py"), "--dataset", a.dataset, "--ps", "1", "--workers", str(workers),
        "--policy", policy, "--bin", a.bin, "--out", str(out), "-q", "--timeout", "1800",
        "--ps-args", f"--dim {a.dim} --optimizer sgd --lr 0.05"] + list(launcher) + ["--"] + extra)
    return json.loads((out / "summary.json").read_text())


class TbfLink:
    """Two network namespaces joined by a veth pair, each end shaped to `mbit` by tc tbf.
    Removed on exit (deleting a namespace deletes its end of the pair)."""

    def __init__(self, mbit):
        tag = os.getpid() % 100000
        self.mbit = mbit
        self.ps_ns, self.wk_ns = f"ember-ps-{tag}", f"ember-wk-{tag}"
        self.ps_if, self.wk_if = f"ebp{tag}", f"ebw{tag}"
        self.ps_ip, self.wk_ip = "10.213.7.1", "10.213.7.2"

    def __enter__(self):
        burst = max(32 * 1024, int(self.mbit * 1e6 / 8 / 100))  # at least rate / HZ
        steps = [["ip", "netns", "add", self.ps_ns], ["ip", "netns", "add", self.wk_ns],
                 ["ip", "link", "add", self.ps_if, "type", "veth", "peer", "name", self.wk_if],
                 ["ip", "link", "set", self.ps_if, "netns", self.ps_ns], ["ip", "link", "set", self.wk_if, "netns", self.wk_ns]]
        for ns, dev, ip in ((self.ps_ns, self.ps_if, self.ps_ip), (self.wk_ns, self.wk_if, self.wk_ip)):
            steps += [["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev], ["ip", "-n", ns, "link", "set", dev, "up"],
                      ["ip", "-n", ns, "link", "set", "lo", "up"],
                      ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{self.mbit}mbit",
                       "burst", str(burst), "latency", "50ms"]]
        try:
            for cmd in steps:
                sh(cmd)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        for ns in (self.ps_ns, self.wk_ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def launcher_args(self):
        return ["--ps-netns", self.ps_ns, "--worker-netns", self.wk_ns, "--ps-address", self.ps_ip]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", help="ember-data dataset (default: generate a Criteo-like one)")
    p.add_argument("--work", default=str(ROOT / "out" / "bench-e2e"))
    p.add_argument("--bin", default=str(ROOT / "build" / "bin"))
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--batch", type=int, default=512, help="global batch")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3, help="runs per case (the median is reported)")
    p.add_argument("--json", action="store_true", help="also one JSON object per case")
    p.add_argument("--link-mbit", type=int, default=100, help="rate of the bandwidth-limited link (tc tbf), Mbit/s")
    p.add_argument("--skip-loopback", action="store_true", help="only the bandwidth-limited case")
    a = p.parse_args()
    Path(a.work).mkdir(parents=True, exist_ok=True)
    if not a.dataset:
        a.dataset = str(Path(a.work) / "criteo")
        tsv = Path(a.work) / "criteo.tsv"
        sh([f"{a.bin}/ember-data", "gen", "--like", "criteo", "--rows", "300000", "--scale", "0.01", "--seed", "1", "--force", "-o", str(tsv)])
        sh([f"{a.bin}/ember-data", "prep", "--format", "criteo", "--val-fraction", "0.02", "--force", "-o", a.dataset, str(tsv)])
    model = ["--model", "dlrm", "--bottom-mlp", "64-32", "--top-mlp", "64-32", "--dense-lr", "0.05", "--seed", "1"]
    med = lambda xs: sorted(xs)[len(xs) // 2]
    cases = []

    w4 = model + ["--batch-per-worker", str(a.batch // 4), "--iterations", str(a.iterations), "--cache-ratio", "0.1", "--progress-every", "0"]

    def herald_vs_vanilla(case, tag, launcher=()):
        runs = {"vanilla": [], "herald": []}
        for _ in range(a.repeats):
            for policy in runs:
                runs[policy].append(launch(a, policy, 4, f"{tag}-{policy}", w4, launcher))
        v = med([r["samples_s"] for r in runs["vanilla"]])
        h = med([r["samples_s"] for r in runs["herald"]])
        return {"case": case, "samples_s": h, "baseline_samples_s": v, "ratio": h / v,
                "rows_moved": runs["herald"][0]["transmissions"], "baseline_rows_moved": runs["vanilla"][0]["transmissions"],
                "rows_ratio": runs["herald"][0]["transmissions"] / runs["vanilla"][0]["transmissions"],
                "runs_samples_s": {p: [r["samples_s"] for r in rs] for p, rs in runs.items()}}

    if not a.skip_loopback:
        # 1. One PS + one worker vs one process with the table in memory.
        ref, one = [], []
        for _ in range(a.repeats):
            out = sh([f"{a.bin}/ember-worker", "--reference", "--dataset", a.dataset, "--workers", "1", "--batch-per-worker", str(a.batch),
                      "--iterations", str(a.iterations), "--dim", str(a.dim), "--optimizer", "sgd", "--lr", "0.05", "--log-level", "warn"] + model)
            ref.append(json.loads(out.strip().splitlines()[-1])["samples_s"])
            s = launch(a, "herald", 1, "one-worker", model + ["--batch-per-worker", str(a.batch), "--iterations", str(a.iterations),
                                                             "--cache-ratio", "0.1", "--progress-every", "0"])
            one.append(s["samples_s"])
        cases.append({"case": "1ps_1worker_vs_single_process", "samples_s": med(one), "baseline_samples_s": med(ref),
                      "ratio": med(one) / med(ref), "target": 0.8})
        # 2. herald vs vanilla, 4 workers over loopback.
        cases.append(herald_vs_vanilla("herald_vs_vanilla_4w_loopback", "w4"))

    # 3. Bandwidth-limited link.
    why = ""
    if os.geteuid() != 0:
        why = "needs root (network namespaces + tc)"
    elif not shutil.which("tc") or not shutil.which("ip"):
        why = "iproute2 (ip, tc) is not installed"
    if why:
        cases.append({"case": "herald_vs_vanilla_4w_tbf_link", "skipped": why})
    else:
        with TbfLink(a.link_mbit) as link:
            c = herald_vs_vanilla(f"herald_vs_vanilla_4w_tbf_{a.link_mbit}mbit", "tbf", link.launcher_args())
            c["link_mbit"] = a.link_mbit
            cases.append(c)

    print(f"{'case':34} {'samples/s':>10} {'baseline':>10} {'ratio':>7}  notes")
    for c in cases:
        if "skipped" in c:
            print(f"{c['case']:34} {'-':>10} {'-':>10} {'-':>7}  skipped: {c['skipped']}")
            continue
        note = f"target >= {c['target']}" if "target" in c else f"rows moved {c['rows_ratio']:.2f}x of vanilla"
        print(f"{c['case']:34} {c['samples_s']:10.0f} {c['baseline_samples_s']:10.0f} {c['ratio']:7.2f}  {note}")
    if a.json:
        for c in cases:
            print(json.dumps(c))


if __name__ == "__main__":
    main()
