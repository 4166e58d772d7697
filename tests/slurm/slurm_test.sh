#!/usr/bin/env bash
# scripts/ember.sbatch under a real (one-node) Slurm cluster, scripts/slurm_local.sh:
#   1. a job of 2 PS shards and 4 workers, `sbatch --wait`: its summary.json has every
#      iteration and no failure, its token is mode 600, and its model (--dump-dir:
#      dense.bin, rows.bin) equals the same job run by ember_launch.py; each daemon got
#      its --metrics-port (EMBER_METRICS_PORT) and summary.json lists the endpoints;
#   2. a job with checkpoints, `scancel`ed mid-run: every Ember process of it is gone
#      within STOP_BOUND_S, it stopped at a checkpoint, and that checkpoint is whole.
# Skips (exit 77) when not root or when slurm-wlm/munge are missing. Brings the cluster
# up and, unless it was up already, down again on any exit.
#   tests/slurm/slurm_test.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin="$(cd "${1:?usage: slurm_test.sh BIN_DIR SOURCE_DIR}" && pwd)"
src="$(cd "${2:?usage: slurm_test.sh BIN_DIR SOURCE_DIR}" && pwd)"
STOP_BOUND_S=${STOP_BOUND_S:-20}
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
[ "$EUID" -eq 0 ] || skip "needs root (slurm_local.sh starts munged, slurmctld, slurmd)"
for b in munged slurmctld slurmd sbatch scancel squeue; do
  command -v "$b" > /dev/null || PATH="$PATH:/usr/sbin" command -v "$b" > /dev/null ||
    skip "$b is missing (apt-get install slurm-wlm munge)"
done
for b in ember-ps ember-worker ember-data; do [ -x "$bin/$b" ] || fail "$bin/$b is missing"; done

t_start=$SECONDS
work="$(mktemp -d /tmp/ember-slurm-test.XXXXXX)"
slurm_dir="${EMBER_SLURM_DIR:-/var/lib/ember-slurm}"
export SLURM_CONF="$slurm_dir/slurm.conf"
was_up=0
bash "$src/scripts/slurm_local.sh" status --dir "$slurm_dir" > /dev/null && was_up=1
jobs_to_cancel=()
cleanup() {
  local rc=$?
  # A job left running (a timed-out sbatch --wait, a failed check) is cancelled.
  for j in "${jobs_to_cancel[@]}" $(cat "$work"/*.jobid 2> /dev/null); do scancel "$j" 2> /dev/null || true; done
  [ "$was_up" -eq 1 ] || bash "$src/scripts/slurm_local.sh" down --dir "$slurm_dir" > /dev/null 2>&1 || true
  if [ $rc -eq 0 ]; then rm -rf "$work"; else echo "(kept $work)" >&2; fi
}
trap cleanup EXIT
timeout 90 bash "$src/scripts/slurm_local.sh" up --dir "$slurm_dir" || fail "slurm_local.sh up failed"

echo "== data"
"$bin/ember-data" gen --like criteo --rows 40000 --scale 0.002 --seed 3 --force -o "$work/c.tsv" > /dev/null
"$bin/ember-data" prep --format criteo --val-fraction 0.1 --force -o "$work/data" "$work/c.tsv" > /dev/null
ps_args="--dim 8 --optimizer adagrad --lr 0.05"
wargs=(--model dlrm --bottom-mlp 32-16 --top-mlp 32-16 --batch-per-worker 64 --eval-every 0 --progress-every 10)

# The ember-* processes of Slurm job $1 still alive on this node (by their environment).
job_procs() {
  local n=0 p exe
  for p in /proc/[0-9]*; do
    exe="$(readlink "$p/exe" 2> /dev/null)" || continue
    case "${exe##*/}" in ember-ps|ember-worker) ;; *) continue ;; esac
    tr '\0' '\n' < "$p/environ" 2> /dev/null | grep -qx "SLURM_JOB_ID=$1" && n=$((n + 1))
  done
  echo "$n"
}

# Job 1 runs the daemons through wrappers that note the --metrics-port each got
# (EMBER_METRICS_PORT) and run the real binary without it.
mkdir -p "$work/stub"
for b in ember-ps ember-worker; do
  printf '%s\n' '#!/usr/bin/env bash' 'args=()' 'while [ $# -gt 0 ]; do' \
    "  if [ \"\$1\" = --metrics-port ]; then echo \"$b \$2\" >> '$work/ports'; shift 2; else args+=(\"\$1\"); shift; fi" \
    'done' "exec '$bin/$b' \"\${args[@]}\"" > "$work/stub/$b"
  chmod +x "$work/stub/$b"
done

echo "== job 1: sbatch --wait, 2 PS shards, 4 workers, 30 iterations"
t0=$SECONDS
EMBER_ROOT="$src" EMBER_BIN="$work/stub" EMBER_METRICS_PORT=9500 EMBER_OUT="$work/sl" EMBER_DUMP_DIR="$work/sl-dump" EMBER_PS_ARGS="$ps_args" \
  timeout 300 sbatch --wait --parsable -o "$work/sl-%j.out" "$src/scripts/ember.sbatch" "$work/data" herald 2 4 \
  -- "${wargs[@]}" --iterations 30 > "$work/sl.jobid" || { cat "$work"/sl-*.out >&2; fail "job 1 failed or timed out"; }
job1="$(cat "$work/sl.jobid")"
echo "job $job1 took $((SECONDS - t0)) s (sbatch --wait)"
cat "$work/sl-$job1.out"
# The daemons serve metrics on their data addresses: here the node's name resolved.
node="$(getent ahostsv4 "$(sinfo -h -o %N | head -1)" | awk 'NR == 1 { print $1 }')"
[ "$(sort "$work/ports" | tr '\n' ' ')" = "ember-ps 9500 ember-ps 9501 ember-worker 9502 ember-worker 9503 ember-worker 9504 ember-worker 9505 " ] ||
  fail "metrics ports passed: $(sort "$work/ports" | tr '\n' ' ')"
python3 - "$work/sl/summary.json" "$node" <<'EOF' || fail "job 1's summary.json"
import json, sys
s = json.load(open(sys.argv[1]))
want = [f"{sys.argv[2]}:{9500 + i}" for i in range(6)]
assert s["metrics_endpoints"] == want, (s["metrics_endpoints"], want)
assert s["iterations"] == 30 and s["stopped_at"] == 0, (s["iterations"], s["stopped_at"])
assert [i["iteration"] for i in s["per_iteration"]] == list(range(30)), "iterations missing"
assert s["workers"] == 4 and s["ps"] == 2 and s["policy"] == "herald"
assert s["pulls"] > 0 and len(s["shards"]) == 2 and s["checkpoints"]["failed"] == 0
EOF
[ "$(stat -c %a "$work/sl/token")" = 600 ] || fail "the job token is mode $(stat -c %a "$work/sl/token"), not 600"

echo "== the same job by ember_launch.py"
timeout 300 python3 "$src/scripts/ember_launch.py" --bin "$bin" --dataset "$work/data" --ps 2 --workers 4 --policy herald -q \
  --out "$work/la" --dump-dir "$work/la-dump" --ps-args "$ps_args" --timeout 240 -- "${wargs[@]}" --iterations 30 > /dev/null ||
  fail "ember_launch.py failed"
python3 - "$work/sl-dump" "$work/la-dump" <<'EOF' || fail "the models differ"
import sys
from array import array
from pathlib import Path
for name in ("dense.bin", "rows.bin"):
    a, b = (Path(d, name).read_bytes() for d in sys.argv[1:])
    if a == b:
        print(f"{name}: byte-equal ({len(a)} bytes)")
        continue
    assert len(a) == len(b), f"{name}: {len(a)} against {len(b)} bytes"
    # both are float32 arrays (docs/training.md, --dump-dir)
    fa, fb = array("f", a[:len(a) // 4 * 4]), array("f", b[:len(b) // 4 * 4])
    d = max(abs(x - y) for x, y in zip(fa, fb))
    assert d < 1e-6, f"{name}: max abs difference {d}"
    print(f"{name}: max abs difference {d}")
EOF

echo "== job 2: checkpoints every 5 iterations, scancel mid-run"
EMBER_ROOT="$src" EMBER_BIN="$bin" EMBER_OUT="$work/st" EMBER_CHECKPOINT_DIR="$work/ckpt" EMBER_CHECKPOINT_EVERY=5 \
  EMBER_PS_ARGS="$ps_args" sbatch --parsable -o "$work/st-%j.out" "$src/scripts/ember.sbatch" "$work/data" herald 2 4 \
  -- "${wargs[@]}" --iterations 100000 > "$work/st.jobid"
job2="$(cat "$work/st.jobid")"
jobs_to_cancel+=("$job2")
for _ in $(seq 1200); do  # up to 120 s for training to be under way past a checkpoint
  grep -q "iteration 20/" "$work/st/worker0.log" 2> /dev/null && break
  sleep 0.1
done
grep -q "iteration 20/" "$work/st/worker0.log" 2> /dev/null || { cat "$work/st-$job2.out" >&2; fail "job 2 did not reach iteration 20 in 120 s"; }
before="$(job_procs "$job2")"
[ "$before" -eq 6 ] || fail "job 2 has $before ember processes, not 6"
t0=$(date +%s.%N)
scancel "$job2"
gone=""
for _ in $(seq $((STOP_BOUND_S * 10))); do
  [ "$(job_procs "$job2")" -eq 0 ] && { gone=$(date +%s.%N); break; }
  sleep 0.1
done
[ -n "$gone" ] || fail "job 2 still has $(job_procs "$job2") ember processes ${STOP_BOUND_S} s after scancel"
stop_s=$(python3 -c "print(f'{$gone - $t0:.1f}')")
echo "scancel: every ember process of job $job2 gone after $stop_s s (bound $STOP_BOUND_S s)"
for _ in $(seq 300); do [ -z "$(squeue -h -j "$job2" 2> /dev/null)" ] && break; sleep 0.1; done
cat "$work/st-$job2.out"
python3 - "$work/st/summary.json" "$work/ckpt" <<'EOF' || fail "job 2 did not stop at a whole checkpoint"
import json, sys
from pathlib import Path
s = json.load(open(sys.argv[1]))
at = s["stopped_at"]
assert at > 0, "summary.json has no stopped_at"
ck = Path(sys.argv[2], "ps", f"iter-{at:09d}")
assert (ck / "manifest.json").exists(), f"{ck}/manifest.json missing"
dense = sorted(p.name for p in Path(sys.argv[2], "dense").glob(f"worker-*-iter-{at:09d}.pt"))
assert len(dense) == 4, f"dense state of {len(dense)} workers at iteration {at}"
print(f"stopped at iteration {at}: {ck} whole, dense state of 4 workers")
EOF
echo "== job 3: a stream (stream:DIR), against ember_launch.py --stream"
"$bin/ember-data" gen --like criteo --rows 4000 --files 4 --scale 0.002 --new-ids 0.1 --seed 5 --force -q -o "$work/stream"
sargs=(--model dlrm --bottom-mlp 16 --top-mlp 16 --batch-per-worker 64 --progress-every 0 --iterations 20 --create-after 2)
EMBER_ROOT="$src" EMBER_BIN="$bin" EMBER_OUT="$work/ss" EMBER_DUMP_DIR="$work/ss-dump" EMBER_PS_ARGS="$ps_args" EMBER_SLOTS_PER_SHARD=16384 \
  timeout 300 sbatch --wait --parsable -o "$work/ss-%j.out" "$src/scripts/ember.sbatch" "stream:$work/stream" herald 1 2 \
  -- "${sargs[@]}" > "$work/ss.jobid" || { cat "$work"/ss-*.out >&2; fail "job 3 (a stream) failed or timed out"; }
timeout 300 python3 "$src/scripts/ember_launch.py" --bin "$bin" --stream "$work/stream" --slots-per-shard 16384 --ps 1 --workers 2 \
  --policy herald -q --out "$work/ls" --dump-dir "$work/ls-dump" --ps-args "$ps_args" --timeout 240 -- "${sargs[@]}" > /dev/null ||
  fail "ember_launch.py --stream failed"
for f in dense.bin rows.bin; do
  cmp -s "$work/ss-dump/$f" "$work/ls-dump/$f" || fail "job 3: $f differs from ember_launch.py --stream's"
done
echo "job 3: the stream job's model is ember_launch.py --stream's, byte for byte"

echo "PASS in $((SECONDS - t_start)) s"
