#!/usr/bin/env python3
"""Rows and bytes across hosts and within them, by mechanism of the host hierarchy for
rows (docs/cluster.md "The host hierarchy for rows"), from ember-sim.

For each dataset and host layout (--layouts, HOSTSxWORKERS), runs ember-sim once per
scheduling variant and prints a markdown table: vanilla, vanilla + per-host aggregation,
flat herald, herald + each mechanism alone (aggregation, two-level allocation, peer
sync) and with all three; rows and bytes across hosts and their ratio to flat herald's,
with the final flush and without it (the iterations alone), and rows and bytes within
hosts (peer sync's hand-offs included). The PS shards run on a host of their own, so
every PS row crosses hosts unless a mechanism keeps it within one.

  scripts/host_rows_table.py [--sim build/bin/ember-sim] [--datasets criteo,avazu]
      [--real DIR --real-batch 16] [--layouts 2x4,4x2] [--json-out FILE]

--datasets names ember-sim's synthetic generators (scale --scale); --real adds an
ember-data directory (the real Criteo head of ../shared/data/real, prepared), at its own
batch and as many iterations as its training split holds.
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_util  # noqa: E402  (running a command)

ROOT = Path(__file__).resolve().parent.parent

# (label, policy, ember-sim flags, counts: "links" flat or "links_aggregated")
VARIANTS = [
    ("vanilla", "vanilla", [], "links"),
    ("vanilla + aggregation", "vanilla", [], "links_aggregated"),
    ("herald (flat)", "herald", [], "links"),
    ("herald + aggregation", "herald", [], "links_aggregated"),
    ("herald + two-level allocation", "herald", ["--host-allocation"], "links"),
    ("herald + peer sync", "herald", ["--peer-sync"], "links"),
    ("herald + all three", "herald", ["--host-allocation", "--peer-sync"], "links_aggregated"),
]


def rows_of(link):
    """Rows on a link: PS transmissions and flushes, and peer sync's hand-offs."""
    return sum(link.get(k, 0) for k in ("pulls", "push_grad", "push_value", "push_evict", "flush_grad", "flush_value", "peer_value",
                                        "peer_grad"))


def flush_bytes(link, dim, state):
    """Payload of the final flush on a link (docs/design.md "Bytes"): values with their
    state, gradients with their trainer count and iteration."""
    return link.get("flush_value", 0) * (8 + 4 * (dim + state)) + link.get("flush_grad", 0) * (16 + 4 * dim)


def run_sim(a, data_args, hosts, workers, batch, iterations, warmup, policy, flags):
    cmd = [a.sim, *data_args, "--workers", str(workers), "--batch-per-worker", str(batch), "--cache-ratio", str(a.cache_ratio),
           "--iterations", str(warmup + iterations), "--warmup", str(warmup), "--policy", policy, "--hosts", str(hosts), "--dim",
           str(a.dim), "--optimizer", a.optimizer, "--json", "-q", *flags]
    out = bench_util.sh(cmd, who="host_rows_table")
    return json.loads(out.splitlines()[0]), " ".join(cmd[1:])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sim", default=str(ROOT / "build" / "bin" / "ember-sim"))
    p.add_argument("--datasets", default="criteo,avazu", help="synthetic generators (empty: none)")
    p.add_argument("--scale", default="1")
    p.add_argument("--real", help="an ember-data directory (e.g. the real Criteo head, prepared)")
    p.add_argument("--real-batch", type=int, default=16)
    p.add_argument("--layouts", default="2x4,4x2", help="HOSTSxWORKERS_PER_HOST, comma-separated")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--iterations", type=int, default=300)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--cache-ratio", type=float, default=0.1)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--optimizer", default="adagrad")
    p.add_argument("--json-out", help="write every run's numbers here")
    a = p.parse_args()
    state = {"sgd": 0, "adagrad": a.dim, "rowwise-adagrad": 1, "adam": 2 * a.dim}[a.optimizer]

    sets = [{"name": f"{d}-like scale {a.scale}", "args": ["--synthetic", d, "--scale", a.scale], "batch": a.batch}
            for d in a.datasets.split(",") if d]
    if a.real:
        manifest = json.loads((Path(a.real) / "manifest.json").read_text())
        sets.append({"name": f"real {Path(a.real).name}", "args": ["--dataset", a.real], "batch": a.real_batch,
                     "train_rows": manifest["rows"]["train"]})
    results = []
    for d in sets:
        name, data_args, batch = d["name"], d["args"], d["batch"]
        for layout in a.layouts.split(","):
            hosts, per = (int(x) for x in layout.split("x"))
            workers = hosts * per
            iterations, warmup = a.iterations, a.warmup
            if "train_rows" in d:  # a real dataset: what its training split holds, a tenth as warm-up
                batches = d["train_rows"] // (workers * batch)
                warmup = batches // 10
                iterations = batches - warmup
            flat = None
            for label, policy, flags, counts in VARIANTS:
                j, cmd = run_sim(a, data_args, hosts, workers, batch, iterations, warmup, policy, flags)
                links = j[counts]
                cross, intra = links["cross_host"], links["intra_host"]
                row = {"dataset": name, "layout": layout, "variant": label, "cross_rows": rows_of(cross),
                       "cross_bytes": cross["bytes"], "intra_rows": rows_of(intra), "intra_bytes": intra["bytes"],
                       # The iterations alone, without the final flush (a cost once per run).
                       "cross_rows_run": rows_of(cross) - cross.get("flush_grad", 0) - cross.get("flush_value", 0),
                       "cross_bytes_run": cross["bytes"] - flush_bytes(cross, a.dim, state),
                       "iterations": iterations, "warmup": warmup, "batch": batch, "command": cmd, "links": links}
                if label == "herald (flat)":
                    flat = row
                results.append(row)
                print(f"{name} {layout} {label}: across {row['cross_rows']:,} rows", file=sys.stderr)
            for row in results:
                if row["dataset"] == name and row["layout"] == layout:
                    for k in ("cross_rows", "cross_bytes", "cross_rows_run", "cross_bytes_run"):
                        row[k + "_vs_flat"] = row[k] / flat[k]
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(results, indent=1))
    for name in dict.fromkeys(r["dataset"] for r in results):
        rs = [r for r in results if r["dataset"] == name]
        print(f"\n{name}: W x B = hosts x workers per host x {rs[0]['batch']}, {rs[0]['iterations']} iterations after "
              f"{rs[0]['warmup']}, cache {a.cache_ratio}, {a.optimizer} dim {a.dim}\n")
        print("| layout | variant | rows across hosts | vs flat herald | MB across | vs flat | without the final flush: rows | "
              "vs flat | MB | vs flat | rows within | MB within |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rs:
            print(f"| {r['layout']} | {r['variant']} | {r['cross_rows']:,} | {r['cross_rows_vs_flat']:.2f}x | {r['cross_bytes'] / 1e6:.1f} | "
                  f"{r['cross_bytes_vs_flat']:.2f}x | {r['cross_rows_run']:,} | {r['cross_rows_run_vs_flat']:.2f}x | "
                  f"{r['cross_bytes_run'] / 1e6:.1f} | {r['cross_bytes_run_vs_flat']:.2f}x | {r['intra_rows']:,} | {r['intra_bytes'] / 1e6:.1f} |")


if __name__ == "__main__":
    main()
