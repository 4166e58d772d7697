#!/usr/bin/env bash
# Multi-host runs for real (issue 43 part 5) on a 4-host scripts/cluster_local.sh cluster
# (unshaped links) of its own, host4 a spare that only (vi) and (xii) use:
#   1. one job (1 PS shard on host1; workers 0-1 on host2, 2-3 on host3; herald; Adagrad;
#      checkpoints every 10 iterations; a small DLRM, ITERATIONS global batches) run
#      (a) on this machine over loopback by ember_launch.py: the reference;
#      (b) across the hosts by launch_hosts.sh over ssh, from here (--ssh-config
#          STATE/ssh_config) with a hostfile of names (STATE/hostfile's);
#      (c) by `sbatch --nodes=3 ember.sbatch` on the cluster's Slurm.
#      (b) and (c) must give (a)'s model (worker 0's --dump-dir: dense.bin and rows.bin
#      within 1e-5) and (a)'s counts (summary.json: rows pulled, pushed by kind, cache
#      hits, bytes each way).
#   2. faults; each must end every Ember process of the job on every host within
#      BOUND_S of it: the heartbeat timeout (HB_MS), the workers' 3 s grace after the
#      control plane fails the job (ember-worker: "did not stop within 3000 ms"), and 3 s;
#      and the control plane's failure file (OUT/failure.json) must name a lost member:
#      (i)   scancel of a running sbatch job: it stops at a whole checkpoint;
#      (ii)  host3 killed: kill -9 of the job's ember-* processes in host3's namespace,
#            under launch_hosts.sh and under sbatch: fails naming worker 2 or 3;
#      (iii) host3's link down for 30 s (ember-v3, the bridge's end of its veth), under
#            launch_hosts.sh and under sbatch: fails naming worker 2 or 3, host3's
#            workers log that they lost the coordinator; the Slurm job ends once the
#            link is back;
#      (iv)  host3's link down for 2 s mid-run, under launch_hosts.sh and under sbatch:
#            the job completes with the reference's model and counts.
#   3. jobs that heal themselves, each ending with the reference's model:
#      (v)   host3's processes killed under launch_hosts.sh --max-restarts 1;
#      (vi)  host3's link down for good under launch_hosts.sh --max-restarts 1 --spares 1:
#            host4 takes host3's workers, ranks kept;
#      (vii) host3's processes killed under sbatch with EMBER_MAX_RESTARTS=1: Slurm
#            requeues the job (the test lets the requeued job start at once).
#   4. with the host hierarchy (--host-aggregation --host-allocation --peer-sync,
#      lookahead 3, prefetch), under launch_hosts.sh --max-restarts 2, each job ending
#      byte-identical to the same job uninterrupted (viii-ref), with the seconds from each
#      loss to training again (the test's clock: the kill to the next attempt's first
#      iteration) and the iterations recomputed:
#      (viii) host3's processes killed; (ix) the PS host's shard killed; (x) host3's
#      processes killed, then the PS's shard in the restarted attempt; (xi) host3's
#      processes killed under sbatch with EMBER_MAX_RESTARTS=1 (Slurm's requeue); and
#      (xii) host3's link down for good with --spares 1: host4 takes its workers; and
#      (xiii) host3's link down for 30 s with no spare: the launcher waits for host3 to
#      answer again (--host-wait) and restarts the job on the same hosts.
#   They run in the order i, ii, iv, v, vii, viii-xi, vi, xii, xiii, iii: after a link down
#   slurmctld may find host3 not responding or set it DOWN at a later ping, for a while
#   (every sbatch waits for the 4 nodes idle, but a job started before that ping has its
#   steps held back).
#   Nothing is left: no job process, no Slurm job, and after `down` no namespace or link.
# Skips (exit 77, the reason printed) when not root, when a package is missing, when
# namespaces cannot be made, or when a cluster is up already (bridge ember-br0). The
# cluster goes down on any exit. About 11 minutes on the 2-core development host.
#   tests/cluster/multihost_test.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin="$(cd "${1:?usage: multihost_test.sh BIN_DIR SOURCE_DIR}" && pwd)"
src="$(cd "${2:?usage: multihost_test.sh BIN_DIR SOURCE_DIR}" && pwd)"
HB_MS=${HB_MS:-5000}
BOUND_S=$(( HB_MS / 1000 + 3 + 3 ))
ITERATIONS=${ITERATIONS:-150}
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
[ "$EUID" -eq 0 ] || skip "needs root (network namespaces, a bridge, sshd, slurmd)"
PATH="$PATH:/usr/sbin:/sbin"
for b in ip tc unshare nsenter mountpoint sshd ssh ssh-keygen munged slurmctld slurmd sinfo srun sbatch scancel squeue python3; do
  command -v "$b" > /dev/null || skip "$b is missing (bash scripts/install_deps.sh --ops)"
done
unshare --net --uts true 2> /dev/null || skip "cannot create network and UTS namespaces here"
for b in ember-ps ember-worker ember-data; do [ -x "$bin/$b" ] || fail "$bin/$b is missing"; done

t_start=$SECONDS
cl="$src/scripts/cluster_local.sh"
state="${EMBER_CLUSTER_JOBS_TEST_DIR:-/var/lib/ember-cluster-jobs-test}"
if ip link show ember-br0 > /dev/null 2>&1; then
  # This test's own cluster, left by a run killed before its cleanup, is taken down
  # (cluster_local.sh refuses anyone else's: then this test skips).
  bash "$cl" down --state "$state" > /dev/null 2>&1 || true
  ip link show ember-br0 > /dev/null 2>&1 && skip "a cluster is up already (bridge ember-br0): cluster_local.sh down it first"
  echo "multihost_test: took down the cluster a killed run of this test left in $state"
fi
export SLURM_CONF="$state/slurm.conf"
work="$(mktemp -d /tmp/ember-multihost-test.XXXXXX)"
bg_pids=()
cleanup() {
  local rc=$? p j
  ip link set ember-v3 up 2> /dev/null || true
  for j in "$work"/*.jobid; do [ -s "$j" ] && { scancel "$(cat "$j")" 2> /dev/null || true; }; done
  for p in "${bg_pids[@]}"; do kill "$p" 2> /dev/null || true; done
  bash "$cl" down --state "$state" > /dev/null 2>&1 || true
  # Processes of the test's jobs outside the hosts (the reference's, a launcher's ssh).
  for p in $(pgrep -f "$work/" || true); do kill -KILL "$p" 2> /dev/null || true; done
  if [ $rc -eq 0 ]; then rm -rf "$work"; else echo "(kept $work; cluster logs in $state/log)" >&2; fi
}
trap cleanup EXIT
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }

# The job's ember-* processes in host K's network namespace (TAG: a path of the job's).
host_job_procs() {  # K TAG
  local p
  for p in $(ip netns pids "ember-host$1"); do
    case "$(cat "/proc/$p/comm" 2> /dev/null)" in ember-*) ;; *) continue ;; esac
    if tr '\0' ' ' < "/proc/$p/cmdline" 2> /dev/null | grep -qF "$2"; then echo "$p"; fi
  done
}

# The ember-ps and ember-worker processes of a job (their command line names TAG, a path
# of the job's), wherever they run: "host3:PID:ember-worker" lines (root: this namespace).
job_procs() {
  python3 - "$1" <<'EOF'
import os, sys
tag = sys.argv[1]
ns = {}
for k in range(1, 4):
    try:
        ns[os.stat(f"/run/netns/ember-host{k}").st_ino] = f"host{k}"
    except OSError:
        pass
for p in os.listdir("/proc"):
    if not p.isdigit():
        continue
    try:
        comm = open(f"/proc/{p}/comm").read().strip()
        if comm not in ("ember-ps", "ember-worker"):
            continue
        if tag not in open(f"/proc/{p}/cmdline").read().replace("\0", " "):
            continue
        if open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
            continue
        where = ns.get(os.stat(f"/proc/{p}/ns/net").st_ino, "root")
    except OSError:
        continue
    print(f"{where}:{p}:{comm}")
EOF
}
# Waits until the job of TAG has no process left; prints the seconds since T0, or fails
# naming what is left BOUND_S after T0.
wait_gone() {  # TAG T0 WHAT
  local tag="$1" t0="$2" what="$3" left
  while :; do
    left="$(job_procs "$tag")"
    [ -z "$left" ] && { since "$t0"; return 0; }
    python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) - float(sys.argv[1]) > $BOUND_S else 1)" "$t0" "$(now)" &&
      fail "$what: $(echo "$left" | wc -l) Ember process(es) still running $BOUND_S s after the fault: $(echo "$left" | paste -sd' ')"
    sleep 0.1
  done
}
# Iterations worker 0 of the job writing OUT has logged (its metrics).
iterations_of() { local n; n="$(grep -cs '"iteration"' "$1/w0.jsonl")" || true; echo "${n:-0}"; }
# Waits until worker 0 of the job writing OUT has logged N iterations (its metrics).
wait_iterations() {  # OUT N WHAT
  for _ in $(seq 1200); do
    [ "$(iterations_of "$1")" -ge "$2" ] && return 0
    sleep 0.05
  done
  fail "$3: worker 0 did not reach iteration $2 within 60 s"
}
# Who names the lost member (one of host3's workers, 2 or 3): the control plane's failure
# file, else (ALSO, Slurm's output) srun, whose --kill-on-bad-exit stops the other
# workers at once: one of them may then fall silent first by the coordinator's clock.
lost_member() {  # OUT WHAT [ALSO]
  [ -s "$1/failure.json" ] || fail "$2: no failure file ($1/failure.json)"
  python3 - "$1/failure.json" "$2" "${3:-}" <<'EOF' || exit 1
import json, re, sys
f = json.load(open(sys.argv[1]))
word = f"{f.get('member')}: {f.get('cause')}"
if f.get("member") in ("worker 2", "worker 3"):
    print(f"the control plane: {word}")
    sys.exit(0)
m = re.search(r"srun: error: host3: tasks? [0-9-]+: Killed", open(sys.argv[3]).read()) if sys.argv[3] else None
if m and "2" in m.group(0) and "3" in m.group(0):
    print(f"{m.group(0)} (the control plane: {word})")
    sys.exit(0)
print(f"FAIL: {sys.argv[2]}: the lost member is not named: the control plane names {word}, not worker 2 or 3 (host3's)", file=sys.stderr)
sys.exit(1)
EOF
}
wait_job_gone() {  # JOBID WHAT SECONDS
  for _ in $(seq $(( $3 * 10 ))); do
    [ -z "$(squeue -h -j "$1" 2> /dev/null)" ] && return 0
    sleep 0.1
  done
  fail "$2: Slurm job $1 still in the queue $3 s on: $(squeue -h -j "$1" -o '%i %T %R' 2> /dev/null)"
}

echo "== up: 4 hosts (the 4th a spare), unshaped"
timeout 90 bash "$cl" up --state "$state" --hosts 4 || fail "cluster_local.sh up failed"
# The job's hostfile, by name: shard 0 on the first host, two workers on each other one.
mapfile -t names < <(grep -v '^\s*#' "$state/hostfile")
[ "${#names[@]}" -eq 4 ] || fail "$state/hostfile lists ${#names[@]} hosts, not 4"
printf '%s\n' "${names[0]}" "${names[1]}" "${names[1]}" "${names[2]}" "${names[2]}" > "$work/hosts"

echo "== data"
"$bin/ember-data" gen --like criteo --rows 20000 --scale 0.002 --seed 3 --force -o "$work/c.tsv" > /dev/null
"$bin/ember-data" prep --format criteo --val-fraction 0.1 --force -o "$work/data" "$work/c.tsv" > /dev/null
ps_args="--dim 8 --optimizer adagrad --lr 0.05"
wargs=(--model dlrm --bottom-mlp 32-16 --top-mlp 32-16 --batch-per-worker 64 --eval-every 0)

# (b): launch_hosts.sh from this namespace. NAME ITERATIONS; output in $work/NAME.
ssh_job() {
  local d="$work/$1"
  timeout 180 bash "$src/scripts/launch_hosts.sh" --ssh-config "$state/ssh_config" --hostfile "$work/hosts" --bin "$bin" \
    --ps 1 --workers 4 --dataset "$work/data" --policy herald --out "$d/run" \
    --ps-args "$ps_args --heartbeat-timeout-ms $HB_MS --checkpoint-dir $d/ckpt/ps --checkpoint-every 10" \
    -- "${wargs[@]}" --iterations "$2" --heartbeat-timeout-ms "$HB_MS" --checkpoint-dir "$d/ckpt/dense" --dump-dir "$d/dump" \
    > "$work/$1.launcher" 2>&1
}
# The 4 nodes idle: slurmctld sets a node it has not heard from for SlurmdTimeout DOWN,
# at its next ping, which may come after the node is back (a link down for a while).
nodes_idle() {  # WHAT
  for _ in $(seq 900); do
    [ "$(sinfo -h -N -o '%N %T' | awk '$2 == "idle"' | wc -l)" -eq 4 ] && return 0
    sleep 0.1
  done
  fail "$1: the 4 nodes are not all idle after 90 s: $(sinfo -h -N -o '%N %T' | paste -sd,)"
}
# (c): ember.sbatch. NAME ITERATIONS [sbatch options]; the job id in $work/NAME.jobid;
# slurm_extra: more worker arguments.
slurm_extra=()
slurm_job() {
  local d="$work/$1" name="$1" iters="$2"; shift 2
  nodes_idle "$name"
  (cd "$work" && EMBER_ROOT="$src" EMBER_BIN="$bin" EMBER_OUT="$d/run" EMBER_DUMP_DIR="$d/dump" EMBER_CHECKPOINT_DIR="$d/ckpt" \
    EMBER_CHECKPOINT_EVERY=10 EMBER_HEARTBEAT_TIMEOUT_MS="$HB_MS" EMBER_PS_ARGS="$ps_args" \
    sbatch --parsable --nodes=3 --exclude="${names[3]}" -o "$work/$name.out" "$@" "$src/scripts/ember.sbatch" "$work/data" herald 1 4 \
    -- "${wargs[@]}" "${slurm_extra[@]}" --iterations "$iters" > "$work/$name.jobid")
}

echo "== (a) the reference: ember_launch.py on this machine, $ITERATIONS iterations"
t0=$SECONDS
timeout 180 python3 "$src/scripts/ember_launch.py" --bin "$bin" --dataset "$work/data" --ps 1 --workers 4 --policy herald -q \
  --out "$work/a/run" --dump-dir "$work/a/dump" --ps-args "$ps_args" --checkpoint-dir "$work/a/ckpt" --checkpoint-every 10 \
  --heartbeat-timeout-ms "$HB_MS" --timeout 150 -- "${wargs[@]}" --iterations "$ITERATIONS" || fail "(a) ember_launch.py failed"
a_s=$((SECONDS - t0))

# Run NAME's model against run REF's (both under $work): MODE `counts`, within 1e-5 and
# the same counts; `model`, within 1e-5 alone (a restarted job's counts cover its last
# attempt); `exact`, byte-identical with RESTARTS restarts counted. Prints what it found.
compare_run() {  # REF NAME WHAT MODE [RESTARTS]
  python3 - "$work/$1" "$work/$2" "$3" "$4" "${5:-0}" <<'EOF' || exit 1
import json, sys
from array import array
from pathlib import Path
ref, run, what, mode, restarts = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
def bad(msg):
    print(f"FAIL: {what}: {msg}", file=sys.stderr)
    sys.exit(1)
worst = 0.0
for name in ("dense.bin", "rows.bin"):
    try:
        a, b = (Path(d, "dump", name).read_bytes() for d in (ref, run))
    except OSError as e:
        bad(f"no model: {e}")
    if len(a) != len(b):
        bad(f"{name}: {len(b)} bytes against the reference's {len(a)}")
    if a != b:
        if mode == "exact":
            bad(f"{name} is not byte-identical to the uninterrupted job's")
        # float32 arrays (docs/training.md, --dump-dir); rows.bin's keys compare as floats too
        fa, fb = array("f", a[:len(a) // 4 * 4]), array("f", b[:len(b) // 4 * 4])
        d = max(abs(x - y) for x, y in zip(fa, fb))
        if not d <= 1e-5:
            bad(f"{name}: max abs difference {d} from the reference's (more than 1e-5)")
        worst = max(worst, d)
sb = json.loads(Path(run, "run", "summary.json").read_text())
if mode == "exact":
    if sb.get("restart_count") != restarts:
        bad(f"{sb.get('restart_count')} restart(s) counted, not {restarts}: {sb.get('restarts')}")
    lost = ", ".join(f"{r['iterations_lost']} from iteration {r['resumed_at']}" for r in sb["restarts"])
    rec = sb["restarts"][-1].get("recovery_s") or 0
    print(f"byte-identical to the uninterrupted job; iterations recomputed {sb['iterations_recomputed']} ({lost}); "
          f"worker 0: training {rec:.1f} s after the launcher saw the last loss")
    sys.exit(0)
if mode == "model":
    print(f"model: max abs difference {worst:g} ({'byte-equal' if worst == 0 else 'within 1e-5'})")
    sys.exit(0)
keys = ("iterations", "pulls", "pushes", "push_grad", "push_value", "push_evict", "hits", "bytes_out", "bytes_in")
sa = json.loads(Path(ref, "run", "summary.json").read_text())
diff = [f"{k} {sb.get(k)} (reference {sa[k]})" for k in keys if sb.get(k) != sa[k]]
if diff:
    bad("counts differ: " + ", ".join(diff))
print(f"model: max abs difference {worst:g} ({'byte-equal' if worst == 0 else 'within 1e-5'}); rows pulled {sb['pulls']}, "
      f"pushed {sb['pushes']}, hits {sb['hits']} as the reference")
EOF
}
# Run NAME against (a), the reference: `same_as_reference NAME WHAT [model]`.
same_as_reference() { compare_run a "$1" "$2" "${3:-counts}"; }

echo "== (b) launch_hosts.sh over ssh, hostfile of names ($(paste -sd' ' "$work/hosts"))"
t0=$SECONDS
ssh_job b "$ITERATIONS" || { cat "$work/b.launcher" >&2; fail "(b) launch_hosts.sh failed"; }
b_s=$((SECONDS - t0))
cat "$work/b.launcher"
grep -q "2 hosts: ${names[1]} (workers 0-1), ${names[2]} (workers 2-3)" "$work/b/run/worker0.log" ||
  fail "(b) worker 0 does not place workers 0-1 on ${names[1]} and 2-3 on ${names[2]}: $(grep -m1 'hosts:' "$work/b/run/worker0.log")"
grep -q "joining the job at tcp://10.77.0.11:" "$work/b/run/worker3.log" || fail "(b) worker 3 did not join at host1's address"
b_model="$(same_as_reference b "(b) launch_hosts.sh")"
echo "(b) $b_model"

echo "== (c) sbatch --nodes=3 ember.sbatch"
t0=$SECONDS
slurm_job c "$ITERATIONS" --wait || { cat "$work"/c.out >&2; fail "(c) the sbatch job failed"; }
c_s=$((SECONDS - t0))
cat "$work/c.out"
grep -q "4 worker(s) on host2 host3" "$work/c.out" || fail "(c) the workers did not run on host2 and host3"
c_model="$(same_as_reference c "(c) ember.sbatch")"
echo "(c) $c_model"

echo "== (i) scancel of a running sbatch job (bound $BOUND_S s)"
slurm_job i 100000
job="$(cat "$work/i.jobid")"
wait_iterations "$work/i/run" 20 "(i)"
n="$(job_procs "$work/i/" | wc -l)"
[ "$n" -eq 5 ] || fail "(i) the job has $n Ember processes, not 5: $(job_procs "$work/i/" | paste -sd' ')"
t0=$(now)
scancel "$job"
i_end="$(wait_gone "$work/i/" "$t0" "(i) scancel")"
wait_job_gone "$job" "(i) scancel" 30
cat "$work/i.out"
grep -q "CANCELLED" "$work/i.out" || fail "(i) Slurm's output does not say the job was cancelled"
i_at="$(python3 - "$work/i" <<'EOF'
import json, sys
from pathlib import Path
d = Path(sys.argv[1])
at = json.loads((d / "run" / "summary.json").read_text())["stopped_at"]
assert at > 0, "summary.json has no stopped_at"
assert (d / "ckpt" / "ps" / f"iter-{at:09d}" / "manifest.json").exists(), f"checkpoint {at} is not whole"
dense = list((d / "ckpt" / "dense").glob(f"worker-*-iter-{at:09d}.pt"))
assert len(dense) == 4, f"dense state of {len(dense)} workers at iteration {at}"
print(at)
EOF
)" || fail "(i) the job did not stop at a whole checkpoint"
echo "(i) scancel: every Ember process gone after $i_end s; stopped at iteration $i_at, a whole checkpoint"

host3_job_procs() { host_job_procs 3 "$1"; }
start_job() {  # KIND NAME ITERATIONS: in the background; the launcher's pid or the job id
  if [ "$1" = ssh ]; then
    ssh_job "$2" "$3" &
    echo $! > "$work/$2.pid"
    bg_pids+=("$(cat "$work/$2.pid")")
  else
    slurm_job "$2" "$3"
  fi
}
# Waits for the launcher of a failed job; checks that it says the control plane's word.
job_failed() {  # KIND NAME WHAT
  local rc=0
  if [ "$1" = ssh ]; then
    wait "$(cat "$work/$2.pid")" || rc=$?
    [ "$rc" -eq 1 ] || { cat "$work/$2.launcher" >&2; fail "$3: launch_hosts.sh exited $rc, not 1"; }
    grep -q "the job failed; by the control plane: " "$work/$2.launcher" ||
      { cat "$work/$2.launcher" >&2; fail "$3: launch_hosts.sh does not give the control plane's word"; }
  else
    wait_job_gone "$(cat "$work/$2.jobid")" "$3" 60
    grep -q "the job failed; by the control plane: " "$work/$2.out" ||
      { cat "$work/$2.out" >&2; fail "$3: ember.sbatch does not give the control plane's word"; }
  fi
}

declare -A ends=() stall=()
for kind in ssh slurm; do
  name="ii-$kind"
  echo "== (ii) host3 killed under $kind (kill -9 of the job's ember-* processes there; bound $BOUND_S s)"
  start_job "$kind" "$name" 100000
  wait_iterations "$work/$name/run" 20 "(ii) $kind"
  victims="$(host3_job_procs "$work/$name/")"
  [ "$(echo "$victims" | wc -w)" -eq 2 ] || fail "(ii) $kind: host3 runs $(echo "$victims" | wc -w) of the job's processes, not 2"
  t0=$(now)
  # shellcheck disable=SC2086  # one pid a word
  kill -KILL $victims
  ends[ii-$kind]="$(wait_gone "$work/$name/" "$t0" "(ii) $kind")"
  job_failed "$kind" "$name" "(ii) $kind"
  also=""
  [ "$kind" = ssh ] || also="$work/$name.out"
  member="$(lost_member "$work/$name/run" "(ii) $kind" "$also")"
  echo "(ii) $kind: every Ember process gone after ${ends[ii-$kind]} s; named by $member"
done

for kind in ssh slurm; do
  name="iv-$kind"
  echo "== (iv) host3's link down for 2 s mid-run under $kind: nothing changes"
  t0s=$SECONDS
  start_job "$kind" "$name" "$ITERATIONS"
  wait_iterations "$work/$name/run" 20 "(iv) $kind"
  ip link set ember-v3 down
  at="$(iterations_of "$work/$name/run")"
  sleep 2
  ip link set ember-v3 up
  [ "$at" -lt "$ITERATIONS" ] || fail "(iv) $kind: the job had finished ($at iterations) before the link went down"
  if [ "$kind" = ssh ]; then
    wait "$(cat "$work/$name.pid")" || { cat "$work/$name.launcher" >&2; fail "(iv) ssh: the job failed"; }
  else
    wait_job_gone "$(cat "$work/$name.jobid")" "(iv) slurm" 120
    if [ ! -s "$work/$name/run/summary.json" ] || grep -q "the job failed" "$work/$name.out"; then
      cat "$work/$name.out" >&2
      fail "(iv) slurm: the job failed"
    fi
  fi
  ends[iv-$kind]=$((SECONDS - t0s))
  model="$(same_as_reference "$name" "(iv) $kind")"
  # The longest iteration (worker 0's iter_ms): the one the link's 2 s fell in.
  stall[$kind]="$(python3 -c "import json, sys
print(f'{max(j[\"iter_ms\"] for j in map(json.loads, open(sys.argv[1])) if \"iter_ms\" in j) / 1000:.1f}')" "$work/$name/run/w0.jsonl")"
  echo "(iv) $kind: link down at iteration $at, the job completed in ${ends[iv-$kind]} s, its longest iteration ${stall[$kind]} s; $model"
done

# What a healed job's summary.json counts: one restart, the iterations recomputed, and
# the seconds from the loss to training again (worker 0's, from its --restart-record).
restart_counted() {  # RUN_DIR WHAT: prints "recovery X s, N iteration(s) recomputed"
  python3 - "$1/summary.json" "$2" << 'PY' || fail "$2: summary.json does not count the restart"
import json, sys
s = json.load(open(sys.argv[1]))
r = (s.get("restarts") or [{}])[-1]
ok = s.get("restart_count") == 1 and s.get("iterations_recomputed", -1) >= 0 and (r.get("recovery_s") or 0) > 0
print(f"recovery {r.get('recovery_s')} s, {s.get('iterations_recomputed')} iteration(s) recomputed")
sys.exit(0 if ok else print(f"{sys.argv[2]}: {json.dumps(s.get('restarts'))}", file=sys.stderr) or 1)
PY
}

# (v) launch_hosts.sh --max-restarts 1: host3's processes killed once; the job restarts
# by itself from the newest checkpoint and ends with the reference model.
name="v-ssh"
echo "== (v) host3's processes killed under launch_hosts.sh --max-restarts 1: the job heals itself"
d="$work/$name"
t0s=$SECONDS
timeout 300 bash "$src/scripts/launch_hosts.sh" --ssh-config "$state/ssh_config" --hostfile "$work/hosts" --bin "$bin" \
  --ps 1 --workers 4 --dataset "$work/data" --policy herald --out "$d/run" --ps-args "$ps_args --heartbeat-timeout-ms $HB_MS" \
  --checkpoint-dir "$d/ckpt" --checkpoint-every 10 --max-restarts 1 \
  -- "${wargs[@]}" --iterations "$ITERATIONS" --heartbeat-timeout-ms "$HB_MS" --dump-dir "$d/dump" > "$work/$name.launcher" 2>&1 &
pid=$!
bg_pids+=("$pid")
wait_iterations "$d/run" 20 "(v)"
victims="$(host3_job_procs "$d/")"
[ -n "$victims" ] || fail "(v): no process of the job on host3"
# shellcheck disable=SC2086  # one pid a word
kill -KILL $victims
wait "$pid" || { cat "$work/$name.launcher" >&2; fail "(v): the job did not heal (launch_hosts.sh failed)"; }
grep -q "launch_hosts: restart 1/1: from $d/ckpt/ps/iter-" "$work/$name.launcher" ||
  { cat "$work/$name.launcher" >&2; fail "(v): no restart line naming the checkpoint"; }
ends[v]=$((SECONDS - t0s))
model="$(same_as_reference "$name" "(v) healed" model)"
restart="$(grep "launch_hosts: restart 1/1" "$work/$name.launcher" | sed 's/^launch_hosts: //')"
counted="$(restart_counted "$d/run" "(v)")"
echo "(v) healed in one restart ($restart); $counted; the job completed in ${ends[v]} s; $model"

# (vii) ember.sbatch with EMBER_MAX_RESTARTS=1: host3's processes killed once; the script
# has Slurm requeue the job (the same id), which resumes from its newest checkpoint.
requeued_job() {  # NAME WHAT: prints "pending again N s after the start; ..."
  local name="$1" what="$2" d="$work/$1" t0s=$SECONDS jobid victims held_s
  EMBER_MAX_RESTARTS=1 slurm_job "$name" "$ITERATIONS" --requeue --open-mode=append
  wait_iterations "$d/run" 20 "$what"
  victims="$(host3_job_procs "$d/")"
  [ -n "$victims" ] || fail "$what: no process of the job on host3"
  # shellcheck disable=SC2086  # one pid a word
  kill -KILL $victims
  # Slurm holds a requeued job back for a while (about 2 minutes here) before it may
  # start again: the test lets it start 3 s later. Not at once: slurmd revokes the old
  # run's credential at the requeue's second, and a new run whose credential dates from
  # that same second is killed as "non-startable batch job: Job credential revoked".
  jobid="$(cat "$work/$name.jobid")"
  for _ in $(seq 600); do
    [ "$(squeue -h -j "$jobid" -o '%T' 2> /dev/null)" = PENDING ] && grep -q "restart 1/1: requeued" "$work/$name.out" && break
    sleep 0.1
  done
  held_s=$(( SECONDS - t0s ))
  scontrol update JobId="$jobid" StartTime=now+3 2> /dev/null || true
  wait_job_gone "$jobid" "$what" 240
  grep -q "ember.sbatch: restart 1/1: requeued" "$work/$name.out" || { cat "$work/$name.out" >&2; fail "$what: no requeue line"; }
  [ -s "$d/run/summary.json" ] || { cat "$work/$name.out" >&2; fail "$what: the requeued job wrote no summary"; }
  echo "pending again ${held_s} s after the start; the job completed in $((SECONDS - t0s)) s"
}
name="vii-slurm"
echo "== (vii) host3's processes killed under sbatch with EMBER_MAX_RESTARTS=1: Slurm requeues the job"
requeued_job "$name" "(vii)" > "$work/$name.result"
model="$(same_as_reference "$name" "(vii) requeued" model)"
counted="$(restart_counted "$work/$name/run" "(vii)")"
ends[vii]="$(sed -n 's/.*completed in \([0-9]*\) s.*/\1/p' "$work/$name.result")"
echo "(vii) requeued once by Slurm ($(cat "$work/$name.result")); $counted; $model"

# (viii)-(x): the host hierarchy for rows under launch_hosts.sh --max-restarts 2.
hier=(--host-aggregation --host-allocation --peer-sync --lookahead 3 --prefetch)
hier_job() {  # NAME [HOSTFILE [LAUNCHER ARGS...]]: in the background, its launcher's pid in $work/NAME.pid
  local name="$1" d="$work/$1" hostfile="${2:-$work/hosts}"
  shift $(($# < 2 ? $# : 2))
  timeout 400 bash "$src/scripts/launch_hosts.sh" --ssh-config "$state/ssh_config" --hostfile "$hostfile" "$@" --bin "$bin" \
    --ps 1 --workers 4 --dataset "$work/data" --policy herald --out "$d/run" --ps-args "$ps_args --heartbeat-timeout-ms $HB_MS" \
    --checkpoint-dir "$d/ckpt" --checkpoint-every 10 --max-restarts 2 \
    -- "${wargs[@]}" "${hier[@]}" --iterations "$ITERATIONS" --heartbeat-timeout-ms "$HB_MS" --dump-dir "$d/dump" \
    > "$work/$name.launcher" 2>&1 &
  echo $! > "$work/$name.pid"
  bg_pids+=("$(cat "$work/$name.pid")")
}
# Waits for restart ATTEMPT's line and the next attempt's first iteration, 120 s at most;
# prints the seconds since T0 (the fault).
training_again() {  # NAME ATTEMPT T0 WHAT
  for _ in $(seq 1200); do  # 120 s
    # The restart line comes after the failed attempt's logs moved away.
    grep -q "launch_hosts: restart $2/" "$work/$1.launcher" && [ "$(iterations_of "$work/$1/run")" -ge 1 ] && { since "$3"; return 0; }
    sleep 0.1
  done
  fail "$4: the job was not training again 120 s after the fault: $(tail -n 3 "$work/$1.launcher")"
}
# Kills the job's processes on host K once worker 0 of its current attempt has logged 15
# iterations; then waits for the next attempt's first iteration. Prints the seconds from
# the kill to it.
kill_and_time() {  # NAME K ATTEMPT WHAT
  local d="$work/$1" victims t0
  wait_iterations "$d/run" 15 "$4"
  victims="$(host_job_procs "$2" "$d/")"
  [ -n "$victims" ] || fail "$4: no process of the job on host$2"
  t0=$(now)
  # shellcheck disable=SC2086  # one pid a word
  kill -KILL $victims
  training_again "$1" "$3" "$t0" "$4"
}
# The job healed with RESTARTS restarts, byte-identical to viii-ref; what it counted in
# $work/NAME.result. (Not in a command substitution: `wait` needs this shell.)
hier_done() {  # NAME RESTARTS WHAT
  local rc=0
  wait "$(cat "$work/$1.pid")" || rc=$?
  [ "$rc" -eq 0 ] || { cat "$work/$1.launcher" >&2; fail "$3: the job did not heal (launch_hosts.sh exited $rc)"; }
  hier_same "$@"
}
# Run NAME byte-identical to viii-ref, the hierarchy's uninterrupted job, with RESTARTS.
hier_same() { compare_run viii-ref "$1" "$3" exact "$2"; }  # NAME RESTARTS WHAT

echo "== (viii-ref) the host hierarchy, uninterrupted, under launch_hosts.sh"
hier_job viii-ref
rc=0
wait "$(cat "$work/viii-ref.pid")" || rc=$?
[ "$rc" -eq 0 ] || { cat "$work/viii-ref.launcher" >&2; fail "(viii-ref) launch_hosts.sh failed"; }
# The hierarchy at work: 2 hosts, rows relayed within them, peer hand-offs.
python3 - "$work/viii-ref/run/summary.json" << 'PY' || fail "(viii-ref) the job did not run the host hierarchy"
import json, sys
s = json.load(open(sys.argv[1]))
intra = s["links"]["intra_host"]
ok = s["hosts"] == 2 and intra["relay_rows"]["pull"] > 0 and intra["peer_bytes_out"] > 0
print(f"(viii-ref) 2 hosts: {intra['relay_rows']['pull']} rows pulled through a host's aggregator, {intra['peer_bytes_out']} peer bytes within hosts")
sys.exit(0 if ok else 1)
PY
declare -A healed=()
echo "== (viii) the host hierarchy: host3's processes killed; the job heals itself"
hier_job viii
healed[viii]="$(kill_and_time viii 3 1 "(viii)")"
hier_done viii 1 "(viii)" > "$work/viii.result"
echo "(viii) training again ${healed[viii]} s after the kill; $(cat "$work/viii.result")"
echo "== (ix) the host hierarchy: the PS host's shard killed; the job heals itself"
hier_job ix
healed[ix]="$(kill_and_time ix 1 1 "(ix)")"
hier_done ix 1 "(ix)" > "$work/ix.result"
echo "(ix) training again ${healed[ix]} s after the kill; $(cat "$work/ix.result")"
echo "== (x) the host hierarchy: host3's processes killed, then the PS's shard in the restarted attempt"
hier_job x
healed[x1]="$(kill_and_time x 3 1 "(x) first fault")"
healed[x2]="$(kill_and_time x 1 2 "(x) second fault")"
hier_done x 2 "(x)" > "$work/x.result"
echo "(x) training again ${healed[x1]} s and ${healed[x2]} s after the kills; $(cat "$work/x.result")"
echo "== (xi) the host hierarchy under sbatch with EMBER_MAX_RESTARTS=1: host3's processes killed, Slurm requeues"
slurm_extra=("${hier[@]}")
requeued_job xi-slurm "(xi)" > "$work/xi-slurm.held"
slurm_extra=()
hier_same xi-slurm 1 "(xi)" > "$work/xi-slurm.result"
echo "(xi) requeued once by Slurm ($(cat "$work/xi-slurm.held")); $(cat "$work/xi-slurm.result")"

# (vi) host3's link down for good under launch_hosts.sh --max-restarts 1 --spares 1: the
# restart finds host3 gone (ssh), puts its workers on the spare host4, same ranks, and
# the job ends with the reference model. After every sbatch job: slurmctld may find host3
# not responding at a ping in the outage and then hold a new job's steps back.
name="vi-ssh"
echo "== (vi) host3 lost (link down) under launch_hosts.sh --max-restarts 1 --spares 1: host4 takes its place"
d="$work/$name"
printf '%s\n' "${names[0]}" "${names[1]}" "${names[1]}" "${names[2]}" "${names[2]}" "${names[3]}" > "$work/hosts-spare"
t0s=$SECONDS
timeout 300 bash "$src/scripts/launch_hosts.sh" --ssh-config "$state/ssh_config" --hostfile "$work/hosts-spare" --spares 1 --bin "$bin" \
  --ps 1 --workers 4 --dataset "$work/data" --policy herald --out "$d/run" --ps-args "$ps_args --heartbeat-timeout-ms $HB_MS" \
  --checkpoint-dir "$d/ckpt" --checkpoint-every 10 --max-restarts 1 \
  -- "${wargs[@]}" --iterations "$ITERATIONS" --heartbeat-timeout-ms "$HB_MS" --dump-dir "$d/dump" > "$work/$name.launcher" 2>&1 &
pid=$!
bg_pids+=("$pid")
wait_iterations "$d/run" 20 "(vi)"
ip link set ember-v3 down
rc=0
wait "$pid" || rc=$?
ip link set ember-v3 up
[ "$rc" -eq 0 ] || { cat "$work/$name.launcher" >&2; fail "(vi): the job did not heal (launch_hosts.sh exited $rc)"; }
grep -q "replaced ${names[2]} by the spare ${names[3]};" "$work/$name.launcher" ||
  { cat "$work/$name.launcher" >&2; fail "(vi): no line saying host3 was replaced by host4"; }
[ "$(paste -sd' ' "$d/run/hosts-attempt-2")" = "${names[0]} ${names[1]} ${names[1]} ${names[3]} ${names[3]}" ] ||
  fail "(vi): the restart's hosts are $(paste -sd' ' "$d/run/hosts-attempt-2"), not host3's workers on the spare"
ends[vi]=$((SECONDS - t0s))
model="$(same_as_reference "$name" "(vi) on a spare host" model)"
echo "(vi) host3 replaced by host4 at the restart; the job completed in ${ends[vi]} s; $model"

# (xii) the same under the host hierarchy: host4 takes host3's workers, the same ranks and
# the same host grouping, so the healed job is byte-identical to viii-ref.
echo "== (xii) the host hierarchy: host3 lost (link down) with a spare; host4 takes its place"
hier_job xii "$work/hosts-spare" --spares 1
wait_iterations "$work/xii/run" 20 "(xii)"
t0=$(now)
ip link set ember-v3 down
healed[xii]="$(training_again xii 1 "$t0" "(xii)")"
hier_done xii 1 "(xii)" > "$work/xii.result"  # (the link stays down until the job ends)
ip link set ember-v3 up
grep -q "replaced ${names[2]} by the spare ${names[3]};" "$work/xii.launcher" ||
  { cat "$work/xii.launcher" >&2; fail "(xii): no line saying host3 was replaced by host4"; }
echo "(xii) host3 replaced by host4; training again ${healed[xii]} s after the link went down; $(cat "$work/xii.result")"

# (xiii) host3's link down for 30 s, no spare: the launcher waits for host3 to answer ssh
# again (--host-wait, 60 s by default) and restarts the job on the same hosts.
echo "== (xiii) the host hierarchy: host3's link down for 30 s, no spare; the launcher waits for it"
hier_job xiii
wait_iterations "$work/xiii/run" 20 "(xiii)"
t0=$(now)
ip link set ember-v3 down
(sleep 30; ip link set ember-v3 up) &
up_pid=$!
bg_pids+=("$up_pid")
healed[xiii]="$(training_again xiii 1 "$t0" "(xiii)")"
wait "$up_pid" || true
ip link set ember-v3 up
hier_done xiii 1 "(xiii)" > "$work/xiii.result"
grep -q "launch_hosts: host ${names[2]} does not answer ssh and no spare host is left: waiting up to 60 s" "$work/xiii.launcher" &&
  grep -q "${names[2]} answered again after [0-9]* s;" "$work/xiii.launcher" ||
  { cat "$work/xiii.launcher" >&2; fail "(xiii): no lines saying the launcher waited for host3 and it answered again"; }
echo "(xiii) $(grep -o "${names[2]} answered again after [0-9]* s" "$work/xiii.launcher"); training again ${healed[xiii]} s after the link went down; $(cat "$work/xiii.result")"

for kind in ssh slurm; do
  name="iii-$kind"
  echo "== (iii) host3's link down for 30 s under $kind (bound $BOUND_S s)"
  start_job "$kind" "$name" 100000
  wait_iterations "$work/$name/run" 20 "(iii) $kind"
  t0=$(now)
  ip link set ember-v3 down
  ends[iii-$kind]="$(wait_gone "$work/$name/" "$t0" "(iii) $kind")"
  member="$(lost_member "$work/$name/run" "(iii) $kind")"
  for w in 2 3; do
    grep -q "lost the coordinator" "$work/$name/run/worker$w.log" ||
      fail "(iii) $kind: worker $w (on host3) does not log that it lost the coordinator: $(tail -n 2 "$work/$name/run/worker$w.log")"
  done
  echo "(iii) $kind: every Ember process gone after ${ends[iii-$kind]} s; named by $member; host3's workers: lost the coordinator"
  sleep "$(python3 -c "import sys; print(max(0.0, 30 - (float(sys.argv[2]) - float(sys.argv[1]))))" "$t0" "$(now)")"
  ip link set ember-v3 up
  job_failed "$kind" "$name" "(iii) $kind"
done

echo "== nothing left"
left="$(job_procs "$work/")"
[ -z "$left" ] || fail "Ember processes of the test still running: $(echo "$left" | paste -sd' ')"
[ -z "$(squeue -h 2> /dev/null)" ] || fail "Slurm jobs left: $(squeue -h -o '%i %T' | paste -sd,)"
bash "$cl" down --state "$state" > /dev/null || fail "cluster_local.sh down failed"
[ -z "$(ip netns list | grep ember-host || true)" ] || fail "namespaces left: $(ip netns list | grep ember-host)"
[ -z "$(ip -o link show | grep -E 'ember-(br0|v[0-9])' || true)" ] || fail "links left after down"
[ -z "$(pgrep -f "$work/" || true)" ] || fail "processes of the test left after down: $(pgrep -af "$work/")"
echo "down: no namespace, link or process left"

pulled="$(python3 -c "import json, sys; s = json.load(open(sys.argv[1])); print(s['pulls'], s['pushes'])" "$work/a/run/summary.json")"
echo "PASS: (b) ssh ${b_s} s and (c) sbatch ${c_s} s = (a) loopback ${a_s} s (model and counts: rows pulled/pushed ${pulled/ //}); ends after" \
  "scancel ${i_end} s (checkpoint ${i_at}), host3 killed ${ends[ii-ssh]}/${ends[ii-slurm]} s, link down 30 s" \
  "${ends[iii-ssh]}/${ends[iii-slurm]} s (ssh/slurm; bound ${BOUND_S} s, heartbeat ${HB_MS} ms); link down 2 s: same model," \
  "healed by a restart in ${ends[v]} s, on a spare host in ${ends[vi]} s, by Slurm's requeue in ${ends[vii]} s;" \
  "host hierarchy healed byte-identical, training again after: host3 killed ${healed[viii]} s, PS killed ${healed[ix]} s," \
  "both ${healed[x1]}+${healed[x2]} s, and by Slurm's requeue; link down for good (spare) ${healed[xii]} s, 30 s (waited for) ${healed[xiii]} s;" \
  "an iteration of ${stall[ssh]}/${stall[slurm]} s; in $((SECONDS - t_start)) s"
