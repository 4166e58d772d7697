#!/usr/bin/env bash
# Reruns scripts/quickstart.sh and writes what it printed (the side-by-side table of the
# vanilla and herald jobs) into README.md, between the lines
#   <!-- quickstart-output -->   and   <!-- /quickstart-output -->
# so that the README shows the output of the current code, not a number pasted by hand.
# The block also says when, on what machine (EMBER_MACHINE="..." to describe it; default
# the core count and CPU model) and at which commit it was made, and how long the
# quickstart took after its build step (which may wait for a build lock, EMBER_BUILD_LOCK).
# The quickstart's whole output is kept in out/quickstart/readme-run.log.
#
#   scripts/readme_output.sh            # as root: the shaped link; otherwise loopback
#   EMBER_MACHINE="the 2-core development host" scripts/readme_output.sh
#
# Environment variables of scripts/quickstart.sh (EMBER_LINK_MBIT, EMBER_LOOPBACK, ...)
# pass through.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${EMBER_WORK_DIR:-$root/out/quickstart}"
mkdir -p "$work"
log="$work/readme-run.log"
bash "$root/scripts/quickstart.sh" 2>&1 | tee "$log"
cores=$(nproc)
model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
machine="${EMBER_MACHINE:-$cores cores${model:+ ($model)}}"
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
EMBER_README="$root/README.md" EMBER_LOG="$log" EMBER_MACHINE_TEXT="$machine" EMBER_COMMIT="$commit" \
python3 - <<'EOF'
import os, re, sys, time
from pathlib import Path

readme, log = Path(os.environ["EMBER_README"]), Path(os.environ["EMBER_LOG"])
lines = log.read_text(errors="replace").splitlines()
# The jobs' setting (the quickstart_jobs.py line: link or loopback) and the table
# compare_runs.py printed, without the plot's path.
setting = [l for l in lines if l.startswith("quickstart: ") and not l.startswith("quickstart: done in ")]
done = [re.match(r"quickstart: done in (\d+) s, (\d+) s of it after the build step", l) for l in lines]
done = [m for m in done if m]
if not done:
    sys.exit("readme_output: the quickstart did not say how long it took")
try:
    start = next(i for i, l in enumerate(lines) if l.startswith("== vanilla vs herald"))
except StopIteration:
    sys.exit("readme_output: the quickstart printed no comparison table")
table = [l for l in lines[start + 1:] if not l.startswith(("plot: ", "quickstart: done in "))]
begin, end = "<!-- quickstart-output -->", "<!-- /quickstart-output -->"
text = readme.read_text()
if text.count(begin) != 1 or text.count(end) != 1:
    sys.exit(f"readme_output: README.md needs exactly one {begin} and one {end} line")
secs = int(done[-1].group(2))
block = [begin,
         f"Written by [`scripts/readme_output.sh`](scripts/readme_output.sh) on {time.strftime('%Y-%m-%d')} "
         f"at commit {os.environ['EMBER_COMMIT']}, on {os.environ['EMBER_MACHINE_TEXT']}; once built, the quickstart "
         f"took {secs // 60} min {secs % 60} s after its build step:",
         "", "```", *setting[-1:], *table, "```", end]
head, rest = text.split(begin, 1)
_, tail = rest.split(end, 1)
readme.write_text(head + "\n".join(block) + tail)
print(f"readme_output: README.md block rewritten ({len(table)} table lines)")
EOF
