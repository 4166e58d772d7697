#!/usr/bin/env bash
# Proves that two builds of the scheduler plan alike: runs ember-sim of BEFORE and of
# AFTER over the same dataset in many settings (every policy; lookahead, eviction by next
# use and prefetch; refined and partitioned LAIA; adaptive LAIA; flushes; scheduler
# threads; placements made by ember-plan, with cache shares too; brute force) and diffs
# their whole JSON output (counts, bytes, per-table and per-shard counts, plan digests),
# timing fields left out. Exits 1 on the first difference, 0 when every case agrees.
#
#   scripts/sim_digests.sh BEFORE_BIN_DIR AFTER_BIN_DIR DATA_DIR [WORK_DIR]
#
# BIN_DIRs hold ember-sim (and BEFORE's ember-plan, which writes the placements). A
# dataset: ember-data gen --like criteo --rows 200000 --scale 0.01 --seed 1 -o q.tsv &&
# ember-data prep --format criteo --val-fraction 0.1 -o q q.tsv.
set -euo pipefail

if [[ $# -lt 3 ]]; then
  sed -n 2,14p "$0"
  exit 2
fi
before=$1
after=$2
data=$3
work=${4:-$(mktemp -d)}
mkdir -p "$work"

common=(--dataset "$data" --workers 4 --batch-per-worker 128 --cache-ratio 0.1 --iterations 60 --warmup 0 --seed 1
  --dim 16 --optimizer adagrad --digest --json -q)
all=vanilla,laia,plan,herald,het:2,fae:0.05
no_het=vanilla,laia,plan,herald,fae:0.05
window=(--lookahead 3 --eviction lookahead --prefetch)
flushes=(--eval-every 7 --checkpoint-every 10)

# Placements: ember-plan's searched plan (cached, replicated and uncached tables), and
# the same with cache shares for two cached tables (an LRU of their own each).
plan=$work/plan.json
shares=$work/plan-shares.json
# Builds before the option registry spelt some flags otherwise, and counted ember-sim's
# and ember-plan's --iterations after the --warmup ones: their names for a BIN_DIR.
old_names() {  # (the help read whole: grep -q's early exit would fail the pipe)
  local help
  help=$("$1/ember-sim" --help)
  [[ $help != *--dataset* ]]
}
translate() {  # BIN_DIR ARGS...: ARGS as that build's ember-sim takes them
  local bin=$1
  shift
  if ! old_names "$bin"; then
    printf '%s\n' "$@"
    return
  fi
  for a in "$@"; do
    case $a in
      --dataset) echo --data ;; --policy) echo --policies ;; --sched-threads) echo --threads ;;
      --scheduler-per-host) echo --per-host ;; *) echo "$a" ;;
    esac
  done
}
if [[ ! -s $plan ]]; then
  if old_names "$before"; then plan_data=(--data "$data" --iterations 20); else plan_data=(--dataset "$data" --iterations 25); fi
  "$before/ember-plan" "${plan_data[@]}" --workers 4 --batch-per-worker 128 --cache-ratio 0.1 --dim 16 --optimizer adagrad \
    --memory 200K --link-mbit 50 --policy herald --sample 10 --warmup 5 --plan-out "$plan" >"$work/plan.log"
fi
jq '[.tables[] | select(.treatment == "cache") | .name][0:2] as $two
    | .tables |= map(if (.name | IN($two[])) then .cache_share = 150 else . end)' "$plan" >"$shares"

# name|policies|extra flags
cases=(
  "base|$all|"
  "window|$no_het|${window[*]}"
  "lookahead-lru|$no_het|--lookahead 2 --eviction lru"
  "belady|vanilla,herald|--lookahead 59 --eviction belady"
  "refine|laia,herald|--refine-allocation"
  "refine-window|herald|--refine-allocation ${window[*]}"
  "partitions|laia,herald|--partitions 2 --refine-allocation --sched-threads 2"
  "adaptive-one|laia,herald|--budget-ms 0.000001"
  "adaptive-all|herald|--budget-ms 1000"
  "flushes|$all|${flushes[*]}"
  "flushes-window|$no_het|${flushes[*]} ${window[*]}"
  "threads|$all|--sched-threads 2"
  "threads-window|$no_het|--sched-threads 2 ${window[*]} ${flushes[*]}"
  "shuffle|$all|--shuffle --ps 2"
  "placement|vanilla,laia,plan,herald|--placement $plan"
  "placement-window|vanilla,herald|--placement $plan ${window[*]} ${flushes[*]} --sched-threads 2"
  "placement-refine|herald|--placement $plan --refine-allocation"
  "shares|vanilla,laia,plan,herald|--placement $shares ${flushes[*]}"
  "shares-window|herald|--placement $shares ${window[*]} --sched-threads 2"
  "brute|brute,herald|--batch-per-worker 1 --cache-ratio 0.02"
  "hosts|herald|--workers 8 --hosts 2 --peer-sync --host-allocation ${window[*]} ${flushes[*]}"
  "peer|plan,herald|--workers 8 --hosts 2 --peer-sync --sched-threads 2"
  "eight-refine|laia,herald|--workers 8 --refine-allocation --sched-threads 2"
)

# Timing fields (names with ms, seconds or time) vary from run to run, and the
# scheduler's bytes with how its state is laid out: dropped.
strip='walk(if type == "object" then with_entries(select(.key | test("(^|_)ms(_|$)|seconds|time|scheduler_bytes") | not)) else . end)'

failed=0
for c in "${cases[@]}"; do
  IFS='|' read -r name policies extra <<<"$c"
  # shellcheck disable=SC2206
  flags=($extra)
  # A flag of the case replaces the common one (and its value).
  args=()
  for ((i = 0; i < ${#common[@]}; ++i)); do
    a=${common[i]}
    if [[ " ${flags[*]} " == *" $a "* ]]; then
      ((++i))
      continue
    fi
    args+=("$a")
  done
  for side in before after; do
    bin=$before
    [[ $side == after ]] && bin=$after
    mapfile -t given < <(translate "$bin" "${args[@]}" --policy "$policies" "${flags[@]}")
    "$bin/ember-sim" "${given[@]}" >"$work/$name.$side.raw"
    jq -S -c "$strip" "$work/$name.$side.raw" >"$work/$name.$side.json"
  done
  lines=$(wc -l <"$work/$name.before.json")
  if cmp -s "$work/$name.before.json" "$work/$name.after.json"; then
    echo "same      $name ($lines policies: $policies)"
  else
    echo "DIFFERENT $name: diff $work/$name.before.json $work/$name.after.json"
    failed=1
  fi
done
exit $failed
