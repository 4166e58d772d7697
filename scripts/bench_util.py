"""What the benchmark scripts share: running a command and stopping with its error."""
import subprocess
import sys


def sh(cmd, who="bench", env=None):
    """Runs `cmd` (its parts made strings); returns its stdout, or exits with its stderr's tail."""
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"{who}: {' '.join(map(str, cmd))} failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
    return r.stdout
