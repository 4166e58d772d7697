#!/usr/bin/env python3
"""The quickstart's two jobs (examples/vanilla.toml, examples/herald.toml), run over a
shaped link where this machine allows it. scripts/quickstart.sh calls it.

As root with iproute2 (ip, tc): the PS shard in one network namespace and the 4 workers
in another, joined by a veth pair shaped by tc tbf (bench_e2e.py's TbfLink, --link-mbit,
default 50), so that the rows each policy moves cost what they cost across a network.
The dense all-reduce stays inside the workers' namespace. Around each job the PS end's
byte counters (/sys/class/net/IF/statistics in its namespace) are read, and the
difference goes to RUN/link.json, which compare_runs.py shows next to samples/s.

Otherwise (not root, no iproute2, or the namespaces cannot be made) it says why in one
line and runs both jobs over TCP loopback on localhost, as before.

herald runs with the mechanisms that pay on the shaped link (--herald-flags, default
"--lookahead 4 --prefetch --overlap-allreduce --refine-allocation"; measured in
docs/benchmarks.md#quickstart), over loopback as well, so that both settings run one job.

  scripts/quickstart_jobs.py --dataset out/quickstart/criteo --work out/quickstart
  scripts/quickstart_jobs.py ... --loopback            # the unshaped jobs
  scripts/quickstart_jobs.py ... --repeats 3 -q        # alternated, medians and ratios
"""
import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from bench_e2e import TbfLink  # noqa: E402  (the namespaces and the shaped veth pair)
from bench_util import nic_bytes  # noqa: E402

DEFAULT_HERALD_FLAGS = "--lookahead 4 --prefetch --overlap-allreduce --refine-allocation"


def why_no_link():
    if os.geteuid() != 0:
        return "not root (network namespaces and tc need it)"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "iproute2 (ip, tc) is not installed"
    return ""


def link_counters(link):
    """(tx_bytes, rx_bytes) of the PS end of the veth pair, read inside its namespace."""
    return nic_bytes(link.ps_ns, link.ps_if)


def run_job(a, name, policy, flags, out, link):
    cmd = [sys.executable, str(ROOT / "scripts" / "ember_launch.py"), "--config", str(ROOT / "examples" / f"{policy}.toml"),
           "--dataset", a.dataset, "--bin", a.bin, "--out", str(out)] + flags
    if link:
        cmd += link.launcher_args()
    if a.quiet:
        cmd.append("-q")
    cmd += ["--", "--iterations", str(a.iterations)]
    before = link_counters(link) if link else None
    t0 = time.time()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL if a.quiet else None)
    if r.returncode != 0:
        sys.exit(f"quickstart: the {name} job failed (exit {r.returncode}); logs in {out}")
    wall = time.time() - t0
    (out / "link.json").unlink(missing_ok=True)
    if link:
        after = link_counters(link)
        doc = {"link": f"{link.mbit} Mbit/s tbf", "link_mbit": link.mbit, "interface": link.ps_if, "netns": link.ps_ns,
               "ps_tx_bytes": after[0] - before[0], "ps_rx_bytes": after[1] - before[1]}
        (out / "link.json").write_text(json.dumps(doc, indent=1) + "\n")
    return json.loads((out / "summary.json").read_text()), wall


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True)
    p.add_argument("--work", required=True, help="the runs go to WORK/run-vanilla and WORK/run-herald")
    p.add_argument("--bin", default=str(ROOT / "build" / "bin"))
    p.add_argument("--iterations", type=int, default=300)
    p.add_argument("--link-mbit", type=int, default=50, help="rate of the shaped link, Mbit/s (tc tbf on both ends)")
    p.add_argument("--loopback", action="store_true", help="no shaped link: both jobs over TCP loopback")
    p.add_argument("--herald-flags", default=DEFAULT_HERALD_FLAGS,
                   help=f"ember_launch.py flags for the herald job (default \"{DEFAULT_HERALD_FLAGS}\")")
    p.add_argument("--repeats", type=int, default=1, help="runs of each job, alternated (RUN-rN dirs when > 1)")
    p.add_argument("-q", "--quiet", action="store_true", help="no launcher output")
    a = p.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    jobs = [("vanilla", "vanilla", []), ("herald", "herald", shlex.split(a.herald_flags))]

    why = "--loopback" if a.loopback else why_no_link()
    link = None
    if not why:
        link = TbfLink(a.link_mbit)
        try:
            link.__enter__()
        except SystemExit as e:  # bench_e2e's sh() exits with the failed command and its stderr
            link = None
            why = "the namespaces could not be made: " + (str(e.code).strip().splitlines() or ["?"])[-1]
    if link:
        print(f"quickstart: the PS in one network namespace, the workers in another, joined by a veth pair "
              f"shaped to {a.link_mbit} Mbit/s (tc tbf)", flush=True)
    else:
        print(f"quickstart: {why}: both jobs run over TCP loopback on localhost", flush=True)

    runs = {name: [] for name, _, _ in jobs}
    try:
        for rep in range(a.repeats):
            for name, policy, flags in jobs:
                out = work / (f"run-{name}" if a.repeats == 1 else f"run-{name}-r{rep}")
                where = f"{a.link_mbit} Mbit/s link" if link else "loopback"
                print(f"== training with {name}: 1 PS + 4 workers over TCP, {where} (examples/{policy}.toml"
                      + (f" {' '.join(flags)}" if flags else "") + ")"
                      + (f", repeat {rep + 1}/{a.repeats}" if a.repeats > 1 else ""), flush=True)
                s, wall = run_job(a, name, policy, flags, out, link)
                runs[name].append(s["samples_s"])
                if a.repeats > 1:
                    print(f"   {s['samples_s']:.0f} samples/s ({wall:.0f} s)", flush=True)
    finally:
        if link:
            link.__exit__()
    if a.repeats > 1:
        v, h = runs["vanilla"], runs["herald"]
        print(f"samples/s, median of {a.repeats}: vanilla {statistics.median(v):.0f}, herald {statistics.median(h):.0f} "
              f"({statistics.median(h) / statistics.median(v):.2f}x); per repeat herald/vanilla: "
              + ", ".join(f"{y / x:.2f}" for x, y in zip(v, h)))


if __name__ == "__main__":
    main()
