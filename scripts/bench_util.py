"""What the benchmark scripts share: running a command (and stopping with its error), and
a network interface's byte counters inside a network namespace."""
import json
import subprocess
import sys


def run(cmd, **kw):
    """Runs `cmd` (its parts made strings), its output captured as text; returns the
    CompletedProcess whatever its exit status."""
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)


def sh(cmd, who="bench", **kw):
    """Runs `cmd` as run() does; returns its stdout, or exits naming `who`, the command and
    its exit status, with the tail of its stderr (stdout when stderr is empty)."""
    r = run(cmd, **kw)
    if r.returncode != 0:
        sys.exit(f"{who}: {' '.join(map(str, cmd))} failed (exit {r.returncode}):\n{(r.stderr or r.stdout)[-2000:]}")
    return r.stdout


def nic_bytes(netns, dev):
    """(tx_bytes, rx_bytes) of interface `dev` in network namespace `netns`: iproute2's
    JSON statistics, or the namespace's /sys on an iproute2 without -j."""
    r = run(["ip", "-n", netns, "-s", "-j", "link", "show", "dev", dev])
    if r.returncode == 0:
        st = json.loads(r.stdout)[0]["stats64"]
        return st["tx"]["bytes"], st["rx"]["bytes"]
    return tuple(int(sh(["ip", "netns", "exec", netns, "cat", f"/sys/class/net/{dev}/statistics/{k}"], who="nic_bytes"))
                 for k in ("tx_bytes", "rx_bytes"))
