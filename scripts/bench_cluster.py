#!/usr/bin/env python3
"""Ember across hosts: samples/s and bytes crossing hosts on a cluster of network
namespaces (scripts/cluster_local.sh), 1 PS host and 2 worker hosts x 4 workers.

For each inter-host link rate in --links (Mbit/s, tc tbf on each host's link; 0 =
unshaped), each configuration (vanilla, herald, herald + lookahead) and each dense
all-reduce (flat ring, hierarchical), --repeats runs alternated within each repeat,
through scripts/launch_hosts.sh over ssh (run on host1, as a user of the cluster would).
(`--configs` picks among vanilla, herald, herald+lookahead, herald+hosts (herald +
lookahead with per-host aggregation, two-level allocation and peer sync) and herald+peer
(the same without aggregation); `--allreduce` among flat and hierarchical.) Per run:
  - samples/s (the slowest worker's);
  - bytes crossing hosts per iteration as the transport counts them (summary "links":
    cross-host PS traffic both ways, plus the all-reduce payload each worker sent to
    another host), split into PS and all-reduce;
  - the ground truth: bytes the worker hosts' eth0 sent and received (their interface
    counters, `ip -n ember-hostK -s -j link`, read before and after the job), per
    iteration, and the transport's share of them (the rest: TCP/IP headers, Gloo's and
    ZeroMQ's framing, the job's start and end).
Medians over the repeats; ratios within one run of the script: hierarchical over flat
(cross-host all-reduce bytes, samples/s) and each configuration over vanilla.

  sudo scripts/bench_cluster.py --dataset DIR [--links 25,50,100,0] [--repeats 3] [--iterations 60]

--net-only brings the cluster up without sshd or Slurm (`cluster_local.sh up --net-only`)
and launches through `cluster_local.sh rsh` in place of ssh: for a machine that has
iproute2 but no openssh-server or Slurm (the GPU machine, scripts/device_check.sh).

Needs root and the cluster's packages (cluster_local.sh says which are missing); brings
the cluster up (or reshapes one that is up) and leaves it up unless --down. Writes
WORK/cluster.json with every run, and prints a markdown table.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "scripts" / "cluster_local.sh"
sys.path.insert(0, str(ROOT / "scripts"))
import bench_util  # noqa: E402  (running a command, NIC counters)
CONFIGS = [
    ("vanilla", "vanilla", []),
    ("herald", "herald", []),
    ("herald+lookahead", "herald", ["--lookahead", "4", "--prefetch", "--overlap-allreduce"]),
    # The host hierarchy for rows, every mechanism (docs/cluster.md), on top of the above.
    ("herald+hosts", "herald", ["--lookahead", "4", "--prefetch", "--overlap-allreduce", "--host-aggregation",
                                "--host-allocation", "--peer-sync"]),
    # The same without per-host aggregation (its pulls take two hops within the host).
    ("herald+peer", "herald", ["--lookahead", "4", "--prefetch", "--overlap-allreduce", "--host-allocation", "--peer-sync"]),
]
ALLREDUCE = ["flat", "hierarchical"]


def sh(cmd):
    return bench_util.sh(cmd, who="bench_cluster")


def eth0(host):
    """(tx_bytes, rx_bytes) of host K's eth0, read in its network namespace."""
    return bench_util.nic_bytes(f"ember-{host}", "eth0")


def summaries(out, workers):
    rows = []
    for w in range(workers):
        for line in (out / f"w{w}.jsonl").read_text().splitlines():
            j = json.loads(line)
            if j.get("summary"):
                rows.append(j)
    if len(rows) != workers:
        sys.exit(f"bench_cluster: {out}: {len(rows)} of {workers} workers wrote a summary")
    return rows


def run_job(a, state, hostfile, name, policy, flags, allreduce):
    out = Path(a.work) / name
    subprocess.run(["rm", "-rf", str(out)])
    cmd = [str(ROOT / "scripts" / "launch_hosts.sh"), "--hostfile", str(hostfile), "--ps", "1", "--workers", str(a.workers),
           "--dataset", a.dataset, "--policy", policy, "--out", str(out), "--bin", a.bin,
           "--ps-args", f"--dim {a.dim} --optimizer adagrad --lr 0.05"]
    if a.net_only:
        cmd += ["--rsh", f"bash {CLUSTER} --state {state} rsh"]
    cmd += ["--",
           "--iterations", str(a.iterations), "--batch-per-worker", str(a.batch), "--eval-every", "0",
           "--allreduce", allreduce, "--log-level", "warn"] + a.model.split() + flags
    worker_hosts = ["host2", "host3"]
    before = {h: eth0(h) for h in worker_hosts}
    t0 = time.time()
    r = subprocess.run(["bash", str(CLUSTER), "--state", state, "exec", "host1"] + cmd, capture_output=True, text=True,
                       timeout=1800)
    wall = time.time() - t0
    if r.returncode != 0:
        sys.exit(f"bench_cluster: {name} failed ({r.returncode}); logs in {out}:\n{(r.stderr or r.stdout)[-3000:]}")
    after = {h: eth0(h) for h in worker_hosts}
    sums = summaries(out, a.workers)
    it = sums[0]["iterations"]
    cross = [s["links"]["cross_host"] for s in sums]
    ps_bytes = sum(c["ps_bytes_out"] + c["ps_bytes_in"] for c in cross)
    peer_bytes = sum(c["peer_bytes_out"] for c in cross)
    nic = sum(after[h][0] - before[h][0] + after[h][1] - before[h][1] for h in worker_hosts)
    # What crosses hosts counted once: each worker host's eth0 carries its PS traffic
    # both ways and the all-reduce bytes it sends and receives; over the two worker
    # hosts the all-reduce's cross-host bytes appear twice (sent by one, received by the
    # other), the PS's once.
    transport_at_nics = ps_bytes + 2 * peer_bytes
    return {"name": name, "samples_s": min(s["samples_s"] for s in sums), "iterations": it, "wall_s": wall,
            "cross_ps_per_it": ps_bytes / it, "cross_allreduce_per_it": peer_bytes / it,
            "cross_per_it": (ps_bytes + peer_bytes) / it,
            "nic_bytes_per_it": nic / it, "transport_share_of_nic": transport_at_nics / nic if nic else 0.0}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True, help="an ember-data prep directory (enough rows for the iterations)")
    p.add_argument("--work", default="/tmp/ember-bench-cluster")
    p.add_argument("--bin", default=str(ROOT / "build" / "bin"))
    p.add_argument("--links", default="25,50,100,0", help="inter-host link rates, Mbit/s (0: unshaped)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iterations", type=int, default=60)
    p.add_argument("--workers", type=int, default=8, help="split over 2 worker hosts")
    p.add_argument("--batch", type=int, default=128, help="samples per worker per iteration")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--model", default="--model dlrm --bottom-mlp 64-16 --top-mlp 64-32",
                   help="ember-worker model flags")
    p.add_argument("--state", default="/var/lib/ember-cluster", help="cluster_local.sh --state")
    p.add_argument("--configs", default=",".join(c[0] for c in CONFIGS))
    p.add_argument("--allreduce", default=",".join(ALLREDUCE), help="dense all-reduces to run (flat, hierarchical)")
    p.add_argument("--down", action="store_true", help="take the cluster down at the end")
    p.add_argument("--net-only", action="store_true",
                   help="no sshd or Slurm: namespaces and links alone, launched through cluster_local.sh rsh")
    p.add_argument("--table", nargs="+", metavar="JSON", help="print the table of earlier runs (their cluster.json files) and exit")
    a = p.parse_args()
    if a.table:
        results = [r for f in a.table for r in json.loads(Path(f).read_text())]
        a.iterations, a.batch = results[0]["iterations"], a.batch
        a.repeats = max(r["repeat"] for r in results) + 1
        print_table(results, a)
        return
    a.dataset = str(Path(a.dataset).resolve())
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    configs = [c for c in CONFIGS if c[0] in a.configs.split(",")]
    # PS on host1; workers 0..W/2-1 on host2, the rest on host3 (launch_hosts.sh puts
    # shard 0 on the first line and worker w on line 1 + w).
    half = a.workers // 2
    hostfile = work / "hostfile"
    hostfile.write_text("\n".join(["host1"] + ["host2"] * half + ["host3"] * (a.workers - half)) + "\n")
    results = []
    try:
        for mbit in [int(x) for x in a.links.split(",")]:
            sh(["bash", CLUSTER, "--state", a.state, "up", "--hosts", "3", "--link-mbit", str(mbit)] +
               (["--net-only"] if a.net_only else []))
            for rep in range(a.repeats):
                for cfg, policy, flags in configs:
                    for ar in a.allreduce.split(","):
                        name = f"{mbit or 'unshaped'}-{cfg}-{ar}-r{rep}"
                        r = run_job(a, a.state, hostfile, name, policy, flags, ar)
                        r.update({"link_mbit": mbit, "config": cfg, "allreduce": ar, "repeat": rep})
                        results.append(r)
                        print(f"{name}: {r['samples_s']:.0f} samples/s, across hosts {r['cross_per_it'] / 1e3:.1f} kB/it "
                              f"(all-reduce {r['cross_allreduce_per_it'] / 1e3:.1f}), worker NICs {r['nic_bytes_per_it'] / 1e3:.1f} kB/it",
                              flush=True)
                        (work / "cluster.json").write_text(json.dumps(results, indent=1) + "\n")
    finally:
        if a.down:
            bench_util.run(["bash", CLUSTER, "--state", a.state, "down"])
    print_table(results, a)


def print_table(results, a):
    def med(rows, k):
        return statistics.median(r[k] for r in rows)

    print(f"\n{a.workers} workers on 2 hosts + 1 PS host, {a.iterations} iterations x {a.batch} samples per worker, "
          f"median of {a.repeats}; kB per iteration across hosts (transport), and at the worker hosts' NICs\n")
    print("| link | config | all-reduce | samples/s | vs vanilla | hier/flat samples/s | across hosts kB/it | PS kB/it "
          "| all-reduce kB/it | hier/flat all-reduce | NIC kB/it | transport/NIC |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    links = sorted({r["link_mbit"] for r in results}, key=lambda m: m or 1e9)
    for mbit in links:
        for cfg in dict.fromkeys(r["config"] for r in results):
            for ar in ALLREDUCE:
                rows = [r for r in results if r["link_mbit"] == mbit and r["config"] == cfg and r["allreduce"] == ar]
                if not rows:
                    continue
                van = [r for r in results if r["link_mbit"] == mbit and r["config"] == "vanilla" and r["allreduce"] == ar]
                flat = [r for r in results if r["link_mbit"] == mbit and r["config"] == cfg and r["allreduce"] == "flat"]
                sps = med(rows, "samples_s")
                vs = f"{sps / med(van, 'samples_s'):.2f}" if van else "-"
                hf = f"{sps / med(flat, 'samples_s'):.2f}" if ar != "flat" and flat else "-"
                har = f"{med(rows, 'cross_allreduce_per_it') / med(flat, 'cross_allreduce_per_it'):.2f}" if ar != "flat" and flat else "-"
                print(f"| {mbit or 'unshaped'} | {cfg} | {ar} | {sps:.0f} | {vs} | {hf} | {med(rows, 'cross_per_it') / 1e3:.1f} | "
                      f"{med(rows, 'cross_ps_per_it') / 1e3:.1f} | {med(rows, 'cross_allreduce_per_it') / 1e3:.1f} | {har} | "
                      f"{med(rows, 'nic_bytes_per_it') / 1e3:.1f} | {med(rows, 'transport_share_of_nic'):.3f} |")


if __name__ == "__main__":
    main()
