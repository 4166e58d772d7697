#!/usr/bin/env python3
"""Multi-host runs for real (issue 43 part 5), the ctest `cluster_jobs`, on a 4-host
scripts/cluster_local.sh cluster (unshaped links) of its own; host4 is a spare that only
(vi) and (xii) use.

1. One job (1 PS shard on host1; workers 0-1 on host2, 2-3 on host3; herald; Adagrad;
   checkpoints every 10 iterations; a small DLRM, ITERATIONS global batches) run
   (a) on this machine over loopback by ember_launch.py: the reference;
   (b) across the hosts by launch_hosts.sh over ssh, from here (--ssh-config
       STATE/ssh_config) with a hostfile of names (STATE/hostfile's);
   (c) by `sbatch --nodes=3 ember.sbatch` on the cluster's Slurm.
   (b) and (c) must give (a)'s model (worker 0's --dump-dir: dense.bin and rows.bin
   within 1e-5) and (a)'s counts (summary.json: rows pulled, pushed by kind, cache hits,
   bytes each way).
2. Faults. Each must end every Ember process of the job on every host within BOUND_S of
   it (the heartbeat timeout HB_MS, the workers' 3 s grace after the control plane fails
   the job, and 3 s), and the control plane's failure file (OUT/failure.json) must name a
   lost member:
   (i)   scancel of a running sbatch job: it stops at a whole checkpoint;
   (ii)  host3 killed (kill -9 of the job's ember-* processes in host3's namespace),
         under launch_hosts.sh and under sbatch: fails naming worker 2 or 3;
   (iii) host3's link down for 30 s (ember-v3, the bridge's end of its veth), under
         launch_hosts.sh and under sbatch: fails naming worker 2 or 3, host3's workers
         log that they lost the coordinator; the Slurm job ends once the link is back;
   (iv)  host3's link down for 2 s mid-run, under launch_hosts.sh and under sbatch: the
         job completes with the reference's model and counts.
3. Jobs that heal themselves, each ending with the reference's model:
   (v)   host3's processes killed under launch_hosts.sh --max-restarts 1;
   (vi)  host3's link down for good under launch_hosts.sh --max-restarts 1 --spares 1:
         host4 takes host3's workers, ranks kept;
   (vii) host3's processes killed under sbatch with EMBER_MAX_RESTARTS=1: Slurm requeues
         the job (the test lets the requeued job start at once).
4. The host hierarchy (--host-aggregation --host-allocation --peer-sync, lookahead 3,
   prefetch) under launch_hosts.sh --max-restarts 2, each job ending byte-identical to
   the same job uninterrupted (viii-ref), with the seconds from each loss to training
   again (the test's clock: the fault to the next attempt's first iteration) and the
   iterations recomputed: (viii) host3's processes killed; (ix) the PS host's shard
   killed; (x) host3's processes killed, then the PS's shard in the restarted attempt;
   (xi) host3's processes killed under sbatch with EMBER_MAX_RESTARTS=1 (Slurm's
   requeue); (xii) host3's link down for good with --spares 1: host4 takes its workers;
   (xiii) host3's link down for 30 s with no spare: the launcher waits for host3 to
   answer again (--host-wait) and restarts the job on the same hosts.

The cases run in the order a, b, c, i, ii, iv, v, vii, viii-ref, viii-xi, vi, xii, xiii,
iii: after a link down slurmctld may find host3 not responding or set it DOWN at a later
ping, for a while (every sbatch waits for the 4 nodes idle, but a job started before that
ping has its steps held back). At the end nothing is left: no job process, no Slurm job,
and after `down` no namespace or link.

Skips (prints `SKIP: reason`, exits 77) when not root, when a package is missing, when
namespaces cannot be made, or when a cluster is up already (bridge ember-br0). On any exit
the cluster goes down, the Slurm jobs are cancelled and the test's leftover processes
killed; the work directory is kept when the test fails. About 9 minutes on the 2-core
development host.

  python3 tests/cluster/multihost_test.py BIN_DIR SOURCE_DIR

Environment: HB_MS (heartbeat timeout, default 5000), ITERATIONS (default 150),
EMBER_CLUSTER_JOBS_TEST_DIR (the cluster's state, default /var/lib/ember-cluster-jobs-test),
EMBER_MULTIHOST_CASES (a comma-separated subset, e.g. `ii,v`, for quicker runs while
working on the test; the cases a subset compares with, a or viii-ref, run too).
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path

if len(sys.argv) != 3 or not all(os.path.isdir(a) for a in sys.argv[1:]):
    sys.exit("usage: multihost_test.py BIN_DIR SOURCE_DIR")
BIN, SRC = (Path(a).resolve() for a in sys.argv[1:3])
sys.path.insert(0, str(SRC / "scripts"))
from bench_util import run, sh  # noqa: E402  (found through SOURCE_DIR)

HB_MS = int(os.environ.get("HB_MS", "5000"))
# The heartbeat timeout, the workers' 3 s grace after the control plane fails the job
# (ember-worker: "did not stop within 3000 ms"), and 3 s.
BOUND_S = HB_MS // 1000 + 3 + 3
ITERATIONS = int(os.environ.get("ITERATIONS", "150"))
ENDLESS = 100000  # iterations of a job that only a fault ends
STATE = Path(os.environ.get("EMBER_CLUSTER_JOBS_TEST_DIR", "/var/lib/ember-cluster-jobs-test"))
CLUSTER = SRC / "scripts" / "cluster_local.sh"
HOST3_LINK = "ember-v3"  # the bridge's end of host3's veth
PS_ARGS = "--dim 8 --optimizer adagrad --lr 0.05"
WORKER_ARGS = ["--model", "dlrm", "--bottom-mlp", "32-16", "--top-mlp", "32-16", "--batch-per-worker", "64",
               "--eval-every", "0"]
HIERARCHY = ["--host-aggregation", "--host-allocation", "--peer-sync", "--lookahead", "3", "--prefetch"]
TOOLS = ["ip", "tc", "unshare", "nsenter", "mountpoint", "sshd", "ssh", "ssh-keygen", "munged", "slurmctld",
         "slurmd", "sinfo", "srun", "sbatch", "scancel", "squeue", "python3"]
# summary.json's counts that (b), (c) and (iv) must share with the reference.
COUNTS = ("iterations", "pulls", "pushes", "push_grad", "push_value", "push_evict", "hits", "bytes_out", "bytes_in")

WORK = None  # the work directory (main makes it): every job's output, WORK/NAME/...
NAMES = []  # the cluster's host names, its hostfile's order
BACKGROUND = {}  # the processes started in the background, by job name (cleanup stops them)
FOUND = {}  # what the cases measured, for the PASS line


# ---- small helpers -------------------------------------------------------------------

def skip(why):
    print(f"SKIP: {why}", flush=True)
    sys.exit(77)


def fail(what, show=None):
    """Ends the test with `FAIL: what`, after the text of file `show` (a launcher's or
    Slurm's output) when given."""
    if show is not None:
        sys.stderr.write(read(show))
    print(f"FAIL: {what}", file=sys.stderr, flush=True)
    sys.exit(1)


def read(path):
    """A file's text; "" when it cannot be read."""
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def load_json(path, what):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        fail(f"{what}: cannot read {path}: {e}")


def seconds_since(t0):
    return f"{time.monotonic() - t0:.1f}"


def passed(deadline):
    return time.monotonic() > deadline


def kill_all(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def set_host3_link(state):
    r = run(["ip", "link", "set", HOST3_LINK, state])
    if r.returncode != 0:
        fail(f"ip link set {HOST3_LINK} {state} failed: {r.stderr.strip()}")


def out_file(name, kind):
    """WORK/NAME.launcher (launch_hosts.sh's output) or WORK/NAME.out (Slurm's)."""
    return WORK / f"{name}.{'launcher' if kind == 'ssh' else 'out'}"


# ---- processes of a job, in the hosts' namespaces -------------------------------------

def cmdline(pid):
    return read(f"/proc/{pid}/cmdline").replace("\0", " ")


def host_job_procs(k, tag):
    """The pids of the job's ember-* processes in host K's network namespace (TAG: a path
    of the job's that their command lines name)."""
    pids = run(["ip", "netns", "pids", f"ember-host{k}"]).stdout.split()
    return [int(p) for p in pids if read(f"/proc/{p}/comm").startswith("ember-") and tag in cmdline(p)]


def netns_hosts():
    """Host names by the inode of their network namespace."""
    hosts = {}
    for k in range(1, 5):
        try:
            hosts[os.stat(f"/run/netns/ember-host{k}").st_ino] = f"host{k}"
        except OSError:
            pass
    return hosts


def job_procs(tag):
    """The ember-ps and ember-worker processes of a job (their command lines name TAG, a
    path of the job's) wherever they run, zombies left out: "host3:PID:ember-worker"
    ("root": this namespace)."""
    hosts, found = netns_hosts(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            if comm not in ("ember-ps", "ember-worker") or tag not in cmdline(pid):
                continue
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            where = hosts.get(os.stat(f"/proc/{pid}/ns/net").st_ino, "root")
        except OSError:
            continue
        found.append(f"{where}:{pid}:{comm}")
    return found


def wait_gone(tag, t0, what):
    """Waits until the job of TAG has no process left; returns the seconds since T0 (the
    fault), or fails naming what is left BOUND_S after it."""
    while True:
        left = job_procs(tag)
        if not left:
            return seconds_since(t0)
        if time.monotonic() - t0 > BOUND_S:
            fail(f"{what}: {len(left)} Ember process(es) still running {BOUND_S} s after the fault: {' '.join(left)}")
        time.sleep(0.1)


# ---- a job's progress and its failure ------------------------------------------------

def iterations_of(out):
    """The iterations worker 0 of the job writing OUT has logged (its metrics)."""
    return sum('"iteration"' in line for line in read(Path(out) / "w0.jsonl").splitlines())


def wait_iterations(out, n, what):
    deadline = time.monotonic() + 60
    while iterations_of(out) < n:
        if passed(deadline):
            fail(f"{what}: worker 0 did not reach iteration {n} within 60 s")
        time.sleep(0.05)


def lost_member(out, what, slurm_out=None):
    """Who names the lost member (one of host3's workers, 2 or 3): the control plane's
    failure file, else srun in Slurm's output (SLURM_OUT): its --kill-on-bad-exit stops
    the other workers at once, so one of them may fall silent first by the coordinator's
    clock."""
    path = Path(out) / "failure.json"
    if not read(path):
        fail(f"{what}: no failure file ({path})")
    failure = load_json(path, what)
    word = f"{failure.get('member')}: {failure.get('cause')}"
    if failure.get("member") in ("worker 2", "worker 3"):
        return f"the control plane: {word}"
    m = re.search(r"srun: error: host3: tasks? ([0-9-]+): Killed", read(slurm_out)) if slurm_out else None
    if m and set(m.group(1).split("-")) <= {"2", "3"}:
        return f"{m.group(0)} (the control plane: {word})"
    fail(f"{what}: the lost member is not named: the control plane names {word}, not worker 2 or 3 (host3's)")


def job_failed(kind, name, what):
    """Waits for the launcher of failed job NAME; checks that it gives the control
    plane's word."""
    if kind == "ssh":
        rc = BACKGROUND[name].wait()
        if rc != 1:
            fail(f"{what}: launch_hosts.sh exited {rc}, not 1", show=out_file(name, kind))
    else:
        wait_job_gone(job_id(name), what, 60)
    # launch_hosts: "the job failed: worker2 failed first, by the control plane: CAUSE";
    # ember.sbatch: "the job failed; by the control plane: {...}".
    if not re.search(r"the job failed[:;] .*by the control plane: ", read(out_file(name, kind))):
        launcher = "launch_hosts.sh" if kind == "ssh" else "ember.sbatch"
        fail(f"{what}: {launcher} does not give the control plane's word", show=out_file(name, kind))


# ---- Slurm ---------------------------------------------------------------------------

def job_id(name):
    return read(WORK / f"{name}.jobid").strip()


def nodes_idle(what):
    """Waits for the 4 nodes idle: slurmctld sets a node it has not heard from for
    SlurmdTimeout DOWN at its next ping, which may come after the node is back (a link
    down for a while)."""
    deadline = time.monotonic() + 90
    while True:
        nodes = run(["sinfo", "-h", "-N", "-o", "%N %T"]).stdout.split("\n")
        if sum(line.split()[1:2] == ["idle"] for line in nodes) == 4:
            return
        if passed(deadline):
            fail(f"{what}: the 4 nodes are not all idle after 90 s: {','.join(filter(None, nodes))}")
        time.sleep(0.1)


def wait_job_gone(job, what, seconds):
    deadline = time.monotonic() + seconds
    while run(["squeue", "-h", "-j", job]).stdout.strip():
        if passed(deadline):
            state = run(["squeue", "-h", "-j", job, "-o", "%i %T %R"]).stdout.strip()
            fail(f"{what}: Slurm job {job} still in the queue {seconds} s on: {state}")
        time.sleep(0.1)


def slurm_job(name, iterations, sbatch_args=(), worker_extra=(), max_restarts=None):
    """Submits ember.sbatch on host1-host3 (job NAME, output WORK/NAME.out, its id in
    WORK/NAME.jobid) once the 4 nodes are idle; returns sbatch's exit status (with
    --wait, the job's)."""
    nodes_idle(name)
    d = WORK / name
    env = dict(os.environ, EMBER_ROOT=str(SRC), EMBER_BIN=str(BIN), EMBER_OUT=f"{d}/run", EMBER_DUMP_DIR=f"{d}/dump",
               EMBER_CHECKPOINT_DIR=f"{d}/ckpt", EMBER_CHECKPOINT_EVERY="10", EMBER_HEARTBEAT_TIMEOUT_MS=str(HB_MS),
               EMBER_PS_ARGS=PS_ARGS)
    if max_restarts is not None:
        env["EMBER_MAX_RESTARTS"] = str(max_restarts)
    cmd = ["sbatch", "--parsable", "--nodes=3", f"--exclude={NAMES[3]}", "-o", WORK / f"{name}.out", *sbatch_args,
           SRC / "scripts" / "ember.sbatch", WORK / "data", "herald", "1", "4",
           "--", *WORKER_ARGS, *worker_extra, "--iterations", iterations]
    with open(WORK / f"{name}.jobid", "w") as ids:
        return subprocess.run([str(c) for c in cmd], stdout=ids, cwd=WORK, env=env).returncode


# ---- launch_hosts.sh -----------------------------------------------------------------

def in_background(name, cmd, output=None):
    """Starts CMD, its output to file OUTPUT (else ours); BACKGROUND[NAME] holds it."""
    cmd = [str(c) for c in cmd]
    if output is None:
        BACKGROUND[name] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    else:
        with open(output, "w") as f:
            BACKGROUND[name] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT)
    return BACKGROUND[name]


def launch_hosts(name, timeout_s, ps_args, launcher_args, worker_args, hostfile=None):
    """Starts launch_hosts.sh from this namespace in the background over ssh, its job
    writing WORK/NAME/run, its output in WORK/NAME.launcher."""
    cmd = ["timeout", timeout_s, "bash", SRC / "scripts" / "launch_hosts.sh", "--ssh-config", STATE / "ssh_config",
           "--hostfile", hostfile or WORK / "hosts", "--bin", BIN, "--ps", "1", "--workers", "4",
           "--dataset", WORK / "data", "--policy", "herald", "--out", WORK / name / "run",
           "--ps-args", ps_args, *launcher_args, "--", *worker_args]
    return in_background(name, cmd, out_file(name, "ssh"))


def ssh_job(name, iterations):
    """(b)'s job: the checkpoints are the programs' own (no restarts)."""
    d = WORK / name
    ps_args = f"{PS_ARGS} --heartbeat-timeout-ms {HB_MS} --checkpoint-dir {d}/ckpt/ps --checkpoint-every 10"
    worker_args = [*WORKER_ARGS, "--iterations", iterations, "--heartbeat-timeout-ms", HB_MS,
                   "--checkpoint-dir", d / "ckpt" / "dense", "--dump-dir", d / "dump"]
    return launch_hosts(name, 180, ps_args, [], worker_args)


def healing_job(name, max_restarts, timeout_s, worker_extra=(), hostfile=None, spares=0):
    """A job of ITERATIONS that launch_hosts.sh restarts up to MAX_RESTARTS times from its
    checkpoints (every 10 iterations), with SPARES spare hosts at the end of HOSTFILE."""
    d = WORK / name
    launcher = ["--checkpoint-dir", d / "ckpt", "--checkpoint-every", "10", "--max-restarts", max_restarts]
    if spares:
        launcher += ["--spares", spares]
    return launch_hosts(name, timeout_s, f"{PS_ARGS} --heartbeat-timeout-ms {HB_MS}", launcher,
                        [*WORKER_ARGS, *worker_extra, "--iterations", ITERATIONS, "--heartbeat-timeout-ms", HB_MS,
                         "--dump-dir", d / "dump"], hostfile)


def hier_job(name, hostfile=None, spares=0):
    """The host hierarchy's job, restarted up to twice."""
    return healing_job(name, 2, 400, HIERARCHY, hostfile, spares)


def start_job(kind, name, iterations):
    """Job NAME in the background: by launch_hosts.sh (KIND ssh) or by sbatch (slurm)."""
    if kind == "ssh":
        ssh_job(name, iterations)
    elif slurm_job(name, iterations) != 0:
        fail(f"{name}: sbatch failed")


# ---- comparing models and summaries --------------------------------------------------

def model_difference(ref, run_dir, what, exact):
    """The largest absolute difference between worker 0's dumped models (dense.bin and
    rows.bin, float32 arrays: docs/training.md, --dump-dir) of two jobs; fails past 1e-5,
    or on any difference when EXACT. rows.bin's keys compare as floats too."""
    worst = 0.0
    for name in ("dense.bin", "rows.bin"):
        try:
            a, b = ((d / "dump" / name).read_bytes() for d in (ref, run_dir))
        except OSError as e:
            fail(f"{what}: no model: {e}")
        if len(a) != len(b):
            fail(f"{what}: {name}: {len(b)} bytes against the reference's {len(a)}")
        if a == b:
            continue
        if exact:
            fail(f"{what}: {name} is not byte-identical to the uninterrupted job's")
        fa, fb = array("f", a[:len(a) // 4 * 4]), array("f", b[:len(b) // 4 * 4])
        d = max((abs(x - y) for x, y in zip(fa, fb)), default=0.0)
        if not d <= 1e-5:  # NaN fails too
            fail(f"{what}: {name}: max abs difference {d} from the reference's (more than 1e-5)")
        worst = max(worst, d)
    return worst


def restarts_line(summary, what, restarts):
    """Checks that summary.json counts RESTARTS restarts; says what they cost."""
    if summary.get("restart_count") != restarts:
        fail(f"{what}: {summary.get('restart_count')} restart(s) counted, not {restarts}: {summary.get('restarts')}")
    lost = ", ".join(f"{r['iterations_lost']} from iteration {r['resumed_at']}" for r in summary["restarts"])
    recovery = summary["restarts"][-1].get("recovery_s") or 0
    return (f"byte-identical to the uninterrupted job; iterations recomputed {summary['iterations_recomputed']} ({lost}); "
            f"worker 0: training {recovery:.1f} s after the launcher saw the last loss")


def compare_run(ref, name, what, mode="counts", restarts=0):
    """Job NAME's model against job REF's: MODE `counts`, within 1e-5 and the same counts;
    `model`, within 1e-5 alone (a restarted job's counts cover its last attempt); `exact`,
    byte-identical with RESTARTS restarts counted. Returns what it found."""
    ref, job = WORK / ref, WORK / name
    worst = model_difference(ref, job, what, exact=mode == "exact")
    summary = load_json(job / "run" / "summary.json", what)
    if mode == "exact":
        return restarts_line(summary, what, restarts)
    model = f"model: max abs difference {worst:g} ({'byte-equal' if worst == 0 else 'within 1e-5'})"
    if mode == "model":
        return model
    reference = load_json(ref / "run" / "summary.json", what)
    diff = [f"{k} {summary.get(k)} (reference {reference[k]})" for k in COUNTS if summary.get(k) != reference[k]]
    if diff:
        fail(f"{what}: counts differ: {', '.join(diff)}")
    return f"{model}; rows pulled {summary['pulls']}, pushed {summary['pushes']}, hits {summary['hits']} as the reference"


def restart_counted(run_dir, what):
    """What a healed job's summary.json counts: one restart, the iterations recomputed, and
    the seconds from the loss to training again (worker 0's, from its --restart-record)."""
    summary = load_json(Path(run_dir) / "summary.json", what)
    last = (summary.get("restarts") or [{}])[-1]
    if not (summary.get("restart_count") == 1 and summary.get("iterations_recomputed", -1) >= 0
            and (last.get("recovery_s") or 0) > 0):
        fail(f"{what}: summary.json does not count the restart: {json.dumps(summary.get('restarts'))}")
    return f"recovery {last.get('recovery_s')} s, {summary.get('iterations_recomputed')} iteration(s) recomputed"


def whole_checkpoint(d):
    """The iteration a cancelled job stopped at, where its checkpoint must be whole: the
    shard's manifest and the 4 workers' dense state."""
    at = load_json(d / "run" / "summary.json", "(i)").get("stopped_at") or 0
    if at <= 0:
        fail("(i) the job did not stop at a whole checkpoint: summary.json has no stopped_at")
    if not (d / "ckpt" / "ps" / f"iter-{at:09d}" / "manifest.json").exists():
        fail(f"(i) the job did not stop at a whole checkpoint: checkpoint {at} is not whole")
    dense = list((d / "ckpt" / "dense").glob(f"worker-*-iter-{at:09d}.pt"))
    if len(dense) != 4:
        fail(f"(i) the job did not stop at a whole checkpoint: dense state of {len(dense)} workers at iteration {at}")
    return at


def longest_iteration_s(metrics):
    """The longest iteration worker 0 logged (iter_ms), in seconds."""
    ms = [j["iter_ms"] for j in map(json.loads, read(metrics).splitlines()) if "iter_ms" in j]
    return f"{max(ms) / 1000:.1f}"


# ---- 1: the same job three ways ------------------------------------------------------

def case_reference():
    print(f"== (a) the reference: ember_launch.py on this machine, {ITERATIONS} iterations")
    t0 = time.monotonic()
    cmd = ["timeout", "180", "python3", SRC / "scripts" / "ember_launch.py", "--bin", BIN, "--dataset", WORK / "data",
           "--ps", "1", "--workers", "4", "--policy", "herald", "-q", "--out", WORK / "a" / "run",
           "--dump-dir", WORK / "a" / "dump", "--ps-args", PS_ARGS, "--checkpoint-dir", WORK / "a" / "ckpt",
           "--checkpoint-every", "10", "--heartbeat-timeout-ms", HB_MS, "--timeout", "150",
           "--", *WORKER_ARGS, "--iterations", ITERATIONS]
    if subprocess.run([str(c) for c in cmd]).returncode != 0:
        fail("(a) ember_launch.py failed")
    FOUND["a_s"] = int(time.monotonic() - t0)


def case_ssh():
    print(f"== (b) launch_hosts.sh over ssh, hostfile of names ({' '.join(read(WORK / 'hosts').split())})")
    t0 = time.monotonic()
    if ssh_job("b", ITERATIONS).wait() != 0:
        fail("(b) launch_hosts.sh failed", show=out_file("b", "ssh"))
    FOUND["b_s"] = int(time.monotonic() - t0)
    sys.stdout.write(read(out_file("b", "ssh")))
    w0 = read(WORK / "b" / "run" / "worker0.log")
    if f"2 hosts: {NAMES[1]} (workers 0-1), {NAMES[2]} (workers 2-3)" not in w0:
        placed = next((line for line in w0.splitlines() if "hosts:" in line), "")
        fail(f"(b) worker 0 does not place workers 0-1 on {NAMES[1]} and 2-3 on {NAMES[2]}: {placed}")
    if "joining the job at tcp://10.77.0.11:" not in read(WORK / "b" / "run" / "worker3.log"):
        fail("(b) worker 3 did not join at host1's address")
    print(f"(b) {compare_run('a', 'b', '(b) launch_hosts.sh')}")


def case_sbatch():
    print("== (c) sbatch --nodes=3 ember.sbatch")
    t0 = time.monotonic()
    if slurm_job("c", ITERATIONS, ["--wait"]) != 0:
        fail("(c) the sbatch job failed", show=out_file("c", "slurm"))
    FOUND["c_s"] = int(time.monotonic() - t0)
    sys.stdout.write(read(out_file("c", "slurm")))
    if "4 worker(s) on host2 host3" not in read(out_file("c", "slurm")):
        fail("(c) the workers did not run on host2 and host3")
    print(f"(c) {compare_run('a', 'c', '(c) ember.sbatch')}")


# ---- 2: faults that end the job within BOUND_S ---------------------------------------

def case_scancel():
    print(f"== (i) scancel of a running sbatch job (bound {BOUND_S} s)")
    start_job("slurm", "i", ENDLESS)
    job, tag = job_id("i"), f"{WORK}/i/"
    wait_iterations(WORK / "i" / "run", 20, "(i)")
    procs = job_procs(tag)
    if len(procs) != 5:
        fail(f"(i) the job has {len(procs)} Ember processes, not 5: {' '.join(procs)}")
    t0 = time.monotonic()
    sh(["scancel", job], who="multihost_test")
    FOUND["i_end"] = wait_gone(tag, t0, "(i) scancel")
    wait_job_gone(job, "(i) scancel", 30)
    sys.stdout.write(read(out_file("i", "slurm")))
    if "CANCELLED" not in read(out_file("i", "slurm")):
        fail("(i) Slurm's output does not say the job was cancelled")
    FOUND["i_at"] = whole_checkpoint(WORK / "i")
    print(f"(i) scancel: every Ember process gone after {FOUND['i_end']} s; stopped at iteration {FOUND['i_at']}, "
          "a whole checkpoint")


def host3_killed(kind):
    """(ii) under KIND: kill -9 of the job's ember-* processes in host3's namespace."""
    name, what = f"ii-{kind}", f"(ii) {kind}"
    print(f"== (ii) host3 killed under {kind} (kill -9 of the job's ember-* processes there; bound {BOUND_S} s)")
    start_job(kind, name, ENDLESS)
    wait_iterations(WORK / name / "run", 20, what)
    victims = host_job_procs(3, f"{WORK}/{name}/")
    if len(victims) != 2:
        fail(f"{what}: host3 runs {len(victims)} of the job's processes, not 2")
    t0 = time.monotonic()
    kill_all(victims)
    FOUND[name] = wait_gone(f"{WORK}/{name}/", t0, what)
    job_failed(kind, name, what)
    member = lost_member(WORK / name / "run", what, None if kind == "ssh" else out_file(name, kind))
    print(f"{what}: every Ember process gone after {FOUND[name]} s; named by {member}")


def link_blip(kind):
    """(iv) under KIND: host3's link down for 2 s mid-run changes nothing."""
    name, what = f"iv-{kind}", f"(iv) {kind}"
    print(f"== (iv) host3's link down for 2 s mid-run under {kind}: nothing changes")
    t0 = time.monotonic()
    start_job(kind, name, ITERATIONS)
    wait_iterations(WORK / name / "run", 20, what)
    set_host3_link("down")
    at = iterations_of(WORK / name / "run")
    time.sleep(2)
    set_host3_link("up")
    if at >= ITERATIONS:
        fail(f"{what}: the job had finished ({at} iterations) before the link went down")
    if kind == "ssh":
        if BACKGROUND[name].wait() != 0:
            fail(f"{what}: the job failed", show=out_file(name, kind))
    else:
        wait_job_gone(job_id(name), what, 120)
        if not read(WORK / name / "run" / "summary.json") or "the job failed" in read(out_file(name, kind)):
            fail(f"{what}: the job failed", show=out_file(name, kind))
    FOUND[name] = int(time.monotonic() - t0)
    model = compare_run("a", name, what)
    # The longest iteration: the one the link's 2 s fell in.
    FOUND[f"stall-{kind}"] = longest_iteration_s(WORK / name / "run" / "w0.jsonl")
    print(f"{what}: link down at iteration {at}, the job completed in {FOUND[name]} s, its longest iteration "
          f"{FOUND[f'stall-{kind}']} s; {model}")


def link_down_30s(kind):
    """(iii) under KIND: host3's link down for 30 s fails the job within BOUND_S."""
    name, what = f"iii-{kind}", f"(iii) {kind}"
    print(f"== (iii) host3's link down for 30 s under {kind} (bound {BOUND_S} s)")
    start_job(kind, name, ENDLESS)
    wait_iterations(WORK / name / "run", 20, what)
    t0 = time.monotonic()
    set_host3_link("down")
    FOUND[name] = wait_gone(f"{WORK}/{name}/", t0, what)
    member = lost_member(WORK / name / "run", what)
    for w in (2, 3):
        log = read(WORK / name / "run" / f"worker{w}.log")
        if "lost the coordinator" not in log:
            fail(f"{what}: worker {w} (on host3) does not log that it lost the coordinator: "
                 f"{' | '.join(log.splitlines()[-2:])}")
    print(f"{what}: every Ember process gone after {FOUND[name]} s; named by {member}; "
          "host3's workers: lost the coordinator")
    time.sleep(max(0.0, 30 - (time.monotonic() - t0)))
    set_host3_link("up")
    job_failed(kind, name, what)


def case_host_killed():
    for kind in ("ssh", "slurm"):
        host3_killed(kind)


def case_link_blip():
    for kind in ("ssh", "slurm"):
        link_blip(kind)


def case_link_down():
    for kind in ("ssh", "slurm"):
        link_down_30s(kind)


# ---- 3: jobs that heal themselves ----------------------------------------------------

def case_restart_ssh():
    """(v) launch_hosts.sh --max-restarts 1: host3's processes killed once; the job
    restarts by itself from the newest checkpoint and ends with the reference model."""
    name, d = "v-ssh", WORK / "v-ssh"
    print("== (v) host3's processes killed under launch_hosts.sh --max-restarts 1: the job heals itself")
    t0 = time.monotonic()
    launcher = healing_job(name, 1, 300)
    wait_iterations(d / "run", 20, "(v)")
    victims = host_job_procs(3, f"{d}/")
    if not victims:
        fail("(v): no process of the job on host3")
    kill_all(victims)
    if launcher.wait() != 0:
        fail("(v): the job did not heal (launch_hosts.sh failed)", show=out_file(name, "ssh"))
    output = read(out_file(name, "ssh"))
    if not re.search(rf"launch_hosts: restart 1/1: .*; from checkpoint {re.escape(str(d))}/ckpt/ps/iter-", output):
        fail("(v): no restart line naming the checkpoint", show=out_file(name, "ssh"))
    FOUND["v"] = int(time.monotonic() - t0)
    model = compare_run("a", name, "(v) healed", "model")
    restart = next(line for line in output.splitlines() if "launch_hosts: restart 1/1" in line)
    counted = restart_counted(d / "run", "(v)")
    print(f"(v) healed in one restart ({restart.replace('launch_hosts: ', '', 1)}); {counted}; "
          f"the job completed in {FOUND['v']} s; {model}")


def requeued_job(name, what, worker_extra=()):
    """ember.sbatch with EMBER_MAX_RESTARTS=1: host3's processes killed once; the script
    has Slurm requeue the job (the same id), which resumes from its newest checkpoint.
    Returns (what it saw, the seconds the job took)."""
    d, t0 = WORK / name, time.monotonic()
    if slurm_job(name, ITERATIONS, ["--requeue", "--open-mode=append"], worker_extra, max_restarts=1) != 0:
        fail(f"{what}: sbatch failed")
    wait_iterations(d / "run", 20, what)
    victims = host_job_procs(3, f"{d}/")
    if not victims:
        fail(f"{what}: no process of the job on host3")
    kill_all(victims)
    # Slurm holds a requeued job back for a while (about 2 minutes here) before it may
    # start again: the test lets it start 3 s later. Not at once: slurmd revokes the old
    # run's credential at the requeue's second, and a new run whose credential dates from
    # that same second is killed as "non-startable batch job: Job credential revoked".
    job, deadline = job_id(name), time.monotonic() + 60
    while not passed(deadline):
        if (run(["squeue", "-h", "-j", job, "-o", "%T"]).stdout.strip() == "PENDING"
                and "ember.sbatch: requeued (scontrol requeue" in read(out_file(name, "slurm"))):
            break
        time.sleep(0.1)
    held_s = int(time.monotonic() - t0)
    run(["scontrol", "update", f"JobId={job}", "StartTime=now+3"])
    wait_job_gone(job, what, 240)
    output = read(out_file(name, "slurm"))
    if not ("ember.sbatch: restart 1/1: " in output and "ember.sbatch: requeued (scontrol requeue" in output):
        fail(f"{what}: no requeue line", show=out_file(name, "slurm"))
    if not read(d / "run" / "summary.json"):
        fail(f"{what}: the requeued job wrote no summary", show=out_file(name, "slurm"))
    took = int(time.monotonic() - t0)
    return f"pending again {held_s} s after the start; the job completed in {took} s", took


def case_requeue():
    print("== (vii) host3's processes killed under sbatch with EMBER_MAX_RESTARTS=1: Slurm requeues the job")
    held, FOUND["vii"] = requeued_job("vii-slurm", "(vii)")
    model = compare_run("a", "vii-slurm", "(vii) requeued", "model")
    counted = restart_counted(WORK / "vii-slurm" / "run", "(vii)")
    print(f"(vii) requeued once by Slurm ({held}); {counted}; {model}")


def spare_hosts():
    """The hostfile with host4 as the spare at its end."""
    path = WORK / "hosts-spare"
    path.write_text("\n".join([NAMES[0], NAMES[1], NAMES[1], NAMES[2], NAMES[2], NAMES[3]]) + "\n")
    return path


def case_spare_ssh():
    """(vi) host3's link down for good under launch_hosts.sh --max-restarts 1 --spares 1:
    the restart finds host3 gone (ssh) and puts its workers on the spare host4, the same
    ranks; the job ends with the reference model."""
    name, d = "vi-ssh", WORK / "vi-ssh"
    print("== (vi) host3 lost (link down) under launch_hosts.sh --max-restarts 1 --spares 1: host4 takes its place")
    t0 = time.monotonic()
    launcher = healing_job(name, 1, 300, hostfile=spare_hosts(), spares=1)
    wait_iterations(d / "run", 20, "(vi)")
    set_host3_link("down")
    rc = launcher.wait()
    set_host3_link("up")
    if rc != 0:
        fail(f"(vi): the job did not heal (launch_hosts.sh exited {rc})", show=out_file(name, "ssh"))
    if f"replaced {NAMES[2]} by the spare {NAMES[3]};" not in read(out_file(name, "ssh")):
        fail("(vi): no line saying host3 was replaced by host4", show=out_file(name, "ssh"))
    hosts = " ".join(read(d / "run" / "hosts-attempt-2").split())
    if hosts != " ".join([NAMES[0], NAMES[1], NAMES[1], NAMES[3], NAMES[3]]):
        fail(f"(vi): the restart's hosts are {hosts}, not host3's workers on the spare")
    FOUND["vi"] = int(time.monotonic() - t0)
    model = compare_run("a", name, "(vi) on a spare host", "model")
    print(f"(vi) host3 replaced by host4 at the restart; the job completed in {FOUND['vi']} s; {model}")


# ---- 4: the host hierarchy, healed byte-identical ------------------------------------

def training_again(name, attempt, t0, what):
    """Waits (120 s at most) for restart ATTEMPT's line and the next attempt's first
    iteration; returns the seconds since T0 (the fault)."""
    deadline = time.monotonic() + 120
    while True:
        # The restart line comes after the failed attempt's logs moved away.
        restarted = f"launch_hosts: restart {attempt}/" in read(out_file(name, "ssh"))
        if restarted and iterations_of(WORK / name / "run") >= 1:
            return seconds_since(t0)
        if passed(deadline):
            tail = " | ".join(read(out_file(name, "ssh")).splitlines()[-3:])
            fail(f"{what}: the job was not training again 120 s after the fault: {tail}")
        time.sleep(0.1)


def kill_and_time(name, k, attempt, what):
    """Kills the job's processes on host K once worker 0 of its current attempt has
    logged 15 iterations; returns the seconds from the kill to the next attempt's first
    iteration."""
    d = WORK / name
    wait_iterations(d / "run", 15, what)
    victims = host_job_procs(k, f"{d}/")
    if not victims:
        fail(f"{what}: no process of the job on host{k}")
    t0 = time.monotonic()
    kill_all(victims)
    return training_again(name, attempt, t0, what)


def hier_done(name, restarts, what):
    """Waits for job NAME, healed with RESTARTS restarts, byte-identical to viii-ref."""
    rc = BACKGROUND[name].wait()
    if rc != 0:
        fail(f"{what}: the job did not heal (launch_hosts.sh exited {rc})", show=out_file(name, "ssh"))
    return compare_run("viii-ref", name, what, "exact", restarts)


def case_hier_reference():
    print("== (viii-ref) the host hierarchy, uninterrupted, under launch_hosts.sh")
    if hier_job("viii-ref").wait() != 0:
        fail("(viii-ref) launch_hosts.sh failed", show=out_file("viii-ref", "ssh"))
    # The hierarchy at work: 2 hosts, rows relayed within them, peer hand-offs.
    summary = load_json(WORK / "viii-ref" / "run" / "summary.json", "(viii-ref)")
    try:
        intra = summary["links"]["intra_host"]
        pulled, peer = intra["relay_rows"]["pull"], intra["peer_bytes_out"]
    except (KeyError, TypeError) as e:
        fail(f"(viii-ref) the job did not run the host hierarchy: summary.json has no {e}")
    print(f"(viii-ref) 2 hosts: {pulled} rows pulled through a host's aggregator, {peer} peer bytes within hosts")
    if not (summary.get("hosts") == 2 and pulled > 0 and peer > 0):
        fail("(viii-ref) the job did not run the host hierarchy")


def case_hier_host_killed():
    print("== (viii) the host hierarchy: host3's processes killed; the job heals itself")
    hier_job("viii")
    FOUND["viii"] = kill_and_time("viii", 3, 1, "(viii)")
    print(f"(viii) training again {FOUND['viii']} s after the kill; {hier_done('viii', 1, '(viii)')}")


def case_hier_ps_killed():
    print("== (ix) the host hierarchy: the PS host's shard killed; the job heals itself")
    hier_job("ix")
    FOUND["ix"] = kill_and_time("ix", 1, 1, "(ix)")
    print(f"(ix) training again {FOUND['ix']} s after the kill; {hier_done('ix', 1, '(ix)')}")


def case_hier_both_killed():
    print("== (x) the host hierarchy: host3's processes killed, then the PS's shard in the restarted attempt")
    hier_job("x")
    FOUND["x1"] = kill_and_time("x", 3, 1, "(x) first fault")
    FOUND["x2"] = kill_and_time("x", 1, 2, "(x) second fault")
    print(f"(x) training again {FOUND['x1']} s and {FOUND['x2']} s after the kills; {hier_done('x', 2, '(x)')}")


def case_hier_requeue():
    print("== (xi) the host hierarchy under sbatch with EMBER_MAX_RESTARTS=1: host3's processes killed, Slurm requeues")
    held, _ = requeued_job("xi-slurm", "(xi)", HIERARCHY)
    print(f"(xi) requeued once by Slurm ({held}); {compare_run('viii-ref', 'xi-slurm', '(xi)', 'exact', 1)}")


def case_hier_spare():
    """(xii) host3's link down for good: host4 takes its workers, the same ranks and the
    same host grouping, so the healed job is byte-identical to viii-ref."""
    print("== (xii) the host hierarchy: host3 lost (link down) with a spare; host4 takes its place")
    hier_job("xii", spare_hosts(), spares=1)
    wait_iterations(WORK / "xii" / "run", 20, "(xii)")
    t0 = time.monotonic()
    set_host3_link("down")
    FOUND["xii"] = training_again("xii", 1, t0, "(xii)")
    result = hier_done("xii", 1, "(xii)")  # the link stays down until the job ends
    set_host3_link("up")
    if f"replaced {NAMES[2]} by the spare {NAMES[3]};" not in read(out_file("xii", "ssh")):
        fail("(xii): no line saying host3 was replaced by host4", show=out_file("xii", "ssh"))
    print(f"(xii) host3 replaced by host4; training again {FOUND['xii']} s after the link went down; {result}")


def case_hier_host_wait():
    """(xiii) host3's link down for 30 s, no spare: the launcher waits for host3 to answer
    ssh again (--host-wait, 60 s by default) and restarts the job on the same hosts."""
    print("== (xiii) the host hierarchy: host3's link down for 30 s, no spare; the launcher waits for it")
    hier_job("xiii")
    wait_iterations(WORK / "xiii" / "run", 20, "(xiii)")
    t0 = time.monotonic()
    set_host3_link("down")
    link_back = in_background("xiii-link", ["sh", "-c", f"sleep 30; ip link set {HOST3_LINK} up"])
    FOUND["xiii"] = training_again("xiii", 1, t0, "(xiii)")
    link_back.wait()
    set_host3_link("up")
    result = hier_done("xiii", 1, "(xiii)")
    output = read(out_file("xiii", "ssh"))
    waited = f"launch_hosts: host {NAMES[2]} does not answer ssh and no spare host is left: waiting up to 60 s"
    answered = re.search(rf"({re.escape(NAMES[2])} answered again after [0-9]* s);", output)
    if waited not in output or not answered:
        fail("(xiii): no lines saying the launcher waited for host3 and it answered again", show=out_file("xiii", "ssh"))
    print(f"(xiii) {answered.group(1)}; training again {FOUND['xiii']} s after the link went down; {result}")


# ---- the run -------------------------------------------------------------------------

# Every case in the order it runs, and the case whose job it compares with.
CASES = [
    ("a", case_reference, None), ("b", case_ssh, "a"), ("c", case_sbatch, "a"),
    ("i", case_scancel, None), ("ii", case_host_killed, None), ("iv", case_link_blip, "a"),
    ("v", case_restart_ssh, "a"), ("vii", case_requeue, "a"),
    ("viii-ref", case_hier_reference, None), ("viii", case_hier_host_killed, "viii-ref"),
    ("ix", case_hier_ps_killed, "viii-ref"), ("x", case_hier_both_killed, "viii-ref"),
    ("xi", case_hier_requeue, "viii-ref"), ("vi", case_spare_ssh, "a"), ("xii", case_hier_spare, "viii-ref"),
    ("xiii", case_hier_host_wait, "viii-ref"), ("iii", case_link_down, None),
]


def chosen_cases():
    """The cases EMBER_MULTIHOST_CASES names (every case when it is unset), with those
    they compare with."""
    want = set(filter(None, os.environ.get("EMBER_MULTIHOST_CASES", "").split(",")))
    if not want:
        return CASES
    unknown = want - {name for name, _, _ in CASES}
    if unknown:
        fail(f"EMBER_MULTIHOST_CASES: no case {', '.join(sorted(unknown))}")
    want |= {needs for name, _, needs in CASES if name in want and needs}
    return [case for case in CASES if case[0] in want]


def check_can_run():
    """Skips (exit 77) where the test cannot run; takes down this test's own cluster left
    by a killed run."""
    if os.geteuid() != 0:
        skip("needs root (network namespaces, a bridge, sshd, slurmd)")
    os.environ["PATH"] += ":/usr/sbin:/sbin"
    for tool in TOOLS:
        if not shutil.which(tool):
            skip(f"{tool} is missing (bash scripts/install_deps.sh --ops)")
    if run(["unshare", "--net", "--uts", "true"]).returncode != 0:
        skip("cannot create network and UTS namespaces here")
    for b in ("ember-ps", "ember-worker", "ember-data"):
        if not os.access(BIN / b, os.X_OK):
            fail(f"{BIN / b} is missing")
    if run(["ip", "link", "show", "ember-br0"]).returncode == 0:
        # cluster_local.sh refuses to take down anyone else's cluster: then this test skips.
        run(["bash", CLUSTER, "down", "--state", STATE])
        if run(["ip", "link", "show", "ember-br0"]).returncode == 0:
            skip("a cluster is up already (bridge ember-br0): cluster_local.sh down it first")
        print(f"multihost_test: took down the cluster a killed run of this test left in {STATE}")


def bring_up():
    """The cluster, the job's hostfile (shard 0 on the first host, two workers on each
    other one) and the data set."""
    global NAMES
    print("== up: 4 hosts (the 4th a spare), unshaped", flush=True)
    if subprocess.run(["timeout", "90", "bash", str(CLUSTER), "up", "--state", str(STATE), "--hosts", "4"]).returncode:
        fail("up: cluster_local.sh up failed")
    NAMES = [line for line in read(STATE / "hostfile").splitlines() if not re.match(r"\s*#", line)]
    if len(NAMES) != 4:
        fail(f"up: {STATE}/hostfile lists {len(NAMES)} hosts, not 4")
    (WORK / "hosts").write_text("\n".join([NAMES[0], NAMES[1], NAMES[1], NAMES[2], NAMES[2]]) + "\n")
    print("== data", flush=True)
    sh([BIN / "ember-data", "gen", "--like", "criteo", "--rows", "20000", "--scale", "0.002", "--seed", "3", "--force",
        "-o", WORK / "c.tsv"], who="multihost_test: data")
    sh([BIN / "ember-data", "prep", "--format", "criteo", "--val-fraction", "0.1", "--force", "-o", WORK / "data",
        WORK / "c.tsv"], who="multihost_test: data")


def nothing_left():
    print("== nothing left")
    left = job_procs(f"{WORK}/")
    if left:
        fail(f"nothing left: Ember processes of the test still running: {' '.join(left)}")
    if run(["squeue", "-h"]).stdout.strip():
        jobs = run(["squeue", "-h", "-o", "%i %T"]).stdout.splitlines()
        fail(f"nothing left: Slurm jobs left: {','.join(jobs)}")
    if run(["bash", CLUSTER, "down", "--state", STATE]).returncode != 0:
        fail("nothing left: cluster_local.sh down failed")
    namespaces = [line for line in run(["ip", "netns", "list"]).stdout.splitlines() if "ember-host" in line]
    if namespaces:
        fail(f"nothing left: namespaces left: {' '.join(namespaces)}")
    if re.search(r"ember-(br0|v[0-9])", run(["ip", "-o", "link", "show"]).stdout):
        fail("nothing left: links left after down")
    procs = run(["pgrep", "-af", f"{WORK}/"]).stdout.strip()
    if procs:
        fail(f"nothing left: processes of the test left after down: {procs}")
    print("down: no namespace, link or process left")


def pass_line(t_start):
    """The PASS line: what every case measured, in one line."""
    f = FOUND
    counts = load_json(WORK / "a" / "run" / "summary.json", "PASS line")
    parts = [
        f"(b) ssh {f['b_s']} s and (c) sbatch {f['c_s']} s = (a) loopback {f['a_s']} s "
        f"(model and counts: rows pulled/pushed {counts['pulls']}/{counts['pushes']})",
        f"ends after scancel {f['i_end']} s (checkpoint {f['i_at']}), host3 killed {f['ii-ssh']}/{f['ii-slurm']} s, "
        f"link down 30 s {f['iii-ssh']}/{f['iii-slurm']} s (ssh/slurm",
        f"bound {BOUND_S} s, heartbeat {HB_MS} ms)",
        f"link down 2 s: same model, healed by a restart in {f['v']} s, on a spare host in {f['vi']} s, "
        f"by Slurm's requeue in {f['vii']} s",
        f"host hierarchy healed byte-identical, training again after: host3 killed {f['viii']} s, "
        f"PS killed {f['ix']} s, both {f['x1']}+{f['x2']} s, and by Slurm's requeue",
        f"link down for good (spare) {f['xii']} s, 30 s (waited for) {f['xiii']} s",
        f"an iteration of {f['stall-ssh']}/{f['stall-slurm']} s",
        f"in {int(time.monotonic() - t_start)} s",
    ]
    print("PASS: " + "; ".join(parts))


def cleanup(ok):
    """On any exit: host3's link up, the Slurm jobs cancelled, the background processes
    stopped, the cluster down, the jobs' processes outside the hosts (the reference's, a
    launcher's ssh) killed; the work directory removed, or kept on failure."""
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)  # a second signal must not cut the cleanup short
    run(["ip", "link", "set", HOST3_LINK, "up"])
    for ids in WORK.glob("*.jobid"):
        if read(ids).strip():
            run(["scancel", read(ids).strip()])
    for p in BACKGROUND.values():
        if p.poll() is None:
            p.terminate()
    run(["bash", CLUSTER, "down", "--state", STATE])
    for pid in run(["pgrep", "-f", f"{WORK}/"]).stdout.split():
        kill_all([int(pid)])
    if ok:
        shutil.rmtree(WORK, ignore_errors=True)
    else:
        print(f"(kept {WORK}; cluster logs in {STATE}/log)", file=sys.stderr, flush=True)


def on_signal(signum, _frame):
    raise SystemExit(128 + signum)  # so that cleanup() runs


def main():
    global WORK
    sys.stdout.reconfigure(line_buffering=True)
    t_start = time.monotonic()
    check_can_run()
    cases = chosen_cases()
    os.environ["SLURM_CONF"] = str(STATE / "slurm.conf")
    WORK = Path(tempfile.mkdtemp(prefix="ember-multihost-test."))
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    ok = False
    try:
        bring_up()
        for _, case, _ in cases:
            case()
        nothing_left()
        if cases == CASES:
            pass_line(t_start)
        else:
            print(f"PASS: cases {', '.join(name for name, _, _ in cases)} (EMBER_MULTIHOST_CASES) "
                  f"in {int(time.monotonic() - t_start)} s")
        ok = True
    finally:
        cleanup(ok)


if __name__ == "__main__":
    main()
